"""Prefill tile sweep (issue 21, lever "prefill-shaped tiles"): our paged kernel on causal prefill
rows with forced configs (``tune.override``), beside FlashInfer's paged prefill (fa3 and fa2, the
faster reported) in the same process. GPU only; times are medians of CUDA-graph replays
(``bench.common.graph_ms``).

    python bench/experiments/prefill_tiles.py [--flashinfer .peers/flashinfer] [--quick] [--desc]

Every config's output is compared with the default config's (rel. err.) and FlashInfer's; a config
that does not compile or fit is printed as such and skipped.
"""
from __future__ import annotations

import argparse
import itertools
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import triton_xpu_attn as ours  # noqa: E402  (first: selects the backend before triton loads)
import torch  # noqa: E402

from bench.common import causal_flops, flashinfer_peer_script, graph_ms, rel_err  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402

DEV = "cuda"


def make_case(B, Hq, Hkv, D, q_len, L, P):
    n = L // P
    num_pages = B * n + 8
    table = torch.randperm(num_pages, device=DEV)[: B * n].view(B, n).to(torch.int32)
    k = torch.randn(num_pages, P, Hkv, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(num_pages, P, Hkv, D, device=DEV, dtype=torch.bfloat16)
    q = torch.randn(B * q_len, Hq, D, device=DEV, dtype=torch.bfloat16)
    seqlens = torch.full((B,), L, device=DEV, dtype=torch.int32)
    cu_q = torch.arange(0, B + 1, device=DEV, dtype=torch.int32) * q_len
    return dict(q=q, k=k, v=v, table=table, seqlens=seqlens, cu_q=cu_q, q_len=q_len, scale=D**-0.5)


def ours_call(c):
    return lambda: ours.flash_attn_with_kvcache(
        c["q"], c["k"], c["v"], cache_seqlens=c["seqlens"], page_table=c["table"], cu_seqlens_q=c["cu_q"],
        max_seqlen_q=c["q_len"], softmax_scale=c["scale"], causal=True)


def configs(quick, desc=False):
    if desc:  # tensor-descriptor K/V loads against pointer loads, on the tiles that matter
        for kv_desc, (bm, bn, warps, stages) in itertools.product((False, True), [
                (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 4, 2), (128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 3)]):
            yield dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, kv_desc=kv_desc)
        return
    tiles = [(64, 64), (128, 64), (128, 128), (64, 128)] if not quick else [(128, 64), (128, 128)]
    for (bm, bn), warps, stages in itertools.product(tiles, (4, 8), (2, 3)):
        yield dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashinfer", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--desc", action="store_true", help="sweep tensor-descriptor K/V loads (kv_desc) against pointer loads")
    args = ap.parse_args()
    fi = peer = None
    if args.flashinfer:  # the bundle folder; its set-up script flashinfer_peer.py lies beside it
        peer = flashinfer_peer_script(pathlib.Path(args.flashinfer).resolve().parent)
        fi = peer.setup(args.flashinfer)
    import triton
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    grid = [(1, 32, 8, 128, 8192, 8192, 64), (1, 32, 8, 128, 8192, 8192, 16), (4, 32, 8, 128, 4096, 4096, 64),
            (4, 32, 8, 64, 4096, 4096, 64), (4, 32, 8, 128, 2048, 8192, 64)]
    summary = []
    for B, Hq, Hkv, D, q_len, L, P in grid:
        torch.manual_seed(0)
        c = make_case(B, Hq, Hkv, D, q_len, L, P)
        tf = lambda us: causal_flops(B, Hq, D, q_len, L) / us / 1e6  # noqa: E731
        name = f"B={B} {Hq}/{Hkv}/{D} q={q_len} L={L} P={P}"
        base = ours_call(c)()
        t_def = graph_ms(ours_call(c), warmup=10, rep=40) * 1e3
        line = f"{name}: ours default {t_def:.0f} us {tf(t_def):.0f} TF/s"
        t_fi = None
        if fi is not None:
            best = None
            for backend in ("fa3", "fa2"):
                try:
                    f = peer.gqa_prefill(fi, c["q"], c["k"], c["v"], c["table"], c["seqlens"], c["cu_q"],
                                                    c["scale"], backend)
                    err = rel_err(f(), base)
                    t = graph_ms(f, warmup=10, rep=40) * 1e3
                    if best is None or t < best[0]:
                        best = (t, backend, err)
                except Exception as exc:  # noqa: BLE001
                    print(f"  flashinfer {backend}: {type(exc).__name__}: {str(exc)[:120]}")
            if best:
                t_fi = best[0]
                line += f" | flashinfer {best[1]} {t_fi:.0f} us {tf(t_fi):.0f} TF/s (err vs ours {best[2]:.1e})"
        print(line, flush=True)
        results = []
        for cfg in configs(args.quick, args.desc):
            try:
                with tune.override("paged_attention", cfg):
                    err = rel_err(ours_call(c)(), base)
                    t = graph_ms(ours_call(c), warmup=10, rep=40) * 1e3
            except Exception as exc:  # noqa: BLE001  (out of shared memory / registers)
                print(f"  {cfg}: {type(exc).__name__} {str(exc)[:80]}")
                continue
            results.append((t, cfg))
            print(f"  {cfg}: {t:.0f} us {tf(t):.0f} TF/s x{t_def / t:.2f} vs default"
                  + (f", ours/FI {t_fi / t:.2f}" if t_fi else "") + f" err {err:.1e}", flush=True)
        if results:
            t, cfg = min(results, key=lambda r: r[0])
            summary.append((name, t_def, t, cfg, t_fi))
    print("\nsummary: case | default us | best us | best config | best/default | best ours/FlashInfer")
    for name, t_def, t, cfg, t_fi in summary:
        print(f"{name} | {t_def:.0f} | {t:.0f} | {cfg} | {t_def / t:.2f}x | "
              + (f"{t_fi / t:.2f}x" if t_fi else "-"))
    if all(s[4] for s in summary):
        print(f"geomean best ours/FlashInfer {math.exp(sum(math.log(s[4] / s[2]) for s in summary) / len(summary)):.2f}x")


if __name__ == "__main__":
    main()
