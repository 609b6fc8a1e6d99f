"""Placeholder for vllm-xpu-kernels' ``_C`` extension, which vLLM imports to register its
``torch.ops`` kernels: triton_xpu_attn registers none here (its attention ops are Python calls
in ``flash_attn_interface``)."""
