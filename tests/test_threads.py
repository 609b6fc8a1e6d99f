"""Concurrent calls from several Python threads: four threads running the ops at once
get the results one thread gets, compiled (launches run concurrently) and under Triton's
interpreter (whose launches take turns: ``_common.device_guard``)."""
from __future__ import annotations

import threading

import torch

from helpers import DEVICE
from triton_xpu_attn import flash_attn_varlen_func, flash_attn_with_kvcache, flash_mla_decode, merge_state_v2

THREADS = 4


def _problems(seed: int) -> dict:
    """Small inputs of three ops, different per seed."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen).to(DEVICE)  # noqa: E731
    i32 = lambda values: torch.tensor(values, dtype=torch.int32, device=DEVICE)  # noqa: E731
    return dict(
        paged=dict(q=r(3, 4, 64), k_cache=r(6, 4, 2, 64), v_cache=r(6, 4, 2, 64), cache_seqlens=i32([5, 7]),
                   page_table=i32([[3, 1], [5, 2]]), cu_seqlens_q=i32([0, 1, 3]), causal=True, num_splits=2),
        varlen=dict(q=r(5, 4, 64), k=r(9, 2, 64), v=r(9, 2, 64), cu_seqlens_q=i32([0, 2, 5]), cu_seqlens_k=i32([0, 4, 9]),
                    max_seqlen_q=3, max_seqlen_k=5, causal=True),
        mla=dict(q_nope=r(2, 3, 32), q_pe=r(2, 3, 16), kv_c_and_k_pe_cache=r(4, 4, 48), seq_lens=i32([3, 6]),
                 page_table=i32([[2, 0], [1, 3]]), workspace=None, sm_scale=0.2, num_kv_splits=1),
        merge=dict(v_a=r(3, 2, 16), s_a=r(3, 2), v_b=r(3, 2, 16), s_b=r(3, 2)),
    )


def _run(p: dict) -> list:
    return [
        flash_attn_with_kvcache(**p["paged"]),
        flash_attn_varlen_func(**p["varlen"]),
        flash_mla_decode(**p["mla"]),
        *merge_state_v2(**p["merge"]),
    ]


def test_four_threads_get_the_single_thread_results():
    problems = [_problems(seed) for seed in range(THREADS)]
    expected = [_run(p) for p in problems]
    got, errors = [None] * THREADS, []
    start = threading.Barrier(THREADS)

    def worker(i: int) -> None:
        try:
            start.wait()
            for _ in range(3):  # several rounds, so the calls overlap
                got[i] = _run(problems[i])
        except Exception as exc:  # noqa: BLE001  (reported below, with its thread)
            errors.append((i, repr(exc)))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"threads failed: {errors}"
    for i in range(THREADS):
        for a, b in zip(got[i], expected[i]):
            assert torch.equal(a, b), f"thread {i}: a result differs from the single-thread run"
