"""Sparse MLA benchmark (DeepSeek sparse attention): flash_mla_sparse_fwd (prefill) and flash_mla_with_kvcache (decode) vs vLLM's Triton sparse MLA kernel.

Three grids, bf16 queries, every index list full of distinct valid tokens drawn at random:

* prefill: ``flash_mla_sparse_fwd`` at s_q 1k-8k, h_q 16/32/64/128, d_qk 576 (512 latent + 64 rope),
  topk 2048 over s_kv 8k-128k rows;
* decode over a bf16 paged cache (page 64): ``flash_mla_with_kvcache(indices=...)`` at B 1-128,
  q_len 1-2, h_q 16/128, topk 2048 (each request's tokens in its own 16k-token share of the pool);
* DeepSeek-V4 decode: the packed fp8 cache (448 e4m3 + 64 bf16 channels a token, UE8M0 scales at
  the page end; page 256, d_qk 512), h_q 64, 128 window entries in it plus 512 entries of an extra
  fp8 cache of 64-token pages, q_len 1-2, B 1-128.

The peer, vLLM 0.33.0's ``triton_bf16_mla_sparse_interface`` (its XPU_MLA_SPARSE backend's kernel,
loaded with ``vllm_loader.load(DIR/vllm)`` from ``--peers DIR``, see ../shared/peers/README.md), runs
in the same process: prefill as it is called; decode with the B x q_len query tokens flattened into
its prefill-style call over the flat bf16 cache (same rows, same indices); V4 only on a bf16 copy of
the dequantised caches joined into one (512 channels, ``block_dpe=0``, 640 entries a token), since
it cannot read fp8 pages: that ratio leaves out the dequantisation the peer skips (labelled
``vs vLLM (bf16 copy)``). Without the peer (or on a CPU) only ours is timed.

Every kernel is checked first against a float32 reference on a few query tokens (relative error
above 0.05: WRONG, not timed), then timed eager and as a CUDA-graph replay; the graph time counts.
Per row: time, TFLOP/s (2 x heads x entries x (d_qk + d_v) per token), GB/s (the index lists' rows
as each token reads them, plus q and out) and ours/vLLM speedup (vLLM time / ours).

usage:
  python bench/bench_mla_sparse.py [--quick] [--out DIR] [--peers DIR] [--time-budget S] [--grids prefill,decode,v4]

On a machine without a GPU, one tiny case per grid runs through the Triton interpreter (a smoke
test; vLLM's kernel only when --peers is given).
"""
from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import triton_xpu_attn as ours  # noqa: E402  (selects the interpreter on a machine without a GPU)
from triton_xpu_attn import device as _device  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402

D_QK, D_V, D_V4 = 576, 512, 512
TOPK = 2048
#: query / bf16-cache dtype (fp32 for the interpreter smoke test: its bf16 arithmetic is wrong)
DTYPE = torch.bfloat16

PREFILL_GRID = [(s_q, h, s_kv) for s_q in (1024, 8192) for h in (16, 32, 64, 128) for s_kv in (8192, 131072)]
PREFILL_QUICK = [(1024, 64, 32768), (4096, 128, 131072)]
DECODE_GRID = [(B, q_len, h) for B in (1, 8, 32, 128) for q_len in (1, 2) for h in (16, 128)]
DECODE_QUICK = [(1, 1, 128), (64, 2, 16)]
V4_GRID = [(B, q_len) for B in (1, 8, 32, 128) for q_len in (1, 2)]
V4_QUICK = [(1, 1), (64, 2)]
V4_PAGE, V4_TOPK, V4_X_PAGE, V4_X_TOPK, V4_HEADS = 256, 128, 64, 512, 64


# ------------------------------------------------------------------------------------------
# peers and checks
# ------------------------------------------------------------------------------------------


def load_vllm(peers):
    """vLLM's sparse MLA interface, or None (no --peers, no loader, no kernel file: said why)."""
    if not peers:
        return None
    loader = pathlib.Path(peers) / "vllm_loader.py"
    if not loader.exists():
        print(f"vLLM peer skipped: {loader} not found")
        return None
    try:
        spec = importlib.util.spec_from_file_location("vllm_loader", loader)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        peer = mod.load(str(pathlib.Path(peers) / "vllm")).mla_sparse
    except Exception as exc:  # noqa: BLE001  (a peer that cannot load is skipped, not fatal)
        print(f"vLLM peer skipped: {exc!r}"[:200])
        return None
    if peer is None:
        print("vLLM peer skipped: its wheel has no ops/xpu_mla_sparse.py")
    return peer


def reference_rows(q, rows_of, indices, sm_scale, d_v, tokens):
    """float32 outputs of query ``tokens`` (rows of ``q [T, H, D]``): ``rows_of(token_indices)``
    gives the selected rows ``[n, D]`` (all entries valid)."""
    outs = []
    for t in tokens:
        kv = rows_of(indices[t]).float()
        z = (q[t].float() @ kv.T) * sm_scale
        outs.append(torch.softmax(z, -1) @ kv[:, :d_v])
    return torch.stack(outs)


def checked(name, fn, check, row):
    """Run ``fn`` once, check it (``check(output) -> rel err``), time it; into ``row``."""
    try:
        err = check(fn())
    except Exception as exc:  # noqa: BLE001  (a shape the kernel refuses: keep going)
        row[f"{name}_note"] = f"failed: {exc!r}"[:200]
        return
    row[f"{name}_err"] = err
    if not err <= 0.05:
        row[f"{name}_note"] = f"WRONG: rel err {err:.2e}"
        return
    eager, replay = common.bench_both(fn)
    row[f"{name}_eager_us"] = eager
    row[f"{name}_us"] = replay if common.finite(replay) else eager


def finish(row, names):
    common.rate_columns(row, names)
    for name in names:
        t = row.get(f"{name}_time_us", float("nan"))
        row[f"{name}_GBs"] = row["bytes"] / t / 1e3 if common.finite(t) else float("nan")
    row["time_us"] = row.get("ours_time_us", float("nan"))
    if len(names) > 1:
        a, b = row.get("ours_time_us"), row.get(f"{names[1]}_time_us")
        row[f"ours_vs_{names[1]}"] = b / a if common.finite(a) and common.finite(b) else float("nan")


def distinct_indices(T, topk, pool, dev, gen, base=None):
    """``[T, topk]`` int32: distinct tokens of ``[0, pool)`` per row (plus ``base[t]``)."""
    idx = torch.rand(T, pool, device=dev, generator=gen).topk(topk, dim=1).indices.to(torch.int32)
    return idx if base is None else idx + base[:, None]


# ------------------------------------------------------------------------------------------
# cases
# ------------------------------------------------------------------------------------------


def prefill_case(s_q, h, s_kv, topk, dev, vllm, gen):
    q = torch.randn(s_q, h, D_QK, device=dev, generator=gen).to(DTYPE)
    kv = torch.randn(s_kv, 1, D_QK, device=dev, generator=gen).to(DTYPE)
    idx = torch.cat([distinct_indices(min(s_q, 256), topk, s_kv, dev, gen)] * -(-s_q // 256))[:s_q, None]
    scale = D_QK**-0.5
    tokens = [0, s_q // 2, s_q - 1]
    exp = reference_rows(q, lambda i: kv[i.long(), 0], idx[:, 0], scale, D_V, tokens)
    row = dict(grid="prefill", s_q=s_q, h_q=h, s_kv=s_kv, topk=topk, cache="bf16",
               flops=2 * s_q * h * topk * (D_QK + D_V), bytes=s_q * topk * D_QK * 2 + s_q * h * (D_QK + D_V) * 2)
    check = lambda res: common.rel_err(res[0][tokens], exp)  # noqa: E731
    checked("ours", lambda: ours.flash_mla_sparse_fwd(q, kv, idx, scale, D_V), check, row)
    names = ["ours"]
    if vllm is not None:
        checked("vllm", lambda: vllm(q, kv, idx, scale), check, row)
        names.append("vllm")
    finish(row, names)
    return row


def decode_case(B, q_len, h, dev, vllm, gen, page=64, topk=TOPK, share=16384):
    pool = B * share
    pages = -(-pool // page)
    cache = torch.randn(pages, page, 1, D_QK, device=dev, generator=gen).to(DTYPE)
    base = (torch.arange(B, device=dev) * share).repeat_interleave(q_len)
    idx = distinct_indices(B * q_len, topk, share, dev, gen, base)
    q = torch.randn(B, q_len, h, D_QK, device=dev, generator=gen).to(DTYPE)
    flat = cache.view(-1, 1, D_QK)
    scale = D_QK**-0.5
    tokens = [0, B * q_len - 1]
    exp = reference_rows(q.view(-1, h, D_QK), lambda i: flat[i.long(), 0], idx, scale, D_V, tokens)
    row = dict(grid="decode", B=B, q_len=q_len, h_q=h, topk=topk, cache="bf16 page 64",
               flops=2 * B * q_len * h * topk * (D_QK + D_V),
               bytes=B * q_len * (topk * D_QK * 2 + h * (D_QK + D_V) * 2))
    idx3 = idx.view(B, q_len, topk)
    checked("ours", lambda: ours.flash_mla_with_kvcache(q, cache, None, None, D_V, None, None, scale, indices=idx3),
            lambda res: common.rel_err(res[0].reshape(-1, h, D_V)[tokens], exp), row)
    names = ["ours"]
    if vllm is not None:
        qf, idxf = q.view(-1, h, D_QK), idx[:, None]
        checked("vllm", lambda: vllm(qf, flat, idxf, scale), lambda res: common.rel_err(res[0][tokens], exp), row)
        names.append("vllm")
    finish(row, names)
    return row


def v4_cache(pages, page, dev, gen):
    """A DeepSeek-V4 packed fp8 cache view ``[pages, page, 1, 584]`` (random e4m3 channels, scales
    2^-4..2^4, bf16 rope) and its dequantised bf16 rows ``[pages * page, 512]``."""
    page_bytes = page * 576 + -(-page * 8 // 576) * 576
    raw = torch.zeros(pages, page_bytes, dtype=torch.uint8, device=dev)
    nope = torch.randn(pages, page, 448, device=dev, generator=gen).to(torch.float8_e4m3fn)
    rope = torch.randn(pages, page, 64, device=dev, generator=gen).to(torch.bfloat16)
    exps = torch.randint(123, 132, (pages, page, 7), device=dev, generator=gen, dtype=torch.int32)
    data = raw[:, : page * 576].view(pages, page, 576)
    data[..., :448] = nope.view(torch.uint8)
    data[..., 448:] = rope.view(torch.uint8)
    raw[:, page * 576: page * 584].view(pages, page, 8)[..., :7] = exps.to(torch.uint8)
    rows = torch.cat([(nope.float().view(pages, page, 7, 64) * torch.pow(2.0, exps - 127.0)[..., None])
                      .view(pages, page, 448), rope.float()], -1)
    view = raw.as_strided((pages, page, 1, 584), (raw.stride(0), 584, 584, 1)).view(torch.float8_e4m3fn)
    return view, rows.view(-1, 512).to(DTYPE)


def v4_case(B, q_len, dev, vllm, gen):
    h, T = V4_HEADS, B * q_len
    main_pool = max(4 * V4_PAGE, B * V4_PAGE)  # a window's pages per request
    x_pool = max(4096, B * 4096)
    cache, rows = v4_cache(main_pool // V4_PAGE, V4_PAGE, dev, gen)
    x_cache, x_rows = v4_cache(x_pool // V4_X_PAGE, V4_X_PAGE, dev, gen)
    idx = distinct_indices(T, V4_TOPK, main_pool, dev, gen)
    x_idx = distinct_indices(T, V4_X_TOPK, x_pool, dev, gen)
    q = torch.randn(B, q_len, h, D_V4, device=dev, generator=gen).to(DTYPE)
    scale = D_V4**-0.5
    joined = torch.cat([rows, x_rows])[:, None]  # the peer's bf16 copy: one cache, one index list
    joined_idx = torch.cat([idx, x_idx + rows.shape[0]], 1)
    tokens = [0, T - 1]
    exp = reference_rows(q.view(-1, h, D_V4), lambda i: joined[i.long(), 0], joined_idx, scale, D_V4, tokens)
    n = V4_TOPK + V4_X_TOPK
    row = dict(grid="v4", B=B, q_len=q_len, h_q=h, topk=f"{V4_TOPK}+{V4_X_TOPK}",
               cache=f"fp8 v4 page {V4_PAGE} + extra page {V4_X_PAGE}",
               flops=2 * T * h * n * (D_V4 + D_V4), bytes=T * (n * 584 + h * (D_V4 + D_V4) * 2))
    checked("ours", lambda: ours.flash_mla_with_kvcache(
        q, cache, None, None, D_V4, None, None, scale, False, True, idx.view(B, q_len, -1), None, x_cache,
        x_idx.view(B, q_len, -1)), lambda res: common.rel_err(res[0].reshape(-1, h, D_V4)[tokens], exp), row)
    names = ["ours"]
    if vllm is not None:
        qf, jidx = q.view(-1, h, D_V4), joined_idx[:, None]
        checked("vllm_bf16copy", lambda: vllm(qf, joined, jidx, scale, block_dpe=0),
                lambda res: common.rel_err(res[0][tokens], exp), row)
        names.append("vllm_bf16copy")
    finish(row, names)
    return row


def fmt(row) -> str:
    shape = " ".join(f"{k}={row[k]}" for k in ("s_q", "B", "q_len", "h_q", "s_kv", "topk") if k in row)
    parts = [f"[{row['grid']}] {shape}"]
    for name in ("ours", "vllm", "vllm_bf16copy"):
        if f"{name}_note" in row:
            parts.append(f"{name}: {row[f'{name}_note']}")
        elif common.finite(row.get(f"{name}_time_us")):
            parts.append(f"{name}: {row[f'{name}_time_us']:.1f} us {row[f'{name}_TFLOPs']:.1f} TF/s "
                         f"{row[f'{name}_GBs']:.0f} GB/s err {row[f'{name}_err']:.1e}")
    for key in ("ours_vs_vllm", "ours_vs_vllm_bf16copy"):
        if common.finite(row.get(key)):
            parts.append(f"{key} {row[key]:.2f}x")
    return " | ".join(parts)


def main(argv=None):
    ap = common.flashinfer_bench_parser(__doc__.split("\n\n")[0], "a short grid (on CPU: one tiny interpreter case a grid)")
    ap.add_argument("--grids", default="prefill,decode,v4", help="which grids: prefill, decode, v4")
    args = ap.parse_args(argv)
    grids = [g for g in args.grids.split(",") if g]
    dev = _device.default_device()
    gen = torch.Generator(device=dev).manual_seed(0)
    vllm = load_vllm(args.peers)
    print(common.header(), flush=True)
    cases = []
    if dev.type == "cpu":
        # interpreter smoke test: tiny shapes, fp32 stand-ins for the bf16 the kernels take
        global DTYPE
        DTYPE = torch.float32
        if "prefill" in grids:
            cases.append(lambda: prefill_case(4, 16, 64, 32, dev, vllm, gen))
        if "decode" in grids:
            cases.append(lambda: decode_case(2, 2, 16, dev, vllm, gen, page=4, topk=32, share=48))
        if "v4" in grids and hasattr(torch, "float8_e4m3fn"):
            global V4_PAGE, V4_TOPK, V4_X_PAGE, V4_X_TOPK, V4_HEADS
            V4_PAGE, V4_TOPK, V4_X_PAGE, V4_X_TOPK, V4_HEADS = 4, 16, 2, 16, 16
            cases.append(lambda: v4_case(1, 2, dev, vllm, gen))
    else:
        if "prefill" in grids:
            cases += [lambda c=c: prefill_case(*c, TOPK, dev, vllm, gen)
                      for c in (PREFILL_QUICK if args.quick else PREFILL_GRID)]
        if "decode" in grids:
            cases += [lambda c=c: decode_case(*c, dev, vllm, gen) for c in (DECODE_QUICK if args.quick else DECODE_GRID)]
        if "v4" in grids:
            cases += [lambda c=c: v4_case(*c, dev, vllm, gen) for c in (V4_QUICK if args.quick else V4_GRID)]
    common.set_time_budget(args.time_budget)
    rows, summary = [], []
    for index, case in enumerate(cases):
        if common.out_of_time():
            summary.append(f"stopped after {index} of {len(cases)} cases: time budget (--time-budget) spent")
            print(summary[-1], flush=True)
            break
        rows.append(case())
        print(fmt(rows[-1]), flush=True)
        common.free_memory()
    for grid in ("prefill", "decode", "v4"):
        for key, name in (("ours_vs_vllm", "vLLM Triton sparse MLA"), ("ours_vs_vllm_bf16copy", "vLLM (bf16 copy)")):
            line = common.speedup_line([r for r in rows if r["grid"] == grid], key, f"{grid}: ours vs {name}")
            if line:
                summary.append(line)
    for line in summary:
        print(line)
    if rows:
        common.write_results("mla_sparse", rows, out=args.out, quick=args.quick or dev.type == "cpu",
                             title="Sparse MLA (DSA): flash_mla_sparse_fwd and flash_mla_with_kvcache",
                             summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
