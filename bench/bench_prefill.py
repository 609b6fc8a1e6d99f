"""Paged prefill benchmark: our ``flash_attn_with_kvcache`` with q_len > 1 (causal, bottom-right
aligned) vs FlashInfer's paged prefill and dense torch SDPA flash, side by side in one run on one
GPU (bf16, GQA, Hkv = 8).

The prefill grid (six full-prefill and two chunked-prefill rows), every row at page sizes P = 1, 16, 64 and 256:

* full prefill (q_len = L): ``(B, L)`` = (1, 8192), (4, 4096), (16, 1024) at Hq/Hkv/D 32/8/128, and
  (4, 4096) at 32/8/64, 64/8/128 and 32/8/256;
* chunked prefill (q_len < L; the queries are the last q_len positions of each request):
  ``(B, q_len, L)`` = (4, 2048, 8192), (8, 512, 4096) at 32/8/128.

Per row one set of dense keys and values ``[B*L, Hkv, D]`` is drawn; per page size it is scattered
into a paged cache ``[pages, P, Hkv, D]`` through a page table built from a random permutation of the
pages (``[B, L / P]``; for P = 1 ``[B, L]``; eight spare pages hold noise). Ours reads ragged
``q [B*q_len, Hq, D]`` with ``cu_seqlens_q``, ``max_seqlen_q``, ``cache_seqlens = L`` and that table.

    python bench/bench_prefill.py [--quick] [--out bench/results] [--time-budget S] [--peers .peers]

``--peers DIR``: a folder holding ``flashinfer_peer.py`` and the FlashInfer bundle ``flashinfer/``
(the peers harness, outside the repository: bench/README.md, "Peers"; modules prebuilt for sm_90a at D = 64 and 128). It adds FlashInfer
0.7.2.post1's ``BatchPrefillWithPagedKVCacheWrapper`` through ``flashinfer_peer.gqa_prefill`` on the
same q, the same cache tensors and page table (causal, bottom-right like ours, planned outside the
timing): fa3 and fa2 both timed, the faster correct one reported (``flashinfer_variant``). Without
CUDA or the bundle it is skipped with the reason printed; a variant that fails (no module for
D = 256) is recorded with a note, the bench goes on. Torch SDPA (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``,
``is_causal=True``, ``enable_gqa=True``) runs on full-prefill rows only, on ``[B, H, L, D]`` views of
the dense tensors (its top-left causal mask equals bottom-right when q_len = L), timed once per row
(it does not depend on P) and shown on every page size of the row.

Times: CUDA-graph replays (``*_us``, the headline) and eager calls (``*_eager_us``). ``flops`` is the
exact causal count, ``4 Hq D B (q_len (L - q_len) + q_len (q_len + 1) / 2)`` (QK^T and PV, two FLOPs a
multiply-add); ``bytes`` is q read, the L keys and values of each request read once, out written.
Every kernel is checked, before it is timed, against a float32 torch reference on the first and last
64 queries of request 0 computed from the dense keys and values: rel err > 0.05 is WRONG, not timed,
in no speedup. ``speedup_vs_flashinfer`` = FlashInfer's time / ours, ``speedup_vs_sdpa`` = SDPA's /
ours (>= 1: ours faster). Targets: >= 0.9x FlashInfer at P >= 16, >= 0.7x at P = 1.
Results: ``<out>/<device_key>/prefill.csv`` / ``.md`` / ``.json`` (quick runs in ``quick/``). Under
the CPU interpreter tiny float32 cases run instead (a smoke test: the times mean nothing).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton_xpu_attn as ours  # noqa: E402  (first: on a CPU it must select the interpreter before triton loads)
from triton_xpu_attn import reference, tune  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402
from bench.bench_varlen_attention import run_sdpa  # noqa: E402
from bench.common import bench_both, rel_err  # noqa: E402

#: (B, q_len, L, Hq, Hkv, D): the full-prefill rows (q_len = L), then the chunked-prefill rows
GRID = [
    (1, 8192, 8192, 32, 8, 128),
    (4, 4096, 4096, 32, 8, 128),
    (16, 1024, 1024, 32, 8, 128),
    (4, 4096, 4096, 32, 8, 64),
    (4, 4096, 4096, 64, 8, 128),
    (4, 4096, 4096, 32, 8, 256),
    (4, 2048, 8192, 32, 8, 128),
    (8, 512, 4096, 32, 8, 128),
]
PAGES = (1, 16, 64, 256)
QUICK_GRID = [(4, 4096, 4096, 32, 8, 128), (4, 2048, 8192, 32, 8, 128)]
QUICK_PAGES = (1, 64)
#: the interpreter smoke cases (float32: the interpreter's bf16 arithmetic is wrong)
SMOKE_GRID = [(2, 32, 32, 4, 2, 64), (2, 8, 32, 4, 2, 64)]
SMOKE_PAGES = (1, 16)
#: queries of request 0 checked against the float32 reference, at each end of its chunk
CHECK_ROWS = 64
PEERS = ("ours", "flashinfer", "sdpa")


def io_bytes(B, q_len, L, Hq, Hkv, D, itemsize=2) -> int:
    return B * (2 * q_len * Hq + 2 * L * Hkv) * D * itemsize  # q read, K and V read once, out written


def make_dense(B, q_len, L, Hq, Hkv, D, device, dtype):
    """Ragged q ``[B*q_len, Hq, D]`` and dense k/v ``[B*L, Hkv, D]`` (request b: rows b*L..), with
    ``cu_seqlens_q`` and the cache lengths."""
    return dict(
        q=torch.randn(B * q_len, Hq, D, device=device, dtype=dtype),
        k=torch.randn(B * L, Hkv, D, device=device, dtype=dtype),
        v=torch.randn(B * L, Hkv, D, device=device, dtype=dtype),
        cu_q=torch.arange(0, B + 1, device=device, dtype=torch.int32) * q_len,
        seqlens=torch.full((B,), L, device=device, dtype=torch.int32),
        B=B, q_len=q_len, L=L,
    )


def make_paged(case, page):
    """The dense k/v scattered into a paged cache ``[pages, page, Hkv, D]`` through a page table
    ``[B, L / page]`` from a random permutation of the pages (eight spare pages hold noise)."""
    B, L = case["B"], case["L"]
    assert L % page == 0, (L, page)
    n = L // page
    num_pages = B * n + 8
    table = torch.randperm(num_pages, device=case["k"].device)[: B * n].view(B, n).to(torch.int32)
    paged = dict(table=table, page=page)
    for name in ("k", "v"):
        dense = case[name]
        cache = torch.randn(num_pages, page, *dense.shape[1:], device=dense.device, dtype=dense.dtype)
        cache[table.view(-1).long()] = dense.view(B * n, page, *dense.shape[1:])
        paged[f"{name}_cache"] = cache
    return paged


def reference_check(case, scale):
    """``check(out) -> rel err``: the first and last ``CHECK_ROWS`` queries of request 0 against
    float32 torch on the dense keys (bottom-right causal: those rows are a request of their own over
    the keys they can see)."""
    q_len, L = case["q_len"], case["L"]
    rows = min(CHECK_ROWS, q_len)
    refs = []
    for first in sorted({0, q_len - rows}):
        kv_len = L - q_len + first + rows
        cu_q = torch.tensor([0, rows], dtype=torch.int32)
        cu_k = torch.tensor([0, kv_len], dtype=torch.int32)
        ref, _ = reference.varlen_attention(case["q"][first:first + rows], case["k"][:kv_len], case["v"][:kv_len],
                                            cu_q, cu_k, softmax_scale=scale, causal=True, dtype=torch.float32)
        refs.append((first, ref))
    return lambda out: max(rel_err(out[first:first + rows], ref) for first, ref in refs)


def run_ours(case, paged, scale):
    return lambda: ours.flash_attn_with_kvcache(
        case["q"], paged["k_cache"], paged["v_cache"], cache_seqlens=case["seqlens"], page_table=paged["table"],
        cu_seqlens_q=case["cu_q"], max_seqlen_q=case["q_len"], softmax_scale=scale, causal=True)


def time_call(f):
    """(eager, graph-replayed) microseconds; under the interpreter one timed call, no graph."""
    if common.on_gpu():
        return bench_both(f)
    return common.bench_ms(f, repeats=1) * 1e3, float("nan")


def time_sdpa(case, scale, check) -> dict:
    """SDPA flash (torch's pick under the interpreter) on the dense tensors: its ``sdpa_*`` columns."""
    from torch.nn.attention import SDPBackend

    B, L, q = case["B"], case["L"], case["q"]
    backend = SDPBackend.FLASH_ATTENTION if common.on_gpu() else None
    cols = {}
    common.time_variants(
        "sdpa", {"flash" if backend else "default": lambda: run_sdpa(case, scale, backend)},
        lambda o: check(o.transpose(1, 2).reshape(B * L, *q.shape[1:])), cols)
    return cols


def run_case(case, paged, scale, dims, sdpa_cols, fi=None, peer=None) -> dict:
    B, q_len, L, Hq, Hkv, D = dims
    P = paged["page"]
    row = dict(B=B, q_len=q_len, L=L, Hq=Hq, Hkv=Hkv, D=D, P=P, kind="full" if q_len == L else "chunked",
               flops=common.causal_flops(B, Hq, D, q_len, L), bytes=io_bytes(B, q_len, L, Hq, Hkv, D, case["q"].element_size()))
    check = case["check"]
    f = run_ours(case, paged, scale)
    try:
        row["ours_err"] = check(f())
        row["ours_config"] = tune.LAST_SOURCE.get("paged_attention", "-")
        row["ours_eager_us"], row["ours_us"] = time_call(f)
    except Exception as exc:  # noqa: BLE001  (out of resources: the peers still run)
        row.update(ours_err=float("nan"), ours_error=repr(exc)[:200])
    if fi is not None:
        def make(backend):
            return peer.gqa_prefill(fi, case["q"], paged["k_cache"], paged["v_cache"], paged["table"], case["seqlens"],
                                    case["cu_q"], scale, backend)
        common.time_variants("flashinfer", {b: (lambda b=b: make(b)) for b in ("fa3", "fa2")}, check, row)
    row.update(sdpa_cols)
    common.rate_columns(row, PEERS)
    for name in PEERS[1:]:
        if common.finite(row[f"{name}_time_us"]) and common.finite(row["ours_time_us"]) and row["ours_err"] <= common.BAD_ERR:
            row[f"speedup_vs_{name}"] = row[f"{name}_time_us"] / row["ours_time_us"]
    row["time_us"] = row["ours_time_us"]
    print(case_line(row), flush=True)
    return row


def case_name(r) -> str:
    return f"B={r['B']} q={r['q_len']} L={r['L']} {r['Hq']}/{r['Hkv']}/{r['D']} P={r['P']}"


def case_line(r) -> str:
    text = case_name(r)
    if "error" in r:
        return f"{text}: FAILED {r['error']}"
    if "ours_error" in r:
        text += f": ours FAILED {r['ours_error']}"
    else:
        text += f": ours {r['ours_TFLOPs']:.0f} TFLOP/s ({r['ours_time_us']:.0f} us, err {r['ours_err']:.1e})"
    if "flashinfer_variant" in r:
        text += (f" | FlashInfer [{r['flashinfer_variant']}] {r['flashinfer_TFLOPs']:.0f} TFLOP/s "
                 f"(err {r['flashinfer_err']:.1e})")
        if "speedup_vs_flashinfer" in r and common.on_gpu():
            text += f" ours/FI x{r['speedup_vs_flashinfer']:.2f}"
    elif "flashinfer_note" in r:
        text += f" | FlashInfer: {r['flashinfer_note'][:160]}"
    if "sdpa_variant" in r:
        text += f" | SDPA {r['sdpa_TFLOPs']:.0f} TFLOP/s"
        if "speedup_vs_sdpa" in r and common.on_gpu():
            text += f" ours/SDPA x{r['speedup_vs_sdpa']:.2f}"
    elif "sdpa_note" in r:
        text += f" | SDPA: {r['sdpa_note'][:120]}"
    return text


def compact_table(rows) -> str:
    """The console / markdown table."""
    def cell(r, key, spec):
        return format(r[key], spec) if common.finite(r.get(key)) else "-"

    text = ("| B | q_len | L | Hq/Hkv/D | P | ours us | ours TF/s | FlashInfer us [variant] | FlashInfer TF/s | "
            "ours/FlashInfer | SDPA TF/s | ours/SDPA | err | config | note |\n" + "|---" * 15 + "|\n")
    for r in rows:
        variant = f" [{r['flashinfer_variant']}]" if "flashinfer_variant" in r else ""
        note = "; ".join(r[k] for k in ("error", "ours_error", "flashinfer_note", "sdpa_note") if k in r)
        text += (f"| {r['B']} | {r['q_len']} | {r['L']} | {r['Hq']}/{r['Hkv']}/{r['D']} | {r['P']} | "
                 f"{cell(r, 'ours_time_us', '.0f')} | {cell(r, 'ours_TFLOPs', '.0f')} | "
                 f"{cell(r, 'flashinfer_time_us', '.0f')}{variant} | {cell(r, 'flashinfer_TFLOPs', '.0f')} | "
                 f"{cell(r, 'speedup_vs_flashinfer', '.2f')} | {cell(r, 'sdpa_TFLOPs', '.0f')} | "
                 f"{cell(r, 'speedup_vs_sdpa', '.2f')} | {cell(r, 'ours_err', '.1e')} | "
                 f"{str(r.get('ours_config', '-')).replace('|', '/')} | {str(note).replace('|', '/')[:160]} |\n")
    return text


def summary_lines(rows, pages) -> list[str]:
    fi, sdpa = "speedup_vs_flashinfer", "speedup_vs_sdpa"
    wanted = [
        ([r for r in rows if r.get("P", 0) >= 16], fi, "ours/FlashInfer paged prefill, P >= 16", "target >= 0.9x"),
        ([r for r in rows if r.get("P") == 1], fi, "ours/FlashInfer paged prefill, P = 1", "target >= 0.7x"),
        ([r for r in rows if r.get("kind") == "full"], sdpa, "ours/SDPA flash (dense), full prefill", ""),
    ]
    for P in pages:
        at = [r for r in rows if r.get("P") == P]
        wanted += [(at, fi, f"P = {P}: ours/FlashInfer", ""), (at, sdpa, f"P = {P}: ours/SDPA flash", "")]
    lines = [common.speedup_line(rs, key, name, target) for rs, key, name, target in wanted]
    return [line for line in lines if line]


def main(argv=None):
    ap = common.flashinfer_bench_parser(__doc__, "two rows at P = 1 and 64 (on CPU: tiny interpreter cases)", "rows")
    args = ap.parse_args(argv)
    device = ours.device.default_device()
    smoke = device.type == "cpu"
    if smoke:
        grid, pages, dtype = SMOKE_GRID, SMOKE_PAGES, torch.float32
    else:
        grid, pages = (QUICK_GRID, QUICK_PAGES) if args.quick else (GRID, PAGES)
        dtype = torch.bfloat16
    torch.manual_seed(0)
    common.set_time_budget(args.time_budget)
    print(common.header(), flush=True)
    fi = common.load_flashinfer(args.peers)
    peer = common.flashinfer_peer_script(args.peers) if fi is not None else None
    rows, summary = [], []
    for index, dims in enumerate(grid):
        if common.out_of_time():
            summary.append(f"stopped after {index} of {len(grid)} rows: time budget (--time-budget) spent")
            print(summary[-1], flush=True)
            break
        B, q_len, L, Hq, Hkv, D = dims
        scale = D**-0.5
        try:
            case = make_dense(*dims, device, dtype)
            case["check"] = reference_check(case, scale)
            sdpa_cols = time_sdpa(case, scale, case["check"]) if q_len == L else {}
        except Exception as exc:  # noqa: BLE001  (out of memory: keep the grid going)
            rows += [dict(B=B, q_len=q_len, L=L, Hq=Hq, Hkv=Hkv, D=D, P=P, error=repr(exc)[:200]) for P in pages]
            print(case_line(rows[-1]), flush=True)
            continue
        for P in pages:
            try:
                rows.append(run_case(case, make_paged(case, P), scale, dims, sdpa_cols, fi, peer))
            except Exception as exc:  # noqa: BLE001  (keep the grid going)
                rows.append(dict(B=B, q_len=q_len, L=L, Hq=Hq, Hkv=Hkv, D=D, P=P, error=repr(exc)[:200]))
                print(case_line(rows[-1]), flush=True)
            common.free_memory()
        del case
        common.free_memory()
    summary += summary_lines(rows, pages)
    table = compact_table(rows)
    print("\n" + table + "\n" + "\n".join(summary), flush=True)
    common.write_results(
        "prefill", rows, out=args.out, quick=args.quick or smoke,
        title="flash_attn_with_kvcache paged prefill (causal" + (", interpreter smoke run)" if smoke else ", bf16)"),
        notes=("Triton interpreter on the CPU, float32: a smoke test, the times mean nothing.\n\n" if smoke else "")
        + "Times: CUDA-graph replays (`*_us`), eager calls (`*_eager_us`); `*_time_us` is the one the rates use. "
          "`flops` = 4 Hq D B (q_len (L - q_len) + q_len (q_len + 1) / 2) (exact causal count, bottom-right); "
          "`*_TFLOPs` = flops / time. Paged cache at page size P, page table from a random permutation of the pages. "
          "FlashInfer (`--peers`): `BatchPrefillWithPagedKVCacheWrapper` via `flashinfer_peer.gqa_prefill`, causal, the "
          "same q, cache tensors and page table; fa3 and fa2 timed (`flashinfer_fa3_us`, `flashinfer_fa2_us`), the faster "
          "correct one reported. SDPA: `sdpa_kernel(SDPBackend.FLASH_ATTENTION)`, is_causal, enable_gqa, on dense [B, H, L, D] "
          "views of the same keys, full-prefill rows only, timed once per row. err: ours against a float32 reference on "
          "the first and last 64 queries of request 0; a peer above 0.05 is WRONG and in no ratio. "
          "`speedup_vs_<peer>` = peer time / ours. Every column is in the CSV.",
        summary=summary, table=table, headline_kw=dict(speedup="speedup_vs_flashinfer", peer="FlashInfer paged prefill"),
    )
    bad = [case_name(r) for r in rows if not r.get("ours_err", 1.0) < (1e-4 if smoke else common.BAD_ERR)]
    if smoke and bad:
        print(f"interpreter smoke run: wrong or failed against the float32 reference: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
