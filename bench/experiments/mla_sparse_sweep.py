"""Tile sweep of the sparse MLA kernel (``flash_mla_sparse_fwd`` prefill, ``flash_mla_with_kvcache``
sparse decode over bf16 pages and DeepSeek-V4 fp8 pages) on bench_mla_sparse.py's shapes, CUDA graphs.

    python bench/experiments/mla_sparse_sweep.py [--jobs 10] [--round 1-12] [--cases prefill128,decode128,...]

Every (case, config) pair is first compiled by ``--jobs`` child processes at once (Triton's cache
is shared; a config that cannot launch, e.g. out of shared memory, is reported and dropped), then
timed in this process one after another, each checked against the shipped config's output first.
Prints per case each config's graph time and its ratio to the shipped one (< 1 faster).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import triton_xpu_attn as tx  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402
from bench.bench_mla_sparse import D_QK, D_V, D_V4, TOPK, V4_HEADS, V4_PAGE, V4_TOPK, V4_X_PAGE, V4_X_TOPK  # noqa: E402
from bench.bench_mla_sparse import distinct_indices, v4_cache  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402

CASES = {
    "prefill128": ("prefill", dict(s_q=4096, h=128, s_kv=32768)),
    "prefill16": ("prefill", dict(s_q=4096, h=16, s_kv=32768)),
    "decode128": ("decode", dict(B=32, q_len=1, h=128)),
    "decode16": ("decode", dict(B=128, q_len=1, h=16)),
    "v4b32": ("v4", dict(B=32, q_len=1)),
    "v4b128": ("v4", dict(B=128, q_len=2)),
    "prefill64": ("prefill", dict(s_q=4096, h=64, s_kv=32768)),
    "prefill32": ("prefill", dict(s_q=4096, h=32, s_kv=32768)),
    "decode128b128": ("decode", dict(B=128, q_len=1, h=128)),
    "decode128b8": ("decode", dict(B=8, q_len=2, h=128)),
    "decode16b32": ("decode", dict(B=32, q_len=2, h=16)),
    "v4b8": ("v4", dict(B=8, q_len=2)),
    "prefill16l": ("prefill", dict(s_q=1024, h=16, s_kv=131072)),
    "decode16b128q2": ("decode", dict(B=128, q_len=2, h=16)),
    "v4b32q2": ("v4", dict(B=32, q_len=2)),
    "decode16b1": ("decode", dict(B=1, q_len=1, h=16)),
    "decode16b8": ("decode", dict(B=8, q_len=1, h=16)),
    "decode128b1": ("decode", dict(B=1, q_len=1, h=128)),
}
#: the second round's cases (``--round 2``): the first round's best tiles around the other head counts
ROUND2 = "prefill64,prefill32,decode128b128,decode128b8,decode16b32,decode128,v4b8,v4b32,v4b128"


def cfg(bh, bn, warps, stages, dv=0, splits=None, chunk=0):
    c = dict(BLOCK_H=bh, BLOCK_N=bn, SCORE_CHUNK=chunk, BLOCK_DV=dv, num_warps=warps, num_stages=stages)
    if splits is not None:
        c["SPLITS"] = splits
    return c


PLAIN = [cfg(16, 32, 8, 2), cfg(32, 32, 8, 2), cfg(16, 16, 8, 2), cfg(32, 16, 8, 2), cfg(64, 32, 8, 2),
         cfg(64, 32, 8, 1), cfg(64, 32, 8, 3), cfg(64, 64, 8, 1), cfg(64, 32, 4, 2), cfg(64, 64, 8, 2, 256),
         cfg(64, 32, 8, 2, 256), cfg(128, 32, 8, 2, 256), cfg(128, 32, 8, 1, 256), cfg(16, 32, 4, 2),
         cfg(16, 64, 4, 2), cfg(32, 64, 8, 1), cfg(64, 16, 8, 2)]
FP8 = [cfg(16, 16, 8, 2), cfg(32, 16, 8, 2), cfg(64, 16, 8, 2), cfg(16, 32, 8, 2), cfg(32, 32, 8, 2),
       cfg(64, 32, 8, 2), cfg(64, 32, 8, 1), cfg(64, 32, 8, 2, 256), cfg(64, 16, 8, 2, 256), cfg(32, 32, 4, 2),
       cfg(64, 64, 8, 1), cfg(32, 32, 8, 2, 256)]

PLAIN2 = [cfg(64, 32, 8, 3), cfg(64, 32, 8, 2), cfg(32, 32, 8, 2), cfg(32, 64, 4, 2), cfg(32, 32, 4, 2),
          cfg(32, 32, 8, 3), cfg(16, 64, 4, 2), cfg(16, 32, 8, 2), cfg(16, 32, 8, 3), cfg(64, 64, 8, 1),
          cfg(64, 32, 8, 3, splits=1), cfg(64, 32, 8, 3, splits=2), cfg(64, 32, 8, 3, splits=4),
          cfg(16, 32, 8, 2, splits=2), cfg(16, 32, 8, 2, splits=8)]
FP8_2 = [cfg(64, 64, 8, 1), cfg(64, 64, 8, 2), cfg(64, 32, 8, 1), cfg(64, 64, 4, 1), cfg(64, 128, 8, 1),
         cfg(64, 64, 8, 1, splits=1), cfg(64, 64, 8, 1, splits=2), cfg(64, 64, 8, 1, splits=4),
         cfg(64, 64, 8, 1, splits=8)]
#: the third round (``--round 3``): the rows under 2x vLLM after round 2, deeper pipelines
#: (index loads one stage ahead of their gathers) and the split count's target (``waves``)
H16_3 = [cfg(16, 32, 8, 2), cfg(16, 32, 8, 3), cfg(16, 32, 8, 4), cfg(16, 64, 4, 2), cfg(16, 64, 4, 3),
         cfg(16, 64, 4, 4), cfg(16, 32, 4, 3), cfg(16, 32, 4, 4), cfg(16, 16, 4, 4), cfg(16, 64, 8, 3)]
ROUND3 = {
    "prefill16l": H16_3,
    "decode16": H16_3 + [dict(c, waves=w) for c in (cfg(16, 32, 8, 3), cfg(16, 64, 4, 3)) for w in (1, 2, 8)],
    "decode16b128q2": H16_3 + [dict(cfg(16, 32, 8, 3), waves=w) for w in (1, 2, 8)],
    "decode16b32": H16_3 + [dict(c, waves=w) for c in (cfg(16, 32, 8, 3), cfg(16, 64, 4, 3)) for w in (1, 2, 8)],
    "decode128": [cfg(64, 32, 8, 3), cfg(64, 32, 8, 4), cfg(64, 16, 8, 4), cfg(64, 32, 8, 3, splits=2)]
    + [dict(cfg(64, 32, 8, 3), waves=w) for w in (2, 4)],
    "decode128b8": [cfg(64, 32, 8, 3), cfg(64, 32, 8, 4), cfg(64, 16, 8, 4), cfg(64, 32, 8, 3, splits=8)]
    + [dict(cfg(64, 32, 8, 3), waves=w) for w in (2, 4)],
    "v4b32q2": [cfg(64, 64, 8, 1), cfg(64, 32, 8, 1), cfg(64, 16, 8, 1), cfg(64, 64, 8, 1, splits=2),
                cfg(64, 64, 8, 1, splits=4), cfg(64, 32, 8, 1, splits=4)] + [dict(cfg(64, 64, 8, 1), waves=w) for w in (2, 4)],
    "v4b8": [cfg(64, 64, 8, 1), cfg(64, 32, 8, 1, splits=8), cfg(64, 16, 8, 1, splits=8), cfg(64, 64, 8, 1, splits=10)],
}
#: the fourth round (``--round 4``): DeepSeek-V4 pages with the rope channels as their own piece
#: (1 CTA an SM at 8 warps, 255 registers: 16 warps halve the accumulator a thread)
V4_4 = [dict(c, min_split_tokens=64, waves=1) for c in (cfg(64, 64, 8, 1), cfg(64, 64, 8, 2), cfg(64, 64, 16, 1),
                                                         cfg(64, 32, 16, 1), cfg(64, 32, 16, 2), cfg(64, 64, 16, 2))]
ROUND4 = {name: V4_4 for name in ("v4b8", "v4b32", "v4b32q2", "v4b128")}
#: the fifth round (``--round 5``): DeepSeek-V4 pages with the two lists walked in turn (fewer
#: integer instructions a tile, 88 B spilled at two stages against 664 B at one: ptxas, sm_90)
V4_5 = [dict(c, min_split_tokens=64, waves=w) for c, w in ((cfg(64, 64, 8, 1), 1), (cfg(64, 64, 8, 2), 1),
                                                          (cfg(64, 32, 8, 1), 1), (cfg(64, 32, 8, 2), 1),
                                                          (cfg(64, 64, 8, 2), 2))]
ROUND5 = {name: V4_5 for name in ("v4b8", "v4b32", "v4b32q2", "v4b128")}
#: the sixth round (``--round 6``): DeepSeek-V4 split counts at 2 stages (forced ``SPLITS``, or the
#: automatic count with a longer shortest split)
V4_6 = ([dict(cfg(64, 64, 8, 2, splits=n), min_split_tokens=64, waves=1) for n in (1, 2, 3, 4, 5, 6, 8, 10)]
        + [dict(cfg(64, 64, 8, 2), min_split_tokens=m, waves=1) for m in (128, 192)])
ROUND6 = {name: V4_6 for name in ("v4b8", "v4b32", "v4b32q2", "v4b128")}
#: the seventh round (``--round 7``): DeepSeek-V4 with one 512-wide K tile, stages and the walk length
#: from which index entries are loaded a tile ahead (``prefetch_from_tiles``; walks: v4b8 2 tiles,
#: v4b32 3, v4b32q2 5, v4b128 10)
V4_7 = ([dict(cfg(64, 64, 8, s), min_split_tokens=64, waves=1) for s in (1, 2)]
        + [dict(cfg(64, 64, 8, 1), min_split_tokens=64, waves=1, prefetch_from_tiles=t) for t in (1, 3, 4, 6)])
ROUND7 = {name: V4_7 for name in ("v4b8", "v4b32", "v4b32q2", "v4b128")}
#: the eighth round (``--round 8``): bf16 pages with index entries loaded a tile ahead
#: (``prefetch_from_tiles`` 1) beside the tiles the H200 file held at fef2dd7, at their stages and one more: the
#: pipeliner prefetches a tile's rows one iteration ahead, their addresses then no longer waiting
#: on the same iteration's index load
H16_8 = [cfg(16, 64, 4, 2), cfg(16, 64, 4, 3), cfg(16, 32, 4, 3), cfg(16, 32, 4, 4)]
H16_8 = H16_8 + [dict(c, prefetch_from_tiles=1) for c in H16_8]
H128_8 = [dict(cfg(64, 32, 8, s), waves=1) for s in (2, 3)]
H128_8 = H128_8 + [dict(c, prefetch_from_tiles=1) for c in H128_8]
ROUND8 = {"decode16": H16_8, "decode16b128q2": H16_8, "decode16b32": H16_8, "prefill16l": H16_8[:1] + H16_8[4:5],
          "decode128": H128_8, "decode128b8": H128_8,
          "prefill128": [cfg(64, 32, 8, 3), dict(cfg(64, 32, 8, 3), prefetch_from_tiles=1)]}
#: the ninth round (``--round 9``): the tiles around round 8's best with entries a tile ahead, for
#: every head count of both ops
PF = dict(prefetch_from_tiles=1)
H16_9 = [dict(c, **PF) for c in (cfg(16, 32, 4, 3), cfg(16, 32, 4, 2), cfg(16, 32, 8, 3), cfg(16, 16, 4, 4),
                                 cfg(16, 16, 4, 3), cfg(16, 32, 4, 4))]
H32_9 = [cfg(32, 64, 4, 2)] + [dict(c, **PF) for c in (cfg(32, 32, 4, 3), cfg(32, 32, 8, 3), cfg(32, 16, 4, 4),
                                                       cfg(64, 32, 8, 3), cfg(64, 16, 8, 4))]
H128_9 = [dict(c, waves=1, **PF) for c in (cfg(64, 32, 8, 3), cfg(64, 32, 8, 4), cfg(64, 16, 8, 4), cfg(64, 16, 8, 3))]
ROUND9 = {"decode16": H16_9, "decode16b128q2": H16_9, "decode16b32": H16_9, "prefill16l": H16_9, "prefill16": H16_9,
          "prefill32": H32_9, "prefill64": H32_9, "decode128": H128_9, "decode128b8": H128_9,
          "decode128b128": H128_9, "prefill128": [dict(c, **PF) for c in (cfg(64, 32, 8, 3), cfg(64, 32, 8, 4))]}
#: the tenth round (``--round 10``): bf16 pages h 16 around round 9's tile, its split count and warps
H16_10 = ([dict(cfg(16, 32, 4, 3), **PF)] + [dict(cfg(16, 32, 4, 3), waves=w, **PF) for w in (1, 4)]
          + [dict(cfg(16, 32, 4, 3, splits=n), **PF) for n in (2, 4)] + [dict(cfg(16, 32, 2, 3), **PF),
                                                                        dict(cfg(16, 64, 8, 2), **PF)])
ROUND10 = {"decode16b128q2": H16_10, "decode16": H16_10, "decode16b32": H16_10}
#: the eleventh round (``--round 11``): DeepSeek-V4 pages with entries a tile ahead from the first
#: tile at 2 and 3 stages (round 7 timed them ahead at 1 stage only)
V4_11 = [dict(cfg(64, n, 8, s), min_split_tokens=64, waves=1, **PF) for n in (64, 32) for s in (1, 2, 3)]
ROUND11 = {name: V4_11 for name in ("v4b8", "v4b32", "v4b32q2", "v4b128")}
#: the twelfth round (``--round 12``): bf16 pages at small batches, round 9's tiles by the shortest
#: split (``min_split_tokens``; 256 by default: B 1 h 16 walks 8 tiles of 32 in each of 8 splits),
#: h 16 also beside the earlier 16 x 64 x 2-stage tile
H16_12 = ([dict(cfg(16, 32, 4, 3), **PF)] + [dict(cfg(16, 32, 4, 3), min_split_tokens=m, **PF) for m in (64, 128)]
          + [cfg(16, 64, 4, 2)])
H128_12 = [dict(cfg(64, 32, 8, 3), waves=1, **PF)] + [dict(cfg(64, 32, 8, 3), waves=1, min_split_tokens=m, **PF)
                                                        for m in (64, 128)]
ROUND12 = {"decode16b1": H16_12, "decode16b8": H16_12, "decode16": H16_12, "decode128b1": H128_12,
           "decode128b8": H128_12, "decode128": H128_12}
#: the thirteenth round (``--round 13``): DeepSeek-V4 pages on chunked tiles (the score dot in
#: ``SCORE_CHUNK``-channel pieces, ``BLOCK_DV`` output channels a program, each program redoing the
#: score dot): 4 warps at 255 registers and 82-98 KB of shared memory leave room for 2 programs an SM
#: (sm_90, ptxas: 64 x 64 / 64 x 32 entries, 64-channel chunks, 60-460 B spilled at 4 warps); its
#: 64 x 32 tiles are refused on CUDA (sparse_tiles: sm_90 compiles them wrongly) and report the refusal
V4_13 = [dict(c, min_split_tokens=64, waves=w) for c, w in (
    (cfg(64, 64, 4, 1, 256, chunk=64), 2), (cfg(64, 64, 4, 1, 256, chunk=64), 1), (cfg(64, 64, 4, 1, 128, chunk=64), 2),
    (cfg(64, 32, 4, 1, 256, chunk=64), 2), (cfg(64, 32, 4, 1, 128, chunk=64), 2), (cfg(64, 32, 4, 2, 128, chunk=64), 2),
    (cfg(64, 64, 8, 1, 256, chunk=64), 1), (cfg(64, 32, 8, 1, 128, chunk=64), 1))]
ROUND13 = {name: V4_13 for name in ("v4b8", "v4b32", "v4b32q2", "v4b128")}
#: the rounds from 3 on: case -> its configs (``--round N`` runs them all by default)
CASE_ROUNDS = {3: ROUND3, 4: ROUND4, 5: ROUND5, 6: ROUND6, 7: ROUND7, 8: ROUND8, 9: ROUND9, 10: ROUND10,
               11: ROUND11, 12: ROUND12, 13: ROUND13}
ROUND = 1


def build(kind, p, dev, mod=tx):
    """``(op, fn)``: the case's op name and a call of ``mod``'s op on fixed inputs (``mod``: this
    package, or another tree's, for ab_mla_sparse.py)."""
    gen = torch.Generator(device=dev).manual_seed(0)
    dt = torch.bfloat16
    if kind == "prefill":
        q = torch.randn(p["s_q"], p["h"], D_QK, device=dev, generator=gen, dtype=dt)
        kv = torch.randn(p["s_kv"], 1, D_QK, device=dev, generator=gen, dtype=dt)
        idx = torch.cat([distinct_indices(256, TOPK, p["s_kv"], dev, gen)] * (p["s_q"] // 256))[:, None]
        return "mla_sparse", lambda: mod.flash_mla_sparse_fwd(q, kv, idx, D_QK**-0.5, D_V)[0]
    if kind == "decode":
        B, q_len, h, share, page = p["B"], p["q_len"], p["h"], 16384, 64
        cache = torch.randn(B * share // page, page, 1, D_QK, device=dev, generator=gen, dtype=dt)
        base = (torch.arange(B, device=dev) * share).repeat_interleave(q_len)
        idx = distinct_indices(B * q_len, TOPK, share, dev, gen, base).view(B, q_len, TOPK)
        q = torch.randn(B, q_len, h, D_QK, device=dev, generator=gen, dtype=dt)
        return "mla_sparse_decode", lambda: mod.flash_mla_with_kvcache(q, cache, None, None, D_V, None, None,
                                                                      D_QK**-0.5, indices=idx)[0]
    B, q_len = p["B"], p["q_len"]
    T = B * q_len
    main_pool, x_pool = max(4 * V4_PAGE, B * V4_PAGE), max(4096, B * 4096)
    cache, _ = v4_cache(main_pool // V4_PAGE, V4_PAGE, dev, gen)
    x_cache, _ = v4_cache(x_pool // V4_X_PAGE, V4_X_PAGE, dev, gen)
    idx = distinct_indices(T, V4_TOPK, main_pool, dev, gen).view(B, q_len, -1)
    x_idx = distinct_indices(T, V4_X_TOPK, x_pool, dev, gen).view(B, q_len, -1)
    q = torch.randn(B, q_len, V4_HEADS, D_V4, device=dev, generator=gen, dtype=dt)
    return "mla_sparse_decode", lambda: mod.flash_mla_with_kvcache(q, cache, None, None, D_V4, None, None,
                                                                  D_V4**-0.5, False, True, idx, None, x_cache, x_idx)[0]


def configs_for(name):
    if ROUND in CASE_ROUNDS:
        return CASE_ROUNDS[ROUND][name]
    if ROUND == 2:
        return FP8_2 if CASES[name][0] == "v4" else PLAIN2
    return FP8 if CASES[name][0] == "v4" else PLAIN


def child(pairs):
    """Compile (run once) each (case, config index) pair; print the ones that failed."""
    dev = torch.device("cuda")
    failed = {}
    for name in sorted({n for n, _ in pairs}):
        op, fn = build(*CASES[name], dev)
        for n, i in pairs:
            if n != name:
                continue
            try:
                with tune.override(op, configs_for(name)[i]):
                    fn()
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001
                failed[f"{name}:{i}"] = repr(exc)[:160]
    print(json.dumps(failed))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--cases", default=None)
    ap.add_argument("--round", type=int, default=1, help="1: the first tile list; 2: the second (ROUND2 cases); 3-13: ROUND3-ROUND13")
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    global ROUND
    ROUND = args.round
    if args.cases is None:
        default = "prefill128,prefill16,decode128,decode16,v4b32,v4b128"
        args.cases = ROUND2 if ROUND == 2 else ",".join(CASE_ROUNDS[ROUND]) if ROUND in CASE_ROUNDS else default
    if args.child:
        child(json.loads(args.child))
        return 0
    names = [n for n in args.cases.split(",") if n]
    pairs = [(n, i) for n in names for i in range(len(configs_for(n)))]
    chunks = [pairs[j::args.jobs] for j in range(args.jobs)]
    failed = {}
    with cf.ThreadPoolExecutor(args.jobs) as pool:
        procs = [pool.submit(subprocess.run, [sys.executable, __file__, "--round", str(ROUND), "--child", json.dumps(c)],
                             capture_output=True,
                             text=True) for c in chunks if c]
        for f in procs:
            res = f.result()
            try:
                failed.update(json.loads(res.stdout.strip().splitlines()[-1]))
            except Exception:  # noqa: BLE001
                print("child failed:", res.stderr[-600:])
    print(common.header())
    dev = torch.device("cuda")
    for name in names:
        op, fn = build(*CASES[name], dev)
        ref = fn().float()
        base = common.graph_ms(fn, warmup=10, rep=50) * 1e3
        print(f"== {name} {CASES[name][1]}: shipped {base:.1f} us")
        results = []
        for i, c in enumerate(configs_for(name)):
            if f"{name}:{i}" in failed:
                print(f"   {c}: failed {failed[f'{name}:{i}']}")
                continue
            try:
                with tune.override(op, c):
                    err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
                    t = common.graph_ms(fn, warmup=10, rep=50) * 1e3 if err < 2e-2 else float("nan")
            except Exception as exc:  # noqa: BLE001  (out of shared memory and the like)
                print(f"   {c}: failed {exc!r:.120}")
                continue
            results.append((t, c))
            print(f"   {c}: {t:.1f} us {t / base:.3f}x err {err:.1e}")
        best = min((r for r in results if r[0] == r[0]), key=lambda r: r[0], default=None)
        if best:
            print(f"   best {best[1]} {best[0]:.1f} us {best[0] / base:.3f}x")
        del fn
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
