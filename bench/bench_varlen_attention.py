"""Non-paged prefill benchmark: our ``flash_attn_varlen_func`` vs torch SDPA's flash backend and
FlashInfer's ragged prefill, side by side in one run on one GPU (bf16, causal, GQA).

The full-prefill grid: ``(B, L)`` = (1, 8192), (4, 4096), (16, 1024) at Hq/Hkv/D
32/8/128, and (4, 4096) at 32/8/64, 64/8/128 and 32/8/256; every request has L queries over its
own L keys. Ours reads ragged ``q [B*L, Hq, D]`` and ``k/v [B*L, Hkv, D]`` with ``cu_seqlens``;
SDPA reads the same tensors as ``[B, H, L, D]`` views of BSHD (no copy) with
``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``, ``is_causal=True``, ``enable_gqa=True``.

    python bench/bench_varlen_attention.py [--quick] [--out bench/results] [--peers .peers]

``--peers DIR``: a folder holding ``flashinfer_peer.py`` and the FlashInfer bundle ``flashinfer/``
(the peers harness, outside the repository: bench/README.md, "Peers"; modules prebuilt for sm_90a at D = 64 and 128). It adds FlashInfer
0.7.2.post1's ``BatchPrefillWithRaggedKVCacheWrapper`` on the same q/k/v tensors and
``cu_seqlens`` (causal, planned outside the timing; the ragged run lives in the same prebuilt batch
prefill modules as the paged one): fa3 and fa2 both timed, the faster correct one reported
(``flashinfer_variant``). Without CUDA or the bundle it is skipped with the reason printed.

Times: CUDA-graph replays (``*_us``, the headline) and eager calls (``*_eager_us``). ``flops``
is the exact causal count, ``4 * Hq * D * B * L (L + 1) / 2`` (QK^T and PV, two FLOPs a
multiply-add); ``bytes`` is q, k, v read and out written once. ``speedup_vs_sdpa`` = SDPA's time /
ours, ``speedup_vs_flashinfer`` = FlashInfer's / ours (>= 1: ours faster; the target is
>= 0.9 against both). Every peer is checked against SDPA's flash output (ours where SDPA cannot
run) before it is timed: rel err > 0.05 is WRONG, not timed, in no speedup. Results:
``<out>/<device_key>/varlen_attention.csv`` / ``.md`` / ``.json`` (quick runs in ``quick/``).
Under the CPU interpreter a tiny smoke case runs instead (the time means nothing).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton_xpu_attn as ours  # noqa: E402  (first: on a CPU it must select the interpreter before triton loads)
from triton_xpu_attn import tune  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402
from bench.common import bench_both, rel_err  # noqa: E402

#: (B, L, Hq, Hkv, D): the full-prefill rows plus D = 256
GRID = [
    (1, 8192, 32, 8, 128),
    (4, 4096, 32, 8, 128),
    (16, 1024, 32, 8, 128),
    (4, 4096, 32, 8, 64),
    (4, 4096, 64, 8, 128),
    (4, 4096, 32, 8, 256),
]
QUICK_GRID = [(4, 4096, 32, 8, 128), (16, 1024, 32, 8, 128)]


def make_case(B, L, Hq, Hkv, D, device, dtype=torch.bfloat16):
    """Ragged q/k/v of B requests of L tokens each and their cumulative lengths."""
    q = torch.randn(B * L, Hq, D, device=device, dtype=dtype)
    k = torch.randn(B * L, Hkv, D, device=device, dtype=dtype)
    v = torch.randn(B * L, Hkv, D, device=device, dtype=dtype)
    cu = torch.arange(0, (B + 1) * L, L, device=device, dtype=torch.int32)
    return dict(q=q, k=k, v=v, cu=cu, B=B, L=L)


def run_ours(case, scale):
    L = case["L"]
    return lambda: ours.flash_attn_varlen_func(
        case["q"], case["k"], case["v"], case["cu"], case["cu"], L, L, softmax_scale=scale, causal=True
    )


def bshd(t, B, L):
    """``[B*L, H, D]`` as SDPA's ``[B, H, L, D]``: a view of the same memory."""
    return t.view(B, L, *t.shape[1:]).transpose(1, 2)


def run_sdpa(case, scale, backend=None):
    """SDPA on the same tensors; ``backend`` None = let torch pick (the interpreter smoke case)."""
    B, L = case["B"], case["L"]
    q, k, v = (bshd(case[n], B, L) for n in ("q", "k", "v"))

    def call():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)

    if backend is None:
        return call
    from torch.nn.attention import sdpa_kernel

    def flash():
        with sdpa_kernel(backend):
            return call()

    return flash


def io_bytes(B, L, Hq, Hkv, D, itemsize=2) -> int:
    return B * L * (2 * Hq + 2 * Hkv) * D * itemsize  # q, k, v read; out written


def run_flashinfer(fi, case, scale, backend):
    """FlashInfer's ragged prefill on the same tensors: ``plan`` runs here, outside the timing."""
    q, k, v, cu = case["q"], case["k"], case["v"], case["cu"]
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(common.flashinfer_workspace(q.device), "NHD", backend=backend)
    w.plan(cu, cu, q.shape[1], k.shape[1], q.shape[2], causal=True, sm_scale=scale, q_data_type=q.dtype,
           kv_data_type=k.dtype)
    out = torch.empty_like(q)
    return lambda: w.run(q, k, v, out=out)


PEERS = ("ours", "sdpa", "flashinfer")


def run_case(device, B, L, Hq, Hkv, D, fi=None) -> dict:
    from torch.nn.attention import SDPBackend

    case = make_case(B, L, Hq, Hkv, D, device)
    scale = D**-0.5
    row = dict(B=B, L=L, Hq=Hq, Hkv=Hkv, D=D, flops=common.causal_flops(B, Hq, D, L, L), bytes=io_bytes(B, L, Hq, Hkv, D))
    f = run_ours(case, scale)
    out = f()
    ref = out
    row["ours_config"] = tune.LAST_SOURCE.get("paged_attention", "-")
    row["ours_eager_us"], row["ours_us"] = bench_both(f)
    try:
        g = run_sdpa(case, scale, SDPBackend.FLASH_ATTENTION)
        ref = g().transpose(1, 2).reshape(B * L, Hq, D)
        row["ours_err"] = rel_err(out, ref)
        row["sdpa_eager_us"], row["sdpa_us"] = bench_both(g)
    except Exception as exc:  # noqa: BLE001  (a torch without the flash backend for this shape: keep ours)
        row["sdpa_note"] = f"flash backend failed: {exc!r}"[:160]
    if fi is not None:
        common.time_variants("flashinfer", {b: (lambda b=b: run_flashinfer(fi, case, scale, b)) for b in ("fa3", "fa2")},
                             lambda o: rel_err(o, ref), row)
    common.rate_columns(row, PEERS)
    for peer in PEERS[1:]:
        if common.finite(row.get(f"{peer}_time_us")):
            row[f"speedup_vs_{peer}"] = row[f"{peer}_time_us"] / row["ours_time_us"]
    row["time_us"] = row["ours_time_us"]
    fi_cell = ""
    if "flashinfer_variant" in row:
        fi_cell = (f" | FlashInfer ragged [{row['flashinfer_variant']}] {row['flashinfer_TFLOPs']:.0f} TFLOP/s "
                   f"(err {row['flashinfer_err']:.1e}) ours/FI x{row['speedup_vs_flashinfer']:.2f}")
    elif "flashinfer_note" in row:
        fi_cell = f" | FlashInfer: {row['flashinfer_note']}"
    print(
        f"B={B} L={L} Hq={Hq} Hkv={Hkv} D={D}: ours {row['ours_TFLOPs']:.0f} TFLOP/s ({row['time_us']:.0f} us, "
        f"err {row.get('ours_err', float('nan')):.1e}) | SDPA flash {row['sdpa_TFLOPs']:.0f} TFLOP/s"
        + (f" | ours/SDPA x{row['speedup_vs_sdpa']:.2f}" if "speedup_vs_sdpa" in row else "") + fi_cell,
        flush=True,
    )
    return row


def compact_table(rows) -> str:
    """The console / markdown table: TFLOP/s per peer and ours' speedups."""
    def cell(r, key, spec):
        return format(r[key], spec) if common.finite(r.get(key)) else "-"

    text = ("| B | L | Hq/Hkv/D | ours TF/s | SDPA flash TF/s | FlashInfer ragged TF/s [variant] | ours/SDPA | "
            "ours/FlashInfer | note |\n|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        note = r.get("error") or r.get("flashinfer_note") or r.get("sdpa_note") or ""
        text += (f"| {r['B']} | {r['L']} | {r['Hq']}/{r['Hkv']}/{r['D']} | {cell(r, 'ours_TFLOPs', '.0f')} | "
                 f"{cell(r, 'sdpa_TFLOPs', '.0f')} | {cell(r, 'flashinfer_TFLOPs', '.0f')}"
                 + (f" [{r['flashinfer_variant']}]" if "flashinfer_variant" in r else "")
                 + f" | {cell(r, 'speedup_vs_sdpa', '.2f')} | {cell(r, 'speedup_vs_flashinfer', '.2f')} | "
                 f"{str(note).replace('|', '/')[:120]} |\n")
    return text


def smoke(args) -> int:
    """Interpreter smoke run: one tiny case (fp32: the interpreter's bf16 arithmetic is wrong),
    checked against SDPA's math path; the time means nothing."""
    device = ours.device.default_device()
    B, L, Hq, Hkv, D = 2, 16, 4, 2, 64
    case = make_case(B, L, Hq, Hkv, D, device, dtype=torch.float32)
    f = run_ours(case, 0.125)
    out = f()
    ref = run_sdpa(case, 0.125)().transpose(1, 2).reshape(B * L, Hq, D)
    us = common.bench_ms(f, repeats=1) * 1e3
    row = dict(B=B, L=L, Hq=Hq, Hkv=Hkv, D=D, flops=common.causal_flops(B, Hq, D, L, L), bytes=io_bytes(B, L, Hq, Hkv, D, 4),
               ours_err=rel_err(out, ref), ours_eager_us=us, ours_us=float("nan"), time_us=us)
    if not row["ours_err"] < 1e-4:
        print(f"interpreter smoke run: error {row['ours_err']:.1e} against SDPA", file=sys.stderr)
        return 1
    print(f"interpreter smoke run ok: out {tuple(out.shape)}, err {row['ours_err']:.1e}")
    common.write_results("varlen_attention", [row], out=args.out, quick=True,
                         title="flash_attn_varlen_func prefill (interpreter smoke run)",
                         notes="Triton interpreter on the CPU: a smoke test, the time means nothing.")
    return 0


def main(argv=None):
    ap = common.flashinfer_bench_parser(__doc__, "two cases only")
    args = ap.parse_args(argv)
    device = ours.device.default_device()
    if device.type == "cpu":
        if args.peers:
            print("FlashInfer skipped: it needs a CUDA device (interpreter smoke run)")
        return smoke(args)
    torch.manual_seed(0)
    common.set_time_budget(args.time_budget)
    print(common.header(), flush=True)
    fi = common.load_flashinfer(args.peers)
    grid = QUICK_GRID if args.quick else GRID
    rows, summary = [], []
    for index, (B, L, Hq, Hkv, D) in enumerate(grid):
        if common.out_of_time():
            summary.append(f"stopped after {index} of {len(grid)} cases: time budget (--time-budget) spent")
            break
        try:
            rows.append(run_case(device, B, L, Hq, Hkv, D, fi))
        except Exception as exc:  # noqa: BLE001  (keep the grid going)
            print(f"B={B} L={L} Hq={Hq} Hkv={Hkv} D={D}: FAILED {exc!r}"[:300], flush=True)
            rows.append(dict(B=B, L=L, Hq=Hq, Hkv=Hkv, D=D, error=repr(exc)[:200]))
        common.free_memory()
    for key, name in (("speedup_vs_sdpa", "ours/SDPA flash"), ("speedup_vs_flashinfer", "ours/FlashInfer ragged prefill")):
        line = common.speedup_line(rows, key, name, "target >= 0.9x")
        if line:
            summary.append(line)
    table = compact_table(rows)
    print("\n" + table + "\n" + "\n".join(summary), flush=True)
    common.write_results(
        "varlen_attention", rows, out=args.out, quick=args.quick, title="flash_attn_varlen_func prefill (bf16, causal)",
        notes="Times: CUDA-graph replays (`*_us`), eager calls (`*_eager_us`); `*_time_us` is the one the rates use. "
              "`flops` = 4 Hq D B L (L + 1) / 2 (exact causal count); `*_TFLOPs` = flops / time. SDPA: "
              "`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`, is_causal, enable_gqa, on [B, H, L, D] views of the same "
              "tensors. FlashInfer (`--peers`): `BatchPrefillWithRaggedKVCacheWrapper`, causal, the same q/k/v and "
              "cu_seqlens, fa3 and fa2 timed (`flashinfer_fa3_us`, `flashinfer_fa2_us`), the faster correct one "
              "reported. `speedup_vs_<peer>` = peer time / ours. Every column is in the CSV.",
        summary=summary, table=table, headline_kw=dict(speedup="speedup_vs_sdpa", peer="torch SDPA flash"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
