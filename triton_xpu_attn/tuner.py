"""The tuner: ``python -m triton_xpu_attn.tuner [--ops ...] [--quick] [--only FIELD=VALUE] [--out DIR]``.

Runs each op's candidate configs on representative problems, checks them against the reference,
times the correct ones from device graphs and writes ``autotune_configs/<backend>/<device_key>.json``,
which :func:`triton_xpu_attn.tune.lookup` reads. It sits above ``ops/``: it imports the ops (to run
candidates) and the lookup; the ops import only the lookup (:mod:`triton_xpu_attn.tune`), and no
module of the package imports this one.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import sys
from typing import Any, Callable

import torch

from . import device as _device
from . import reference
from .ops.mla_decode import flash_mla_decode, flash_mla_get_workspace_size
from .ops.mla_prefill import flash_mla_prefill
from .ops.paged_attention import flash_attn_with_kvcache
from .ops.varlen_attention import flash_attn_varlen_func
from .tune import _SHIPPED_DIRS, CONFIG_DIR_ENV, bucket_key, clear_cache, override


@dataclasses.dataclass
class TuningSpec:
    """How to tune one op: its buckets (the ``fields`` its launcher looks up), a few
    representative problems per bucket, and candidate configs (tried in two stages: tile shape
    first, then the rest with the best tile)."""

    buckets: Callable[[bool], list[dict]]
    problems: Callable[[dict, bool], list[dict]]
    make: Callable[[dict, dict, Any], Any]  # (problem, bucket fields, device) -> inputs on the device
    run: Callable[[Any], Any]  # prepared inputs -> output tensor (uses tune.lookup inside)
    reference: Callable[[Any], Any]  # prepared inputs -> float reference output
    tolerance: float
    stage1: Callable[[dict, bool], list[dict]]
    stage2: Callable[[dict, bool], list[dict]]


TUNING_SPECS: dict[str, TuningSpec] = {}


#: a tuned config replaces the heuristic only when it is at least this much faster
MIN_TUNED_GAIN = 1.03


def _config_id(config: dict) -> str:
    return json.dumps(config, sort_keys=True)


def _time_graph(fn) -> float:
    """Median microseconds of ``fn`` replayed from a device graph (no Python launch overhead),
    falling back to eager launches where graphs are unavailable."""
    from triton.testing import do_bench

    replay = fn
    if _device.backend() == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        replay = graph.replay
    return do_bench(replay, warmup=10, rep=50, return_mode="median") * 1e3


def _measure(op: str, spec: TuningSpec, prepared: list, references: list, config: dict | None) -> float | None:
    """Geometric-mean microseconds over the bucket's problems, or None if any output is wrong."""
    # no config = the built-in heuristic (an empty override), never a shipped file's entry
    ctx = override(op, config if config is not None else {})
    times = []
    with ctx:
        for inputs, ref in zip(prepared, references):
            try:
                out = spec.run(inputs)
            except Exception as exc:  # a config that does not compile (resources) is just skipped
                print(f"      fails: {type(exc).__name__}: {str(exc)[:100]}")
                return None
            err = ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
            if not err < spec.tolerance:
                print(f"      wrong: relative error {err:.2e}")
                return None
            times.append(_time_graph(lambda: spec.run(inputs)))
    return float(math.exp(sum(math.log(t) for t in times) / len(times)))


def _only_values(only: dict | None) -> dict[str, tuple[str, ...]]:
    """``{field: value or values}`` -> ``{field: values as text}`` (as typed on the command line)."""
    return {k: tuple(str(x) for x in ((v,) if isinstance(v, (str, int)) else v)) for k, v in (only or {}).items()}


def choose_entry(heuristic_us, previous: dict | None, previous_us, best: dict, best_us: float):
    """``(entry, its time, what was decided)`` for a bucket: the fastest candidate only where it
    beats both the heuristic and the file's previous entry by ``MIN_TUNED_GAIN``; else the previous
    entry where it still beats the heuristic by that much; else the heuristic (an empty entry).
    Near-ties picked on the tuner's few problems did not carry over (H100, D=64: +1-3% here,
    0.76-0.88x at B=64..128), and a re-run must never replace an entry with a slower one."""
    incumbent, incumbent_us, name = {}, heuristic_us, "heuristic"
    if previous and previous_us is not None and (heuristic_us is None or previous_us * MIN_TUNED_GAIN <= heuristic_us):
        incumbent, incumbent_us, name = previous, previous_us, "previous entry"
    if incumbent_us is None or best_us * MIN_TUNED_GAIN <= incumbent_us:
        shown = "-" if incumbent_us is None else f"{incumbent_us:.1f}"
        return best, best_us, f"tuned {_config_id(best)} {best_us:.1f} us (the {name}: {shown} us)"
    if previous and name == "heuristic":
        what = f"previous entry {_config_id(previous)} dropped: " + (
            "it failed" if previous_us is None else f"{previous_us:.1f} us, not {MIN_TUNED_GAIN}x faster than the heuristic")
    else:
        what = f"the {name} kept"
    return incumbent, incumbent_us, f"{what} ({incumbent_us:.1f} us; best candidate {best_us:.1f} us)"


def select_buckets(buckets: list[dict], only: dict | None) -> list[dict]:
    """The buckets whose every field named in ``only`` ({field: value or values}) has one of the
    given values (compared as text)."""
    wanted = _only_values(only)
    return [f for f in buckets if all(str(f.get(k)) in values for k, values in wanted.items())]


def tune(ops: list[str], quick: bool, out_dir: str, only: dict | None = None) -> pathlib.Path:
    import datetime

    import triton

    backend = _device.backend()
    key = _device.device_key()
    folder = pathlib.Path(out_dir) / backend
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    progress_path = folder / f"{key}.progress.json"
    progress = json.loads(progress_path.read_text()) if progress_path.exists() else {}
    result = json.loads(path.read_text()) if path.exists() else {}
    result.update(
        device_name=_device.device_name(), device_key=key, backend=backend, triton_version=triton.__version__,
        torch_version=torch.__version__, date=datetime.date.today().isoformat(), measured_on_hardware=True,
    )
    # a file is often tuned in several runs (a quick pass, then some buckets in full): keep them all
    command = f"python -m triton_xpu_attn.tuner --ops {','.join(ops)}" + (" --quick" if quick else "") + "".join(
        f" --only {k}={','.join(v)}" for k, v in _only_values(only).items())
    history = result.get("tuned_with", [])
    history = [history] if isinstance(history, str) else list(history)
    result["tuned_with"] = history + [f"{datetime.date.today().isoformat()}: {command}"]
    result.setdefault("ops", {})
    result.setdefault("gain_over_heuristic", {})
    for op_index, op in enumerate(ops, 1):
        spec = TUNING_SPECS[op]
        buckets = select_buckets(spec.buckets(quick), only)
        op_progress = progress.setdefault(op, {})
        for b_index, fields in enumerate(buckets, 1):
            bucket = bucket_key(fields)
            done = op_progress.setdefault(bucket, {})
            print(f"[op {op_index}/{len(ops)} {op}] bucket {b_index}/{len(buckets)} {bucket}", flush=True)
            problems = spec.problems(fields, quick)
            prepared = [spec.make(p, fields, _device.default_device()) for p in problems]
            references = [spec.reference(x) for x in prepared]

            def measure(config):
                cid = _config_id(config) if config is not None else "heuristic"
                if cid not in done:  # resumable: measured candidates are kept in the progress file
                    done[cid] = _measure(op, spec, prepared, references, config)
                    progress_path.write_text(json.dumps(progress, indent=1))
                return done[cid]

            baseline = measure(None)
            # the entry a file already has for this bucket: timed too, and replaced only by a
            # clearly faster one (a re-run must not silently cost time)
            previous = result["ops"].get(op, {}).get(bucket) or None
            previous_time = measure(previous) if previous else None
            best, best_time = None, float("inf")
            for stage, candidates in enumerate((spec.stage1(fields, quick), None), 1):
                if candidates is None:
                    base = best or {}
                    candidates = [{**base, **c} for c in spec.stage2(fields, quick)]
                for c_index, config in enumerate(candidates, 1):
                    t = measure(config)
                    left = len(candidates) - c_index
                    shown = "failed" if t is None else f"{t:8.1f} us"
                    print(f"    stage {stage} candidate {c_index}/{len(candidates)} ({left} left) {shown}  {_config_id(config)}", flush=True)
                    if t is not None and t < best_time:
                        best, best_time = config, t
            if best is None:
                continue
            best, best_time, note = choose_entry(baseline, previous, previous_time, best, best_time)
            kept = not best
            print(f"    -> {note}", flush=True)
            result["ops"].setdefault(op, {})[bucket] = best
            if baseline:
                result["gain_over_heuristic"].setdefault(op, {})[bucket] = dict(
                    heuristic_us=round(baseline, 2), tuned_us=round(best_time, 2), speedup=round(baseline / best_time, 3),
                    **({"kept_heuristic": True} if kept else {}),
                )
            path.write_text(json.dumps(result, indent=1, sort_keys=True))
            del prepared, references
    path.write_text(json.dumps(result, indent=1, sort_keys=True))
    clear_cache()
    return path


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m triton_xpu_attn.tuner", description="Tune kernel configs for this device.")
    parser.add_argument("--ops", default=",".join(TUNING_SPECS), help=f"comma-separated, from {', '.join(TUNING_SPECS)}")
    parser.add_argument("--quick", action="store_true", help="fewer buckets and candidates")
    parser.add_argument("--only", action="append", default=[], metavar="FIELD=VALUE[,VALUE...]",
                        help="tune only buckets with one of these field values (repeatable, all must hold), "
                        "e.g. --only q=draft --only p=1,16,64")
    parser.add_argument("--out", default=os.environ.get(CONFIG_DIR_ENV) or str(_SHIPPED_DIRS[1]),
                        help="config folder (default: $%s, else the checkout's autotune_configs/)" % CONFIG_DIR_ENV)
    args = parser.parse_args(argv)
    only = {}
    for item in args.only:
        field, sep, values = item.partition("=")
        if not sep or not field or not values:
            parser.error(f"--only {item!r}: expected FIELD=VALUE[,VALUE...]")
        only[field] = tuple(values.split(","))
    if _device.backend() == "interpreter":
        print("The tuner needs a GPU: it refuses to run under the Triton interpreter (timings there are "
              "meaningless). Run it on an XPU or CUDA machine.", file=sys.stderr)
        return 2
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in TUNING_SPECS]
    if unknown:
        parser.error(f"unknown ops {unknown}; choose from {sorted(TUNING_SPECS)}")
    path = tune(ops, args.quick, args.out, only)
    print(f"wrote {path}")
    return 0


def _random_page_table(B: int, L: int, P: int, device) -> tuple[torch.Tensor, int]:
    """``(page_table [B, cdiv(L, P)] int32, pool pages)``: a fixed random permutation of a pool
    one page larger than the table needs (every tuning problem scatters its pages the same way)."""
    n = -(-L // P)
    gen = torch.Generator(device="cpu").manual_seed(0)
    table = torch.randperm(B * n + 1, generator=gen)[: B * n].view(B, n).to(torch.int32).to(device)
    return table, B * n + 1


# ---- paged attention ----


def _pa_buckets(quick: bool) -> list[dict]:
    # (head dim, group): 32/8/128, 8/1 and 64/8, 32/8/64, 16/8/256 (Gemma 2/3: without a D = 256 bucket
    # its q_len-4 drafts took the nearest D = 128 draft tile, 1.46-1.51x slower than the heuristic at
    # P = 16 on the H100: bench/results/NVIDIA_H100_80GB_HBM3/experiments/size_fields.txt)
    shapes = [(128, 4), (128, 8), (64, 4), (256, 2)]
    pages = [1, 16, 64] if quick else [1, 16, 64, 128]
    works = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32]
    # "draft": decode-like launches of 2..16 queries per request (speculative drafts, MTP); their
    # (token x head) tiles are larger than decode's and want other tiles (H200, q_len 4, 64/8/128,
    # B=64, L=8k, page 16: 821 us on the decode config, 613 on 128-key tiles with 3 stages)
    out = [dict(d=d, dv=d, g=g, p=p, q=q, w=w, dtype="bfloat16")
           for q in ("decode", "draft") for d, g in shapes for p in pages for w in works]
    if not quick:
        # prefill page sizes: token-granular tables (gathers), 16-token pages, one-tile pages. Without a
        # p=1 bucket a P=1 prefill took the nearest tuned one, p=16's, whose tile may be a two-page
        # descriptor tile that gathers run far slower on (H100, P=1: 128 x 32 tiles 215-226 vs 314-328 TF/s)
        out += [dict(d=128, dv=128, g=4, p=p, q="prefill", w=w, dtype="bfloat16") for p in (1, 16, 64) for w in (4, 32)]
        # flash_attn_varlen_func (contiguous K/V): page field 256 by convention, see _launch
        out += [dict(d=128, dv=128, g=4, p=256, q="varlen", w=w, dtype="bfloat16") for w in (4, 32)]
    return out


def _pa_kv_heads(fields: dict) -> int:
    return 8 if fields["g"] <= 4 else 1


def _pa_problems(fields: dict, quick: bool) -> list[dict]:
    # a batch whose launch lands in the bucket's work class on this device
    programs = max(1, fields["w"] * _device.compute_units() // 4)
    if fields["q"] in ("decode", "draft"):
        batch = max(1, programs // _pa_kv_heads(fields))
        # small batches split the keys: two lengths, since the split policy (min_split_tokens,
        # waves) that suits 8k keys alone starved 1k-key batches (H200: 2 splits of 512 keys where
        # 8 of 128 ran 1.5x faster). Full batches barely split: long keys, where the tile matters
        # (H100, D=64: tiles picked at 1k/4k keys ran 0.76-0.86x the heuristic at 8k/32k)
        lengths = (1024, 8192) if fields["w"] <= 4 else (8192,)
        if fields["q"] == "draft" and fields["w"] <= 16:
            # drafts also at 32k keys: there 64-key tiles beat the 128-key ones that win at 1k-8k
            # (H200, 8/1/128, q_len 4, B=64, L=32k: 316 us vs 417 on the 1k/8k pick; experiments/q4_rows.txt)
            lengths += (32768,)
        q_len = 1 if fields["q"] == "decode" else 4
        problems = [dict(B=batch, L=length, q_len=q_len) for length in lengths]
        if fields["w"] == 1 and batch > 1:
            # the smallest work class also holds single requests, which want more splits than a
            # few requests do (H100, 8/4/256, P = 64, B = 1, L = 1k: 16.0 us on the tile picked at
            # B = 4 vs 13.7 on a 4-wave split one; experiments/tune_d256.txt)
            problems += [dict(B=1, L=length, q_len=q_len) for length in (1024, 8192)]
        return problems
    if fields["q"] == "varlen":
        # full prefill, every request's queries over its own keys: L/16 query tiles x H_kv
        # programs a request. The prefill benchmark's grid (B x L = 8-16k tokens) lands in w=32; w=4 is a short prompt
        L = 2048 if fields["w"] >= 16 else 256
        return [dict(B=max(1, programs * 16 // (_pa_kv_heads(fields) * L)), L=L, q_len=L)]
    return [dict(B=max(1, programs // (_pa_kv_heads(fields) * 8)), L=2048, q_len=512)]


def _pa_make(problem: dict, fields: dict, device):
    B, L, S, P, D, g = problem["B"], problem["L"], problem["q_len"], fields["p"], fields["d"], fields["g"]
    hkv = _pa_kv_heads(fields)
    if fields["q"] == "varlen":
        dtype = getattr(torch, fields["dtype"])
        cu = torch.arange(0, (B + 1) * L, L, dtype=torch.int32, device=device)
        cu_q = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device=device)
        k, v = (torch.randn(B * L, hkv, D, device=device, dtype=dtype) for _ in range(2))
        return dict(q=torch.randn(B * S, g * hkv, D, device=device, dtype=dtype), k=k, v=v, cu_q=cu_q, cu_k=cu,
                    max_q=S, max_k=L)
    table, num_pages = _random_page_table(B, L, P, device)
    dtype = getattr(torch, fields["dtype"])
    k = torch.randn(num_pages, P, hkv, D, device=device, dtype=dtype)
    v = torch.randn(num_pages, P, hkv, D, device=device, dtype=dtype)
    q = torch.randn(B, S, g * hkv, D, device=device, dtype=dtype)
    return dict(q=q, k=k, v=v, table=table, seqlens=torch.full((B,), L, device=device, dtype=torch.int32))


def _pa_run(x):
    if "cu_k" in x:
        return flash_attn_varlen_func(x["q"], x["k"], x["v"], x["cu_q"], x["cu_k"], x["max_q"], x["max_k"], causal=True)
    return flash_attn_with_kvcache(x["q"], x["k"], x["v"], cache_seqlens=x["seqlens"], page_table=x["table"], causal=True)


def _pa_reference(x):
    if "cu_k" in x:
        return reference.varlen_attention(x["q"], x["k"], x["v"], x["cu_q"], x["cu_k"], causal=True, dtype=torch.float32)[0]
    out, _ = reference.paged_attention(
        x["q"], x["k"], x["v"], x["seqlens"], x["table"], causal=True, dtype=torch.float32
    )
    return out


TUNING_SPECS["paged_attention"] = TuningSpec(
    buckets=_pa_buckets,
    problems=_pa_problems,
    make=_pa_make,
    run=_pa_run,
    reference=_pa_reference,
    tolerance=2e-2,
    stage1=lambda f, quick: _pa_prefill_tiles(f) if f["q"] in ("prefill", "varlen") else [
        dict(BLOCK_N=bn, num_warps=w, num_stages=st)
        for bn in (32, 64, 128)
        for w in ((2, 4, 8) if not quick else (2, 4))
        for st in ((2, 3) if not quick else (2,))
        if not (f["d"] > 128 and bn > 64)
    ] + [
        # CUDA: the 4-warp tiles capped at 128 registers, 4 programs an SM (ptxas may take a few
        # more and drop to 3: the 64/8/128 P = 16 draft tile, 134 registers, 1.22x slower)
        dict(BLOCK_N=bn, num_warps=4, num_stages=2, maxnreg=128)
        for bn in (64, 128) if _device.backend() == "cuda" and not (f["d"] > 128 and bn > 64)
    ],
    stage2=lambda f, quick: [{}] if f["q"] in ("prefill", "varlen") else [
        dict(min_split_tokens=m, waves=w) for m in (128, 256, 512) for w in ((1, 2, 4) if not quick else (2, 4))
    ],
)


def _pa_prefill_tiles(fields: dict) -> list[dict]:
    """Prefill candidates: query-tile rows, key tiles, warps, stages and tensor-descriptor K/V
    (the knobs that moved causal prefill on the H100: bench/results/NVIDIA_H100_80GB_HBM3/
    experiments/prefill_tiles.txt, prefill_desc.txt); no splits (query tiles fill the device)."""
    return [
        dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, kv_desc=desc)
        for bm in (64, 128)
        for bn in (32, 64)
        for w in (4, 8)
        for st in (2, 3)
        for desc in (False, True)
        if not (fields["d"] > 128 and bn > 32)
    ]



# ---- MLA decode ----


def _mla_buckets(quick: bool) -> list[dict]:
    rows = [16, 128] if quick else [16, 32, 64, 128]
    works = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32]
    return [dict(rows=r, r=512, w=w, kv=kv, dtype="bfloat16") for r in rows for w in works for kv in ("page", "gather")]


def _mla_problems(fields: dict, quick: bool) -> list[dict]:
    programs = max(1, fields["w"] * _device.compute_units() // 4)
    batch = max(1, programs // -(-fields["rows"] // 16))
    return [dict(B=batch, H=fields["rows"], L=4096 if batch <= 64 else 2048, P=64 if fields["kv"] == "page" else 1)]


def _mla_make(problem: dict, fields: dict, device):
    B, H, L, P = problem["B"], problem["H"], problem["L"], problem["P"]
    table, num_pages = _random_page_table(B, L, P, device)
    dtype = getattr(torch, fields["dtype"])
    cache = torch.randn(num_pages, P, 576, device=device, dtype=dtype)
    q = torch.randn(B, H, 576, device=device, dtype=dtype)
    seqlens = torch.full((B,), L, device=device, dtype=torch.int32)
    workspace = torch.empty(flash_mla_get_workspace_size(L, B, H, P, -1), dtype=torch.uint8, device=device)
    return dict(q=q, cache=cache, table=table, seqlens=seqlens, workspace=workspace)


def _mla_run(x):
    return flash_mla_decode(
        x["q"][..., :512], x["q"][..., 512:], x["cache"], x["seqlens"], x["table"], x["workspace"], 192**-0.5,
        num_kv_splits=-1,
    )


def _mla_reference(x):
    return reference.mla_decode(
        x["q"][..., :512], x["q"][..., 512:], x["cache"], x["seqlens"], x["table"], 192**-0.5, dtype=torch.float32
    )[0]


def _mla_tiles(max_rows: int) -> list[dict]:
    """Stage 1 of the MLA kernel (decode and prefill): rows x keys per tile, warps."""
    return [
        dict(BLOCK_H=bh, BLOCK_N=bn, num_warps=w, num_stages=2)
        for bh in (16, 32, 64)
        if bh <= max(16, max_rows)
        for bn in (32, 64)
        for w in ((4, 8) if bh >= 32 else (4,))
    ]


def _mla_stage2(fields: dict) -> list[dict]:
    """Stage 2 of the MLA kernel: pipeline depth; gather buckets also without the one-tile-ahead
    page-id prefetch (the prefetch adds a pipeline stage's worth of shared memory)."""
    return [dict(num_stages=1), dict(num_stages=3)] + (
        [dict(PREFETCH_PAGES=0), dict(PREFETCH_PAGES=0, num_stages=3)] if fields["kv"] == "gather" else [])


TUNING_SPECS["mla_decode"] = TuningSpec(
    buckets=_mla_buckets,
    problems=_mla_problems,
    make=_mla_make,
    run=_mla_run,
    reference=_mla_reference,
    tolerance=2e-2,
    stage1=lambda f, quick: _mla_tiles(f["rows"]),
    stage2=lambda f, quick: _mla_stage2(f),
)


# ---- MLA prefill ----


def _mla_prefill_buckets(quick: bool) -> list[dict]:
    heads = [16, 128] if quick else [16, 32, 64, 128]
    works = [32] if quick else [4, 16, 32]
    return [dict(h=h, r=512, w=w, kv=kv, dtype="bfloat16") for h in heads for w in works for kv in ("page", "gather")]


def _mla_prefill_problems(fields: dict, quick: bool) -> list[dict]:
    """One causal request filling the bucket's work (64-row tiles per compute unit); the saturated
    bucket (w = 32) a 4096-token prefill and 4 chunks of 1024 tokens over 4096 keys."""
    P = 64 if fields["kv"] == "page" else 1
    if fields["w"] >= 32:
        return [dict(B=1, q=4096, L=4096, H=fields["h"], P=P)] + ([] if quick else [dict(B=4, q=1024, L=4096, H=fields["h"], P=P)])
    rows = fields["w"] * _device.compute_units() // 4 * 64
    q = max(16, rows // fields["h"])
    return [dict(B=1, q=q, L=q, H=fields["h"], P=P)]


def _mla_prefill_make(problem: dict, fields: dict, device):
    B, H, q, L, P = problem["B"], problem["H"], problem["q"], problem["L"], problem["P"]
    table, num_pages = _random_page_table(B, L, P, device)
    dtype = getattr(torch, fields["dtype"])
    return dict(q=torch.randn(B * q, H, 576, device=device, dtype=dtype),
                cache=torch.randn(num_pages, P, 576, device=device, dtype=dtype), table=table,
                cu=torch.arange(B + 1, dtype=torch.int32, device=device) * q,
                seqlens=torch.full((B,), L, device=device, dtype=torch.int32), q_len=q)


def _mla_prefill_run(x):
    """The whole prefill; returns (a view of) the last 16 queries of request 0, the rows checked."""
    out = flash_mla_prefill(x["q"][..., :512], x["q"][..., 512:], x["cache"], x["cu"], x["seqlens"], x["q_len"], x["table"],
                            None, 192**-0.5)
    n = x["q_len"]
    return out[n - min(16, n):n]


def _mla_prefill_reference(x):
    """float32 reference of the last 16 queries of request 0 (bottom-right causal: a request of 16
    queries over the keys they see)."""
    n = x["q_len"]
    sub = x["q"][n - min(16, n):n]
    return reference.mla_prefill(sub[..., :512], sub[..., 512:], x["cache"], torch.tensor([0, sub.shape[0]]),
                                 [int(x["seqlens"][0])], x["table"][:1], 192**-0.5, dtype=torch.float32)[0]


TUNING_SPECS["mla_prefill"] = TuningSpec(
    buckets=_mla_prefill_buckets,
    problems=_mla_prefill_problems,
    make=_mla_prefill_make,
    run=_mla_prefill_run,
    reference=_mla_prefill_reference,
    tolerance=2e-2,
    stage1=lambda f, quick: _mla_tiles(64),
    stage2=lambda f, quick: _mla_stage2(f),
)


if __name__ == "__main__":
    sys.exit(main())
