"""Prefill experiments of session 11 (issue 21), each config forced with ``tune.override`` beside the
shipped heuristic, in one process (GPU only; medians of CUDA-graph replays):

* ``pages``: pages shorter than a key tile (P = 16, 32) through one tensor descriptor per page
  (``_descriptor_pages_tile``: a score dot per page, one softmax update per tile) against the
  shipped row gathers;
* ``layout``: the same keys as 64-token pages in a random or in the identity order, and as
  contiguous K/V (``flash_attn_varlen_func``), descriptors on and off: is the contiguous path's
  lack of a descriptor gain the memory order or the code?
* ``d64``: D = 64 prefill tiles;
* ``ab``: the shipped heuristic of an old copy of ``ops/paged_attention.py`` (``--old``) against
  today's on the prefill rows (paged P = 16, 32, 64, 256 and contiguous K/V), timed alternately;
* ``varlen``: contiguous-K/V tiles with descriptors;
* ``control``: A/A on the descriptor rows (the timing's order effect);
* ``p1``: token-granular tables (P = 1), tiles and warps;
* ``gathers``: A/B on the row-gather rows and two decode rows; ``heads``: one query head a tile
  (a launcher knob of that run only); ``mla_prefill``: MLA prefill tiles.

    python bench/experiments/prefill_pages.py [pages,layout,d64,ab,varlen,control,p1] [--old PATH]
"""
from __future__ import annotations

import argparse
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import triton_xpu_attn as ours  # noqa: E402
import torch  # noqa: E402

from bench.common import bench_ms, capture_graph, causal_flops, graph_ms, rel_err  # noqa: E402
from prefill_tiles import make_case, ours_call  # noqa: E402
from triton_xpu_attn import reference, tune  # noqa: E402


def timed(fn, base):
    err = rel_err(fn(), base)
    return graph_ms(fn, warmup=10, rep=40) * 1e3, err


def sweep(name, c, flops, configs, fi_time=None, check=None):
    """One line: the shipped heuristic, then each forced config (TF/s, !: rel. err. > 2e-2)."""
    f = ours_call(c) if not callable(c) else c
    base = f() if check is None else check
    t0, e0 = timed(f, base)
    cells = [f"shipped {flops / t0 / 1e6:.0f}" + (f" (err {e0:.1e})" if check is not None else "")]
    for label, cfg in configs:
        try:
            with tune.override("paged_attention", cfg):
                t, err = timed(f, base)
            cells.append(f"{label} {flops / t / 1e6:.0f}{'!' if err > 2e-2 else ''}")
        except Exception as exc:  # noqa: BLE001  (does not fit / compile)
            cells.append(f"{label} {type(exc).__name__}: {str(exc)[:60]}")
    if fi_time:
        cells.append(f"flashinfer {flops / fi_time / 1e6:.0f}")
    print(f"{name}: " + " | ".join(cells) + " TF/s", flush=True)


def cfg(bm, bn, w, st, desc):
    return f"{bm}x{bn}/{w}w/{st}s/{'desc' if desc else 'ptr'}", dict(
        BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st, kv_desc=desc)


def check_against_reference(c, q_len):
    """fp32 reference of request 0's last 64 queries (the kernel's rows checked)."""
    B = c["table"].shape[0]
    out = ours_call(c)()
    sub = slice(q_len - 64, q_len)
    ref, _ = reference.paged_attention(
        c["q"][sub].unsqueeze(0), c["k"], c["v"], c["seqlens"][:1], c["table"][:1], causal=True, dtype=torch.float32)
    return rel_err(out[sub], ref.view_as(out[sub]).to(out.dtype)), B


def pages(fi):
    configs = [cfg(128, 64, 8, 2, False), cfg(128, 64, 8, 2, True), cfg(128, 64, 8, 3, True), cfg(64, 64, 4, 2, True),
               cfg(64, 64, 4, 3, True), cfg(128, 64, 4, 3, True), cfg(128, 32, 8, 2, True), cfg(128, 32, 8, 3, True),
               cfg(64, 32, 4, 3, True)]
    for B, q_len, L, P in [(1, 8192, 8192, 16), (4, 4096, 4096, 16), (8, 512, 4096, 16), (1, 8192, 8192, 32)]:
        torch.manual_seed(0)
        c = make_case(B, 32, 8, 128, q_len, L, P)
        for label, config in (configs[1], configs[6]):  # correctness of the new path first
            with tune.override("paged_attention", config):
                err, _ = check_against_reference(c, q_len)
            print(f"  check {label} P={P}: rel. err. vs fp32 reference {err:.1e}", flush=True)
        sweep(f"B={B} 32/8/128 q={q_len} L={L} P={P}", c, causal_flops(B, 32, 128, q_len, L), configs)
        del c


def layout(fi):
    for B, L in [(1, 8192), (4, 4096)]:
        torch.manual_seed(0)
        c = make_case(B, 32, 8, 128, L, L, 64)
        flops = causal_flops(B, 32, 128, L, L)
        configs = [cfg(64, 64, 4, 2, False), cfg(64, 64, 4, 2, True), cfg(64, 64, 4, 3, True), cfg(128, 64, 8, 3, True)]
        sweep(f"B={B} L={L} paged64 random pages", c, flops, configs)
        n = L // 64
        identity = dict(c, table=torch.arange(B * n, device="cuda", dtype=torch.int32).view(B, n))
        sweep(f"B={B} L={L} paged64 identity pages", identity, flops, configs)
        # the same keys contiguous: request b's rows b*L .. b*L + L - 1 of [B*L, H_kv, D]
        k = c["k"][: B * n].reshape(B * L, 8, 128)
        v = c["v"][: B * n].reshape(B * L, 8, 128)
        cu = torch.arange(0, (B + 1) * L, L, device="cuda", dtype=torch.int32)
        run = lambda: ours.flash_attn_varlen_func(c["q"], k, v, cu, cu, L, L, causal=True)  # noqa: E731
        sweep(f"B={B} L={L} varlen contiguous", run, flops, configs, check=ours_call(identity)())
        del c, identity, k, v


def d64(fi):
    configs = [cfg(64, 64, 4, 2, False), cfg(64, 64, 4, 3, False), cfg(128, 64, 8, 2, False), cfg(128, 64, 8, 3, False),
               cfg(128, 64, 4, 3, False), cfg(128, 64, 8, 3, True)]
    for B, L, P in [(4, 4096, 64), (4, 4096, 16)]:
        torch.manual_seed(0)
        c = make_case(B, 32, 8, 64, L, L, P)
        sweep(f"B={B} 32/8/64 L={L} P={P}", c, causal_flops(B, 32, 64, L, L), configs)
        del c


def ab(old_path, rows=None, new_module=None):
    """Old vs new shipped heuristics, same inputs, CUDA-graph replays timed in a pair each way round;
    new/old > 1 means faster now (TF/s columns: the faster time of each). ``new_module``: another
    module in place of today's package (an A/A control: the old copy loaded twice)."""
    from sweeps import load_old_op
    old = load_old_op(old_path)
    new = new_module or ours
    ratios = []
    for B, q_len, L, P, D in rows or [(1, 8192, 8192, 64, 128), (4, 4096, 4096, 64, 128), (16, 1024, 1024, 64, 128),
                              (4, 2048, 8192, 64, 128), (1, 8192, 8192, 256, 128), (1, 8192, 8192, 32, 128),
                              (4, 4096, 4096, 32, 128), (1, 8192, 8192, 16, 128), (8, 512, 4096, 16, 128),
                              (4, 4096, 4096, 64, 64), (4, 4096, 4096, 16, 64), (4, 4096, 4096, 64, 256),
                              (1, 8192, 8192, 0, 128), (4, 4096, 4096, 0, 128), (16, 1024, 1024, 0, 128),
                              (4, 4096, 4096, 0, 64)]:
        torch.manual_seed(0)
        c = make_case(B, 32, 8, D, q_len, L, P or 64)
        flops = causal_flops(B, 32, D, q_len, L)
        if P == 0:  # the same keys contiguous (full prefill rows: request b's keys at b*L)
            k = c["k"][c["table"].flatten().long()].reshape(B * L, 8, D)
            v = c["v"][c["table"].flatten().long()].reshape(B * L, 8, D)
            cu = torch.arange(0, (B + 1) * L, L, device="cuda", dtype=torch.int32)
            runs = {"old": lambda: _old_varlen(old)(c["q"], k, v, cu, cu, L, L, causal=True),
                    "new": lambda: new.flash_attn_varlen_func(c["q"], k, v, cu, cu, L, L, causal=True)}
        else:
            runs = {"old": lambda: old.flash_attn_with_kvcache(
                        c["q"], c["k"], c["v"], cache_seqlens=c["seqlens"], page_table=c["table"], cu_seqlens_q=c["cu_q"],
                        max_seqlen_q=q_len, softmax_scale=c["scale"], causal=True),
                    "new": lambda: new.flash_attn_with_kvcache(
                        c["q"], c["k"], c["v"], cache_seqlens=c["seqlens"], page_table=c["table"], cu_seqlens_q=c["cu_q"],
                        max_seqlen_q=q_len, softmax_scale=c["scale"], causal=True)}
        err = rel_err(runs["new"](), runs["old"]())
        replays = {name: capture_graph(run) or run for name, run in runs.items()}
        # timed in both orders (old, new then new, old): the graph timed first in a pair ran up to
        # 5% faster in an A/A control (experiments/prefill_pages.txt), so each pair's ratio is kept
        # and the two are averaged (geometric mean)
        pair_ratios, times = [], {"old": [], "new": []}
        for order in (("old", "new"), ("new", "old")):
            t = {name: bench_ms(replays[name], warmup=5, rep=30) * 1e3 for name in order}
            pair_ratios.append(t["old"] / t["new"])
            for name in t:
                times[name].append(t[name])
        t_old, t_new = min(times["old"]), min(times["new"])
        ratios.append(math.sqrt(pair_ratios[0] * pair_ratios[1]))
        kind = f"P={P}" if P else "varlen"
        print(f"B={B} q={q_len} L={L} D={D} {kind}: old {flops / t_old / 1e6:.0f} new {flops / t_new / 1e6:.0f} TF/s "
              f"new/old speed {ratios[-1]:.3f} (pairs {pair_ratios[0]:.3f}, {pair_ratios[1]:.3f}) rel.err {err:.1e}", flush=True)
        del c, runs, replays
    print(f"speed new/old: min {min(ratios):.3f} geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


def _old_varlen(old_pa):
    """flash_attn_varlen_func of today's module with the old kernel launcher (_launch) swapped in."""
    from triton_xpu_attn.ops import varlen_attention as va_new

    def call(*args, **kwargs):
        saved = va_new._launch
        va_new._launch = old_pa._launch
        try:
            return va_new.flash_attn_varlen_func(*args, **kwargs)
        finally:
            va_new._launch = saved
    return call


def control(old_path):
    """A/A control on the descriptor rows: the old copy against a second load of itself (session 11,
    run 4, before pairs were timed both ways round: 0.95x for the one timed second)."""
    import importlib.util
    rows = [(1, 8192, 8192, 64, 128), (1, 8192, 8192, 256, 128), (4, 4096, 4096, 64, 128)]
    spec = importlib.util.spec_from_file_location("triton_xpu_attn.ops._paged_attention_aa", old_path)
    twin = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = twin
    spec.loader.exec_module(twin)
    print("# A/A: old copy vs old copy", flush=True)
    ab(old_path, rows, new_module=twin)


def gathers(old_path):
    """A/B on the row-gather rows (P = 1, 16; P = 32's boundary tiles) and two decode rows (the pointer path serves decode)."""
    ab(old_path, [(4, 4096, 4096, 1, 128), (4, 2048, 8192, 1, 128), (1, 8192, 8192, 16, 128), (8, 512, 4096, 16, 128),
                  (4, 4096, 4096, 16, 128), (16, 1024, 1024, 16, 128), (4, 2048, 8192, 16, 128), (4, 4096, 4096, 32, 128),
                  (4, 4096, 4096, 16, 64), (16, 1024, 1024, 64, 128), (64, 1, 4096, 16, 128), (16, 4, 8192, 64, 128)])


def heads(_):
    """Prefill tiles of one query head (``pack_gqa`` off: BLOCK_M tokens of a head, KV tiles read by
    each head's program) against the shipped GQA-packed tiles ((token, head) rows). Needs the
    launcher knob of ``results/NVIDIA_H100_80GB_HBM3/experiments/pack_gqa.patch`` (not shipped:
    level, session 11); without it every config runs packed."""
    configs = []
    for bm, w, st in [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2), (128, 8, 3)]:
        for desc in (False, True):
            label, config = cfg(bm, 64, w, st, desc)
            configs.append((label + "/1head", dict(config, pack_gqa=False)))
    for B, q_len, L, P in [(1, 8192, 8192, 64), (4, 2048, 8192, 64), (1, 8192, 8192, 16), (4, 4096, 4096, 1)]:
        torch.manual_seed(0)
        c = make_case(B, 32, 8, 128, q_len, L, P)
        sweep(f"B={B} 32/8/128 q={q_len} L={L} P={P}", c, causal_flops(B, 32, 128, q_len, L), configs)
        del c
    B, L = 4, 4096
    q = torch.randn(B * L, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B * L, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu = torch.arange(0, (B + 1) * L, L, device="cuda", dtype=torch.int32)
    sweep(f"varlen B={B} L={L} 32/8/128", lambda: ours.flash_attn_varlen_func(q, k, v, cu, cu, L, L, causal=True),
          causal_flops(B, 32, 128, L, L), configs)


def mla_prefill(_):
    """MLA prefill (causal, R 512 + Dr 64) tiles: rows x keys, warps, stages, descriptors; the
    shipped tile is 64 x 64, 8 warps, 2 stages, descriptors at pages >= 16 (session 10)."""
    import math as _math
    from bench import bench_mla_prefill as bm
    configs = []
    for bh, bn, w, st in [(64, 64, 8, 2), (64, 32, 8, 2), (64, 32, 8, 3), (64, 32, 4, 2), (64, 32, 4, 3),
                          (64, 64, 4, 2), (32, 64, 4, 2), (32, 32, 4, 3), (64, 16, 8, 3), (64, 16, 4, 4)]:
        for desc in (True, False):
            configs.append((f"{bh}x{bn}/{w}w/{st}s/{'desc' if desc else 'ptr'}",
                            dict(BLOCK_H=bh, BLOCK_N=bn, BLOCK_DV=0, num_warps=w, num_stages=st, kv_desc=desc)))
    for B, H, q_len, L, page in [(1, 128, 4096, 4096, 64), (1, 16, 4096, 4096, 64), (4, 128, 1024, 4096, 1)]:
        torch.manual_seed(0)
        q, cache, cu, seq_lens, table = bm.make_case(B, H, q_len, L, page, "cuda", torch.bfloat16)
        ws = torch.empty(16, dtype=torch.uint8, device="cuda")
        flops = 2 * H * bm.visible_keys(B, q_len, L) * (2 * bm.R + bm.DR)
        run = lambda: ours.flash_mla_prefill(q[..., :bm.R], q[..., bm.R:], cache, cu, seq_lens, q_len, table, ws,  # noqa: E731
                                             1 / _math.sqrt(192), causal=True)
        base = run()
        t0 = graph_ms(run, warmup=5, rep=20) * 1e3
        cells = [f"shipped {flops / t0 / 1e6:.0f}"]
        for label, config in configs:
            try:
                with tune.override("mla_prefill", config):
                    err = rel_err(run(), base)
                    t = graph_ms(run, warmup=5, rep=20) * 1e3
                cells.append(f"{label} {flops / t / 1e6:.0f}{'!' if err > 2e-2 else ''}")
            except Exception as exc:  # noqa: BLE001
                cells.append(f"{label} {type(exc).__name__}")
        print(f"MLA prefill B={B} H={H} q={q_len} L={L} P={page}: " + " | ".join(cells) + " TF/s", flush=True)


def d64_rows(old_path):
    """A/B of the D = 64 prefill heuristic (128-row tiles, 8 warps, 3 stages) on rows beyond the one
    it was measured on: pages of 128/256, short prompts, chunks, contiguous K/V."""
    ab(old_path, [(4, 4096, 4096, 256, 64), (4, 4096, 4096, 128, 64), (1, 8192, 8192, 256, 64), (16, 1024, 1024, 64, 64),
                  (4, 2048, 8192, 64, 64), (16, 1024, 1024, 0, 64), (1, 8192, 8192, 0, 64), (8, 256, 256, 64, 64)])


def d64_rows2(old_path):
    """The D = 64 heuristic narrowed to one-tile pages and contiguous K/V from 1k queries, and
    128-row gather tiles at P = 1 for D = 64 and short prompts."""
    ab(old_path, [(4, 4096, 4096, 64, 64), (4, 2048, 8192, 64, 64), (8, 256, 256, 64, 64), (4, 4096, 4096, 256, 64),
                  (4, 4096, 4096, 1, 64), (8, 256, 256, 1, 128), (8, 256, 256, 1, 64), (1, 8192, 8192, 0, 64)])


def p1(_):
    """Token-granular tables (P = 1): tiles and warps."""
    configs = [cfg(64, 64, 4, 2, False), cfg(64, 64, 4, 3, False), cfg(128, 64, 8, 2, False), cfg(128, 64, 8, 3, False),
               cfg(128, 64, 4, 2, False), cfg(128, 32, 8, 2, False), cfg(64, 32, 4, 2, False)]
    for B, q_len, L in [(4, 4096, 4096), (4, 2048, 8192)]:
        torch.manual_seed(0)
        c = make_case(B, 32, 8, 128, q_len, L, 1)
        sweep(f"P=1 B={B} 32/8/128 q={q_len} L={L}", c, causal_flops(B, 32, 128, q_len, L), configs)
        del c


def varlen(_):
    configs = [cfg(64, 64, 4, 2, False), cfg(64, 64, 4, 2, True), cfg(64, 64, 4, 3, True), cfg(128, 64, 4, 2, True),
               cfg(128, 64, 8, 2, True), cfg(128, 64, 8, 3, True), cfg(128, 128, 8, 3, True), cfg(64, 128, 4, 2, True)]
    for B, L in [(1, 8192), (4, 4096), (16, 1024)]:
        torch.manual_seed(0)
        q = torch.randn(B * L, 32, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B * L, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cu = torch.arange(0, (B + 1) * L, L, device="cuda", dtype=torch.int32)
        run = lambda: ours.flash_attn_varlen_func(q, k, v, cu, cu, L, L, causal=True)  # noqa: E731
        sweep(f"varlen B={B} L={L} 32/8/128", run, causal_flops(B, 32, 128, L, L), configs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="pages,layout,d64")
    ap.add_argument("--flashinfer", default=None)
    ap.add_argument("--old", default=None, help="old copy of ops/paged_attention.py (ab)")
    args = ap.parse_args()
    import triton
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}", flush=True)
    for what in args.what.split(","):
        print(f"## {what}", flush=True)
        {"pages": pages, "layout": layout, "d64": d64, "ab": ab, "varlen": varlen, "control": control,
         "p1": p1, "gathers": gathers, "heads": heads,
         "mla_prefill": mla_prefill, "d64_rows": d64_rows,
         "d64_rows2": d64_rows2}[what](args.old)


if __name__ == "__main__":
    main()
