"""``vllm_xpu_kernels.rotary``: not attention, not provided (imported at module level by vLLM's
``_xpu_ops.py``, so the name exists and raises ``NotImplementedError`` when called)."""
from .._stand_ins import unprovided

apply_rotary_emb = unprovided("vllm_xpu_kernels.rotary", "apply_rotary_emb", "rotary embedding")
