"""``make_local_attention_virtual_batches`` as sglang calls it, and CPU inputs on a
machine whose kernels run on a GPU.

* sglang's keyword names (``query_start_loc_np``, ``seq_lens_np``) and ``preserve_attn_chunk_size``
  with sglang's meaning (``False``: its sequence-length-based chunk normalization, bit for bit);
* CPU in, CPU out: with a GPU backend, CPU inputs take the host path, which equals the kernels
  (run here through the interpreter) and the reference, numpy return types included;
* every other op given CPU tensors under a GPU backend raises ``ValueError`` naming the tensor
  and both devices (one check in ``_common.check_same_device``), never Triton's "cannot be
  accessed from Triton (cpu tensor?)".

On this CPU machine the GPU backend is pretended (``device.backend`` patched to ``cuda``): the
device check and the host path run before anything would launch. The ``gpu`` tests do the same
with the real backend.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import triton_xpu_attn as tx
from helpers import DEVICE, INTERPRET, poison
from triton_xpu_attn import device as _device
from triton_xpu_attn import make_local_attention_virtual_batches, max_local_attention_virtual_batches
from triton_xpu_attn import reference as ref

CPU = torch.device("cpu")


@pytest.fixture
def gpu_backend(monkeypatch):
    """Pretend the kernels run on CUDA (nothing may launch: a launch on CPU tensors would fail)."""
    monkeypatch.setattr(_device, "backend", lambda: "cuda")
    monkeypatch.setattr(_device, "default_device", lambda: torch.device("cuda"))


def _lists(outputs):
    return [np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x).tolist() for x in outputs]


def _sglang_chunk(chunk: int, seq_lens, page_size: int) -> int:
    """sglang's normalization (local_attention.py, preserve_attn_chunk_size=False), restated."""
    effective = min(chunk, int(np.max(seq_lens)))
    return max(page_size, effective // page_size * page_size)


# ---------------------------------------------------------------------------------------------
# sglang's call
# ---------------------------------------------------------------------------------------------


def _short_prompt(**kwargs):
    """sglang's short-prompt case: one 1000-token prefill, chunk 8192, 16-token pages."""
    return make_local_attention_virtual_batches(
        attn_chunk_size=8192,
        query_start_loc_np=np.array([0, 1000], dtype=np.int32),
        seq_lens_np=np.array([1000], dtype=np.int32),
        block_table=torch.arange(128, dtype=torch.int32).reshape(1, 128).to(DEVICE),
        page_size=16,
        **kwargs,
    )


def test_sglang_keywords_and_preserved_chunk():
    q_lens, cu, k_lens, table = _short_prompt(preserve_attn_chunk_size=True)
    assert all(isinstance(x, np.ndarray) and x.dtype == np.int32 for x in (q_lens, cu, k_lens))
    assert q_lens.tolist() == [1000] and cu.tolist() == [0, 1000] and k_lens.tolist() == [1000]
    assert isinstance(table, torch.Tensor) and table.shape == (1, 512)
    assert torch.equal(table[0, :128].cpu(), torch.arange(128, dtype=torch.int32))
    # our default keeps the chunk too
    assert _lists(_short_prompt()) == _lists((q_lens, cu, k_lens, table))


def test_preserve_false_is_sglangs_chunk_normalization():
    q_lens, cu, k_lens, table = _short_prompt(preserve_attn_chunk_size=False)
    # the chunk becomes 1000 // 16 * 16 = 992: two virtual batches, 62 pages wide (the second from page 62)
    assert q_lens.tolist() == [992, 8] and cu.tolist() == [0, 992, 1000] and k_lens.tolist() == [992, 8]
    assert table.shape == (2, 62)
    assert torch.equal(table.cpu(), torch.arange(124).view(2, 62).to(torch.int32))


@given(
    page_size=st.sampled_from([1, 2, 4, 16]),
    pages_per_chunk=st.integers(1, 4),
    batch=st.integers(1, 3),
    data=st.data(),
)
def test_preserve_false_equals_the_reference_at_sglangs_chunk(page_size, pages_per_chunk, batch, data):
    chunk = page_size * pages_per_chunk
    q_lens = data.draw(st.lists(st.integers(0, 2 * chunk), min_size=batch, max_size=batch))
    seq_lens = [q + data.draw(st.integers(0, 2 * chunk)) for q in q_lens]
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    max_pages = -(-max(seq_lens) // page_size) + 1
    table = torch.randint(0, 100, (batch, max_pages), dtype=torch.int32)
    got = make_local_attention_virtual_batches(
        chunk, query_start_loc_np=qsl, seq_lens_np=np.asarray(seq_lens, np.int32), block_table=table.to(DEVICE),
        page_size=page_size, preserve_attn_chunk_size=False,
    )
    effective = _sglang_chunk(chunk, seq_lens, page_size)
    assert _lists(got) == _lists(ref.make_local_attention_virtual_batches(effective, qsl, seq_lens, table, page_size))


def test_argument_spellings():
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10).to(DEVICE)
    qsl, seq = np.array([0, 4, 14, 19]), np.array([6, 17, 9])
    ours = make_local_attention_virtual_batches(4, qsl, seq, bt, 2)
    theirs = make_local_attention_virtual_batches(4, query_start_loc_np=qsl, seq_lens_np=seq, block_table=bt, page_size=2)
    assert _lists(ours) == _lists(theirs)
    with pytest.raises(TypeError, match="query_start_loc or query_start_loc_np"):
        make_local_attention_virtual_batches(4, qsl, seq, bt, 2, query_start_loc_np=qsl)
    with pytest.raises(TypeError, match="missing seq_lens"):
        make_local_attention_virtual_batches(4, qsl, block_table=bt, page_size=2)
    with pytest.raises(ValueError, match="preserve_attn_chunk_size=False"):
        make_local_attention_virtual_batches(4, qsl, seq, bt, 2, preserve_attn_chunk_size=False, max_virtual_batches=8)


# ---------------------------------------------------------------------------------------------
# CPU in, CPU out under a GPU backend
# ---------------------------------------------------------------------------------------------


def _draw(data, chunk, batch, valid):
    q_lens = data.draw(st.lists(st.integers(0, 3 * chunk), min_size=batch, max_size=batch))
    if valid:
        seq_lens = [q + data.draw(st.integers(0, 3 * chunk)) for q in q_lens]
    else:  # also fewer keys than queries and negative lengths: both paths clamp the same way
        seq_lens = data.draw(st.lists(st.integers(-2, 4 * chunk), min_size=batch, max_size=batch))
    return q_lens, seq_lens


@given(
    page_size=st.sampled_from([1, 2, 4, 16]),
    pages_per_chunk=st.integers(1, 3),
    batch=st.integers(0, 4),
    mode=st.sampled_from(["eager", "graph", "graph_out", "graph_short"]),
    numpy_inputs=st.booleans(),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    valid=st.booleans(),
    data=st.data(),
)
def test_host_path_equals_the_kernels(page_size, pages_per_chunk, batch, mode, numpy_inputs, index_dtype,
                                      valid, data):
    chunk = page_size * pages_per_chunk
    q_lens, seq_lens = _draw(data, chunk, batch, valid)
    qsl = np.concatenate([[data.draw(st.integers(0, 3))], q_lens]).cumsum()
    need = -(-max(seq_lens, default=0) // page_size) if valid else 0
    max_pages = need + data.draw(st.integers(0, 2))
    table = torch.randint(0, 1000, (batch, max_pages), dtype=index_dtype)
    if data.draw(st.booleans()):
        table = table.t().contiguous().t()  # column stride != 1
    bound = max_local_attention_virtual_batches(batch, int(sum(q_lens)), chunk)
    kwargs = {}
    m = None
    if mode != "eager":
        m = max(batch, bound // 2) if mode == "graph_short" else bound + data.draw(st.integers(0, 2))
        kwargs["max_virtual_batches"] = m

    def call(device):
        kw = dict(kwargs)
        if mode == "graph_out":
            kw["out"] = tuple(poison(torch.empty(s, dtype=torch.int32, device=device))
                              for s in ((m,), (m + 1,), (m,), (m, pages_per_chunk)))
        if numpy_inputs:
            lens = (qsl.astype(np.int64), np.asarray(seq_lens, dtype=np.int32))
        else:
            lens = (torch.tensor(qsl, dtype=index_dtype, device=device), torch.tensor(seq_lens, dtype=index_dtype, device=device))
        return make_local_attention_virtual_batches(chunk, *lens, table.to(device), page_size, validate=valid and mode != "graph_short", **kw)

    kernels = call(DEVICE)  # this machine: the interpreter (a GPU machine: the GPU)
    with pytest.MonkeyPatch.context() as patch:  # a fresh patch per drawn example
        patch.setattr(_device, "backend", lambda: "cuda")
        host = call(CPU)
    assert _lists(host) == _lists(kernels)
    assert all(x.device == CPU for x in host if isinstance(x, torch.Tensor))
    if numpy_inputs:
        assert all(isinstance(x, np.ndarray) and x.dtype == np.int32 for x in host[:3])
    else:
        assert all(x.dtype == torch.int32 for x in host)
    if valid and mode != "graph_short":
        expected = ref.make_local_attention_virtual_batches(chunk, qsl, seq_lens, table, page_size, max_virtual_batches=m)
        assert _lists(host) == _lists(expected)


def test_host_path_validates(gpu_backend):
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10)
    qsl, seq = torch.tensor([0, 4, 14, 19]), torch.tensor([6, 17, 9])
    with pytest.raises(ValueError, match="the batch needs 8 virtual batches, more than max_virtual_batches = 5"):
        make_local_attention_virtual_batches(4, qsl, seq, bt, 2, max_virtual_batches=5, validate=True)
    with pytest.raises(ValueError, match=r"block_table entry 22 \(virtual batch 6, column 0\) is outside the page pool"):
        make_local_attention_virtual_batches(4, qsl, seq, bt, 2, validate=True, num_pages=20)


# ---------------------------------------------------------------------------------------------
# every other op: CPU tensors under a GPU backend raise ValueError naming the tensor and both devices
# ---------------------------------------------------------------------------------------------


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _mapping():
    m = torch.arange(40, dtype=torch.int64)
    m[-1] = -1
    return m


CPU_CALLS = {
    "flash_attn_with_kvcache": ("q", lambda: tx.flash_attn_with_kvcache(
        torch.zeros(2, 1, 4, 64), torch.zeros(6, 4, 2, 64), torch.zeros(6, 4, 2, 64),
        cache_seqlens=_i32([3, 5]), page_table=_i32([[0, 1], [2, 3]]))),
    "flash_attn_varlen_func": ("q", lambda: tx.flash_attn_varlen_func(
        torch.zeros(5, 4, 64), torch.zeros(7, 2, 64), torch.zeros(7, 2, 64), _i32([0, 2, 5]), _i32([0, 3, 7]), 3, 4,
        causal=True)),
    "flash_mla_decode": ("q_nope", lambda: tx.flash_mla_decode(
        torch.zeros(2, 3, 32), torch.zeros(2, 3, 16), torch.zeros(4, 4, 48), _i32([3, 5]), _i32([[0, 1], [2, 3]]),
        None, 0.1, 1)),
    "flash_mla_prefill": ("q_nope", lambda: tx.flash_mla_prefill(
        torch.zeros(5, 3, 32), torch.zeros(5, 3, 16), torch.zeros(4, 4, 48), _i32([0, 2, 5]), _i32([3, 5]), 3,
        _i32([[0, 1], [2, 3]]), None, 0.1)),
    "flash_mla_with_kvcache": ("q", lambda: tx.flash_mla_with_kvcache(
        torch.zeros(2, 1, 4, 64), torch.zeros(3, 4, 1, 64), head_dim_v=32, indices=torch.zeros(2, 1, 3, dtype=torch.int32))),
    "flash_mla_sparse_fwd": ("q", lambda: tx.flash_mla_sparse_fwd(
        torch.zeros(2, 4, 64), torch.zeros(5, 1, 64), torch.zeros(2, 1, 3, dtype=torch.int32), 0.1, 64)),
    "fp8_mqa_logits": ("q_fp8", lambda: tx.fp8_mqa_logits(
        torch.zeros(2, 4, 32, dtype=torch.uint8), (torch.zeros(5, 32, dtype=torch.uint8), torch.ones(5)),
        torch.ones(2, 4), _i32([0, 1]), _i32([3, 5]))),
    "fp8_paged_mqa_logits": ("q_fp8", lambda: tx.fp8_paged_mqa_logits(
        torch.zeros(2, 1, 4, 32, dtype=torch.uint8), torch.zeros(3, 4, 1, 36, dtype=torch.uint8), torch.ones(2, 4),
        _i32([3, 5]), _i32([[0, 1], [2, 0]]), None, 8)),
    "get_paged_mqa_logits_metadata": ("context_lens", lambda: tx.get_paged_mqa_logits_metadata(_i32([3, 5]), 64, 4)),
    "merge_state_v2": ("v_a", lambda: tx.merge_state_v2(
        torch.zeros(3, 2, 16), torch.zeros(3, 2), torch.zeros(3, 2, 16), torch.zeros(3, 2))),
    "merge_state": ("v_a", lambda: tx.merge_state(
        torch.zeros(3, 2, 16), torch.zeros(3, 2), torch.zeros(3, 2, 16), torch.zeros(3, 2))),
    "merge_attn_states": ("output", lambda: tx.merge_attn_states(
        torch.zeros(3, 2, 16), torch.zeros(3, 2, 16), torch.zeros(2, 3), torch.zeros(3, 2, 16), torch.zeros(2, 3))),
    "reshape_and_cache_flash": ("key", lambda: tx.reshape_and_cache_flash(
        torch.zeros(3, 2, 16), torch.zeros(3, 2, 16), torch.zeros(4, 2, 2, 16), torch.zeros(4, 2, 2, 16),
        torch.tensor([0, 5, -1]))),
    "concat_and_cache_mla": ("kv_c", lambda: tx.concat_and_cache_mla(
        torch.zeros(3, 32), torch.zeros(3, 16), torch.zeros(4, 2, 48), torch.tensor([0, 5, -1]))),
    "gather_and_maybe_dequant_cache": ("src_cache", lambda: tx.gather_and_maybe_dequant_cache(
        torch.zeros(4, 2, 48), torch.zeros(3, 48), _i32([[0, 1], [2, 3]]), _i32([0, 2, 3]), 2)),
    "reshape_and_cache": ("key", lambda: tx.reshape_and_cache(
        torch.zeros(3, 2, 16), torch.zeros(3, 2, 16), torch.zeros(4, 2, 2, 2, 8), torch.zeros(4, 2, 16, 2),
        torch.tensor([0, 5, -1]))),
    "gather_cache": ("src_cache", lambda: tx.gather_cache(
        torch.zeros(4, 2, 48), torch.zeros(3, 48), _i32([[0, 1], [2, 3]]), _i32([0, 2, 3]), 2)),
    "indexer_k_quant_and_cache": ("k", lambda: tx.indexer_k_quant_and_cache(
        torch.zeros(3, 32), torch.zeros(4, 2, 36, dtype=torch.uint8), torch.tensor([0, 5, -1]), 32, "ue8m0")),
    "cp_gather_indexer_k_quant_cache": ("kv_cache", lambda: tx.cp_gather_indexer_k_quant_cache(
        torch.zeros(4, 2, 36, dtype=torch.uint8), torch.zeros(3, 32, dtype=torch.uint8),
        torch.zeros(3, 4, dtype=torch.uint8), _i32([[0, 1], [2, 3]]), _i32([0, 2, 3]))),
    "normalize_page_table": ("req_to_token", lambda: tx.normalize_page_table(
        torch.zeros(2, 8, dtype=torch.int32), torch.tensor([0, 1]), _i32([4, 8]), 4)),
    "translate_loc_from_full_to_swa": ("full_to_swa", lambda: tx.translate_loc_from_full_to_swa(
        _mapping(), torch.tensor([1, 2, -1]))),
    "prepare_swa_spec_page_table": ("page_table_dst", lambda: tx.prepare_swa_spec_page_table(
        torch.zeros(2, 5, dtype=torch.int32), _i32([[4, 5, 6]]), _i32([[7], [8]]), _i32([3]), _i32([1, 1]), 2)),
    "fast_topk_v2": ("score", lambda: tx.fast_topk_v2(torch.zeros(2, 8), _i32([8, 3]), 4)),
    "fast_topk_transform_fused": ("score", lambda: tx.fast_topk_transform_fused(
        torch.zeros(2, 8), _i32([8, 3]), torch.zeros(2, 8, dtype=torch.int32), _i32([0, 1, 2]), 4)),
    "fast_topk_transform_ragged_fused": ("score", lambda: tx.fast_topk_transform_ragged_fused(
        torch.zeros(2, 8), _i32([8, 3]), _i32([0, 8]), 4)),
    "sparse_attn_func": ("q", lambda: tx.sparse_attn_func(
        torch.zeros(1, 64, 2, 32), torch.zeros(1, 64, 2, 32), torch.zeros(1, 64, 2, 32), _i32([[[1]]] * 1).expand(1, 2, 1),
        torch.zeros(1, 2, 1, 1, dtype=torch.int32), _i32([[[0]]]).expand(1, 2, 1), torch.zeros(1, 2, 1, 1, dtype=torch.int32),
        causal=True)),
    "sparse_attn_varlen_func": ("q", lambda: tx.sparse_attn_varlen_func(
        torch.zeros(64, 2, 32), torch.zeros(64, 2, 32), torch.zeros(64, 2, 32), _i32([[[1]]]).expand(1, 2, 1),
        torch.zeros(1, 2, 1, 1, dtype=torch.int32), _i32([[[0]]]).expand(1, 2, 1), torch.zeros(1, 2, 1, 1, dtype=torch.int32),
        _i32([0, 64]), _i32([0, 64]), 64, 64, causal=True)),
    "convert_vertical_slash_indexes": ("q_seqlens", lambda: tx.convert_vertical_slash_indexes(
        _i32([64]), _i32([64]), torch.zeros(1, 2, 4, dtype=torch.int32), torch.zeros(1, 2, 4, dtype=torch.int32), 64, 64,
        64)),
    "convert_vertical_slash_indexes_mergehead": ("q_seqlens", lambda: tx.convert_vertical_slash_indexes_mergehead(
        _i32([64]), _i32([64]), torch.zeros(1, 2, 4, dtype=torch.int32), torch.zeros(1, 2, 4, dtype=torch.int32),
        _i32([4, 4]), _i32([4, 4]), 64, 64, 64)),
    "topk_transform_512": ("scores", lambda: tx.topk_transform_512(
        torch.zeros(2, 8), _i32([8, 3]), torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32), 1)),
    "topk_transform_512_v2": ("scores", lambda: tx.topk_transform_512_v2(
        torch.zeros(2, 8), _i32([8, 3]), torch.zeros(2, 8, dtype=torch.int32), torch.zeros(2, 4, dtype=torch.int32), 1,
        torch.zeros(3, 2, dtype=torch.int32))),
}


@pytest.mark.parametrize("op", sorted(CPU_CALLS))
def test_cpu_inputs_under_a_gpu_backend_raise(gpu_backend, op):
    name, call = CPU_CALLS[op]
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{name} is on cpu but kernels run on cuda here (the cuda backend)"), message
    assert "cannot be accessed from Triton" not in message


def test_every_public_tensor_op_is_covered():
    host_helpers = {"flash_mla_get_workspace_size", "flash_mla_decode_get_workspace_size", "flash_mla_prefill_get_workspace_size",
                    "max_local_attention_virtual_batches", "get_mla_metadata"}
    assert set(tx.__all__) - host_helpers == set(CPU_CALLS) | {"make_local_attention_virtual_batches"}


# ---------------------------------------------------------------------------------------------
# the real thing on a GPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("op", sorted(CPU_CALLS))
def test_gpu_cpu_inputs_raise_value_error(op):
    name, call = CPU_CALLS[op]
    with pytest.raises(ValueError, match=f"^{name} is on cpu but kernels run on {_device.default_device()}"):
        call()


@pytest.mark.gpu
def test_gpu_local_attention_cpu_in_cpu_out():
    bt = torch.arange(30, dtype=torch.int32).reshape(3, 10)
    qsl, seq = torch.tensor([0, 4, 14, 19], dtype=torch.int32), torch.tensor([6, 17, 9], dtype=torch.int32)
    host = make_local_attention_virtual_batches(4, qsl, seq, bt, 2)
    assert all(x.device == CPU for x in host)
    on_gpu = make_local_attention_virtual_batches(4, qsl.to(DEVICE), seq.to(DEVICE), bt.to(DEVICE), 2)
    assert _lists(host) == _lists(on_gpu)
    got = make_local_attention_virtual_batches(4, query_start_loc_np=qsl.numpy(), seq_lens_np=seq.numpy(), block_table=bt,
                                               page_size=2, preserve_attn_chunk_size=True)
    assert all(isinstance(x, np.ndarray) for x in got[:3]) and got[3].device == CPU
    assert _lists(got) == _lists(host)


def test_interpreter_runs_cpu_inputs_through_the_kernels():
    if not INTERPRET:
        pytest.skip("interpreter only")
    assert _device.backend() == "interpreter"
    got = tx.merge_state_v2(torch.zeros(3, 2, 16), torch.zeros(3, 2), torch.zeros(3, 2, 16), torch.zeros(3, 2))
    assert got[0].device == CPU
