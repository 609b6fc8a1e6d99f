"""torch.library custom ops: one per public tensor op, each with a fake implementation.

* ``torch.library.opcheck`` passes for every op (schema, fake tensors, AOT dispatch with dynamic
  shapes), on small problems and on empty batches;
* each custom op gives bitwise the public function's results;
* ``torch.compile(fullgraph=True)`` of a decode step that builds a page table, runs paged
  attention, the local-attention virtual batches and attention over them, the SWA tree-verify
  table and attention over it, MLA decode and a state merge compiles without a graph break and
  equals eager bitwise.

Under the interpreter the kernels run on CPU tensors, so all of this runs on the CPU too.
"""
import pytest
import torch

import triton_xpu_attn
from helpers import DEVICE, INTERPRET
from test_hardening import CASES, MLA_DR, MLA_R, assert_bitwise_equal, make_case, snapshot
from triton_xpu_attn import custom_ops as C
from triton_xpu_attn import flash_mla_get_workspace_size, max_local_attention_virtual_batches

ops = torch.ops.triton_xpu_attn


def test_every_public_tensor_op_has_a_custom_op():
    host_helpers = {"flash_mla_get_workspace_size", "flash_mla_decode_get_workspace_size",  # ints in, int out
                    "flash_mla_prefill_get_workspace_size", "max_local_attention_virtual_batches",
                    "get_mla_metadata"}  # no tensors: a placeholder object
    for name in triton_xpu_attn.__all__:
        if name in host_helpers:
            continue
        assert name in C.OPS, name
        assert hasattr(ops, name), name
    for name, op in C.OPS.items():
        schema = getattr(ops, name).default._schema
        assert schema.name == f"{C.NAMESPACE}::{name}"
        # in-place ops declare what they write; nothing else is mutable
        mutable = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        expected = {
            "flash_attn_with_kvcache_out": {"out"},
            "flash_mla_decode": {"workspace"},
            "merge_state_v2_out": {"v_merged", "s_merged"},
            "merge_state_out": {"v_merged", "s_merged"},
            "merge_attn_states": {"output", "output_lse"},
            "normalize_page_table_out": {"out"},
            "make_local_attention_virtual_batches_out": {
                "seqlens_q_local", "cu_seqlens_q_local", "seqlens_k_local", "block_table_local"},
            "prepare_swa_spec_page_table": {"page_table_dst"},
            "topk_transform_512": {"out_page_indices", "out_raw_indices"},
            "topk_transform_512_v2": {"out_page_indices", "out_raw_indices"},
            "reshape_and_cache_flash": {"key_cache", "value_cache"},
            "concat_and_cache_mla": {"kv_cache"},
            "gather_and_maybe_dequant_cache": {"dst"},
            "reshape_and_cache": {"key_cache", "value_cache"},
            "gather_cache": {"dst"},
            "indexer_k_quant_and_cache": {"kv_cache"},
            "cp_gather_indexer_k_quant_cache": {"dst_k", "dst_scale"},
        }.get(name, set())
        assert mutable == expected, (name, mutable)


def test_package_root_exposes_the_custom_ops():
    assert triton_xpu_attn.custom_ops is C


@pytest.mark.parametrize("name", list(CASES))
def test_opcheck(name):
    case = make_case(name)
    op, args, kwargs = case.custom(case.t)
    result = torch.library.opcheck(op, args, kwargs)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("name", list(CASES))
def test_custom_op_equals_public_function(name):
    expected = snapshot((case := make_case(name, seed=1)).public(case.t))
    case = make_case(name, seed=1)
    op, args, kwargs = case.custom(case.t)
    got = case.custom_outputs(case.t, op(*args, **kwargs))
    assert_bitwise_equal(got, expected, name)
    # and through torch.ops
    case = make_case(name, seed=1)
    op, args, kwargs = case.custom(case.t)
    got = case.custom_outputs(case.t, getattr(ops, op._name)(*args, **kwargs))
    assert_bitwise_equal(got, expected, name)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _empty_batch_calls():
    """(op, args, kwargs) of every custom op on an empty batch (no kernel runs; fakes must agree)."""
    f = torch.float32
    z32 = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    k = torch.zeros(3, 4, 1, 64, device=DEVICE)
    cache = torch.zeros(3, 4, MLA_R + MLA_DR, device=DEVICE)
    r2t = torch.zeros(2, 8, dtype=torch.int32, device=DEVICE)
    mapping = torch.tensor([0, 1, -1], device=DEVICE)
    local = (4, _i32([0]), z32, torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), 2)
    swa = (torch.zeros(0, 4, dtype=torch.int32, device=DEVICE), torch.zeros(0, 3, dtype=torch.int32, device=DEVICE),
           torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), z32, z32, 2)
    return {
        "flash_attn_with_kvcache": (C.flash_attn_with_kvcache, (torch.zeros(0, 2, 64, device=DEVICE), k, k, z32,
                                    torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), _i32([0])),
                                    dict(return_softmax_lse=True, num_splits=2)),
        "flash_attn_with_kvcache[decode]": (C.flash_attn_with_kvcache, (torch.zeros(0, 1, 2, 64, device=DEVICE), k, k, z32,
                                            torch.zeros(0, 2, dtype=torch.int32, device=DEVICE)), {}),
        "flash_attn_with_kvcache_out": (C.flash_attn_with_kvcache_out, (torch.zeros(0, 2, 64, device=DEVICE), k, k, z32,
                                        torch.zeros(0, 2, dtype=torch.int32, device=DEVICE),
                                        torch.zeros(0, 2, 64, device=DEVICE)), dict(cu_seqlens_q=_i32([0]))),
        "flash_mla_decode": (C.flash_mla_decode, (torch.zeros(0, 4, MLA_R, device=DEVICE), torch.zeros(0, 4, MLA_DR, device=DEVICE),
                             cache, z32, torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), None, 0.1, 2),
                             dict(return_lse=True)),
        "flash_mla_prefill": (C.flash_mla_prefill, (torch.zeros(0, 4, MLA_R, device=DEVICE), torch.zeros(0, 4, MLA_DR, device=DEVICE),
                              cache, _i32([0]), z32, 0, torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), None, 0.1),
                              dict(return_lse=True)),
        "merge_state_v2": (C.merge_state_v2, (torch.zeros(0, 2, 8, dtype=f, device=DEVICE), torch.zeros(0, 2, device=DEVICE),
                           torch.zeros(0, 2, 8, dtype=f, device=DEVICE), torch.zeros(0, 2, device=DEVICE)), {}),
        "merge_state_v2_out": (C.merge_state_v2_out, tuple(
            torch.zeros(0, 2, *((8,) if i % 2 == 0 else ()), device=DEVICE) for i in range(6)), {}),
        "merge_state": (C.merge_state, (torch.zeros(0, 2, 8, dtype=f, device=DEVICE), torch.zeros(0, 2, device=DEVICE),
                        torch.zeros(0, 2, 8, dtype=f, device=DEVICE), torch.zeros(0, 2, device=DEVICE)), {}),
        "merge_state_out": (C.merge_state_out, tuple(
            torch.zeros(0, 2, *((8,) if i % 2 == 0 else ()), device=DEVICE) for i in range(6)), {}),
        "normalize_page_table": (C.normalize_page_table, (r2t, torch.zeros(0, dtype=torch.int64, device=DEVICE), z32, 4, 3), {}),
        "normalize_page_table_out": (C.normalize_page_table_out, (r2t, torch.zeros(0, dtype=torch.int64, device=DEVICE), z32, 4,
                                     torch.zeros(0, 3, dtype=torch.int32, device=DEVICE)), {}),
        "translate_loc_from_full_to_swa": (C.translate_loc_from_full_to_swa, (mapping, torch.zeros(0, 5, dtype=torch.int64,
                                                                                                  device=DEVICE)), {}),
        "make_local_attention_virtual_batches": (C.make_local_attention_virtual_batches, (*local, 3), {}),
        "make_local_attention_virtual_batches_out": (C.make_local_attention_virtual_batches_out, (
            *local, *(torch.zeros(s, dtype=torch.int32, device=DEVICE) for s in [(3,), (4,), (3,), (3, 2)])), {}),
        "prepare_swa_spec_page_table": (C.prepare_swa_spec_page_table, swa, {}),
    }


@pytest.mark.parametrize("name", list(_empty_batch_calls()))
def test_opcheck_empty_batch(name):
    op, args, kwargs = _empty_batch_calls()[name]
    result = torch.library.opcheck(op, args, kwargs)
    assert all(v == "SUCCESS" for v in result.values()), result


def test_mla_fake_needs_head_dim_v_for_unknown_combined_width():
    q = torch.zeros(2, 4, 100, device="meta")
    with pytest.raises(ValueError, match="pass head_dim_v"):
        C.flash_mla_decode(q, None, torch.zeros(3, 4, 100, device="meta"), torch.zeros(2, dtype=torch.int32, device="meta"),
                           torch.zeros(2, 1, dtype=torch.int32, device="meta"), None, 0.1)


# ---------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True) of a decode step
# ---------------------------------------------------------------------------------------------

PAGE, HKV, GROUP, D = 4, 2, 2, 64
BATCH, CTX, CHUNK, NDT, WINDOW = 3, 16, 8, 2, 5
Q_LENS = [2, 1, 3]
M = max_local_attention_virtual_batches(BATCH, sum(Q_LENS), CHUNK)
DTYPE = torch.float32 if INTERPRET else torch.bfloat16


def _step_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    num_pages = 4 * (CTX // PAGE) + 4
    rows = BATCH + 1  # req_to_token pool rows
    pages = torch.randperm(num_pages, generator=g)[: rows * (CTX // PAGE)].view(rows, CTX // PAGE)
    req_to_token = (pages[:, :, None] * PAGE + torch.arange(PAGE)).reshape(rows, CTX).to(torch.int32)
    req_pool_indices = torch.randperm(rows, generator=g)[:BATCH]
    seq_lens = [q + int(torch.randint(0, CTX - q + 1, (1,), generator=g)) for q in Q_LENS]
    seq_lens[2] = 9 + seed % 2  # request 2's 3 queries straddle a chunk boundary: 2 virtual batches
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    slots = num_pages * PAGE
    hq = HKV * GROUP
    mla_ws = flash_mla_get_workspace_size(4 * PAGE, BATCH, 4, PAGE, 2, head_dim_v=MLA_R, device=DEVICE)
    x = dict(
        k_cache=torch.randn(num_pages, PAGE, HKV, D, generator=g).to(DTYPE),
        v_cache=torch.randn(num_pages, PAGE, HKV, D, generator=g).to(DTYPE),
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        qsl=torch.tensor([0, 2, 3, 6], dtype=torch.int32),
        q=torch.randn(sum(Q_LENS), hq, D, generator=g).to(DTYPE),
        # SWA tree verify: full-pool slots (prefix from req_to_token, drafts), a permutation to the SWA pool
        swa_dst=torch.zeros(BATCH * NDT, CTX + NDT, dtype=torch.int32),
        table_a=req_to_token[req_pool_indices],
        table_b=torch.randint(0, slots, (BATCH * NDT, NDT), generator=g, dtype=torch.int32),
        seq_len_a=seq_lens - torch.tensor(Q_LENS, dtype=torch.int32),
        seq_len_b=torch.randint(1, NDT + 1, (BATCH * NDT,), generator=g, dtype=torch.int32),
        full_to_swa=torch.cat([torch.randperm(slots, generator=g), torch.tensor([-1])]),
        q_swa=torch.randn(BATCH * NDT, hq, D, generator=g).to(DTYPE),
        out_cache_loc=torch.randint(-1, slots, (BATCH,), generator=g),
        # MLA
        q_nope=torch.randn(BATCH, 4, MLA_R, generator=g).to(DTYPE),
        q_pe=torch.randn(BATCH, 4, MLA_DR, generator=g).to(DTYPE),
        mla_cache=torch.randn(num_pages, PAGE, MLA_R + MLA_DR, generator=g).to(DTYPE),
        mla_table=torch.randperm(num_pages, generator=g)[: BATCH * 4].view(BATCH, 4).to(torch.int32),
        mla_seq_lens=torch.randint(1, 4 * PAGE + 1, (BATCH,), generator=g, dtype=torch.int32),
        mla_workspace=torch.zeros(mla_ws, dtype=torch.uint8),
    )
    return {k: v.to(DEVICE) for k, v in x.items()}


def decode_step(x):
    q = x["q"] * 1.0  # plain aten ops around the custom ops
    k, v = x["k_cache"], x["v_cache"]
    # page-granular table from sglang's token-granular req_to_token
    page_table = ops.normalize_page_table(x["req_to_token"], x["req_pool_indices"], x["seq_lens"], PAGE, CTX // PAGE)
    out, lse = ops.flash_attn_with_kvcache(q, k, v, x["seq_lens"], page_table, x["qsl"], max(Q_LENS), causal=True,
                                           num_splits=2, return_softmax_lse=True)
    # chunked local attention over virtual batches (graph mode)
    sq, cu, sk, bt = ops.make_local_attention_virtual_batches(CHUNK, x["qsl"], x["seq_lens"], page_table, PAGE, M)
    local, local_lse = ops.flash_attn_with_kvcache(q, k, v, sk, bt, cu, CHUNK, causal=True, return_softmax_lse=True)
    merged, merged_lse = ops.merge_state_v2(out, lse.T, local, local_lse.T)
    # EAGLE tree verify on the sliding-window layers: token-granular table into the SWA pool
    ops.prepare_swa_spec_page_table(x["swa_dst"], x["table_a"], x["table_b"], x["seq_len_a"], x["seq_len_b"], NDT,
                                    full_to_swa=x["full_to_swa"])
    swa_lens = x["seq_len_a"].repeat_interleave(NDT) + x["seq_len_b"]
    rows = x["q_swa"].shape[0]
    swa_out, _ = C.flash_attn_with_kvcache(
        x["q_swa"], k.view(-1, 1, HKV, D), v.view(-1, 1, HKV, D), swa_lens, x["swa_dst"],
        torch.arange(rows + 1, dtype=torch.int32, device=q.device), 1, causal=True, window_left=WINDOW, window_right=0,
    )
    swa_locs = C.translate_loc_from_full_to_swa(x["full_to_swa"], x["out_cache_loc"])
    mla_out, mla_lse = C.flash_mla_decode(x["q_nope"], x["q_pe"], x["mla_cache"], x["mla_seq_lens"], x["mla_table"],
                                          x["mla_workspace"], 0.125, 2, return_lse=True)
    return dict(page_table=page_table, out=out, lse=lse, sq=sq, cu=cu, sk=sk, bt=bt, local=local, merged=merged,
                merged_lse=merged_lse, swa_dst=x["swa_dst"].clone(), swa_out=swa_out, swa_locs=swa_locs,
                mla_out=mla_out, mla_lse=mla_lse, final=merged.float().sum() + mla_out.float().sum())


def test_compiled_decode_step_has_no_graph_break_and_equals_eager():
    torch._dynamo.reset()
    eager = decode_step(_step_inputs())
    compiled_step = torch.compile(decode_step, fullgraph=True)  # fullgraph: any graph break raises
    for seed in (0, 1):
        expected = eager if seed == 0 else decode_step(_step_inputs(seed))
        got = compiled_step(_step_inputs(seed))
        assert got.keys() == expected.keys()
        for key in expected:
            if key == "final":  # a reduction Inductor may order differently
                torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-3)
                continue
            assert got[key].shape == expected[key].shape, key
            assert torch.equal(got[key], expected[key]), key
    # sanity: the step computed something (local attention made extra virtual batches, the SWA table is filled)
    assert int(expected["cu"][-1]) == sum(Q_LENS) and int((expected["sq"] > 0).sum()) > BATCH
    assert int((expected["swa_dst"] != 0).sum()) > 0


def test_explain_reports_one_graph_and_no_break():
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(decode_step)(_step_inputs())
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
