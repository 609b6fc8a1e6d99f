"""``vllm_xpu_kernels.fused_moe_interface``: MoE, not provided (imported at module level on XPU by
vLLM's ``fused_moe/experts/xpu_moe.py``; using it raises ``NotImplementedError``)."""
from .._stand_ins import unprovided

xpu_fused_moe = unprovided("vllm_xpu_kernels.fused_moe_interface", "xpu_fused_moe", "fused MoE")


class XpuFusedMoe:
    """Stand-in: constructing it raises ``NotImplementedError``."""

    def __init__(self, *args, **kwargs):
        unprovided("vllm_xpu_kernels.fused_moe_interface", "XpuFusedMoe", "fused MoE")()
