"""DeepSeek sparse attention (DSA) prefill: ``flash_mla_sparse_fwd``, a drop-in for sgl-kernel-xpu's
``sgl_kernel.flash_mla_sparse_fwd`` (FlashMLA's function of the same name and contract): its
argument checks and one launch of the sparse kernel family of ``mla_sparse.py`` (rows of q's dtype,
one token per batch entry, no split).
"""
from __future__ import annotations

import math

import torch

from .._common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_int,
    check_real,
    check_same_device,
    check_tensor,
    interpreter_float32,
)
from . import index_order
from .mla_sparse import MAX_HEAD_DIM, launch_sparse, sparse_tiles
from .sparse_rows import LAYOUT_PLAIN


def _check_output(name: str, t, dtype: torch.dtype, shape: tuple, last_dim_contiguous: bool = False):
    if t is not None:
        check_tensor(name, t, dtypes=(dtype,), shape=shape, last_dim_contiguous=last_dim_contiguous)
    return t


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    max_logits: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
):
    """Sparse attention of each query token over the ``kv`` rows its index list selects
    (DeepSeek sparse attention, DSA; sgl-kernel-xpu / FlashMLA drop-in).

    For token ``t``, query head ``h`` and its KV head ``g = h // (h_q / h_kv)``, with
    ``S = {i : i < topk_length[t], 0 <= indices[t, g, i] < s_kv}`` (an index listed twice counts
    twice) and logits ``z_i = sm_scale * q[t, h] . kv[indices[t, g, i], g]`` over all ``d_qk``
    channels::

        max_logits[t, h] = max_{i in S} z_i
        lse[t, h]        = log(sum_{i in S} exp(z_i))
        out[t, h]        = sum_{i in S} exp(z_i - lse) * kv[indices[t, g, i], g, :d_v]
                           * exp(lse) / (exp(lse) + exp(attn_sink[h]))

    Parameters
    ----------
    q : torch.Tensor
        ``[s_q, h_q, d_qk]`` fp16/bf16/fp32 queries (DeepSeek: ``d_qk`` 576 = 512 latent + 64 rope,
        or 512). Any token / head strides; a last dim that is not contiguous is copied.
    kv : torch.Tensor
        ``[s_kv, h_kv, d_qk]`` keys, q's dtype; V is the first ``d_v`` channels of each row. Any
        row / head strides with ``stride(-1) == 1``. Rows no valid entry selects are never read
        (they may hold NaN or inf).
    indices : torch.Tensor
        ``[s_q, h_kv, topk]`` int32 (or int64), any strides: the rows of ``kv`` each token attends
        to, per KV head. An entry outside ``[0, s_kv)`` (-1 padding, any negative value, ``s_kv``
        or more) is skipped. The order of a list does not matter: where ``kv`` is larger than
        the GPU's L2 cache, the lists are first copied grouped by cache region (an int32
        ``[s_q, h_kv, topk]`` tensor, ``index_order.py``), which keeps the rows read together close.
    sm_scale : float
        Softmax scale applied to the ``d_qk``-channel dot (finite).
    d_v : int
        Channels of V and of the output: a multiple of 8, at most ``d_qk`` (upstream: 512).
    attn_sink : torch.Tensor, optional
        ``[h_q]`` float (fp32 upstream) per-head sink logits, natural-log units of the scaled
        logits: they join the softmax denominator, scaling the output by
        ``exp(lse) / (exp(lse) + exp(attn_sink[h]))`` (``-inf``: no effect; ``+inf``: output 0), and
        change neither ``max_logits`` nor ``lse``.
    topk_length : torch.Tensor, optional
        ``[s_q]`` int32 (or int64): token ``t`` uses only its first ``topk_length[t]`` entries
        (values past ``topk`` mean all of them, values <= 0 none). Entries past it are never read,
        nor the rows they name.
    out : torch.Tensor, optional
        ``[s_q, h_q, d_v]`` in q's dtype (last dim contiguous) to write the output into (this
        package's extension; upstream allocates it).
    max_logits, lse : torch.Tensor, optional
        ``[s_q, h_q]`` fp32 tensors to write those results into (this package's extension).

    Returns
    -------
    tuple[torch.Tensor, torch.Tensor, torch.Tensor]
        ``(out [s_q, h_q, d_v]`` in q's dtype, ``max_logits [s_q, h_q]`` fp32, ``lse [s_q, h_q]``
        fp32), as upstream's reference (FlashMLA ``tests/ref.py``) defines them: natural log of the
        scaled logits (FlashMLA's README describes base-2 values: its older kernel's). A token with
        no valid entry gives ``out`` 0, ``max_logits`` ``-inf`` and ``lse`` ``+inf`` (FlashMLA's
        value; this package's other ops give ``-inf`` there).

    No value in ``indices`` or ``topk_length`` makes the kernel read or write outside the given
    tensors, and nothing here reads device values on the host (graph-capturable).
    """
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=3)
    dtype = q.dtype
    check_tensor("kv", kv, dtypes=(dtype,), ndim=3, last_dim_contiguous=True)
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv = kv.shape[0], kv.shape[1]
    if d_qk % 8 or not 8 <= d_qk <= MAX_HEAD_DIM:
        raise ValueError(f"q: head dim d_qk must be a multiple of 8 from 8 to {MAX_HEAD_DIM}, got {d_qk}")
    if kv.shape[2] != d_qk:
        raise ValueError(f"kv rows hold {kv.shape[2]} channels but q's head dim d_qk is {d_qk}")
    if h_kv < 1:
        raise ValueError(f"kv must have at least one KV head, got shape {list(kv.shape)}")
    if s_kv >= 2**31:
        raise ValueError(f"kv has {s_kv} rows: at most 2^31 - 1 (32-bit row indices)")
    if h_q % h_kv:
        raise ValueError(f"q's heads ({h_q}) must be a multiple of kv's heads ({h_kv})")
    check_tensor("indices", indices, dtypes=INDEX_DTYPES, ndim=3)
    if indices.shape[0] != s_q or indices.shape[1] != h_kv:
        raise ValueError(
            f"indices must have shape [s_q, h_kv, topk] = [{s_q}, {h_kv}, topk], got {list(indices.shape)}"
        )
    topk = indices.shape[2]
    sm_scale = check_real(sm_scale, "sm_scale")
    d_v = check_int(d_v, "d_v")
    if d_v % 8 or not 8 <= d_v <= d_qk:
        raise ValueError(f"d_v must be a multiple of 8 from 8 to d_qk = {d_qk}, got {d_v}")
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, dtypes=FLOAT_DTYPES, shape=(h_q,))
    if topk_length is not None:
        check_tensor("topk_length", topk_length, dtypes=INDEX_DTYPES, shape=(s_q,))
    _check_output("out", out, dtype, (s_q, h_q, d_v), last_dim_contiguous=True)
    _check_output("max_logits", max_logits, torch.float32, (s_q, h_q))
    _check_output("lse", lse, torch.float32, (s_q, h_q))
    device = check_same_device(q=q, kv=kv, indices=indices, attn_sink=attn_sink, topk_length=topk_length, out=out,
                               max_logits=max_logits, lse=lse)

    tiles = sparse_tiles(h_q, h_kv, d_qk, d_v, dtype, device)

    if out is None:
        out = torch.empty((s_q, h_q, d_v), dtype=dtype, device=device)
    if max_logits is None:
        max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=device)
    if lse is None:
        lse = torch.empty((s_q, h_q), dtype=torch.float32, device=device)
    if s_q == 0 or h_q == 0:
        return out, max_logits, lse
    if s_kv == 0 or topk == 0:  # no entry can be valid: every token is without keys
        out.zero_()
        max_logits.fill_(-math.inf)
        lse.fill_(math.inf)
        return out, max_logits, lse
    if q.stride(-1) != 1:
        q = q.contiguous()

    # a cache larger than the L2 cache: the lists grouped by cache region, so that programs running
    # together read rows of one region (index_order.py; the result does not depend on the order)
    buckets = index_order.locality_buckets(s_kv, h_kv * d_qk * kv.element_size(), s_q * h_kv, topk, device)
    if buckets:
        indices = index_order.order_by_bucket(indices, s_kv, buckets, topk_length)

    # the interpreter's bf16 arithmetic is wrong: bf16 runs in fp32 there (no copy when compiled)
    dest = out
    q, kv, out = interpreter_float32(q, kv, out)
    launch_sparse(
        tiles, grid=(s_q, tiles["programs_per_token"], 1), device=device,
        q=q, q_strides=(q.stride(0), 0, q.stride(1)),
        kv=kv, kv_strides=(kv.stride(0), 0, kv.stride(1)), page_size=1, num_rows=s_kv,
        indices=indices, idx_strides=(indices.stride(0), 0, indices.stride(1), indices.stride(2)),
        topk_length=topk_length, tl_strides=(topk_length.stride(0), 0) if topk_length is not None else (0, 0),
        attn_sink=attn_sink, out=out, o_strides=(out.stride(0), 0, out.stride(1), 0),
        max_logits=max_logits, m_strides=(max_logits.stride(0), 0, max_logits.stride(1)),
        lse=lse, l_strides=(lse.stride(0), 0, lse.stride(1), 0),
        sm_scale=sm_scale, tokens_per_batch=1, topk=topk, layout=LAYOUT_PLAIN, paged=False)
    if out is not dest:
        dest.copy_(out)
    return dest, max_logits, lse
