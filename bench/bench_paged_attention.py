"""Paged-attention decode benchmark: ours vs sglang's Triton decode kernel, dense SDPA and
FlexAttention over a paged cache, side by side in one run on one GPU (bf16).

Every peer is timed twice: eager (``*_eager_us``) and replayed from a CUDA graph (``*_us``, the
headline: decode runs from graphs in sglang and vLLM, and it removes Python launch overhead that
would otherwise dominate small batches for every peer alike).

    python bench/bench_paged_attention.py [--quick] [--out bench/results] [--peers .peers] [--flex] [--vs-heuristic]

``--peers DIR`` points at a folder holding ``sgl_loader.py`` (from the peers harness, outside the
repository: bench/README.md, "Peers") and the unpacked sglang wheel under ``DIR/unpacked``. GB/s count the KV bytes read
(K and V once); the roofline is a measured device-to-device copy (bytes read + written).
``--vs-heuristic`` also times ours with the built-in heuristic config forced: ``tuned_gain`` =
heuristic time / time with this device's config file (``ours_config`` names the config source).
Results: ``<out>/<device_key>/paged_attention.csv`` / ``.md`` / ``.json`` (quick runs in ``quick/``).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton_xpu_attn as ours  # noqa: E402  (first: on a CPU it must select the interpreter before triton loads)
from triton_xpu_attn import tune  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402
from bench.common import bench_both, copy_bandwidth, load_sglang, rel_err  # noqa: E402,F401

GRID_SHAPES = [(32, 8, 128), (8, 1, 128), (64, 8, 128), (32, 8, 64)]  # (Hq, Hkv, D)
GRID_B = [1, 16, 64, 128]
GRID_L = [1024, 8192, 32768]
GRID_P = [1, 16, 64]


def make_case(B, Hq, Hkv, D, L, P, device, dtype=torch.bfloat16):
    n = L // P
    num_pages = B * n + 8
    pages = torch.randperm(num_pages, device=device)[: B * n].view(B, n)
    k = torch.randn(num_pages, P, Hkv, D, device=device, dtype=dtype)
    v = torch.randn(num_pages, P, Hkv, D, device=device, dtype=dtype)
    q = torch.randn(B, Hq, D, device=device, dtype=dtype)
    return dict(q=q, k=k, v=v, table=pages.to(torch.int32), seqlens=torch.full((B,), L, device=device, dtype=torch.int32))


def dense_kv(case, B, L, P):
    """The same KV bytes, contiguous per request ([B, Hkv, L, D]) for SDPA."""
    slots = (case["table"].long()[:, :, None] * P + torch.arange(P, device=case["q"].device)).reshape(B, L)
    Hkv, D = case["k"].shape[2:]
    K = case["k"].view(-1, Hkv, D)[slots].transpose(1, 2).contiguous()
    V = case["v"].view(-1, Hkv, D)[slots].transpose(1, 2).contiguous()
    return K, V, slots


def run_ours(case, scale, q_len=1, attn=None, **options):
    """Our decode call on ``case`` (``q_len`` copies of its query per request); ``options`` go to
    ``flash_attn_with_kvcache`` as they are (e.g. ``num_splits``). ``attn``: the function called
    (default ours; ``sweeps.py ab_paged`` passes an old copy)."""
    B, Hq, D = case["q"].shape
    q = case["q"][:, None].expand(B, q_len, Hq, D).contiguous() if q_len > 1 else case["q"][:, None]
    attn = attn or ours.flash_attn_with_kvcache
    return lambda: attn(
        q, case["k"], case["v"], cache_seqlens=case["seqlens"], page_table=case["table"], softmax_scale=scale,
        causal=True, **options
    )


def run_sglang(sgl, case, slots, scale, splits=8):
    B, Hq, D = case["q"].shape
    Hkv = case["k"].shape[2]
    k3, v3 = case["k"].view(-1, Hkv, D), case["v"].view(-1, Hkv, D)
    o = torch.empty_like(case["q"])
    logits = torch.empty(B, Hq, splits, D, device=o.device, dtype=torch.float32)
    lse = torch.empty(B, Hq, splits, device=o.device, dtype=torch.float32)
    nsplit = torch.full((B,), splits, device=o.device, dtype=torch.int32)
    L = slots.shape[1]
    indptr = torch.arange(0, (B + 1) * L, L, device=o.device, dtype=torch.int32)
    indices = slots.reshape(-1).to(torch.int32)
    P = case["k"].shape[1]
    return o, lambda: sgl.decode_attention_fwd(
        case["q"], k3, v3, o, indptr, indices, logits, lse, nsplit, splits, scale, 1.0, 1.0, page_size=P
    )


def run_flex(case, B, L, P):
    """torch's experimental paged FlexAttention (page size P, one request reserved at a time)."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if getattr(run_flex, "compiled", None) is None:
        import torch._dynamo as dynamo  # a plain `import torch._dynamo` would make `torch` local here

        # every shape compiles anew: past dynamo's recompile limit (8 by default) flex_attention would
        # silently run unfused, materialising the whole score matrix (what the 2026-11-21 H200 run hit
        # from its ninth shape on); raise the limit, and make hitting it an error where torch allows
        cfg = dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 1024))
        if hasattr(cfg, "fail_on_recompile_limit_hit"):
            cfg.fail_on_recompile_limit_hit = True
        run_flex.compiled = torch.compile(flex_attention, dynamic=False)
    flex = run_flex.compiled
    q = case["q"]
    Hq, D = q.shape[1:]
    Hkv = case["k"].shape[2]
    device = q.device
    n_pages = B * (L // P) + 4
    pa = PagedAttention(n_pages, P, B, device=device)
    for b in range(B):
        pa.reserve(torch.tensor(b, device=device), torch.tensor(L, device=device))
    kc = torch.zeros(1, Hkv, n_pages * P, D, device=device, dtype=q.dtype)
    vc = torch.zeros_like(kc)
    K, V, _ = dense_kv(case, B, L, P)
    pa.assign(torch.arange(B, device=device, dtype=torch.int32), torch.arange(L, device=device)[None].expand(B, L), K, V, kc, vc)
    del K, V
    bm = create_block_mask(lambda b, h, qi, kv: kv < L, B, None, 1, L, device=device, BLOCK_SIZE=(128, P))
    pbm, smod = pa.convert_logical_block_mask(bm), pa.get_score_mod(None)
    q4 = q[:, :, None]
    return lambda: flex(q4, kc, vc, block_mask=pbm, score_mod=smod, enable_gqa=True)[:, :, 0]


def flex_summary(rows) -> list[str]:
    """One line: FlexAttention time over ours where FlexAttention ran (``--flex``)."""
    ratios = [timed(r, "flex") / timed(r, "ours") for r in rows if r.get("flex_us") is not None and "ours_us" in r]
    ratios = [x for x in ratios if common.finite(x)]
    if not ratios:
        return []
    return [f"FlexAttention/ours (time): geometric mean {common.geomean(ratios):.2f}x, min {min(ratios):.2f}x "
            f"over {len(ratios)} cases"]


def timed(row, peer):
    """The time a peer's rates use: graph replay where there is one, else eager."""
    t = row.get(f"{peer}_us", float("nan"))
    return t if common.finite(t) else row.get(f"{peer}_eager_us", float("nan"))


def run_case(args, sgl, bw, device, Hq, Hkv, D, B, L, P) -> dict:
    """Time ours and the peers on one grid point; returns the CSV row."""
    case = make_case(B, Hq, Hkv, D, L, P, device)
    scale = D**-0.5
    K, V, slots = dense_kv(case, B, L, P)
    qd = case["q"][:, :, None]
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qd, K, V, enable_gqa=True)  # noqa: E731
    ref = sdpa()[:, :, 0]
    byts = 2 * B * L * Hkv * D * 2
    row = dict(Hq=Hq, Hkv=Hkv, D=D, B=B, L=L, P=P, kv_bytes=byts)
    f = run_ours(case, scale)
    row["ours_err"] = rel_err(f().view(B, Hq, D), ref)
    row["ours_eager_us"], row["ours_us"] = bench_both(f)
    row["ours_config"] = tune.LAST_SOURCE.get("paged_attention", "-")
    if args.vs_heuristic:
        with tune.override("paged_attention", {}):  # empty override = the built-in heuristic
            heur = bench_both(f)
        row["heuristic_us"] = heur[1] if common.finite(heur[1]) else heur[0]
        row["tuned_gain"] = row["heuristic_us"] / timed(row, "ours")
    row["ours_q4_eager_us"], row["ours_q4_us"] = bench_both(run_ours(case, scale, q_len=4))
    row["sdpa_dense_eager_us"], row["sdpa_dense_us"] = bench_both(sdpa)
    # sglang's kernel computes slot offsets in int32: a pool of 2^31 elements or more makes it
    # read out of bounds (an illegal address that ends the process), so it sits those cases out
    sgl_fits = case["k"].numel() < 2**31
    if sgl is not None and not sgl_fits:
        row["sglang_note"] = "skipped: int32 slot offsets overflow"
    if sgl is not None and sgl_fits:
        o, g = run_sglang(sgl, case, slots, scale)
        g()
        row["sglang_err"] = rel_err(o, ref)
        row["sglang_eager_us"], row["sglang_us"] = bench_both(g)
    del K, V
    # the ceiling at this size: a device copy moving the same bytes (kv_bytes / 2 read + written),
    # timed the same way (graph replay after an L2 flush): small caches never reach the 1 GiB roofline
    src = torch.empty(byts // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    row["copy_same_bytes_us"] = bench_both(lambda: dst.copy_(src))[1]
    row["ours_pct_of_copy_same_bytes"] = 100 * row["copy_same_bytes_us"] / timed(row, "ours")
    del src, dst
    if args.flex and P == 64 and L == 8192:
        try:
            h = run_flex(case, B, L, P)
            row["flex_err"] = rel_err(h(), ref)
            row["flex_eager_us"], row["flex_us"] = bench_both(h)
        except Exception as exc:  # keep the run going; report the failure
            print(f"flex failed: {exc!r}"[:200])
    for peer in ("ours", "sglang", "sdpa_dense", "flex"):
        if f"{peer}_us" in row:
            gbs = byts / timed(row, peer) / 1e3
            row[f"{peer}_GBs"] = gbs
            row[f"{peer}_pct"] = 100 * gbs / bw
    if "sglang_us" in row:
        row["speedup_vs_sglang"] = timed(row, "sglang") / timed(row, "ours")
    row["q4_over_decode"] = timed(row, "ours_q4") / timed(row, "ours")
    row.update(time_us=timed(row, "ours"), bytes=byts, flops=4 * B * Hq * L * D)
    print(
        f"Hq={Hq} Hkv={Hkv} D={D} B={B} L={L} P={P}: ours {row['time_us']:.1f}us "
        f"{row['ours_pct']:.0f}% err {row['ours_err']:.1e} | q4 x{row['q4_over_decode']:.2f} | "
        + (f"sglang {row['sglang_pct']:.0f}% x{row['speedup_vs_sglang']:.2f} | " if "sglang_pct" in row else "")
        + f"sdpa {row['sdpa_dense_pct']:.0f}%"
        + (f" | flex {row['flex_pct']:.0f}%" if "flex_pct" in row else "")
        + (f" | config x{row['tuned_gain']:.2f} vs heuristic" if "tuned_gain" in row else ""),
        flush=True,
    )
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few cases only")
    ap.add_argument("--out", default=str(common.RESULTS_DIR), help="results folder (a <device_key>/ folder is made in it)")
    ap.add_argument("--peers", default=None, help="folder with sgl_loader.py and unpacked/ (sglang wheel)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default: the full grid's)")
    ap.add_argument("--lengths", default=None, help="comma-separated KV lengths (default: the full grid's)")
    ap.add_argument("--pages", default=None, help="comma-separated page sizes (default: the full grid's)")
    ap.add_argument("--flex", action="store_true", help="also time FlexAttention (compiles per shape: slow)")
    ap.add_argument("--max-gb", type=float, default=40.0, help="skip cases whose KV cache exceeds this")
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="stop starting new cases after S seconds (results so far are written)")
    ap.add_argument("--vs-heuristic", action="store_true",
                    help="also time ours with the built-in heuristic config (tuned_gain = heuristic / tuned time)")
    args = ap.parse_args(argv)
    device = ours.device.default_device()
    if device.type == "cpu":
        # interpreter smoke run: one tiny case, no peers, a wall-clock time
        B, Hq, Hkv, D, L, P = 1, 4, 1, 64, 64, 16
        case = make_case(B, Hq, Hkv, D, L, P, device, dtype=torch.float16)
        f = run_ours(case, 0.125)
        out = f()
        K, V, _ = dense_kv(case, B, L, P)
        ref = torch.nn.functional.scaled_dot_product_attention(
            case["q"][:, :, None].float(), K.float(), V.float(), enable_gqa=True, scale=0.125)[:, :, 0]
        us = common.bench_ms(f, repeats=1) * 1e3
        byts = 2 * B * L * Hkv * D * 2
        row = dict(Hq=Hq, Hkv=Hkv, D=D, B=B, L=L, P=P, kv_bytes=byts, ours_err=rel_err(out.view(B, Hq, D), ref),
                   ours_eager_us=us, ours_us=float("nan"), time_us=us, bytes=byts, flops=4 * B * Hq * L * D)
        print(f"interpreter smoke run ok: out {tuple(out.shape)}, err {row['ours_err']:.1e}")
        common.write_results("paged_attention", [row], out=args.out, quick=True, title="paged attention decode (interpreter smoke run)",
                             notes="Triton interpreter on the CPU: a smoke test, the time means nothing.")
        return 0
    torch.manual_seed(0)
    common.set_time_budget(args.time_budget)
    sgl = load_sglang(args.peers)
    bw = copy_bandwidth()
    print(common.header(), flush=True)
    shapes, Bs, Ls, Ps = GRID_SHAPES, GRID_B, GRID_L, GRID_P
    if args.batches:
        Bs = [int(x) for x in args.batches.split(",")]
    if args.lengths:
        Ls = [int(x) for x in args.lengths.split(",")]
    if args.pages:
        Ps = [int(x) for x in args.pages.split(",")]
    if args.quick:
        shapes, Bs, Ls, Ps = shapes[:1], [1, 16], [8192], [16]
    rows, summary = [], []
    cases = [(Hq, Hkv, D, B, L, P) for Hq, Hkv, D in shapes for B in Bs for L in Ls for P in Ps
             if 2 * (2 * B * L * Hkv * D * 2 / 1e9) <= args.max_gb]  # the paged cache and its dense copy
    for index, (Hq, Hkv, D, B, L, P) in enumerate(cases):
        if common.out_of_time():
            summary.append(f"stopped after {index} of {len(cases)} cases: time budget (--time-budget) spent")
            print(summary[-1], flush=True)
            break
        try:
            row = run_case(args, sgl, bw, device, Hq, Hkv, D, B, L, P)
        except Exception as exc:  # noqa: BLE001  (keep the grid going: out of memory, a peer failing, ...)
            print(f"Hq={Hq} Hkv={Hkv} D={D} B={B} L={L} P={P}: FAILED {exc!r}"[:300], flush=True)
            row = dict(Hq=Hq, Hkv=Hkv, D=D, B=B, L=L, P=P, error=repr(exc)[:200])
        rows.append(row)
        common.free_memory()
    ratios = [r["speedup_vs_sglang"] for r in rows if "speedup_vs_sglang" in r]
    if ratios:
        summary.append(f"ours/sglang: geometric mean {common.geomean(ratios):.2f}x, min {min(ratios):.2f}x over {len(ratios)} cases")
        print(summary[-1])
    summary += flex_summary(rows)
    common.write_results(
        "paged_attention", rows, out=args.out, quick=args.quick, title="paged attention decode (bf16)",
        notes="Times: CUDA-graph replays (`*_us`), eager calls (`*_eager_us`). GB/s count the KV bytes read (K and V "
              "once); `*_pct` is % of the measured copy roofline; `copy_same_bytes_us` is a device copy moving kv_bytes, "
              "timed alike (the ceiling at that size) and `ours_pct_of_copy_same_bytes` ours against it. `ours_q4`: 4 query tokens per request (drafts). "
              "`speedup_vs_sglang` = sglang time / ours. `flops` = 4 B Hq L D.",
        summary=summary, headline_kw=dict(speedup="speedup_vs_sglang", peer="sglang Triton decode"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
