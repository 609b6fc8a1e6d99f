"""MLA prefill benchmark: triton_xpu_attn.flash_mla_prefill (causal, bf16, DeepSeek latent 512 + rope 64).

Grid: H in {16, 128} x {B=1 full prefill of 4096 tokens, B=4 chunks of 1024 new tokens over 3072
cached ones (L = 4096)} x page size in {64, 1}, plus B=16 chunks of 256 new tokens over 768 cached
ones (L = 1024) at page 64; paged cache with random page order. Each case is checked against a float32 reference on the
first and last 8 queries of its first request (bottom-right causal: those rows equal a request of 8
queries over the keys they can see) before it is timed.

TFLOP/s count the causal visible keys exactly: per request, ``sum_t min(L, L - q_len + t + 1)`` keys per
query and head, ``2 (R + Dr) + 2 R`` flops per key (QK over the 576 channels of the row, PV over the 512
of the latent). GB/s count q read, the latent cache read once, out written.

``--peers DIR``: a folder holding ``flashinfer_peer.py`` and the FlashInfer bundle ``flashinfer/``
(the peers harness, outside the repository: bench/README.md, "Peers"; MLA modules prebuilt for sm_90a). It adds FlashInfer 0.7.2.post1's
``BatchMLAPagedAttentionWrapper`` on the same packed q ``[total_q, H, 576]`` and latent cache ``[pages,
P, 576]``, planned (outside the timing) with the ragged queries' ``qo_indptr``, the page list of our
page table and ``causal=True`` (bottom-right, as ours); fa3 and fa2 both timed, the faster correct one
reported, checked like ours against the float32 reference (rel err > 0.05: WRONG, not timed).
``speedup_vs_flashinfer`` = FlashInfer's time / ours (target: >= 0.8x). Without CUDA or the
bundle it is skipped with the reason printed.

usage:
  python bench/bench_mla_prefill.py [--quick] [--out DIR] [--time-budget S] [--peers DIR]

On a machine without a GPU one tiny case runs through the Triton interpreter (a smoke test; the times
mean nothing there).
"""
from __future__ import annotations

import math
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import triton_xpu_attn as ours  # noqa: E402  (selects the interpreter on a machine without a GPU)
from triton_xpu_attn import device as _device  # noqa: E402
from triton_xpu_attn import reference  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402

GRID_H = [16, 128]
GRID_P = [64, 1]
#: (B, q_len, L): a full prefill, and chunked prefills over a cached prefix
GRID_SHAPES = [(1, 4096, 4096), (4, 1024, 4096)]
#: (B, q_len, L) run at page 64 only: many short chunks (the q_len > 1 side of MLA)
GRID_SHAPES_P64 = [(16, 256, 1024)]
QUICK_SHAPES = [(1, 1024, 1024), (2, 256, 1024)]
R, DR = 512, 64


def visible_keys(B: int, q_len: int, L: int) -> int:
    """Keys summed over the queries of B requests of q_len queries over L keys (bottom-right causal)."""
    per_request = sum(max(0, min(L, L - q_len + t + 1)) for t in range(q_len))
    return B * per_request


def make_case(B, H, q_len, L, page, dev, dtype):
    n = -(-L // page)
    num_pages = B * n + 8
    table = torch.randperm(num_pages, device=dev)[: B * n].view(B, n).to(torch.int32)
    cache = torch.randn(num_pages, page, R + DR, device=dev, dtype=dtype)
    q = torch.randn(B * q_len, H, R + DR, device=dev, dtype=dtype)
    cu = torch.arange(0, B + 1, device=dev, dtype=torch.int32) * q_len
    seq_lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    return q, cache, cu, seq_lens, table


def check(out, q, cache, seq_lens, table, q_len, L, scale, rows=8):
    """Relative error of the first and last ``rows`` queries of request 0 against float32."""
    errs = []
    rows = min(rows, q_len)
    for first in (0, q_len - rows):
        kv_len = L - q_len + first + rows  # those rows are a request of `rows` queries over the keys they see
        sub = q[first:first + rows]
        cu = torch.tensor([0, rows], dtype=torch.int32)
        exp, _ = reference.mla_prefill(sub[..., :R], sub[..., R:], cache, cu, [kv_len], table[:1], scale, dtype=torch.float32)
        errs.append(common.rel_err(out[first:first + rows], exp))
    return max(errs)


def run_flashinfer(fi, q, cache, cu, seq_lens, table, scale, backend):
    """FlashInfer's MLA on the same packed q and latent cache, causal over ragged queries: ``plan``
    runs here, outside the timing. Returns f() -> out [total_q, H, R]."""
    from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

    page = cache.shape[1]
    kv_indptr, kv_indices = common.page_list(table, seq_lens, page)
    w = BatchMLAPagedAttentionWrapper(common.flashinfer_workspace(q.device), backend=backend)
    w.plan(metadata=MLAPlanMetadata.csr(cu, kv_indptr, kv_indices, seq_lens), num_heads=q.shape[1], head_dim_ckv=R,
           head_dim_kpe=DR, page_size=page, causal=True, sm_scale=scale, q_data_type=q.dtype, kv_data_type=cache.dtype)
    out = torch.empty(q.shape[0], q.shape[1], R, dtype=q.dtype, device=q.device)
    return lambda: w.run(query=q, kv_cache=cache, out=out)


def run_case(B, H, q_len, L, page, dev, dtype, bw, fi=None):
    torch.manual_seed(0)
    q, cache, cu, seq_lens, table = make_case(B, H, q_len, L, page, dev, dtype)
    scale = 1 / math.sqrt(192)
    q_nope, q_pe = q[..., :R], q[..., R:]  # sglang's views of one [total_q, H, 576] tensor
    keys = visible_keys(B, q_len, L)
    flops = 2 * H * keys * (R + DR + R)
    byts = (q.numel() + B * L * (R + DR) + B * q_len * H * R) * q.element_size()
    ws = torch.empty(ours.flash_mla_prefill_get_workspace_size(L, B, H, page, -1), dtype=torch.uint8, device=dev)
    row = dict(B=B, H=H, q_len=q_len, L=L, page=page)
    holder = {}

    def ours_fn():
        holder["o"] = ours.flash_mla_prefill(q_nope, q_pe, cache, cu, seq_lens, q_len, table, ws, scale, causal=True)

    try:
        ours_fn()
        row["ours_err"] = check(holder["o"], q, cache, seq_lens, table, q_len, L, scale)
        eager = common.bench_ms(ours_fn, warmup=10, rep=50, repeats=1)
        replay = common.graph_ms(ours_fn, warmup=10, rep=50)
    except Exception as exc:  # noqa: BLE001  (out of memory, out of resources: keep the grid going)
        row["ours_error"] = repr(exc)[:120]
        return row
    ms = replay if replay == replay else eager
    row.update(ours_eager_us=eager * 1e3, ours_us=ms * 1e3, ours_tflops=flops / ms / 1e9, ours_gbs=byts / ms / 1e6,
               ours_pct=100 * byts / ms / 1e6 / bw if bw == bw else float("nan"),
               ours_config=tune.LAST_SOURCE.get("mla_prefill", "-"),
               time_us=ms * 1e3, bytes=byts, flops=flops, visible_keys=keys)
    if fi is not None:
        common.time_variants(
            "flashinfer", {b: (lambda b=b: run_flashinfer(fi, q, cache, cu, seq_lens, table, scale, b)) for b in ("fa3", "fa2")},
            lambda o: check(o, q, cache, seq_lens, table, q_len, L, scale), row)
        if "flashinfer_us" in row:
            row["flashinfer_tflops"] = flops / row["flashinfer_us"] / 1e6
            row["speedup_vs_flashinfer"] = row["flashinfer_us"] / row["ours_us"]
    return row


def fmt_row(row):
    name = f"B={row['B']:<2} H={row['H']:<3} q={row['q_len']:<5} L={row['L']:<5} P={row['page']:<2}"
    if "ours_error" in row:
        return f"{name} | ours: ERROR {row['ours_error']}"
    text = (f"{name} | ours: {row['ours_us']:9.1f}us (eager {row['ours_eager_us']:.1f}) {row['ours_tflops']:6.1f}TF "
            f"{row['ours_gbs']:6.0f}GB/s err {row['ours_err']:.1e} [{row['ours_config']}]")
    if "flashinfer_variant" in row:
        text += (f" | FlashInfer [{row['flashinfer_variant']}]: {row['flashinfer_us']:9.1f}us {row['flashinfer_tflops']:6.1f}TF "
                 f"err {row['flashinfer_err']:.1e} | ours/FI x{row['speedup_vs_flashinfer']:.2f}")
    elif "flashinfer_note" in row:
        text += f" | FlashInfer: {row['flashinfer_note']}"
    return text


def main(argv=None):
    ap = common.flashinfer_bench_parser(__doc__.split("\n\n")[0], "a short grid (on CPU: one tiny interpreter case)")
    args = ap.parse_args(argv)

    dev = _device.default_device()
    if dev.type == "cpu":
        global R, DR
        R, DR = 32, 16  # interpreter smoke test: tiny latent
        grid = [(2, 16, 12, 20, 4)]
        dtype = torch.float16
    else:
        dtype = torch.bfloat16
        shapes = QUICK_SHAPES if args.quick else GRID_SHAPES
        grid = [(B, H, q_len, L, P) for H in GRID_H for (B, q_len, L) in shapes for P in GRID_P]
        if not args.quick:
            grid += [(B, H, q_len, L, 64) for H in GRID_H for (B, q_len, L) in GRID_SHAPES_P64]
    bw = common.copy_bandwidth()
    print(common.header(), flush=True)
    fi = common.load_flashinfer(args.peers)
    rows, summary = [], []
    common.set_time_budget(args.time_budget)
    for index, (B, H, q_len, L, P) in enumerate(grid):
        if common.out_of_time():
            summary.append(f"stopped after {index} of {len(grid)} cases: time budget (--time-budget) spent")
            print(summary[-1], flush=True)
            break
        row = run_case(B, H, q_len, L, P, dev, dtype, bw, fi)
        rows.append(row)
        print(fmt_row(row), flush=True)
        common.free_memory()

    for H in GRID_H:
        tf = [r["ours_tflops"] for r in rows if r["H"] == H and "ours_tflops" in r]
        if tf:
            summary.append(f"H={H}: ours TFLOP/s {min(tf):.1f}-{max(tf):.1f}")
        line = common.speedup_line([r for r in rows if r["H"] == H], "speedup_vs_flashinfer", f"H={H}: ours/FlashInfer MLA")
        if line:
            summary.append(line)
    line = common.speedup_line(rows, "speedup_vs_flashinfer", "ours/FlashInfer MLA (causal, q_len > 1)",
                               "target >= 0.8x")
    if line:
        summary.append(line)

    def cell(r, k, spec):
        return format(r[k], spec) if k in r else ("ERR" if "ours_error" in r else "-")

    table = ("| B | H | q_len | L | P | ours us (eager) | ours TF/s | ours GB/s | err | FlashInfer us [variant] | "
             "FlashInfer TF/s | ours/FlashInfer | config |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        fi_variant = f" [{r['flashinfer_variant']}]" if "flashinfer_variant" in r else ""
        table += (f"| {r['B']} | {r['H']} | {r['q_len']} | {r['L']} | {r['page']} | {cell(r, 'ours_us', '.1f')} "
                  f"({cell(r, 'ours_eager_us', '.1f')}) | {cell(r, 'ours_tflops', '.1f')} | {cell(r, 'ours_gbs', '.0f')} | "
                  f"{cell(r, 'ours_err', '.1e')} | {cell(r, 'flashinfer_us', '.1f')}{fi_variant} | "
                  f"{cell(r, 'flashinfer_tflops', '.1f')} | {cell(r, 'speedup_vs_flashinfer', '.2f')} | "
                  f"{r.get('ours_config', '-')} |\n")
    notes = [f"- {fmt_row(r)}" for r in rows if "flashinfer_note" in r]
    if notes:
        table += "\nFlashInfer not counted:\n\n" + "\n".join(notes) + "\n"
    print("\n" + table)
    for line in summary:
        print(line)
    errors = [fmt_row(r) for r in rows if "ours_error" in r]
    if errors:
        table += "\nErrors:\n\n" + "\n".join(f"- {e}" for e in errors) + "\n"
    common.write_results(
        "mla_prefill", rows, out=args.out, quick=args.quick or dev.type == "cpu",
        title=f"MLA prefill (causal), {str(dtype)[6:]}, R {R} + Dr {DR}",
        notes="Times are CUDA-graph replays (eager calls in brackets). TFLOP/s = 2 H (2 R + Dr) x the causal visible "
              "keys summed over queries / time; GB/s = (q + latent cache once + out) bytes / time. FlashInfer (`--peers`): "
              "`BatchMLAPagedAttentionWrapper`, causal, ragged qo_indptr, packed q and cache; fa3 and fa2 timed "
              "(`flashinfer_fa3_us`, `flashinfer_fa2_us` in the CSV), the faster correct one reported; "
              "`speedup_vs_flashinfer` = FlashInfer time / ours.",
        summary=summary, table=table,
        headline_kw=dict(speedup="speedup_vs_flashinfer", peer="FlashInfer MLA (causal prefill)"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
