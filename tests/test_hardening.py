"""Hardening: determinism, empty batches and zero lengths, the bad-input table of docs/robustness.md,
CUDA/XPU graph capture and replay with new values, no host syncs on graph paths, KV caches of more
than 2^31 elements, several GPUs in one process.

``make_case(name, device, seed)`` builds a small problem for every public tensor op (and its
variants); shapes depend only on the name, values on the seed, so a graph captured with seed 0
can be replayed with the values of seed 1 copied into its inputs. tests/test_custom_ops.py uses
the same cases for ``opcheck``.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable

import numpy as np
import pytest
import torch

from helpers import DEVICE, INTERPRET, SMALL, assert_close, capture_graph
from triton_xpu_attn import custom_ops as C
from triton_xpu_attn import reference as ref
from triton_xpu_attn import (
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
    flash_mla_decode,
    flash_mla_get_workspace_size,
    flash_mla_prefill,
    make_local_attention_virtual_batches,
    max_local_attention_virtual_batches,
    merge_state_v2,
    normalize_page_table,
    prepare_swa_spec_page_table,
    translate_loc_from_full_to_swa,
)

#: dtype of the attention cases: the interpreter's bf16 arithmetic is wrong upstream
ATTN_DTYPE = torch.float32 if INTERPRET else torch.bfloat16
#: MLA widths (R, Dr): tiny under the interpreter, DeepSeek's on a GPU
MLA_R, MLA_DR = (32, 16) if SMALL else (512, 64)


# ---------------------------------------------------------------------------------------------
# cases: one small problem per op
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """``t``: every tensor the op reads or writes (values depend on the seed, shapes do not).
    ``public(t)``: the public Python call, returns the op's results (for in-place ops, the written
    tensors). ``custom(t)``: ``(op, args, kwargs)`` of the equivalent custom op call;
    ``custom_outputs(t, result)``: the results of that call in ``public``'s order."""

    t: dict
    public: Callable
    custom: Callable
    custom_outputs: Callable = lambda t, res: tuple(res) if isinstance(res, (tuple, list)) else (res,)


def _gen(seed):
    return torch.Generator().manual_seed(1000 + seed)


def _split(total, parts, gen):
    """``parts`` non-negative ints summing to ``total`` (random)."""
    if parts == 0:
        return []
    cuts = torch.randint(0, total + 1, (parts - 1,), generator=gen).sort().values.tolist()
    bounds = [0] + cuts + [total]
    return [bounds[i + 1] - bounds[i] for i in range(parts)]


def _cu(lens):
    return torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32)


def _paged_inputs(seed, batch=3, total_q=5, heads_kv=2, group=2, d=64, page=4, width=3, four_d=False):
    g = _gen(seed)
    num_pages = batch * width + 2
    q_lens = [1] * batch if four_d else _split(total_q, batch, g)
    kv_lens = [q + int(torch.randint(0, width * page - q + 1, (1,), generator=g)) for q in q_lens]
    hq = heads_kv * group
    t = dict(
        q=torch.randn(batch, 1, hq, d, generator=g) if four_d else torch.randn(sum(q_lens), hq, d, generator=g),
        k_cache=torch.randn(num_pages, page, heads_kv, d, generator=g),
        v_cache=torch.randn(num_pages, page, heads_kv, d, generator=g),
        cache_seqlens=torch.tensor(kv_lens, dtype=torch.int32),
        page_table=torch.randperm(num_pages, generator=g)[: batch * width].view(batch, width).to(torch.int32),
    )
    if not four_d:
        t["cu_seqlens_q"] = _cu(q_lens)
    t["sinks"] = torch.randn(hq, generator=g)
    return t


def _to(t: dict, device, dtypes=None):
    dtypes = dtypes or {}
    return {k: v.to(device=device, dtype=dtypes.get(k, v.dtype)) for k, v in t.items()}


_ATTN_FLOATS = dict(q=ATTN_DTYPE, k_cache=ATTN_DTYPE, v_cache=ATTN_DTYPE, out=ATTN_DTYPE)


def case_paged_attention(device, seed):
    """Ragged q_len > 1 batch, causal, sinks, split-KV (2 splits), LSE."""
    t = _to(_paged_inputs(seed), device, _ATTN_FLOATS)

    def public(t):
        return flash_attn_with_kvcache(
            t["q"], t["k_cache"], t["v_cache"], cache_seqlens=t["cache_seqlens"], page_table=t["page_table"],
            cu_seqlens_q=t["cu_seqlens_q"], max_seqlen_q=5, causal=True, sinks=t["sinks"], num_splits=2,
            return_softmax_lse=True,
        )

    def custom(t):
        return C.flash_attn_with_kvcache, (t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t["page_table"]), dict(
            cu_seqlens_q=t["cu_seqlens_q"], max_seqlen_q=5, causal=True, sinks=t["sinks"], num_splits=2,
            return_softmax_lse=True,
        )

    return Case(t, public, custom)


def case_paged_attention_decode(device, seed):
    """4-D decode q, sliding window, softcap, automatic splits, no LSE."""
    t = _to(_paged_inputs(seed, four_d=True), device, _ATTN_FLOATS)
    del t["sinks"]

    def public(t):
        return (flash_attn_with_kvcache(
            t["q"], t["k_cache"], t["v_cache"], cache_seqlens=t["cache_seqlens"], page_table=t["page_table"],
            window_size=(5, 0), softcap=3.0, num_splits=0,
        ),)

    def custom(t):
        return C.flash_attn_with_kvcache, (t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t["page_table"]), dict(
            window_left=5, window_right=0, softcap=3.0, num_splits=0,
        )

    return Case(t, public, custom, lambda t, res: (res[0],))


def case_paged_attention_out(device, seed):
    """Ragged batch without max_seqlen_q (requests found on the device), ``out=``, no split."""
    t = _paged_inputs(seed)
    t["out"] = torch.randn(t["q"].shape, generator=_gen(seed))
    t = _to(t, device, _ATTN_FLOATS)

    def public(t):
        res = flash_attn_with_kvcache(
            t["q"], t["k_cache"], t["v_cache"], cache_seqlens=t["cache_seqlens"], page_table=t["page_table"],
            cu_seqlens_q=t["cu_seqlens_q"], causal=True, num_splits=1, return_softmax_lse=True, out=t["out"],
        )
        assert res[0] is t["out"]
        return res

    def custom(t):
        return C.flash_attn_with_kvcache_out, (t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t["page_table"],
                                               t["out"]), dict(
            cu_seqlens_q=t["cu_seqlens_q"], causal=True, num_splits=1, return_softmax_lse=True,
        )

    return Case(t, public, custom, lambda t, lse: (t["out"], lse))


def _mla_inputs(seed, batch=2, heads=4, page=4, width=4, q_len=1):
    g = _gen(seed)
    num_pages = batch * width + 2
    shape = (batch, heads) if q_len == 1 else (batch, q_len, heads)
    return dict(
        q_nope=torch.randn(*shape, MLA_R, generator=g),
        q_pe=torch.randn(*shape, MLA_DR, generator=g),
        cache=torch.randn(num_pages, page, MLA_R + MLA_DR, generator=g),
        seq_lens=torch.randint(q_len, width * page + 1, (batch,), generator=g, dtype=torch.int32),
        page_table=torch.randperm(num_pages, generator=g)[: batch * width].view(batch, width).to(torch.int32),
    )


_MLA_FLOATS = dict(q_nope=ATTN_DTYPE, q_pe=ATTN_DTYPE, cache=ATTN_DTYPE)


def case_mla_decode(device, seed):
    """Decode, 2 KV splits through a workspace, LSE."""
    t = _to(_mla_inputs(seed), device, _MLA_FLOATS)
    b, h = t["q_nope"].shape[:2]
    size = flash_mla_get_workspace_size(t["page_table"].shape[1] * 4, b, h, 4, 2, head_dim_v=MLA_R, device=device)
    t["workspace"] = torch.zeros(size, dtype=torch.uint8, device=device)

    def public(t):
        return flash_mla_decode(t["q_nope"], t["q_pe"], t["cache"], t["seq_lens"], t["page_table"], t["workspace"], 0.125, 2,
                                return_lse=True)

    def custom(t):
        return C.flash_mla_decode, (t["q_nope"], t["q_pe"], t["cache"], t["seq_lens"], t["page_table"], t["workspace"],
                                    0.125, 2), dict(return_lse=True)

    return Case(t, public, custom)


def case_mla_decode_mtp(device, seed):
    """q_len 2 (MTP), combined queries (q_pe None), a device kv_scale, no split, no LSE."""
    t = _mla_inputs(seed, q_len=2)
    t["q"] = torch.cat([t.pop("q_nope"), t.pop("q_pe")], -1)
    t["kv_scale"] = torch.rand(1, generator=_gen(seed)) + 0.5
    t = _to(t, device, dict(q=ATTN_DTYPE, cache=ATTN_DTYPE))

    def public(t):
        return (flash_mla_decode(t["q"], None, t["cache"], t["seq_lens"], t["page_table"], None, 0.125,
                                 kv_scale=t["kv_scale"], head_dim_v=MLA_R),)

    def custom(t):
        return C.flash_mla_decode, (t["q"], None, t["cache"], t["seq_lens"], t["page_table"], None, 0.125), dict(
            kv_scale=t["kv_scale"], head_dim_v=MLA_R)

    return Case(t, public, custom, lambda t, res: (res[0],))


#: MLA prefill case: query lengths of 3 requests (one empty) and one padding row past cu_seqlens_q[B]
_PREFILL_Q_LENS = (3, 0, 2)


def case_mla_prefill(device, seed):
    """Ragged causal prefill with a cached prefix, an empty request, a padding row, LSE."""
    batch = len(_PREFILL_Q_LENS)
    t = _mla_inputs(seed, batch=batch)
    total = sum(_PREFILL_Q_LENS) + 1
    g = _gen(seed + 100)
    t["q_nope"] = torch.randn(total, 4, MLA_R, generator=g)
    t["q_pe"] = torch.randn(total, 4, MLA_DR, generator=g)
    t["cu_seqlens_q"] = torch.tensor([0, *np.cumsum(_PREFILL_Q_LENS)], dtype=torch.int32)
    t["seq_lens"] = torch.maximum(t["seq_lens"], torch.tensor(_PREFILL_Q_LENS, dtype=torch.int32))
    t = _to(t, device, _MLA_FLOATS)

    def public(t):
        return flash_mla_prefill(t["q_nope"], t["q_pe"], t["cache"], t["cu_seqlens_q"], t["seq_lens"], 3, t["page_table"],
                                 None, 0.125, return_lse=True)

    def custom(t):
        return C.flash_mla_prefill, (t["q_nope"], t["q_pe"], t["cache"], t["cu_seqlens_q"], t["seq_lens"], 3,
                                     t["page_table"], None, 0.125), dict(return_lse=True)

    return Case(t, public, custom)


def case_varlen_attention(device, seed):
    """Non-paged ragged prefill: causal, sinks, a request without queries, a padding row of q, a key
    row no request owns, 2 splits, LSE."""
    g = _gen(seed + 200)
    q_lens, k_lens = (2, 0, 3), (4, 3, 5)
    total_q, total_k = sum(q_lens) + 1, sum(k_lens) + 1
    t = dict(
        q=torch.randn(total_q, 4, 64, generator=g), k=torch.randn(total_k, 2, 64, generator=g),
        v=torch.randn(total_k, 2, 64, generator=g), cu_seqlens_q=_cu(q_lens), cu_seqlens_k=_cu(k_lens) + 1,
        sinks=torch.randn(4, generator=g),
    )
    t = _to(t, device, dict(q=ATTN_DTYPE, k=ATTN_DTYPE, v=ATTN_DTYPE))

    def public(t):
        return flash_attn_varlen_func(t["q"], t["k"], t["v"], t["cu_seqlens_q"], t["cu_seqlens_k"], 3, 5,
                                      sinks=t["sinks"], causal=True, num_splits=2, return_softmax_lse=True)

    def custom(t):
        return C.flash_attn_varlen_func, (t["q"], t["k"], t["v"], t["cu_seqlens_q"], t["cu_seqlens_k"], 3, 5), dict(
            sinks=t["sinks"], causal=True, num_splits=2, return_softmax_lse=True)

    return Case(t, public, custom)


def _merge_inputs(seed, n=4, h=2, d=32):
    g = _gen(seed)
    s_a, s_b = torch.randn(n, h, generator=g), torch.randn(n, h, generator=g)
    s_a[0] = -math.inf  # an empty state
    s_b[0, 0] = -math.inf  # both empty: v = 0, s = -inf
    s_b[1, 1] = -math.inf
    return dict(v_a=torch.randn(n, h, d, generator=g), s_a=s_a, v_b=torch.randn(n, h, d, generator=g), s_b=s_b)


def case_merge_state(device, seed):
    t = _to(_merge_inputs(seed), device, dict(v_a=ATTN_DTYPE, v_b=ATTN_DTYPE))

    def public(t):
        return merge_state_v2(t["v_a"], t["s_a"], t["v_b"], t["s_b"])

    def custom(t):
        return C.merge_state_v2, (t["v_a"], t["s_a"], t["v_b"], t["s_b"]), {}

    return Case(t, public, custom)


def case_merge_state_out(device, seed):
    t = _merge_inputs(seed)
    t["v_merged"] = torch.randn(t["v_a"].shape, generator=_gen(seed))
    t["s_merged"] = torch.randn(t["s_a"].shape, generator=_gen(seed))
    t = _to(t, device, dict(v_a=ATTN_DTYPE, v_b=ATTN_DTYPE, v_merged=ATTN_DTYPE))

    def public(t):
        return merge_state_v2(t["v_a"], t["s_a"], t["v_b"], t["s_b"], t["v_merged"], t["s_merged"])

    def custom(t):
        return C.merge_state_v2_out, (t["v_a"], t["s_a"], t["v_b"], t["s_b"], t["v_merged"], t["s_merged"]), {}

    return Case(t, public, custom, lambda t, res: (t["v_merged"], t["s_merged"]))


def _req_to_token_inputs(seed, rows=4, ctx=16, page=4, batch=3, num_pages=20):
    g = _gen(seed)
    pages = torch.randperm(num_pages, generator=g)[: rows * (ctx // page)].view(rows, ctx // page)
    r2t = (pages[:, :, None] * page + torch.arange(page)).reshape(rows, ctx).to(torch.int32)
    mapping = torch.randperm(num_pages * page, generator=g).to(torch.int64)
    mapping = torch.cat([mapping, torch.full((page,), 0, dtype=torch.int64), torch.tensor([-1])])
    return dict(
        req_to_token=r2t,
        req_pool_indices=torch.randperm(rows, generator=g)[:batch].to(torch.int64),
        seq_lens=torch.randint(0, ctx + 1, (batch,), generator=g, dtype=torch.int32),
        full_to_swa=mapping,
    )


def case_normalize_page_table(device, seed):
    """With the full->SWA translation; ``max_pages`` given (no host sync)."""
    t = _to(_req_to_token_inputs(seed), device)

    def public(t):
        return (normalize_page_table(t["req_to_token"], t["req_pool_indices"], t["seq_lens"], 4, max_pages=4,
                                     full_to_swa=t["full_to_swa"]),)

    def custom(t):
        return C.normalize_page_table, (t["req_to_token"], t["req_pool_indices"], t["seq_lens"], 4, 4), dict(
            full_to_swa=t["full_to_swa"])

    return Case(t, public, custom)


def case_normalize_page_table_out(device, seed):
    t = _req_to_token_inputs(seed)
    del t["full_to_swa"]
    t["out"] = torch.randint(-9, 9, (3, 5), generator=_gen(seed), dtype=torch.int32)
    t = _to(t, device)

    def public(t):
        return (normalize_page_table(t["req_to_token"], t["req_pool_indices"], t["seq_lens"], 4, out=t["out"]),)

    def custom(t):
        return C.normalize_page_table_out, (t["req_to_token"], t["req_pool_indices"], t["seq_lens"], 4, t["out"]), {}

    return Case(t, public, custom, lambda t, res: (t["out"],))


def case_translate_loc(device, seed):
    g = _gen(seed)
    mapping = torch.cat([torch.randperm(40, generator=g).to(torch.int64), torch.tensor([-1])])
    t = _to(dict(full_to_swa=mapping, locs=torch.randint(-1, 41, (2, 5), generator=g, dtype=torch.int64)), device)

    def public(t):
        return (translate_loc_from_full_to_swa(t["full_to_swa"], t["locs"]),)

    def custom(t):
        return C.translate_loc_from_full_to_swa, (t["full_to_swa"], t["locs"]), {}

    return Case(t, public, custom)


LOCAL = dict(chunk=4, page=2, batch=3, total_q=6, width=8)
LOCAL_M = max_local_attention_virtual_batches(LOCAL["batch"], LOCAL["total_q"], LOCAL["chunk"])


def _local_inputs(seed):
    g = _gen(seed)
    q = _split(LOCAL["total_q"], LOCAL["batch"], g)
    seq = [x + int(torch.randint(0, LOCAL["width"] * LOCAL["page"] - x + 1, (1,), generator=g)) for x in q]
    return dict(
        query_start_loc=_cu(q),
        seq_lens=torch.tensor(seq, dtype=torch.int32),
        block_table=torch.randint(0, 50, (LOCAL["batch"], LOCAL["width"]), generator=g, dtype=torch.int32),
    )


def case_local_attention(device, seed):
    """Graph mode (``max_virtual_batches`` given)."""
    t = _to(_local_inputs(seed), device)
    args = lambda t: (LOCAL["chunk"], t["query_start_loc"], t["seq_lens"], t["block_table"], LOCAL["page"])  # noqa: E731

    def public(t):
        return make_local_attention_virtual_batches(*args(t), max_virtual_batches=LOCAL_M)

    def custom(t):
        return C.make_local_attention_virtual_batches, (*args(t), LOCAL_M), {}

    return Case(t, public, custom)


_LOCAL_OUT = ("seqlens_q_local", "cu_seqlens_q_local", "seqlens_k_local", "block_table_local")


def case_local_attention_out(device, seed):
    t = _local_inputs(seed)
    g = _gen(seed)
    m, ppc = LOCAL_M, LOCAL["chunk"] // LOCAL["page"]
    for name, shape in zip(_LOCAL_OUT, [(m,), (m + 1,), (m,), (m, ppc)]):
        t[name] = torch.randint(-9, 9, shape, generator=g, dtype=torch.int32)
    t = _to(t, device)
    args = lambda t: (LOCAL["chunk"], t["query_start_loc"], t["seq_lens"], t["block_table"], LOCAL["page"])  # noqa: E731

    def public(t):
        return make_local_attention_virtual_batches(*args(t), out=tuple(t[n] for n in _LOCAL_OUT))

    def custom(t):
        return C.make_local_attention_virtual_batches_out, (*args(t), *(t[n] for n in _LOCAL_OUT)), {}

    return Case(t, public, custom, lambda t, res: tuple(t[n] for n in _LOCAL_OUT))


SWA = dict(batch=2, ndt=2, width_a=6, width_b=3, width_dst=9, pool=30)


def _swa_inputs(seed):
    g = _gen(seed)
    rows = SWA["batch"] * SWA["ndt"]
    return dict(
        page_table_dst=torch.randint(-9, 9, (rows, SWA["width_dst"]), generator=g, dtype=torch.int32),
        page_table_a=torch.randint(0, SWA["pool"], (SWA["batch"], SWA["width_a"]), generator=g, dtype=torch.int32),
        page_table_b=torch.randint(0, SWA["pool"], (rows, SWA["width_b"]), generator=g, dtype=torch.int32),
        seq_len_a=torch.randint(0, SWA["width_a"] + 1, (SWA["batch"],), generator=g, dtype=torch.int32),
        seq_len_b=torch.randint(0, SWA["width_b"] + 1, (rows,), generator=g, dtype=torch.int32),
        seq_start_a=torch.randint(0, 3, (rows,), generator=g, dtype=torch.int32),
        full_to_swa=torch.cat([torch.randperm(SWA["pool"], generator=g), torch.tensor([-1])]).to(torch.int64),
    )


def case_swa_spec(device, seed):
    t = _to(_swa_inputs(seed), device)
    names = ("page_table_dst", "page_table_a", "page_table_b", "seq_len_a", "seq_len_b")

    def public(t):
        res = prepare_swa_spec_page_table(*(t[n] for n in names), SWA["ndt"], seq_start_a=t["seq_start_a"],
                                          full_to_swa=t["full_to_swa"])
        assert res is t["page_table_dst"]
        return (res,)

    def custom(t):
        return C.prepare_swa_spec_page_table, (*(t[n] for n in names), SWA["ndt"]), dict(
            seq_start_a=t["seq_start_a"], full_to_swa=t["full_to_swa"])

    return Case(t, public, custom, lambda t, res: (t["page_table_dst"],))


CASES = {
    "flash_attn_with_kvcache": case_paged_attention,
    "flash_attn_with_kvcache[decode]": case_paged_attention_decode,
    "flash_attn_with_kvcache[out]": case_paged_attention_out,
    "flash_mla_decode": case_mla_decode,
    "flash_mla_decode[mtp]": case_mla_decode_mtp,
    "flash_mla_prefill": case_mla_prefill,
    "flash_attn_varlen_func": case_varlen_attention,
    "merge_state_v2": case_merge_state,
    "merge_state_v2[out]": case_merge_state_out,
    "normalize_page_table": case_normalize_page_table,
    "normalize_page_table[out]": case_normalize_page_table_out,
    "translate_loc_from_full_to_swa": case_translate_loc,
    "make_local_attention_virtual_batches": case_local_attention,
    "make_local_attention_virtual_batches[out]": case_local_attention_out,
    "prepare_swa_spec_page_table": case_swa_spec,
}


def make_case(name, device=DEVICE, seed=0) -> Case:
    return CASES[name](torch.device(device), seed)


def snapshot(outputs):
    return tuple(o.clone() for o in outputs)


def assert_bitwise_equal(got, expected, what=""):
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what} output {i}: {a.shape}/{a.dtype} vs {b.shape}/{b.dtype}"
        assert a.device == b.device, f"{what} output {i}: on {a.device}, expected {b.device}"
        assert torch.equal(a, b), f"{what} output {i} differs"


def _cpu(t):
    return {k: v.cpu() for k, v in t.items()}


def _reference(name, t):
    """float64 / exact references of each case (all seeds' problems are valid)."""
    t = _cpu(t)
    base = name.split("[")[0]
    if base == "flash_attn_with_kvcache":
        if name.endswith("[decode]"):
            return (ref.paged_attention(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t["page_table"],
                                        window_size=(5, 0), softcap=3.0)[0],)
        sinks = t["sinks"] if name == "flash_attn_with_kvcache" else None
        return ref.paged_attention(t["q"], t["k_cache"], t["v_cache"], t["cache_seqlens"], t["page_table"],
                                   t["cu_seqlens_q"], causal=True, sinks=sinks)
    if name == "flash_mla_decode":
        out, lse = ref.mla_decode(t["q_nope"], t["q_pe"], t["cache"], t["seq_lens"], t["page_table"], 0.125)
        return out, lse
    if name == "flash_attn_varlen_func":
        return ref.varlen_attention(t["q"], t["k"], t["v"], t["cu_seqlens_q"], t["cu_seqlens_k"], causal=True,
                                    sinks=t["sinks"])
    if name == "flash_mla_prefill":
        return ref.mla_prefill(t["q_nope"], t["q_pe"], t["cache"], t["cu_seqlens_q"], t["seq_lens"], t["page_table"], 0.125)
    if name == "flash_mla_decode[mtp]":
        q = t["q"]
        return (ref.mla_decode(q[..., :MLA_R], q[..., MLA_R:], t["cache"], t["seq_lens"], t["page_table"], 0.125,
                               kv_scale=t["kv_scale"])[0],)
    if base == "merge_state_v2":
        return ref.merge_state_v2(t["v_a"], t["s_a"], t["v_b"], t["s_b"])
    if name == "normalize_page_table":
        return (ref.normalize_page_table(t["req_to_token"], t["req_pool_indices"], t["seq_lens"], 4, 4, t["full_to_swa"]),)
    if name == "normalize_page_table[out]":
        return (ref.normalize_page_table(t["req_to_token"], t["req_pool_indices"], t["seq_lens"], 4, 5),)
    if base == "translate_loc_from_full_to_swa":
        return (ref.translate_loc_from_full_to_swa(t["full_to_swa"], t["locs"]),)
    if base == "make_local_attention_virtual_batches":
        got = ref.make_local_attention_virtual_batches(LOCAL["chunk"], t["query_start_loc"].numpy(), t["seq_lens"].numpy(),
                                                       t["block_table"], LOCAL["page"], max_virtual_batches=LOCAL_M)
        return tuple(torch.as_tensor(x) for x in got)
    if base == "prepare_swa_spec_page_table":
        return (ref.prepare_swa_spec_page_table(
            t["page_table_dst"], t["page_table_a"], t["page_table_b"], t["seq_len_a"], t["seq_len_b"], SWA["ndt"],
            seq_start_a=t["seq_start_a"], full_to_swa=t["full_to_swa"]),)
    raise KeyError(name)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_cases_match_reference(name, seed):
    case = make_case(name, DEVICE, seed)
    expected = _reference(name, case.t)  # before the op writes any in-place destination
    got = case.public(case.t)
    assert len(got) == len(expected)
    for out, exp in zip(got, expected):
        assert out.shape == exp.shape, name
        if exp.dtype.is_floating_point:
            finite = torch.isfinite(exp)
            assert torch.equal(torch.isfinite(out.cpu()), finite), f"{name}: non-finite entries differ"
            if out.dtype == torch.float32 and exp.dim() < 3:  # an LSE
                assert torch.allclose(out.cpu().double()[finite], exp[finite], atol=1e-2 if not INTERPRET else 1e-4)
            else:
                assert_close(out, exp, out.dtype if out.dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.float32)
        else:
            assert torch.equal(out.cpu().to(exp.dtype), exp), name


# ---------------------------------------------------------------------------------------------
# determinism: repeated runs are bitwise equal
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_repeated_runs_are_bitwise_equal(name):
    case = make_case(name)
    first = snapshot(case.public(case.t))
    for _ in range(2 if INTERPRET else 20):
        assert_bitwise_equal(case.public(case.t), first, name)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [0, 1, 7])
def test_paged_attention_larger_problem_is_deterministic(num_splits):
    # a serving-size batch: many programs per split, and the split combine in a fixed order
    gen = torch.Generator().manual_seed(5)
    batch, hq, hkv, d, page = 16, 32, 8, 128, 16
    lens = torch.randint(1, 2048, (batch,), generator=gen, dtype=torch.int32)
    pages = 2048 // page
    k = torch.randn(batch * pages, page, hkv, d, generator=gen).to(DEVICE, torch.bfloat16)
    v = torch.randn(batch * pages, page, hkv, d, generator=gen).to(DEVICE, torch.bfloat16)
    table = torch.randperm(batch * pages, generator=gen).view(batch, pages).to(DEVICE, torch.int32)
    q = torch.randn(batch, 1, hq, d, generator=gen).to(DEVICE, torch.bfloat16)
    run = lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=lens.to(DEVICE), page_table=table,  # noqa: E731
                                          num_splits=num_splits, return_softmax_lse=True)
    first = snapshot(run())
    for _ in range(50):
        assert_bitwise_equal(run(), first)


# ---------------------------------------------------------------------------------------------
# empty batches and zero-length sequences: defined results for every op
# ---------------------------------------------------------------------------------------------


def _i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def _kv(num_pages=3, page=4, hkv=1, d=64):
    k = torch.randn(num_pages, page, hkv, d, device=DEVICE).to(ATTN_DTYPE)
    return k, torch.randn(num_pages, page, hkv, d, device=DEVICE).to(ATTN_DTYPE)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("layout", ["ragged", "ragged_max_q", "4d"])
def test_paged_attention_empty_batch(layout, num_splits):
    k, v = _kv()
    table = torch.zeros(0, 2, dtype=torch.int32, device=DEVICE)
    kwargs = dict(cache_seqlens=_i32([]), page_table=table, num_splits=num_splits, return_softmax_lse=True)
    if layout == "4d":
        q = torch.randn(0, 1, 2, 64, device=DEVICE, dtype=ATTN_DTYPE)
    else:
        q = torch.randn(0, 2, 64, device=DEVICE, dtype=ATTN_DTYPE)
        kwargs.update(cu_seqlens_q=_i32([0]), max_seqlen_q=1 if layout == "ragged_max_q" else None)
    out, lse = flash_attn_with_kvcache(q, k, v, **kwargs)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
    out, lse = C.flash_attn_with_kvcache(q, k, v, kwargs["cache_seqlens"], table, kwargs.get("cu_seqlens_q"),
                                         kwargs.get("max_seqlen_q"), num_splits=num_splits, return_softmax_lse=True)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_attention_zero_lengths(num_splits):
    # request 0: no keys (one query); request 1: no queries; request 2: a normal decode token
    k, v = _kv()
    q = torch.randn(2, 2, 64, device=DEVICE, dtype=ATTN_DTYPE)
    table = _i32([[0, 1], [1, 2], [2, 0]])
    out, lse = flash_attn_with_kvcache(q, k, v, cache_seqlens=_i32([0, 5, 3]), page_table=table,
                                       cu_seqlens_q=_i32([0, 1, 1, 2]), num_splits=num_splits, sinks=torch.zeros(2, device=DEVICE),
                                       return_softmax_lse=True)
    assert torch.equal(out[0].float().cpu(), torch.zeros(2, 64)) and torch.isneginf(lse[:, 0]).all()
    assert torch.isfinite(out[1].float()).all() and torch.isfinite(lse[:, 1]).all()
    # every request empty (all cache_seqlens 0): outputs 0, LSE -inf, never NaN
    q4 = torch.randn(3, 1, 2, 64, device=DEVICE, dtype=ATTN_DTYPE)
    out, lse = flash_attn_with_kvcache(q4, k, v, cache_seqlens=0, page_table=table, num_splits=num_splits,
                                       return_softmax_lse=True)
    assert torch.equal(out.float().cpu(), torch.zeros(3, 2, 64)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("splits", [1, 2])
def test_mla_decode_empty_batch_and_zero_lengths(splits):
    cache = torch.randn(4, 4, MLA_R + MLA_DR, device=DEVICE).to(ATTN_DTYPE)
    q_nope = lambda *s: torch.randn(*s, MLA_R, device=DEVICE).to(ATTN_DTYPE)  # noqa: E731
    q_pe = lambda *s: torch.randn(*s, MLA_DR, device=DEVICE).to(ATTN_DTYPE)  # noqa: E731
    table = _i32([[1, 2], [3, 0]])
    # empty batch: workspace size 0 (None is fine)
    assert flash_mla_get_workspace_size(8, 0, 4, 4, splits, head_dim_v=MLA_R, device=DEVICE) == 0
    out, lse = flash_mla_decode(q_nope(0, 4), q_pe(0, 4), cache, _i32([]), table[:0], None, 0.1, splits, return_lse=True)
    assert out.shape == (0, 4, MLA_R) and lse.shape == (0, 4)
    out, lse = C.flash_mla_decode(q_nope(0, 4), q_pe(0, 4), cache, _i32([]), table[:0], None, 0.1, splits, return_lse=True)
    assert out.shape == (0, 4, MLA_R) and lse.shape == (0, 4)
    # zero-length requests: 0 and -inf
    size = flash_mla_get_workspace_size(8, 2, 4, 4, splits, head_dim_v=MLA_R, device=DEVICE)
    ws = torch.full((size,), 0xFF, dtype=torch.uint8, device=DEVICE)  # NaN everywhere
    out, lse = flash_mla_decode(q_nope(2, 4), q_pe(2, 4), cache, _i32([0, 5]), table, ws, 0.1, splits, return_lse=True)
    assert torch.equal(out[0].float().cpu(), torch.zeros(4, MLA_R)) and torch.isneginf(lse[0]).all()
    assert torch.isfinite(out[1].float()).all() and torch.isfinite(lse[1]).all()


def test_merge_state_empty_and_both_states_empty():
    v = torch.randn(0, 2, 32, device=DEVICE)
    s = torch.randn(0, 2, device=DEVICE)
    for fn in (merge_state_v2, C.merge_state_v2):
        out, lse = fn(v, s, v, s)
        assert out.shape == (0, 2, 32) and lse.shape == (0, 2)
    v = torch.randn(1, 2, 32, device=DEVICE)
    empty = torch.full((1, 2), -math.inf, device=DEVICE)
    out, lse = merge_state_v2(v, empty, v, empty)
    assert torch.equal(out.cpu(), torch.zeros(1, 2, 32)) and torch.isneginf(lse).all()


def test_page_tables_empty_batch_and_zero_lengths():
    r2t = torch.arange(32, dtype=torch.int32, device=DEVICE).view(2, 16)
    empty_i64 = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    got = normalize_page_table(r2t, empty_i64, _i32([]), 4)  # max_pages from an empty batch: 0
    assert got.shape == (0, 0)
    assert normalize_page_table(r2t, empty_i64, _i32([]), 4, max_pages=3).shape == (0, 3)
    assert C.normalize_page_table(r2t, empty_i64, _i32([]), 4, 3).shape == (0, 3)
    got = normalize_page_table(r2t, torch.tensor([1, 0], device=DEVICE), _i32([0, 5]), 4, max_pages=3)
    # sglang's req_to_token[rpi][:, ::4][:, :3] // 4, whatever the lengths: a zero-length row too
    assert got.cpu().tolist() == [[4, 5, 6], [0, 1, 2]]
    mapping = torch.tensor([3, 2, 1, -1], device=DEVICE)
    for fn in (translate_loc_from_full_to_swa, C.translate_loc_from_full_to_swa):
        got = fn(mapping, torch.zeros(0, 3, dtype=torch.int64, device=DEVICE))
        assert got.shape == (0, 3) and got.dtype == torch.int32


@pytest.mark.parametrize("graph", [False, True])
def test_local_attention_empty_batch_and_zero_lengths(graph):
    kwargs = dict(max_virtual_batches=4) if graph else {}
    got = make_local_attention_virtual_batches(4, _i32([0]), _i32([]), torch.zeros(0, 3, dtype=torch.int32, device=DEVICE),
                                               2, **kwargs)
    v = 4 if graph else 0
    assert [tuple(x.shape) for x in got] == [(v,), (v + 1,), (v,), (v, 2)]
    assert all(int(x.abs().sum()) == 0 for x in got)
    if graph:
        got = C.make_local_attention_virtual_batches(4, _i32([0]), _i32([]), torch.zeros(0, 3, dtype=torch.int32, device=DEVICE),
                                                     2, 4)
        assert all(int(x.abs().sum()) == 0 for x in got)
    # zero-length requests: one virtual batch each, 0 queries, 0 keys
    got = make_local_attention_virtual_batches(4, _i32([0, 0, 0]), _i32([0, 0]), _i32([[7, 8], [9, 10]]), 2, **kwargs)
    v = 4 if graph else 2
    assert got[0].cpu().tolist() == [0] * v and got[1].cpu().tolist() == [0] * (v + 1) and got[2].cpu().tolist() == [0] * v


def test_swa_spec_empty_batch_and_zero_lengths():
    dst = torch.zeros(0, 4, dtype=torch.int32, device=DEVICE)
    z = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    got = prepare_swa_spec_page_table(dst, torch.zeros(0, 3, dtype=torch.int32, device=DEVICE),
                                      torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), z, z, 2)
    assert got is dst and got.shape == (0, 4)
    C.prepare_swa_spec_page_table(dst, torch.zeros(0, 3, dtype=torch.int32, device=DEVICE),
                                  torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), z, z, 2)
    # zero lengths: nothing is written
    dst = torch.full((2, 4), 7, dtype=torch.int32, device=DEVICE)
    prepare_swa_spec_page_table(dst, _i32([[1, 2, 3]]), _i32([[4], [5]]), _i32([0]), _i32([0, 0]), 2)
    assert (dst == 7).all()


def test_host_helpers_on_empty_batches():
    assert max_local_attention_virtual_batches(0, 0, 8) == 0
    assert flash_mla_get_workspace_size(0, 0, 16, 64, -1) == 0


# ---------------------------------------------------------------------------------------------
# docs/robustness.md's "Bad input" table: one test per row, exact exception type and message
# ---------------------------------------------------------------------------------------------


def _paged_args(**change):
    """A valid flash_attn_with_kvcache call (D = 64, page size 4, 2 KV heads, 4 query heads)."""
    args = dict(
        q=torch.zeros(3, 4, 64), k_cache=torch.zeros(6, 4, 2, 64), v_cache=torch.zeros(6, 4, 2, 64),
        cache_seqlens=torch.tensor([3, 5], dtype=torch.int32), page_table=torch.zeros(2, 2, dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32),
    )
    args.update(change)
    return args


def _mla_args(**change):
    args = dict(
        q_nope=torch.zeros(2, 3, 32), q_pe=torch.zeros(2, 3, 16), kv_c_and_k_pe_cache=torch.zeros(4, 4, 48),
        seq_lens=torch.tensor([3, 5], dtype=torch.int32), page_table=torch.zeros(2, 2, dtype=torch.int32),
        workspace=None, sm_scale=0.1, num_kv_splits=1,
    )
    args.update(change)
    return args


def _varlen_args(**change):
    """A valid flash_attn_varlen_func call (D = 64, 2 KV heads, 4 query heads, 2 requests)."""
    args = dict(
        q=torch.zeros(3, 4, 64), k=torch.zeros(5, 2, 64), v=torch.zeros(5, 2, 64),
        cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32), cu_seqlens_k=torch.tensor([0, 2, 5], dtype=torch.int32),
        max_seqlen_q=2, max_seqlen_k=3,
    )
    args.update(change)
    return args


def _mla_prefill_args(**change):
    """A valid flash_mla_prefill call (R + Dr = 32 + 16, page size 4, 2 requests over 5 query rows)."""
    args = dict(
        q_nope=torch.zeros(5, 3, 32), q_pe=torch.zeros(5, 3, 16), kv_c_and_k_pe_cache=torch.zeros(4, 4, 48),
        cu_seqlens_q=torch.tensor([0, 2, 5], dtype=torch.int32), seq_lens_k=torch.tensor([3, 5], dtype=torch.int32),
        max_seqlen_q=3, page_table=torch.zeros(2, 2, dtype=torch.int32), workspace=None, sm_scale=0.1,
    )
    args.update(change)
    return args


def _local_args(**change):
    args = dict(
        attn_chunk_size=4, query_start_loc=torch.tensor([0, 4, 14, 19], dtype=torch.int32),
        seq_lens=torch.tensor([6, 17, 9], dtype=torch.int32), block_table=torch.arange(30, dtype=torch.int32).reshape(3, 10),
        page_size=2,
    )
    args.update(change)
    return args


def _swa_args(**change):
    args = dict(
        page_table_dst=torch.zeros(2, 5, dtype=torch.int32), page_table_a=torch.tensor([[4, 5, 6]], dtype=torch.int32),
        page_table_b=torch.tensor([[7], [8]], dtype=torch.int32), seq_len_a=torch.tensor([3], dtype=torch.int32),
        seq_len_b=torch.tensor([1, 1], dtype=torch.int32), num_draft_tokens=2,
    )
    args.update(change)
    return args


def _merge_args(**change):
    args = dict(v_a=torch.zeros(3, 2, 16), s_a=torch.zeros(3, 2), v_b=torch.zeros(3, 2, 16), s_b=torch.zeros(3, 2))
    args.update(change)
    return args


def _on_device(args):
    """Move tensors to the test device, except those placed on 'meta' on purpose."""
    return {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) and v.device.type != "meta" else v) for k, v in args.items()}


def _call(fn, args):
    args = _on_device(args)
    if fn is make_local_attention_virtual_batches:
        pos = [args.pop(k) for k in ("attn_chunk_size", "query_start_loc", "seq_lens", "block_table", "page_size")]
        return fn(*pos, **args)
    if fn is prepare_swa_spec_page_table:
        pos = [args.pop(k) for k in ("page_table_dst", "page_table_a", "page_table_b", "seq_len_a", "seq_len_b",
                                     "num_draft_tokens")]
        return fn(*pos, **args)
    return fn(**args)


_PA, _MLA, _LOCAL, _SWA, _MERGE = (flash_attn_with_kvcache, flash_mla_decode, make_local_attention_virtual_batches,
                                   prepare_swa_spec_page_table, merge_state_v2)
_VARLEN, _MLA_PREFILL = flash_attn_varlen_func, flash_mla_prefill
_META = torch.device("meta")  # a second device that exists everywhere (two GPUs: test_ops_reject_inputs_on_two_devices)
_DEV = torch.empty(0, device=DEVICE).device  # with its index (cuda:0), as error messages print it

#: (class of invalid input, the input, op, arguments, exception type, exact message or its fixed prefix).
#: docs/robustness.md's "Bad input" table is this list; keep them in step.
BAD_INPUT = [
    ("dtype", "`q` int32", _PA, _paged_args(q=torch.zeros(3, 4, 64, dtype=torch.int32)), TypeError,
     "q must have dtype in (float16, bfloat16, float32), got int32"),
    ("dtype", "`page_table` int64", _PA, _paged_args(page_table=torch.zeros(2, 2, dtype=torch.int64)), TypeError,
     "page_table must have dtype in (int32), got int64: convert it with page_table.to(torch.int32)"),
    ("dtype", "`cache_seqlens` int64", _PA, _paged_args(cache_seqlens=torch.tensor([3, 5])), TypeError,
     "cache_seqlens must have dtype in (int32), got int64: convert it with cache_seqlens.to(torch.int32)"),
    ("dtype", "`k_cache` fp16 under an fp32 `q`", _PA, _paged_args(k_cache=torch.zeros(6, 4, 2, 64, dtype=torch.float16)), TypeError,
     "k_cache's dtype (float16) does not match q's (float32): the cache must have q's dtype or be fp8 "
     "(float8_e4m3fn, float8_e5m2) with k_descale/v_descale"),
    ("dtype", "`seq_lens` float32", _MLA, _mla_args(seq_lens=torch.zeros(2)), TypeError, "seq_lens must have dtype in (int32, int64), got float32"),
    ("dtype", "`v_b` fp16, `v_a` fp32", _MERGE, _merge_args(v_b=torch.zeros(3, 2, 16, dtype=torch.float16)), TypeError,
     "v_b must have dtype in (float32), got float16"),
    ("dtype", "`cu_seqlens_q` int64", _VARLEN, _varlen_args(cu_seqlens_q=torch.tensor([0, 1, 3])), TypeError,
     "cu_seqlens_q must have dtype in (int32), got int64: convert it with cu_seqlens_q.to(torch.int32)"),
    ("not a tensor", "`q` a list", _PA, _paged_args(q=[[0.0]]), TypeError, "q must be a torch.Tensor, got list"),
    ("not a tensor", "`sinks` a list", _PA, _paged_args(sinks=[0.0] * 4), TypeError, "sinks must be a torch.Tensor, got list"),
    ("not a bool", "`causal=1`", _MLA_PREFILL, _mla_prefill_args(causal=1), TypeError, "causal must be a bool, got int"),
    ("not a bool", "`causal=\"no\"`", _PA, _paged_args(causal="no"), TypeError, "causal must be a bool, got str"),
    ("scalar", "`softmax_scale=nan`", _PA, _paged_args(softmax_scale=float("nan")), ValueError,
     "softmax_scale must be finite, got nan"),
    ("scalar", "`softmax_scale=\"abc\"`", _VARLEN, _varlen_args(softmax_scale="abc"), TypeError,
     "softmax_scale must be a real number or None, got str"),
    ("scalar", "`softcap=inf`", _VARLEN, _varlen_args(softcap=float("inf")), ValueError, "softcap must be finite, got inf"),
    ("scalar", "`softcap=None`", _PA, _paged_args(softcap=None), TypeError, "softcap must be a real number, got NoneType"),
    ("scalar", "`sm_scale=inf`", _MLA, _mla_args(sm_scale=float("inf")), ValueError, "sm_scale must be finite, got inf"),
    ("scalar", "`window_size=(1.7, 0)`", _PA, _paged_args(window_size=(1.7, 0)), TypeError,
     "window_size[0] must be an int, got float"),
    ("scalar", "`window_size=(1, 2, 3)`", _VARLEN, _varlen_args(window_size=(1, 2, 3)), TypeError,
     "window_size must be a (left, right) pair of ints, got (1, 2, 3)"),
    ("scalar", "`window_size=(-2, 0)`", _PA, _paged_args(window_size=(-2, 0)), ValueError,
     "window_size[0] must be >= -1, got -2"),
    ("scalar", "`max_seqlen_q=2.5`", _PA, _paged_args(max_seqlen_q=2.5), TypeError,
     "max_seqlen_q must be an int or None, got float"),
    ("scalar", "`max_seqlen_q=-1`", _MLA_PREFILL, _mla_prefill_args(max_seqlen_q=-1), ValueError,
     "max_seqlen_q must be >= 0, got -1"),
    ("scalar", "`num_splits=-1`", _PA, _paged_args(num_splits=-1), ValueError, "num_splits must be >= 0, got -1"),
    ("scalar", "`num_kv_splits=1.0`", _MLA, _mla_args(num_kv_splits=1.0), TypeError, "num_kv_splits must be an int, got float"),
    ("device mismatch", "`k_cache` on another device than `q`", _PA, _paged_args(k_cache=torch.zeros(6, 4, 2, 64, device=_META)), ValueError,
     "k_cache is on meta but q is on {dev}: all inputs must be on one device"),
    ("device mismatch", "`seq_lens` on another device than `q_nope`", _MLA, _mla_args(seq_lens=torch.zeros(2, dtype=torch.int32, device=_META)), ValueError,
     "seq_lens is on meta but q_nope is on {dev}: all inputs must be on one device"),
    ("device mismatch", "`s_b` on another device than `v_a`", _MERGE, _merge_args(s_b=torch.zeros(3, 2, device=_META)), ValueError,
     "s_b is on meta but v_a is on {dev}: all inputs must be on one device"),
    ("device mismatch", "`seq_lens` on another device than `block_table`", _LOCAL, _local_args(seq_lens=torch.tensor([6, 17, 9], dtype=torch.int32, device=_META)), ValueError,
     "seq_lens is on meta but block_table is on {dev}: all inputs must be on one device"),
    ("shape", "`q` with D = 128 over a D = 64 cache", _PA, _paged_args(q=torch.zeros(3, 4, 128)), ValueError, "q's head dim (128) must equal k_cache's (64)"),
    ("shape", "`cu_seqlens_q` of length 2 for B = 2", _PA, _paged_args(cu_seqlens_q=torch.tensor([0, 3], dtype=torch.int32)), ValueError,
     "len(cu_seqlens_q) must be B + 1 = 3 (B from page_table and cache_seqlens), got 2"),
    ("shape", "`page_table` with 3 rows for 2 `cache_seqlens`", _PA, _paged_args(page_table=torch.zeros(3, 2, dtype=torch.int32)), ValueError,
     "page_table has 3 rows but cache_seqlens has 2 entries: both need one per request"),
    ("shape", "cache rows of 56 channels for R + Dr = 48", _MLA, _mla_args(kv_c_and_k_pe_cache=torch.zeros(4, 4, 56)), ValueError,
     "kv_c_and_k_pe_cache rows hold 56 channels but q_nope/q_pe give R + Dr = 32 + 16 = 48"),
    ("shape", "`s_a` `[2, 3]` for `v_a` `[3, 2, 16]`", _MERGE, _merge_args(s_a=torch.zeros(2, 3)), ValueError, "s_a must have shape [3, 2], got [2, 3]"),
    ("shape", "`v` with 4 rows for 5 rows of `k`", _VARLEN, _varlen_args(v=torch.zeros(4, 2, 64)), ValueError,
     "v must have shape [5, 2, Dv] like k, got [4, 2, 64]"),
    ("shape", "`page_table` with 3 rows for 2 requests", _MLA_PREFILL, _mla_prefill_args(page_table=torch.zeros(3, 2, dtype=torch.int32)),
     ValueError, "page_table must have 2 rows (one per request), got shape [3, 2]"),
    ("last-dim stride", "`q.stride(-1) != 1`", _PA, _paged_args(q=torch.zeros(3, 64, 4).transpose(1, 2)), ValueError,
     "q must be contiguous in its last dimension (stride(-1) == 1), got stride (256, 1, 4)"),
    ("last-dim stride", "`k_cache.stride(-1) != 1`", _PA, _paged_args(k_cache=torch.zeros(6, 4, 64, 2).transpose(2, 3)), ValueError,
     "k_cache must be contiguous in its last dimension (stride(-1) == 1), got stride (512, 128, 1, 2)"),
    ("last-dim stride", "cache `stride(-1) != 1`", _MLA, _mla_args(kv_c_and_k_pe_cache=torch.zeros(4, 48, 4).transpose(1, 2)), ValueError,
     "kv_c_and_k_pe_cache must be contiguous in its last dimension (stride(-1) == 1), got stride (192, 1, 4)"),
    ("page size", "`k_cache` page size 3", _PA, _paged_args(k_cache=torch.zeros(6, 3, 2, 64), v_cache=torch.zeros(6, 3, 2, 64)), ValueError,
     "page_size (k_cache.shape[1]) must be a power of two from 1 to 2048, got 3"),
    ("page size", "cache page size 4096", _MLA, _mla_args(kv_c_and_k_pe_cache=torch.zeros(2, 4096, 48)), ValueError,
     "kv_c_and_k_pe_cache.shape[1] (page size) must be a power of two from 1 to 2048, got 4096"),
    ("page size", "`page_size=3`", _LOCAL, _local_args(page_size=3, attn_chunk_size=6), ValueError,
     "page_size must be a power of two from 1 to 2048, got 3"),
    ("page size", "`page_size=2.0`", _LOCAL, _local_args(page_size=2.0), TypeError, "page_size must be an int, got float"),
    ("head dims", "D = 36", _PA, _paged_args(q=torch.zeros(3, 4, 36), k_cache=torch.zeros(6, 4, 2, 36), v_cache=torch.zeros(6, 4, 2, 36)),
     ValueError, "head dim D must be a multiple of 8 from 8 to 576, got 36"),
    ("head dims", "Dv = 100", _PA, _paged_args(v_cache=torch.zeros(6, 4, 2, 100)), ValueError,
     "value head dim Dv must be a multiple of 8 from 8 to 512, got 100"),
    ("head dims", "3 query heads over 2 KV heads", _PA, _paged_args(q=torch.zeros(3, 3, 64)), ValueError,
     "the query heads (3) must be a multiple of the KV heads (2)"),
    ("head dims", "cache `[pages, P, 2, R + Dr]`", _MLA, _mla_args(kv_c_and_k_pe_cache=torch.zeros(4, 4, 2, 48)), ValueError,
     "kv_c_and_k_pe_cache must have one KV head (shape [pages, P, 1, R + Dr]), got [4, 4, 2, 48]"),
    ("head dims", "combined `q_nope` of width 100 without `head_dim_v`", _MLA, _mla_args(q_pe=None, q_nope=torch.zeros(2, 3, 100)), ValueError,
     "q_nope holds combined queries of width 100: pass head_dim_v (the latent width R)"),
    ("length beyond the table (validate=True)", "`seq_lens[1] = 17` over a 4-column table, `validate=True`", _LOCAL, _local_args(block_table=torch.zeros(3, 4, dtype=torch.int32),
                                                                    validate=True), ValueError,
     "seq_lens[1] = 17 needs more pages than block_table has columns (4, page_size 2)"),
    ("length beyond the table (validate=True)", "`seq_len_a + seq_len_b = 4` into 3 columns, `validate=True`", _SWA, _swa_args(page_table_dst=torch.zeros(2, 3, dtype=torch.int32),
                                                                validate=True), ValueError,
     "page_table_dst is too narrow: row 0 needs seq_len_a + seq_len_b = 4 columns, page_table_dst has 3"),
    ("length beyond the table (validate=True)", "`cache_seqlens[1] = 9` over 2 pages of 4, `validate=True`", _PA,
     _paged_args(cache_seqlens=torch.tensor([3, 9], dtype=torch.int32), validate=True), ValueError,
     "cache_seqlens[1] = 9 exceeds the page table: 2 pages x page_size 4"),
    ("page id outside the pool (validate=True)", "page id 6 in a pool of 6 pages, `validate=True`", _PA,
     _paged_args(page_table=torch.tensor([[0, 0], [1, 6]], dtype=torch.int32), validate=True), ValueError,
     "page_table holds page id 6 outside the pool [0, 6)"),
    ("length beyond the table (validate=True)", "`seq_lens[1] = 9` over 2 pages of 4, `validate=True`", _MLA,
     _mla_args(seq_lens=torch.tensor([3, 9], dtype=torch.int32), validate=True), ValueError,
     "seq_lens[1] = 9 exceeds the page table: 2 pages x page_size 4"),
    ("page id outside the pool (validate=True)", "page id 4 in a pool of 4 pages, `validate=True`", _MLA,
     _mla_args(page_table=torch.tensor([[0, 0], [1, 4]], dtype=torch.int32), validate=True), ValueError,
     "page_table holds page id 4 outside the pool [0, 4)"),
    ("length beyond the table (validate=True)", "`seq_lens_k[1] = 9` over 2 pages of 4, `validate=True`", _MLA_PREFILL,
     _mla_prefill_args(seq_lens_k=_i32([3, 9]), validate=True), ValueError,
     "seq_lens_k[1] = 9 exceeds the page table: 2 pages x page_size 4"),
    ("page id outside the pool (validate=True)", "page id 7 in a pool of 4 pages, `validate=True`", _MLA_PREFILL,
     _mla_prefill_args(page_table=_i32([[0, 1], [2, 7]]), validate=True), ValueError,
     "page_table holds page id 7 outside the pool [0, 4)"),
    ("offsets (validate=True)", "`cu_seqlens_q=[0, 3, 2]`, `validate=True`", _MLA_PREFILL,
     _mla_prefill_args(cu_seqlens_q=_i32([0, 3, 2]), validate=True), ValueError, "cu_seqlens_q must be non-decreasing"),
    ("offsets (validate=True)", "`cu_seqlens_q[-1] = 6` over 5 rows of `q_nope`, `validate=True`", _MLA_PREFILL,
     _mla_prefill_args(cu_seqlens_q=_i32([0, 2, 6]), validate=True), ValueError, "cu_seqlens_q[-1] = 6 exceeds q_nope.shape[0] = 5"),
    ("offsets (validate=True)", "`cu_seqlens_k=[0, 2, 6]` over 5 rows of `k`, `validate=True`", _VARLEN,
     _varlen_args(cu_seqlens_k=_i32([0, 2, 6]), validate=True), ValueError,
     "cu_seqlens_k must be non-decreasing from >= 0 up to at most 5 (the rows of k), got [0, 2, 6]"),
    ("offsets (validate=True)", "`max_seqlen_q=1` below a request of 2 queries, `validate=True`", _VARLEN,
     _varlen_args(max_seqlen_q=1, validate=True), ValueError, "max_seqlen_q = 1 but request 1 has 2 queries"),
    ("offsets (validate=True)", "`max_seqlen_q=1` below a request of 2 queries, `validate=True`", _PA,
     _paged_args(max_seqlen_q=1, validate=True), ValueError, "max_seqlen_q = 1 but request 1 has 2 queries"),
    ("offsets (validate=True)", "`cu_seqlens_q=[1, 2, 3]`, `validate=True`", _VARLEN,
     _varlen_args(cu_seqlens_q=_i32([1, 2, 3]), validate=True), ValueError, "cu_seqlens_q[0] must be 0, got 1"),
    ("offsets (validate=True)", "`cu_seqlens_q=[1, 2, 3]`, `validate=True`", _PA,
     _paged_args(cu_seqlens_q=_i32([1, 2, 3]), validate=True), ValueError, "cu_seqlens_q[0] must be 0, got 1"),
    ("offsets (validate=True)", "`max_seqlen_q=2` below a request of 3 queries, `validate=True`", _MLA_PREFILL,
     _mla_prefill_args(max_seqlen_q=2, validate=True), ValueError, "max_seqlen_q = 2 but request 1 has 3 queries"),
    ("offsets (validate=True)", "`seqused_k[1] = 4` beyond its slice of 3 keys, `validate=True`", _VARLEN,
     _varlen_args(seqused_k=_i32([1, 4]), validate=True), ValueError,
     "seqused_k[1] = 4 lies outside [0, 3] (request 1's slice of cu_seqlens_k)"),
    ("page id outside the pool (validate=True)", "table entry 22 with `num_pages=20`, `validate=True`", _LOCAL, _local_args(validate=True, num_pages=20), ValueError,
     "block_table entry 22 (virtual batch 6, column 0) is outside the page pool [0, 20)"),
    ("page id outside the pool (validate=True)", "slot 8 with `swa_pool_size=8`, `validate=True`", _SWA, _swa_args(validate=True, swa_pool_size=8), ValueError,
     "1 destination row(s) hold slots outside the SWA pool [0, 8) (full-pool slots? pass full_to_swa=): "
     "first page_table_dst[1, 3] = 8"),
    ("workspace too small", "a 16-byte workspace for 4 splits", _MLA, _mla_args(num_kv_splits=4, workspace=torch.zeros(16, dtype=torch.uint8)), ValueError,
     "workspace holds 16 bytes but flash_mla_decode needs 3328 bytes for 4 KV splits (B=2, q_len=1, H=3, R=32): "
     "size it with flash_mla_get_workspace_size"),
    ("workspace too small", "no workspace for 2 splits", _MLA, _mla_args(num_kv_splits=2, workspace=None), ValueError,
     "workspace holds 0 bytes but flash_mla_decode needs 1792 bytes for 2 KV splits"),
    ("chunk not a page multiple", "`attn_chunk_size=6`, `page_size=4`", _LOCAL, _local_args(attn_chunk_size=6, page_size=4), ValueError,
     "attn_chunk_size (6) must be a multiple of page_size (4)"),
    ("graph-mode size too small", "`max_virtual_batches=2` for B = 3", _LOCAL, _local_args(max_virtual_batches=2), ValueError,
     "max_virtual_batches (2) must be at least the batch size 3: every request makes at least one virtual batch"),
    ("graph-mode size too small (validate=True)", "`max_virtual_batches=5` when 8 are needed, `validate=True`", _LOCAL, _local_args(max_virtual_batches=5, validate=True), ValueError,
     "the batch needs 8 virtual batches, more than max_virtual_batches = 5"),
    ("missing argument", "`k=` without `v=`", _PA, _paged_args(k=torch.zeros(3, 2, 64)), ValueError,
     "v: the new keys k and values v to append must be given together"),
    ("unsupported feature", "`qv=` given", _VARLEN, _varlen_args(qv=torch.zeros(3, 4, 64)), ValueError,
     "qv: qv (absorbed-MLA extend) is not supported: concatenate it into q/k beforehand"),
    ("unsupported feature", "`num_kv_splits=2`", _MLA_PREFILL, _mla_prefill_args(num_kv_splits=2), ValueError,
     "num_kv_splits=2: flash_mla_prefill does not split the keys (its query tiles fill the device); pass -1, 0 or 1"),
    ("missing argument", "3-D `q` without `cu_seqlens_q`", _PA, _paged_args(cu_seqlens_q=None), ValueError,
     "cu_seqlens_q ([B + 1] int32) is required with a 3-D q [total_q, Hq, D]"),
]


@pytest.mark.parametrize("row", BAD_INPUT, ids=[f"{i}-{r[0]}-{r[2].__name__}" for i, r in enumerate(BAD_INPUT)])
def test_bad_input_table(row):
    _, _, fn, args, error, message = row
    message = message.format(dev=_DEV)
    with pytest.raises(error) as info:
        _call(fn, dict(args))
    assert type(info.value) is error
    assert str(info.value).startswith(message), f"{str(info.value)!r} does not start with {message!r}"


def readme_row(row) -> str:
    """The documentation's line for a BAD_INPUT row (device mismatches shown as cuda:1 vs cuda:0)."""
    cls, what, fn, _, error, message = row
    message = message.replace("is on meta", "is on cuda:1").format(dev="cuda:0")
    return f"| {cls} | {what} | `{fn.__name__}` | `{error.__name__}` | `{message}` |"


def test_docs_bad_input_table_matches_the_tests():
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "robustness.md").read_text()
    assert "\n## Bad input\n" in doc
    missing = [readme_row(row) for row in BAD_INPUT if readme_row(row) not in doc]
    assert not missing, "docs/robustness.md's Bad input table lacks:\n" + "\n".join(missing)
    # and every row of that table is a test's row (no claim without a test)
    section = doc[doc.index("\n## Bad input\n"):]
    section = section[: section.find("\n## ", 1)]
    table = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| class |")]
    untested = sorted(set(table) - {readme_row(row) for row in BAD_INPUT})
    assert not untested, "docs/robustness.md's Bad input table has rows no test checks:\n" + "\n".join(untested)


def test_custom_ops_raise_the_same_errors():
    # the custom ops run the public functions: same exception, same message
    with pytest.raises(ValueError, match=re.escape("q's head dim (128) must equal k_cache's (64)")):
        a = _on_device(_paged_args(q=torch.zeros(3, 4, 128)))
        C.flash_attn_with_kvcache(a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a["page_table"], a["cu_seqlens_q"])
    with pytest.raises(ValueError, match=re.escape("attn_chunk_size (6) must be a multiple of page_size (4)")):
        a = _on_device(_local_args())
        C.make_local_attention_virtual_batches(6, a["query_start_loc"], a["seq_lens"], a["block_table"], 4, 8)
    with pytest.raises(ValueError, match=re.escape("workspace holds 16 bytes but flash_mla_decode needs 3328 bytes")):
        a = _on_device(_mla_args())
        C.flash_mla_decode(a["q_nope"], a["q_pe"], a["kv_c_and_k_pe_cache"], a["seq_lens"], a["page_table"],
                           torch.zeros(16, dtype=torch.uint8, device=DEVICE), 0.1, 4)


# ---------------------------------------------------------------------------------------------
# graphs (GPU): capture once, write new values into the captured inputs, replay == eager
# ---------------------------------------------------------------------------------------------


def _graph_api():
    if DEVICE.type == "cuda":
        return torch.cuda
    if DEVICE.type == "xpu" and hasattr(torch.xpu, "XPUGraph") and hasattr(torch.xpu, "graph"):
        return torch.xpu
    pytest.skip(f"no graph capture for {DEVICE.type} in torch {torch.__version__}")


def _capture(api, fn):
    """``fn`` captured in a device graph after two warm-up calls (helpers.capture_graph)."""
    return capture_graph(api, fn, warmups=2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_graph_capture_and_replay_with_new_values(name):
    api = _graph_api()
    case = make_case(name, DEVICE, seed=0)
    graph, outputs = _capture(api, lambda: case.public(case.t))
    for seed in (1, 2, 3):
        fresh = make_case(name, DEVICE, seed)
        for key, tensor in case.t.items():
            tensor.copy_(fresh.t[key])  # new values (and, for in-place ops, a new destination)
        graph.replay()
        api.synchronize()
        expected = fresh.public(fresh.t)
        assert_bitwise_equal(outputs, expected, f"{name} replay with seed {seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_graph_paths_never_sync_with_the_host(name):
    if DEVICE.type != "cuda":
        pytest.skip("torch.cuda.set_sync_debug_mode is CUDA only")
    case = make_case(name, DEVICE)
    case.public(case.t)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        case.public(case.t)
        op, args, kwargs = case.custom(case.t)
        op(*args, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_custom_op_graph_capture():
    # the custom-op forms capture as well (what torch.compile's CUDA graphs replay)
    api = _graph_api()
    for name in ("flash_attn_with_kvcache", "flash_mla_decode", "make_local_attention_virtual_batches",
                 "prepare_swa_spec_page_table"):
        case = make_case(name, DEVICE, seed=0)

        def run():
            op, args, kwargs = case.custom(case.t)
            return case.custom_outputs(case.t, op(*args, **kwargs))

        graph, outputs = _capture(api, run)
        fresh = make_case(name, DEVICE, seed=4)
        for key, tensor in case.t.items():
            tensor.copy_(fresh.t[key])
        graph.replay()
        api.synchronize()
        assert_bitwise_equal(outputs, fresh.public(fresh.t), name)


# ---------------------------------------------------------------------------------------------
# caches of more than 2^31 elements, the used pages at the far end (GPU)
# ---------------------------------------------------------------------------------------------


def _free_bytes():
    if DEVICE.type == "cuda":
        return torch.cuda.mem_get_info()[0]
    if DEVICE.type == "xpu" and hasattr(torch.xpu, "mem_get_info"):
        return torch.xpu.mem_get_info()[0]
    return 0


def _far_end_paged_attention(num_pages, dtype, num_splits, page=16, hkv=8, d=128, group=4):
    """Paged attention over K/V caches of ``num_pages`` pages whose used pages are the pool's last
    8 (the pool's very last element is read), against the float64 reference on those pages."""
    k_cache = torch.empty(num_pages, page, hkv, d, dtype=dtype, device=DEVICE)
    v_cache = torch.empty(num_pages, page, hkv, d, dtype=dtype, device=DEVICE)
    gen = torch.Generator().manual_seed(0)
    lens = [3 * page, 2 * page + page // 2 + 1, 1]  # within the 3-page table rows
    # page num_pages - 1 - i of the pool holds small_*[i]; request 0 ends on the pool's last page
    table = num_pages - 1 - torch.tensor([[3, 5, 0], [1, 6, 2], [7, 4, 4]], dtype=torch.int32)
    small_k = torch.randn(8, page, hkv, d, generator=gen).to(dtype)
    small_v = torch.randn(8, page, hkv, d, generator=gen).to(dtype)
    used = [num_pages - 1 - i for i in range(8)]
    k_cache[used] = small_k.to(DEVICE)
    v_cache[used] = small_v.to(DEVICE)
    small_table = num_pages - 1 - table
    seqlens = torch.tensor(lens, dtype=torch.int32)
    # decode
    q = torch.randn(3, 1, hkv * group, d, generator=gen).to(dtype)
    out, lse = flash_attn_with_kvcache(q.to(DEVICE), k_cache, v_cache, cache_seqlens=seqlens.to(DEVICE),
                                       page_table=table.to(DEVICE), num_splits=num_splits, return_softmax_lse=True)
    out_ref, lse_ref = ref.paged_attention(q, small_k, small_v, seqlens, small_table)
    assert_close(out, out_ref, dtype)
    assert torch.allclose(lse.cpu().double(), lse_ref, atol=2e-2)
    # causal q_len > 1
    qp = torch.randn(6, hkv * group, d, generator=gen).to(dtype)
    cu = torch.tensor([0, 3, 5, 6], dtype=torch.int32)
    out = flash_attn_with_kvcache(qp.to(DEVICE), k_cache, v_cache, cache_seqlens=seqlens.to(DEVICE),
                                  page_table=table.to(DEVICE), cu_seqlens_q=cu.to(DEVICE), causal=True, num_splits=num_splits)
    out_ref, _ = ref.paged_attention(qp, small_k, small_v, seqlens, small_table, cu, causal=True)
    assert_close(out, out_ref, dtype)


def _far_end_mla(num_pages, dtype, num_kv_splits, r=512, dr=64, page=64, heads=16):
    """MLA decode over a latent cache of ``num_pages`` pages whose used pages are the pool's last 5."""
    cache = torch.empty(num_pages, page, r + dr, dtype=dtype, device=DEVICE)
    gen = torch.Generator().manual_seed(1)
    small = torch.randn(5, page, r + dr, generator=gen).to(dtype)
    cache[[num_pages - 1 - i for i in range(5)]] = small.to(DEVICE)
    table = num_pages - 1 - torch.tensor([[2, 4, 0], [1, 3, 3]], dtype=torch.int32)
    small_table = num_pages - 1 - table
    seq_lens = torch.tensor([3 * page, page + page // 2 + 4], dtype=torch.int32)  # request 0 ends on the pool's last row
    q_nope = torch.randn(2, heads, r, generator=gen).to(dtype)
    q_pe = torch.randn(2, heads, dr, generator=gen).to(dtype)
    size = flash_mla_get_workspace_size(3 * page, 2, heads, page, num_kv_splits, head_dim_v=r, device=DEVICE)
    ws = torch.empty(size, dtype=torch.uint8, device=DEVICE)
    scale = (r // 4 + dr) ** -0.5
    out, lse = flash_mla_decode(q_nope.to(DEVICE), q_pe.to(DEVICE), cache, seq_lens.to(DEVICE), table.to(DEVICE), ws,
                                scale, num_kv_splits, return_lse=True)
    out_ref, lse_ref = ref.mla_decode(q_nope, q_pe, small, seq_lens, small_table, scale)
    assert_close(out, out_ref, dtype)
    assert torch.allclose(lse.cpu().double(), lse_ref, atol=2e-2)


@pytest.mark.parametrize("num_splits", [1, 0])
def test_far_end_harness_small(num_splits):
    # the harness of the 2^31 tests on a small pool (runs everywhere)
    _far_end_paged_attention(12, ATTN_DTYPE, num_splits, page=4, hkv=2, d=64, group=2)
    _far_end_mla(7, ATTN_DTYPE, -1 if num_splits == 0 else 1, r=MLA_R, dr=MLA_DR, page=4, heads=4)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 0])
def test_paged_attention_cache_beyond_2_pow_31_elements(num_splits):
    page, hkv, d = 16, 8, 128
    num_pages = 2**31 // (page * hkv * d) + 4  # 131076 pages: 2^31 + 65536 elements per cache
    assert num_pages * page * hkv * d > 2**31
    need = 2 * num_pages * page * hkv * d * 2
    if _free_bytes() < need + 2**30:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free device memory")
    _far_end_paged_attention(num_pages, torch.bfloat16, num_splits, page=page, hkv=hkv, d=d)


@pytest.mark.gpu
@pytest.mark.parametrize("num_kv_splits", [1, -1])
def test_mla_decode_cache_beyond_2_pow_31_elements(num_kv_splits):
    page, width = 64, 576
    num_pages = 2**31 // (page * width) + 2  # 58256 pages: 2^31 + 65536 elements
    assert num_pages * page * width > 2**31
    need = num_pages * page * width * 2
    if _free_bytes() < need + 2**30:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free device memory")
    _far_end_mla(num_pages, torch.bfloat16, num_kv_splits, page=page)


# ---------------------------------------------------------------------------------------------
# several GPUs in one process (tensor-parallel serving)
# ---------------------------------------------------------------------------------------------


def _second_device():
    kind = DEVICE.type
    if kind not in ("cuda", "xpu") or getattr(torch, kind).device_count() < 2:
        pytest.skip("needs two GPUs")
    return torch.device(kind, 1), getattr(torch, kind)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_ops_run_on_their_inputs_device(name):
    dev1, api = _second_device()
    dev0 = torch.device(DEVICE.type, 0)
    with api.device(dev0):
        assert api.current_device() == 0
        on0 = make_case(name, dev0, seed=3)
        expected = snapshot(on0.public(on0.t))
        on1 = make_case(name, dev1, seed=3)  # same values on the second GPU, current device still 0
        got = snapshot(on1.public(on1.t))
        op, args, kwargs = on1.custom(on1.t)
        got_custom = on1.custom_outputs(on1.t, op(*args, **kwargs))
        assert api.current_device() == 0
        api.synchronize(dev1)
    assert all(o.device == dev1 for o in got + got_custom)
    assert_bitwise_equal(tuple(o.to(dev0) for o in got), expected, f"{name} on {dev1}")
    assert_bitwise_equal(tuple(o.to(dev0) for o in got_custom), expected, f"{name} (custom op) on {dev1}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_ops_reject_inputs_on_two_devices(name):
    dev1, api = _second_device()
    case = make_case(name, dev1)
    first = next(iter(case.t))
    case.t[first] = case.t[first].to(torch.device(DEVICE.type, 0))
    with pytest.raises(ValueError, match="must be on one device"):
        case.public(case.t)
