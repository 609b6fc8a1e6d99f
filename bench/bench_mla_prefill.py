"""MLA prefill benchmark: triton_xpu_attn.flash_mla_prefill (causal, bf16, DeepSeek latent 512 + rope 64).

Grid: H in {16, 128} x {B=1 full prefill of 4096 tokens, B=4 chunks of 1024 new tokens over 3072
cached ones (L = 4096)} x page size in {64, 1}, paged cache with random page order. Each case is
checked against a float32 reference on the first and last 8 queries of its first request (bottom-right
causal: those rows equal a request of 8 queries over the keys they can see) before it is timed.

TFLOP/s count the causal visible keys exactly: per request, ``sum_t min(L, L - q_len + t + 1)`` keys per
query and head, ``2 (R + Dr) + 2 R`` flops per key (QK over the whole row, PV over the latent).
GB/s count q read, the latent cache read once, out written. FlashInfer's MLA prefill joins later as a
peer (the lead's ../shared/peers/).

usage:
  python bench/bench_mla_prefill.py [--quick] [--out DIR] [--time-budget S]

On a machine without a GPU one tiny case runs through the Triton interpreter (a smoke test; the times
mean nothing there).
"""
from __future__ import annotations

import argparse
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


def run_case(B, H, q_len, L, page, dev, dtype, bw):
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
    return row


def fmt_row(row):
    name = f"B={row['B']:<2} H={row['H']:<3} q={row['q_len']:<5} L={row['L']:<5} P={row['page']:<2}"
    if "ours_error" in row:
        return f"{name} | ours: ERROR {row['ours_error']}"
    return (f"{name} | ours: {row['ours_us']:9.1f}us (eager {row['ours_eager_us']:.1f}) {row['ours_tflops']:6.1f}TF "
            f"{row['ours_gbs']:6.0f}GB/s err {row['ours_err']:.1e} [{row['ours_config']}]")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short grid (on CPU: one tiny interpreter case)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--time-budget", type=float, default=None, metavar="S",
                    help="stop starting new cases after S seconds (results so far are written)")
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
    bw = common.copy_bandwidth()
    print(common.header(), flush=True)
    rows, summary = [], []
    common.set_time_budget(args.time_budget)
    for index, (B, H, q_len, L, P) in enumerate(grid):
        if common.out_of_time():
            summary.append(f"stopped after {index} of {len(grid)} cases: time budget (--time-budget) spent")
            print(summary[-1], flush=True)
            break
        row = run_case(B, H, q_len, L, P, dev, dtype, bw)
        rows.append(row)
        print(fmt_row(row), flush=True)
        common.free_memory()

    for H in GRID_H:
        tf = [r["ours_tflops"] for r in rows if r["H"] == H and "ours_tflops" in r]
        if tf:
            summary.append(f"H={H}: ours TFLOP/s {min(tf):.1f}-{max(tf):.1f}")
    for line in summary:
        print(line)

    def cell(r, k, spec):
        return format(r[k], spec) if k in r else ("ERR" if "ours_error" in r else "-")

    table = "| B | H | q_len | L | P | ours us (eager) | ours TF/s | ours GB/s | err | config |\n|---|---|---|---|---|---|---|---|---|---|\n"
    for r in rows:
        table += (f"| {r['B']} | {r['H']} | {r['q_len']} | {r['L']} | {r['page']} | {cell(r, 'ours_us', '.1f')} "
                  f"({cell(r, 'ours_eager_us', '.1f')}) | {cell(r, 'ours_tflops', '.1f')} | {cell(r, 'ours_gbs', '.0f')} | "
                  f"{cell(r, 'ours_err', '.1e')} | {r.get('ours_config', '-')} |\n")
    errors = [fmt_row(r) for r in rows if "ours_error" in r]
    if errors:
        table += "\nErrors:\n\n" + "\n".join(f"- {e}" for e in errors) + "\n"
    common.write_results(
        "mla_prefill", rows, out=args.out, quick=args.quick or dev.type == "cpu",
        title=f"MLA prefill (causal), {str(dtype)[6:]}, R {R} + Dr {DR}",
        notes="Times are CUDA-graph replays (eager calls in brackets). TFLOP/s = 2 H (2 R + Dr) x the causal visible "
              "keys summed over queries / time; GB/s = (q + latent cache once + out) bytes / time.",
        summary=summary, table=table,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
