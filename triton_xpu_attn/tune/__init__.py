"""Kernel configs: loading per-device config files, the built-in fallbacks, and the tuner that
writes those files (``python -m triton_xpu_attn.tune``, entry point in ``__main__.py``).

Lookup order for an op and a shape bucket:
1. ``$TRITON_XPU_ATTN_CONFIG_DIR/<backend>/<device_key>.json`` (a user's own tuning),
2. the shipped ``autotune_configs/<backend>/<device_key>.json`` (vLLM's convention: one JSON per
   device, named from the device name, recording the Triton version it was tuned with),
3. the op's built-in heuristic.
Within a file, an op maps bucket keys (``"d=128|g=4|p=16|..."``) to configs; a ``"default"``
entry serves buckets that were not tuned.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import pathlib
import sys
from typing import Any, Callable

from .. import device as _device

CONFIG_DIR_ENV = "TRITON_XPU_ATTN_CONFIG_DIR"

#: where the shipped files live: inside the package when installed from a wheel
#: (``triton_xpu_attn.autotune_configs``), next to the package in a source checkout.
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent
_SHIPPED_DIRS = (_PACKAGE_DIR / "autotune_configs", _PACKAGE_DIR.parent / "autotune_configs")

#: op name -> where its last lookup came from ("user:…", "shipped:…", "heuristic"); the self-check prints it.
LAST_SOURCE: dict[str, str] = {}


def bucket_key(fields: dict) -> str:
    """Stable text key of a shape bucket, e.g. ``{"d": 128, "g": 4}`` -> ``"d=128|g=4"``."""
    return "|".join(f"{k}={fields[k]}" for k in sorted(fields))


def pow2_bucket(n: int, lo: int = 1, hi: int = 1 << 20) -> int:
    """Round ``n`` up to a power of two inside ``[lo, hi]``: length and batch buckets."""
    b = lo
    while b < n and b < hi:
        b *= 2
    return b


def config_file_candidates(backend: str, key: str) -> list[tuple[str, pathlib.Path]]:
    found = []
    user = os.environ.get(CONFIG_DIR_ENV)
    if user:
        found.append(("user", pathlib.Path(user) / backend / f"{key}.json"))
    for d in _SHIPPED_DIRS:
        found.append(("shipped", d / backend / f"{key}.json"))
    return found


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict | None:
    p = pathlib.Path(path)
    if not p.is_file():
        return None
    with p.open() as f:
        return json.load(f)


def clear_cache() -> None:
    """Forget loaded files and memoised lookups (after writing or changing config files)."""
    _load.cache_clear()
    _MEMO.clear()


def lookup(op: str, fields: dict, heuristic: dict, *, device=None, fallback: dict | None = None) -> dict:
    """Config for ``op`` at the bucket ``fields``: user file, shipped file, else ``heuristic``.

    Entries of a file config override the heuristic's keys (a file may tune only some knobs).
    ``fallback`` (field overrides, e.g. ``{"q": "decode"}``) names a related bucket family to use
    from a file that has no bucket of ``fields``' own text values (a file tuned before that family
    existed). Results are memoised per (op, bucket, device): this runs on every launch.
    """
    forced = _OVERRIDES.get(op)
    if forced is not None:
        LAST_SOURCE[op] = "override"
        return {**heuristic, **forced}
    index = None
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        index = device.index
    memo_key = (op, tuple(sorted(fields.items())), tuple(sorted(heuristic.items())), index,
                tuple(sorted((fallback or {}).items())))
    hit = _MEMO.get(memo_key)
    if hit is None:
        hit = _MEMO[memo_key] = _lookup(op, fields, heuristic, device, fallback)
    LAST_SOURCE[op] = hit[1]
    return dict(hit[0])


_MEMO: dict = {}
_OVERRIDES: dict[str, dict] = {}


@contextlib.contextmanager
def override(op: str, config: dict):
    """Force ``config`` for every launch of ``op`` inside the block (the tuner's candidates)."""
    previous = _OVERRIDES.get(op)
    _OVERRIDES[op] = dict(config)
    try:
        yield
    finally:
        if previous is None:
            _OVERRIDES.pop(op, None)
        else:
            _OVERRIDES[op] = previous


def parse_bucket(text: str) -> dict:
    """Inverse of :func:`bucket_key`: ``"d=128|g=4"`` -> ``{"d": 128, "g": 4}``."""
    out = {}
    for part in text.split("|"):
        k, _, v = part.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def nearest_bucket(table: dict, fields: dict) -> str | None:
    """The tuned bucket closest to ``fields``: text fields must match; numeric ones (all powers
    of two or small counts) are compared on a log scale. ``None`` if nothing is comparable."""
    best, best_distance = None, float("inf")
    for text in table:
        if text == "default":
            continue
        other = parse_bucket(text)
        if set(other) != set(fields):
            continue
        distance = 0.0
        for k, v in fields.items():
            w = other[k]
            if isinstance(v, int) and isinstance(w, int):
                distance += abs(math.log2(max(v, 1)) - math.log2(max(w, 1)))
            elif v != w:
                distance = float("inf")
                break
        if distance < best_distance:
            best, best_distance = text, distance
    return best


def _lookup(op: str, fields: dict, heuristic: dict, device, fallback: dict | None = None) -> tuple[dict, str]:
    backend = _device.backend()
    if backend != "interpreter":
        key = _device.device_key(device)
        wanted = [fields] + ([{**fields, **fallback}] if fallback else [])
        for kind, path in config_file_candidates(backend, key):
            data = _load(str(path))
            if not data:
                continue
            table = data.get("ops", {}).get(op, {})
            for want in wanted:
                bucket = bucket_key(want)
                if bucket in table:
                    return {**heuristic, **table[bucket]}, f"{kind}:{path.name}" + ("" if want is fields else f" (as {bucket})")
                near = nearest_bucket(table, want)
                if near is not None:
                    return {**heuristic, **table[near]}, f"{kind}:{path.name} (nearest: {near})"
            if "default" in table:
                return {**heuristic, **table["default"]}, f"{kind}:{path.name} (default)"
    return dict(heuristic), "heuristic"


def work_bucket(programs: int, compute_units: int) -> int:
    """How much parallel work a launch has, relative to the device: ``4 x programs / compute
    units`` rounded up to a power of two in 1..32. Split policies and tile sizes are tuned per
    work bucket (a single request and a batch of 128 want different configs)."""
    return pow2_bucket(-(-4 * programs // max(compute_units, 1)), 1, 32)


def launch_options(config: dict) -> dict:
    """Keyword options for a kernel launch from a config: ``num_warps``/``num_stages`` everywhere,
    ``grf_mode`` only on XPU (other backends reject it), respelled for the installed Triton."""
    opts = {k: config[k] for k in ("num_warps", "num_stages") if k in config}
    if _device.backend() == "xpu" and config.get("grf_mode"):
        mode = config["grf_mode"]
        if mode in ("large", "256"):
            mode = _device.xpu_large_grf_mode()
        opts["grf_mode"] = mode
    return opts


# ------------------------------------------------------------------------------------------
# The tuner: python -m triton_xpu_attn.tune [--ops ...] [--quick] [--out DIR]
# ------------------------------------------------------------------------------------------


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
    import torch
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


def select_buckets(buckets: list[dict], only: dict | None) -> list[dict]:
    """The buckets whose every field named in ``only`` ({field: value or values}) has one of the
    given values (compared as text)."""
    wanted = _only_values(only)
    return [f for f in buckets if all(str(f.get(k)) in values for k, values in wanted.items())]


def tune(ops: list[str], quick: bool, out_dir: str, only: dict | None = None) -> pathlib.Path:
    import datetime

    import torch
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
    command = f"python -m triton_xpu_attn.tune --ops {','.join(ops)}" + (" --quick" if quick else "") + "".join(
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
            kept = bool(baseline) and best_time * MIN_TUNED_GAIN > baseline
            if kept:
                # within noise of the heuristic: keep it (an empty entry). Near-ties picked on the
                # tuner's few problems did not carry over (H100, D=64: +1-3% here, 0.76-0.88x at B=64..128)
                best, best_time = {}, baseline
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

    parser = argparse.ArgumentParser(prog="python -m triton_xpu_attn.tune", description="Tune kernel configs for this device.")
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


# ---- paged attention ----


def _pa_buckets(quick: bool) -> list[dict]:
    shapes = [(128, 4), (128, 8), (64, 4)]  # (head dim, group): 32/8/128, 8/1 and 64/8, 32/8/64
    pages = [1, 16, 64] if quick else [1, 16, 64, 128]
    works = [1, 4, 16] if quick else [1, 2, 4, 8, 16, 32]
    # "draft": decode-like launches of 2..16 queries per request (speculative drafts, MTP); their
    # (token x head) tiles are larger than decode's and want other tiles (H200, q_len 4, 64/8/128,
    # B=64, L=8k, page 16: 821 us on the decode config, 613 on 128-key tiles with 3 stages)
    out = [dict(d=d, dv=d, g=g, p=p, q=q, w=w, dtype="bfloat16")
           for q in ("decode", "draft") for d, g in shapes for p in pages for w in works]
    if not quick:
        out += [dict(d=128, dv=128, g=4, p=p, q="prefill", w=w, dtype="bfloat16") for p in (16, 64) for w in (4, 32)]
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
        return [dict(B=batch, L=length, q_len=1 if fields["q"] == "decode" else 4) for length in lengths]
    if fields["q"] == "varlen":
        # full prefill, every request's queries over its own keys: L/16 query tiles x H_kv
        # programs a request. Issue 21's grid (B x L = 8-16k tokens) lands in w=32; w=4 is a short prompt
        L = 2048 if fields["w"] >= 16 else 256
        return [dict(B=max(1, programs * 16 // (_pa_kv_heads(fields) * L)), L=L, q_len=L)]
    return [dict(B=max(1, programs // (_pa_kv_heads(fields) * 8)), L=2048, q_len=512)]


def _pa_make(problem: dict, fields: dict, device):
    import torch

    B, L, S, P, D, g = problem["B"], problem["L"], problem["q_len"], fields["p"], fields["d"], fields["g"]
    hkv = _pa_kv_heads(fields)
    if fields["q"] == "varlen":
        dtype = getattr(torch, fields["dtype"])
        cu = torch.arange(0, (B + 1) * L, L, dtype=torch.int32, device=device)
        cu_q = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device=device)
        k, v = (torch.randn(B * L, hkv, D, device=device, dtype=dtype) for _ in range(2))
        return dict(q=torch.randn(B * S, g * hkv, D, device=device, dtype=dtype), k=k, v=v, cu_q=cu_q, cu_k=cu,
                    max_q=S, max_k=L)
    n = -(-L // P)
    gen = torch.Generator(device="cpu").manual_seed(0)
    table = (torch.randperm(B * n + 1, generator=gen)[: B * n] + 0).view(B, n).to(torch.int32).to(device)
    dtype = getattr(torch, fields["dtype"])
    k = torch.randn(B * n + 1, P, hkv, D, device=device, dtype=dtype)
    v = torch.randn(B * n + 1, P, hkv, D, device=device, dtype=dtype)
    q = torch.randn(B, S, g * hkv, D, device=device, dtype=dtype)
    return dict(q=q, k=k, v=v, table=table, seqlens=torch.full((B,), L, device=device, dtype=torch.int32))


def _pa_run(x):
    from ..ops.paged_attention import flash_attn_with_kvcache
    from ..ops.varlen_attention import flash_attn_varlen_func

    if "cu_k" in x:
        return flash_attn_varlen_func(x["q"], x["k"], x["v"], x["cu_q"], x["cu_k"], x["max_q"], x["max_k"], causal=True)
    return flash_attn_with_kvcache(x["q"], x["k"], x["v"], cache_seqlens=x["seqlens"], page_table=x["table"], causal=True)


def _pa_reference(x):
    import torch

    from .. import reference

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
    stage1=lambda f, quick: [
        dict(BLOCK_N=bn, num_warps=w, num_stages=st)
        for bn in (32, 64, 128)
        for w in ((2, 4, 8) if not quick else (2, 4))
        for st in ((2, 3) if not quick else (2,))
        if not (f["d"] > 128 and bn > 64)
    ],
    stage2=lambda f, quick: [
        dict(min_split_tokens=m, waves=w) for m in (128, 256, 512) for w in ((1, 2, 4) if not quick else (2, 4))
    ],
)



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
    import torch

    B, H, L, P = problem["B"], problem["H"], problem["L"], problem["P"]
    n = -(-L // P)
    gen = torch.Generator(device="cpu").manual_seed(0)
    table = torch.randperm(B * n + 1, generator=gen)[: B * n].view(B, n).to(torch.int32).to(device)
    dtype = getattr(torch, fields["dtype"])
    cache = torch.randn(B * n + 1, P, 576, device=device, dtype=dtype)
    q = torch.randn(B, H, 576, device=device, dtype=dtype)
    seqlens = torch.full((B,), L, device=device, dtype=torch.int32)
    from ..ops.mla_decode import flash_mla_get_workspace_size

    workspace = torch.empty(flash_mla_get_workspace_size(L, B, H, P, -1), dtype=torch.uint8, device=device)
    return dict(q=q, cache=cache, table=table, seqlens=seqlens, workspace=workspace)


def _mla_run(x):
    from ..ops.mla_decode import flash_mla_decode

    return flash_mla_decode(
        x["q"][..., :512], x["q"][..., 512:], x["cache"], x["seqlens"], x["table"], x["workspace"], 192**-0.5,
        num_kv_splits=-1,
    )


def _mla_reference(x):
    import torch

    from .. import reference

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
    import torch

    B, H, q, L, P = problem["B"], problem["H"], problem["q"], problem["L"], problem["P"]
    n = -(-L // P)
    gen = torch.Generator(device="cpu").manual_seed(0)
    table = torch.randperm(B * n + 1, generator=gen)[: B * n].view(B, n).to(torch.int32).to(device)
    dtype = getattr(torch, fields["dtype"])
    return dict(q=torch.randn(B * q, H, 576, device=device, dtype=dtype),
                cache=torch.randn(B * n + 1, P, 576, device=device, dtype=dtype), table=table,
                cu=torch.arange(B + 1, dtype=torch.int32, device=device) * q,
                seqlens=torch.full((B,), L, device=device, dtype=torch.int32), q_len=q)


def _mla_prefill_run(x):
    """The whole prefill; returns (a view of) the last 16 queries of request 0, the rows checked."""
    from ..ops.mla_prefill import flash_mla_prefill

    out = flash_mla_prefill(x["q"][..., :512], x["q"][..., 512:], x["cache"], x["cu"], x["seqlens"], x["q_len"], x["table"],
                            None, 192**-0.5)
    n = x["q_len"]
    return out[n - min(16, n):n]


def _mla_prefill_reference(x):
    """float32 reference of the last 16 queries of request 0 (bottom-right causal: a request of 16
    queries over the keys they see)."""
    import torch

    from .. import reference

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
