"""Self-check: ``python -m triton_xpu_attn``.

Detects the backend, runs every op of the package on a small random problem against the
float64 reference and prints one row per op (backend, device, config source, max relative error,
time). Exits 1 on any mismatch. Works on an Intel GPU, an NVIDIA GPU and a CPU (interpreter).
"""
from __future__ import annotations

import os
import sys
import time

import triton_xpu_attn as tx  # first: selects the interpreter on a machine without a GPU

import torch  # noqa: E402

from triton_xpu_attn import device as _device  # noqa: E402
from triton_xpu_attn import reference as ref  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402


def _max_rel(out, expected) -> float:
    """max |out - ref| / max |ref| (0 for exactly equal integer results)."""
    out = out.detach().double().cpu()
    expected = expected.detach().double().cpu()
    if out.shape != expected.shape:
        return float("inf")
    if torch.isnan(out).any():
        return float("nan")
    scale = expected.abs().max().item() if expected.numel() else 0.0
    diff = (out - expected).abs().max().item() if expected.numel() else 0.0
    return diff / scale if scale > 0 else diff


def _timed(fn):
    fn()  # warm-up: compiles on a GPU
    if _device.backend() == "cuda":
        torch.cuda.synchronize()
    elif _device.backend() == "xpu":
        torch.xpu.synchronize()
    start = time.perf_counter()
    result = fn()
    if _device.backend() == "cuda":
        torch.cuda.synchronize()
    elif _device.backend() == "xpu":
        torch.xpu.synchronize()
    return result, (time.perf_counter() - start) * 1e3


def _paged_problem(dev, dtype, gen, q_lens, kv_lens, page_size=16, hq=8, hkv=2, d=128):
    pages = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(pages) + 1
    k = torch.randn(num_pages, page_size, hkv, d, generator=gen).to(dtype)
    v = torch.randn(num_pages, page_size, hkv, d, generator=gen).to(dtype)
    perm = torch.randperm(num_pages - 1, generator=gen) + 1
    table = torch.zeros(len(kv_lens), max(pages), dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[used : used + n]
        used += n
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=gen).to(dtype)
    seqlens = torch.tensor(kv_lens, dtype=torch.int32)
    return q, k, v, table, cu, seqlens


def check_paged_attention(dev, dtype, gen):
    q, k, v, table, cu, seqlens = _paged_problem(dev, dtype, gen, [1, 5, 1], [70, 33, 129])
    kw = dict(causal=True, window_size=(40, 0), softcap=20.0)
    out, ms = _timed(lambda: tx.flash_attn_with_kvcache(
        q.to(dev), k.to(dev), v.to(dev), cache_seqlens=seqlens.to(dev), page_table=table.to(dev),
        cu_seqlens_q=cu.to(dev), max_seqlen_q=5, **kw))
    expected, _ = ref.paged_attention(q, k, v, seqlens, table, cu, **kw)
    return _max_rel(out, expected), ms


def check_varlen_attention(dev, dtype, gen):
    # two prompts of 37 and 80 tokens (causal over their own keys), D = 192 / Dv = 128 as MLA extend
    cu = torch.tensor([0, 37, 117], dtype=torch.int32)
    q = torch.randn(117, 8, 192, generator=gen).to(dtype)
    k = torch.randn(117, 2, 192, generator=gen).to(dtype)
    v = torch.randn(117, 2, 128, generator=gen).to(dtype)
    out, ms = _timed(lambda: tx.flash_attn_varlen_func(q.to(dev), k.to(dev), v.to(dev), cu.to(dev), cu.to(dev), 80, 80,
                                                       causal=True))
    expected, _ = ref.varlen_attention(q, k, v, cu, cu, causal=True)
    return _max_rel(out, expected), ms


def check_merge_state(dev, dtype, gen, name="merge_state_v2"):
    """``merge_state_v2`` (natural-log LSEs) or, with ``name="merge_state"``, v1 (base 2)."""
    v_a, v_b = (torch.randn(6, 4, 128, generator=gen).to(dtype) for _ in range(2))
    s_a, s_b = (torch.randn(6, 4, generator=gen) for _ in range(2))
    (v, s), ms = _timed(lambda: getattr(tx, name)(v_a.to(dev), s_a.to(dev), v_b.to(dev), s_b.to(dev)))
    v_ref, s_ref = getattr(ref, name)(v_a, s_a, v_b, s_b)
    return max(_max_rel(v, v_ref), _max_rel(s, s_ref)), ms


def check_normalize_page_table(dev, dtype, gen):
    page_size = 16
    slots = (torch.randperm(40, generator=gen)[:24] + 1).view(3, 8)[:, :, None] * page_size + torch.arange(page_size)
    req_to_token = slots.reshape(3, -1).to(torch.int32)
    seq_lens = torch.tensor([100, 7, 128], dtype=torch.int32)
    rpi = torch.tensor([2, 0, 1])
    out, ms = _timed(lambda: tx.normalize_page_table(req_to_token.to(dev), rpi.to(dev), seq_lens.to(dev), page_size))
    return _max_rel(out, ref.normalize_page_table(req_to_token, rpi, seq_lens, page_size)), ms


def check_translate_loc(dev, dtype, gen):
    mapping = torch.randint(0, 1000, (300,), generator=gen, dtype=torch.int64)
    mapping[-1] = -1
    locs = torch.randint(-1, 299, (4, 33), generator=gen, dtype=torch.int64)
    out, ms = _timed(lambda: tx.translate_loc_from_full_to_swa(mapping.to(dev), locs.to(dev)))
    return _max_rel(out, ref.translate_loc_from_full_to_swa(mapping, locs)), ms


def check_local_attention(dev, dtype, gen):
    chunk, page_size = 32, 16
    qsl = torch.tensor([0, 40, 41, 90], dtype=torch.int32)
    seq_lens = torch.tensor([100, 17, 130], dtype=torch.int32)
    table = torch.randint(1, 500, (3, 9), generator=gen, dtype=torch.int32)
    got, ms = _timed(lambda: tx.make_local_attention_virtual_batches(chunk, qsl.to(dev), seq_lens.to(dev), table.to(dev), page_size))
    want = ref.make_local_attention_virtual_batches(chunk, qsl.numpy(), seq_lens.numpy(), table, page_size)
    return max(_max_rel(torch.as_tensor(g).to(torch.int64), torch.as_tensor(w).to(torch.int64)) for g, w in zip(got, want)), ms


def check_swa_spec(dev, dtype, gen):
    ndt = 3
    a = torch.randint(0, 200, (2, 12), generator=gen, dtype=torch.int32)
    b = torch.randint(0, 200, (2 * ndt, ndt), generator=gen, dtype=torch.int32)
    la = torch.tensor([9, 12], dtype=torch.int32)
    lb = torch.tensor([1, 2, 2, 1, 3, 2], dtype=torch.int32)
    mapping = torch.randint(0, 100, (201,), generator=gen, dtype=torch.int64)
    mapping[-1] = -1
    dst = torch.zeros(2 * ndt, 16, dtype=torch.int32)
    want = ref.prepare_swa_spec_page_table(dst, a, b, la, lb, ndt, full_to_swa=mapping)

    def run():
        d = torch.zeros(2 * ndt, 16, dtype=torch.int32, device=dev)
        tx.prepare_swa_spec_page_table(d, a.to(dev), b.to(dev), la.to(dev), lb.to(dev), ndt, full_to_swa=mapping.to(dev))
        return d

    got, ms = _timed(run)
    return _max_rel(got, want), ms


def check_mla_decode(dev, dtype, gen):
    batch, heads, page_size, r, dr = 2, 16, 16, 512, 64
    seq = torch.tensor([70, 150], dtype=torch.int32)
    n = -(-150 // page_size)
    cache = torch.randn(2 * n + 1, page_size, r + dr, generator=gen).to(dtype)
    table = (torch.randperm(2 * n, generator=gen) + 1).view(2, n).to(torch.int32)
    q = torch.randn(batch, heads, r + dr, generator=gen).to(dtype)
    scale = 192**-0.5
    size = tx.flash_mla_get_workspace_size(150, batch, heads, page_size, 4)
    ws = torch.empty(size, dtype=torch.uint8, device=dev)
    out, ms = _timed(lambda: tx.flash_mla_decode(
        q[..., :r].to(dev), q[..., r:].to(dev), cache.to(dev), seq.to(dev), table.to(dev), ws, scale, num_kv_splits=4))
    expected, _ = ref.mla_decode(q[..., :r], q[..., r:], cache, seq, table, scale)
    return _max_rel(out, expected), ms


def check_mla_prefill(dev, dtype, gen):
    heads, page_size, r, dr = 16, 16, 512, 64
    cu = torch.tensor([0, 40, 43], dtype=torch.int32)  # a full prefill and a 3-token chunk over a prefix
    seq = torch.tensor([40, 150], dtype=torch.int32)
    n = -(-150 // page_size)
    cache = torch.randn(2 * n + 1, page_size, r + dr, generator=gen).to(dtype)
    table = (torch.randperm(2 * n, generator=gen) + 1).view(2, n).to(torch.int32)
    q = torch.randn(43, heads, r + dr, generator=gen).to(dtype)
    scale = 192**-0.5
    out, ms = _timed(lambda: tx.flash_mla_prefill(
        q[..., :r].to(dev), q[..., r:].to(dev), cache.to(dev), cu.to(dev), seq.to(dev), 40, table.to(dev), None, scale))
    expected, _ = ref.mla_prefill(q[..., :r], q[..., r:], cache, cu, seq, table, scale)
    return _max_rel(out, expected), ms


def check_mla_sparse(dev, dtype, gen):
    tokens, heads, s_kv, topk, d_qk = 3, 16, 40, 24, 576
    q = torch.randn(tokens, heads, d_qk, generator=gen).to(dtype)
    kv = torch.randn(s_kv, 1, d_qk, generator=gen).to(dtype)
    indices = torch.randint(-1, s_kv, (tokens, 1, topk), generator=gen, dtype=torch.int32)  # -1: padding
    scale = d_qk**-0.5
    (out, _, _), ms = _timed(lambda: tx.flash_mla_sparse_fwd(q.to(dev), kv.to(dev), indices.to(dev), scale))
    expected, _, _ = ref.mla_sparse_fwd(q, kv, indices, scale)
    return _max_rel(out, expected), ms


def check_mla_sparse_decode(dev, dtype, gen):
    batch, q_len, heads, pages, page, topk, d_qk = 2, 2, 16, 6, 4, 20, 576
    q = torch.randn(batch, q_len, heads, d_qk, generator=gen).to(dtype)
    cache = torch.randn(pages, page, 1, d_qk, generator=gen).to(dtype)
    extra = torch.randn(3, 2, 1, d_qk, generator=gen).to(dtype)
    indices = torch.randint(-1, pages * page, (batch, q_len, topk), generator=gen, dtype=torch.int32)  # -1: padding
    extra_indices = torch.randint(-1, 6, (batch, q_len, 5), generator=gen, dtype=torch.int32)
    (out, _), ms = _timed(lambda: tx.flash_mla_with_kvcache(
        q.to(dev), cache.to(dev), indices=indices.to(dev), extra_k_cache=extra.to(dev),
        extra_indices_in_kvcache=extra_indices.to(dev)))
    expected, _ = ref.mla_sparse_decode(q, cache, indices, extra_k_cache=extra, extra_indices=extra_indices)
    return _max_rel(out, expected), ms


CHECKS = [
    ("flash_attn_with_kvcache", "paged_attention", check_paged_attention, True),
    ("flash_attn_varlen_func", "paged_attention", check_varlen_attention, True),
    ("merge_state_v2", None, check_merge_state, True),
    ("merge_state", None, lambda dev, dtype, gen: check_merge_state(dev, dtype, gen, "merge_state"), True),
    ("normalize_page_table", None, check_normalize_page_table, False),
    ("translate_loc_from_full_to_swa", None, check_translate_loc, False),
    ("make_local_attention_virtual_batches", None, check_local_attention, False),
    ("prepare_swa_spec_page_table", None, check_swa_spec, False),
    ("flash_mla_decode", "mla_decode", check_mla_decode, True),
    ("flash_mla_prefill", "mla_prefill", check_mla_prefill, True),
    ("flash_mla_sparse_fwd", "mla_sparse", check_mla_sparse, True),
    ("flash_mla_with_kvcache", "mla_sparse_decode", check_mla_sparse_decode, True),
]


def main() -> int:
    info = _device.describe()
    dev = _device.default_device()
    # the interpreter's bf16 arithmetic is broken upstream: fp32 there, bf16 on GPUs
    dtype = torch.float32 if info["backend"] == "interpreter" else torch.bfloat16
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    if info["backend"] == "interpreter":
        # under the interpreter the count is the split heuristics' assumption, not this machine's
        units = (f"{info['compute_units']} nominal compute units, what split counts assume here; "
                 f"{os.cpu_count()} CPU cores")
    else:
        units = f"{info['compute_units']} compute units"
    print(f"triton_xpu_attn {tx.__version__} | backend {info['backend']} | device {info['device']} "
          f"({units}) | triton {info['triton']} | torch {info['torch']}")
    header = f"{'op':38} {'backend':11} {'device':28} {'config source':34} {'max rel err':>11} {'time ms':>9}  ok"
    print(header)
    print("-" * len(header))
    failures = 0
    for name, config_op, check, floating in CHECKS:
        gen = torch.Generator().manual_seed(0)
        try:
            err, ms = check(dev, dtype, gen)
            ok = err == err and err <= (tolerance if floating else 0.0)
        except Exception as exc:  # report and go on: one broken op must not hide the others
            err, ms, ok = float("nan"), float("nan"), False
            print(f"{name}: {type(exc).__name__}: {exc}")
        failures += not ok
        source = tune.LAST_SOURCE.get(config_op, "-") if config_op else "-"
        print(f"{name:38} {info['backend']:11} {info['device'][:28]:28} {source[:34]:34} {err:11.2e} {ms:9.2f}  "
              f"{'yes' if ok else 'NO'}")
    print(f"{len(CHECKS) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
