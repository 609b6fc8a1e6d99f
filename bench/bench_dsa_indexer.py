"""DeepSeek sparse attention (DSA) indexer logits benchmark: triton_xpu_attn.fp8_mqa_logits (prefill)
and fp8_paged_mqa_logits (decode) beside upstream's torch paths, DeepSeek-V3.2 indexer shapes
(64 heads of 128, fp8 e4m3 q and k, fp32 weights and per-key scales).

Prefill: one request of ``Nq`` new tokens over ``Nk`` keys (its ``Nk - Nq`` cached ones and
itself), causal (``ks = 0``, ``ke[i] = Nk - Nq + i + 1``), plus four requests packed in one call
(each row sees its own request's keys, causally). The torch path is sgl-kernel-xpu's
``sgl_kernel.nsa`` algorithm restated: ``torch._scaled_mm`` of the fp8 ``[Nq * H, D]`` queries by
the keys into ``[Nq * H, Nk]`` fp32, relu, weights, head sum, scales, range mask; above ``2^27``
products it loops over the heads (one ``[Nq, Nk]`` ``_scaled_mm`` each, accumulated), as upstream
does to bound memory. (On CUDA ``_scaled_mm`` takes the keys as a column-major view, ``k.t()``;
upstream's XPU code makes them row-major first, which CUDA rejects.)

Decode: ``B`` requests of ``ctx`` keys in a 64-token-page fp8 indexer cache (DeepGEMM's page
layout, random page order), ``next_n`` 1 or 2 query rows each (MTP), the causal rule of DeepGEMM.
The torch path is the vectorised one of sgl-kernel-xpu's tests (and sglang's
``fp8_paged_mqa_logits_torch``) restated: gather the table's pages, split keys and scales, keys to
fp32, one ``bmm`` with the queries, relu, weights, head sum, scales, length mask.

Times: CUDA-graph replays (eager calls beside them). ``ours TF/s`` counts the seen products only
(``2 H D`` per seen (row, key)); ``% fp8 peak`` against the H100 / H200 dense fp8 tensor peak, 1979
TFLOP/s (NVIDIA's data sheet: 3958 with 2:4 sparsity). Decode ``GB/s`` counts the cache bytes of
the seen keys (132 a key) + q + logits written, against the measured copy bandwidth. Each row checks
ours against the torch path (relative error over the whole output; both give 0 at unseen positions).
Target: >= 3x the torch path on every row.

usage:
  python bench/bench_dsa_indexer.py [--quick] [--cases prefill,decode] [--out DIR] [--time-budget S]

On a machine without a GPU a tiny case of each runs through the Triton interpreter (a smoke test;
the times mean nothing there).
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

import torch  # noqa: E402

from bench import common  # noqa: E402

FP8 = torch.float8_e4m3fn
#: dense fp8 tensor-core peak of the H100 SXM / H200 (TFLOP/s)
FP8_PEAK_TFLOPS = {"H100": 1979.0, "H200": 1979.0}
H, D, PAGE = 64, 128, 64
#: (label, Nq, Nk, requests)
PREFILL = [("1k/4k", 1024, 4096, 1), ("2k/16k", 2048, 16384, 1), ("4k/32k", 4096, 32768, 1),
           ("4k/64k", 4096, 65536, 1), ("8k/64k", 8192, 65536, 1), ("8k packed x4", 8192, 8192, 4)]
PREFILL_QUICK = [("1k/4k", 1024, 4096, 1), ("2k/16k", 2048, 16384, 1)]
DECODE_B = [1, 8, 32, 64, 128]
DECODE_CTX = [4096, 32768, 131072]
DECODE_QUICK = [(1, 1, 4096), (32, 1, 32768), (128, 2, 8192)]
#: upstream's threshold for its head loop (products in the [Nq * H, Nk] matrix)
HEAD_LOOP_THRESHOLD = 1 << 27


def fp8_peak() -> float:
    if _device.backend() != "cuda":
        return math.nan
    name = _device.device_name()
    return next((v for k, v in FP8_PEAK_TFLOPS.items() if k in name), math.nan)


def _fp8(shape, dev, gen) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=dev) * 2).clamp(-400, 400).to(FP8)


# ---- upstream's torch paths, restated ----


def torch_mqa_logits(q, k, k_scale, weights, ks, ke):
    """sgl-kernel-xpu's ``fp8_mqa_logits`` algorithm (``_scaled_mm``, head loop above 2^27 products)."""
    n_q, heads, d = q.shape
    n_k = k.shape[0]
    on_gpu = q.device.type in ("cuda", "xpu")
    scaled = on_gpu and n_k % 16 == 0 and d % 16 == 0
    one = torch.ones(1, dtype=torch.float32, device=q.device)
    if n_q * heads * n_k > HEAD_LOOP_THRESHOLD:
        score = torch.zeros(n_q, n_k, dtype=torch.float32, device=q.device)
        if scaled and n_q % 16 == 0:
            k_t = k.t()
            for h in range(heads):
                dots = torch._scaled_mm(q[:, h, :].contiguous(), k_t, scale_a=one, scale_b=one, out_dtype=torch.float32)
                score += dots.relu_() * weights[:, h: h + 1]
        else:
            q16, k16 = q.to(torch.bfloat16), k.to(torch.bfloat16).t().contiguous()
            for h in range(heads):
                score += torch.mm(q16[:, h, :].contiguous(), k16).float().relu_() * weights[:, h: h + 1]
        score *= k_scale
    else:
        q2 = q.reshape(n_q * heads, d)
        if scaled and (n_q * heads) % 16 == 0:
            dots = torch._scaled_mm(q2, k.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        else:
            dots = torch.mm(q2.to(torch.bfloat16), k.to(torch.bfloat16).t()).float()
        score = (dots.view(n_q, heads, n_k).relu() * weights.unsqueeze(-1)).sum(dim=1) * k_scale
    j = torch.arange(n_k, device=q.device, dtype=torch.int32).unsqueeze(0)
    return score * ((j >= ks.unsqueeze(1)) & (j < ke.unsqueeze(1)))


def torch_paged_mqa_logits(q, kv_cache, weights, seq_lens, block_tables, max_seq_len):
    """The vectorised torch path of sgl-kernel-xpu's tests (DeepGEMM's page layout), any next_n."""
    batch, next_n, heads, d = q.shape
    pages, page_size = kv_cache.shape[0], kv_cache.shape[1]
    width = block_tables.shape[1]
    flat = kv_cache.view(pages, -1)
    gathered = flat[block_tables.clamp(min=0)]  # [B, W, page bytes]
    keys = gathered[..., : page_size * d].contiguous().view(FP8).float().reshape(batch, width * page_size, d)
    scales = gathered[..., page_size * d:].contiguous().view(torch.float32).reshape(batch, width * page_size)
    scores = torch.bmm(keys, q.reshape(batch, next_n * heads, d).float().transpose(1, 2))  # [B, S, next_n * H]
    scores = scores.relu().view(batch, -1, next_n, heads) * weights.view(batch, 1, next_n, heads)
    scores = scores.sum(dim=3) * scales[:, :, None]  # [B, S, next_n]
    pos = torch.arange(width * page_size, device=q.device)[None, :, None]
    limit = seq_lens.view(batch, 1, 1) - next_n + torch.arange(next_n, device=q.device)[None, None, :] + 1
    scores = scores.masked_fill(pos >= limit, 0.0).transpose(1, 2).reshape(batch * next_n, -1)
    if scores.shape[1] < max_seq_len:
        return torch.nn.functional.pad(scores, (0, max_seq_len - scores.shape[1]))
    return scores[:, :max_seq_len].contiguous()


# ---- cases ----


def _time(fn):
    """(eager, graph-replayed) median microseconds; the cached blocks of the eager calls are handed
    back before the capture (the torch path's temporaries run to tens of GB at 128k contexts)."""
    eager = common.bench_ms(fn, warmup=5, rep=40, repeats=1) * 1e3
    common.free_memory()
    graph = common.graph_ms(fn, warmup=5, rep=40) * 1e3
    return eager, graph


def _best(eager, graph):
    return graph if graph == graph else eager


def prefill_case(label, n_q, n_k, requests, dev, heads=H, d=D):
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k = _fp8((n_q, heads, d), dev, gen), _fp8((n_k, d), dev, gen)
    k_scale = torch.rand(n_k, generator=gen, device=dev) + 0.5
    w = torch.rand(n_q, heads, generator=gen, device=dev) / heads
    # `requests` requests of n_q / requests new tokens each over its own n_k / requests keys, causal
    per_q, per_k = n_q // requests, n_k // requests
    r = torch.arange(n_q, device=dev) // per_q
    i = torch.arange(n_q, device=dev) % per_q
    ks = (r * per_k).to(torch.int32)
    ke = (r * per_k + per_k - per_q + i + 1).to(torch.int32)
    seen = int((ke.long() - ks.long()).clamp(min=0).sum())
    flops = 2 * heads * d * seen
    row = dict(case="prefill", shape=label, Nq=n_q, Nk=n_k, H=heads, D=d, flops=flops,
               bytes=q.numel() + k.numel() + 4 * (n_k + n_q * heads + n_q * n_k))
    holder = {}

    def ours_fn():
        holder["o"] = ours.fp8_mqa_logits(q, (k, k_scale), w, ks, ke)

    def torch_fn():
        holder["t"] = torch_mqa_logits(q, k, k_scale, w, ks, ke)

    return _run(row, ours_fn, torch_fn, holder)


def decode_case(batch, next_n, ctx, dev, heads=H, d=D, page=PAGE):
    gen = torch.Generator(device=dev).manual_seed(1)
    width = -(-ctx // page)
    pages = batch * width + 1
    raw = torch.empty(pages, page * (d + 4), dtype=torch.uint8, device=dev)
    raw[:, : page * d] = _fp8((pages, page * d), dev, gen).view(torch.uint8)
    raw[:, page * d:] = (torch.rand(pages, page, generator=gen, device=dev) + 0.5).view(torch.uint8)
    cache = raw.view(pages, page, 1, d + 4)
    table = (torch.randperm(pages - 1, generator=gen, device=dev)[: batch * width] + 1).view(batch, width).to(torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    q = _fp8((batch, next_n, heads, d), dev, gen)
    w = torch.rand(batch * next_n, heads, generator=gen, device=dev) / heads
    seen = batch * sum(ctx - next_n + r + 1 for r in range(next_n))
    row = dict(case="decode", shape=f"B{batch} n{next_n} ctx{ctx // 1024}k", B=batch, next_n=next_n, ctx=ctx, H=heads,
               D=d, flops=2 * heads * d * seen,
               bytes=batch * ctx * (d + 4) + q.numel() + 4 * (w.numel() + batch * next_n * width * page))
    holder = {}

    def ours_fn():
        holder["o"] = ours.fp8_paged_mqa_logits(q, cache, w, lens, table, None, width * page)

    def torch_fn():
        holder["t"] = torch_paged_mqa_logits(q, cache, w, lens, table, width * page)

    return _run(row, ours_fn, torch_fn, holder)


def _run(row, ours_fn, torch_fn, holder):
    try:
        ours_fn()
        row["ours_eager_us"], row["ours_us"] = _time(ours_fn)
    except Exception as exc:  # noqa: BLE001  (out of memory / resources: keep the grid going)
        row["ours_error"] = repr(exc)[:160]
        return row
    ms = _best(row["ours_eager_us"], row["ours_us"]) / 1e3
    row.update(time_us=ms * 1e3, ours_tflops=row["flops"] / ms / 1e9, ours_gbs=row["bytes"] / ms / 1e6)
    row["ours_pct_fp8_peak"] = 100 * row["ours_tflops"] / fp8_peak()
    try:
        torch_fn()
        row["err_vs_torch"] = common.rel_err(holder["o"], holder["t"])
        holder.pop("t", None)
        common.free_memory()
        row["torch_eager_us"], row["torch_us"] = _time(torch_fn)
        row["speedup_vs_torch"] = _best(row["torch_eager_us"], row["torch_us"]) / (ms * 1e3)
    except Exception as exc:  # noqa: BLE001  (the torch path runs out of memory first)
        row["torch_error"] = repr(exc)[:160]
    holder.clear()
    common.free_memory()
    return row


def fmt(row):
    head = f"{row['case']:<7} {row['shape']:<16}"
    if "ours_error" in row:
        return f"{head} | ours: ERROR {row['ours_error']}"
    text = (f"{head} | ours {row['ours_us']:10.1f} us (eager {row['ours_eager_us']:.1f}) {row['ours_tflops']:7.1f} TF/s "
            f"({row['ours_pct_fp8_peak']:.1f}% fp8 peak) {row['ours_gbs']:7.0f} GB/s")
    if "torch_error" in row:
        return text + f" | torch: ERROR {row['torch_error']}"
    return text + (f" | torch {_best(row['torch_eager_us'], row['torch_us']):10.1f} us | x{row['speedup_vs_torch']:.2f} "
                   f"| err {row['err_vs_torch']:.1e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few rows of each (on CPU: one tiny interpreter case each)")
    ap.add_argument("--cases", default="prefill,decode", help="comma list of prefill, decode")
    ap.add_argument("--out", default=str(common.RESULTS_DIR), help="results folder (a <device_key>/ folder is made in it)")
    ap.add_argument("--time-budget", type=float, default=None, metavar="S", help="start no new row after S seconds")
    args = ap.parse_args(argv)
    cases = set(args.cases.split(","))

    dev = _device.default_device()
    interp = dev.type == "cpu"
    jobs = []
    if "prefill" in cases:
        if interp:
            jobs.append(lambda: prefill_case("tiny", 32, 64, 2, dev, heads=4, d=32))
        else:
            for label, n_q, n_k, reqs in PREFILL_QUICK if args.quick else PREFILL:
                jobs.append(lambda a=(label, n_q, n_k, reqs): prefill_case(*a, dev))
    if "decode" in cases:
        if interp:
            jobs.append(lambda: decode_case(2, 2, 40, dev, heads=4, d=32, page=16))
        else:
            grid = DECODE_QUICK if args.quick else [(b, n, c) for c in DECODE_CTX for n in (1, 2) for b in DECODE_B]
            for b, n, c in grid:
                jobs.append(lambda a=(b, n, c): decode_case(*a, dev))
    print(common.header(), flush=True)
    print(f"command: {common.command_line()}", flush=True)
    common.set_time_budget(args.time_budget)
    rows = []
    for index, job in enumerate(jobs):
        if common.out_of_time():
            print(f"stopped after {index} of {len(jobs)} rows: time budget spent", flush=True)
            break
        rows.append(job())
        print(fmt(rows[-1]), flush=True)

    def cell(r, k, spec):
        return format(r[k], spec) if k in r and r[k] == r[k] else "-"

    table = ("| case | shape | ours us (eager) | ours TF/s | % fp8 peak | ours GB/s | torch us (eager) | ours/torch | "
             "rel err |\n|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        table += (f"| {r['case']} | {r['shape']} | {cell(r, 'ours_us', '.1f')} ({cell(r, 'ours_eager_us', '.1f')}) | "
                  f"{cell(r, 'ours_tflops', '.1f')} | {cell(r, 'ours_pct_fp8_peak', '.1f')} | {cell(r, 'ours_gbs', '.0f')} | "
                  f"{cell(r, 'torch_us', '.1f')} ({cell(r, 'torch_eager_us', '.1f')}) | "
                  f"{cell(r, 'speedup_vs_torch', '.2f')} | {cell(r, 'err_vs_torch', '.1e')} |\n")
    errors = [fmt(r) for r in rows if "ours_error" in r or "torch_error" in r]
    if errors:
        table += "\nErrors:\n\n" + "\n".join(f"- {e}" for e in errors) + "\n"
    summary = []
    for case in ("prefill", "decode"):
        line = common.speedup_line([r for r in rows if r["case"] == case], "speedup_vs_torch",
                                   f"{case}: ours / upstream torch path", "target >= 3x every row")
        if line:
            summary.append(line)
    print("\n" + table)
    for line in summary:
        print(line)
    common.write_results(
        "dsa_indexer", rows, out=args.out, quick=args.quick or interp,
        title=f"DSA indexer logits (fp8, H {H}, D {D}), ours vs upstream's torch paths",
        notes=__doc__.split("\n\n")[4], summary=summary, table=table,
        headline_kw=dict(speedup="speedup_vs_torch", peer="upstream torch path"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
