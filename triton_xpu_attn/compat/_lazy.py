"""Package-root ops that a compat module re-exports but that this build may not have yet."""
from __future__ import annotations

import triton_xpu_attn


def root_op(name: str, fallback=None):
    """``triton_xpu_attn.<name>``; else ``fallback``; else a function that raises
    ``NotImplementedError`` naming the op (so the engine still imports, and fails loudly on use)."""
    op = getattr(triton_xpu_attn, name, None)
    if op is not None:
        return op
    if fallback is not None:
        return fallback

    def missing(*args, **kwargs):
        raise NotImplementedError(f"{name} is not provided by this build of triton_xpu_attn")

    missing.__name__ = missing.__qualname__ = name
    missing.missing_op = True
    return missing


def unprovided(package: str, name: str, what: str):
    """A stand-in for a non-attention kernel that an engine imports at module level: the import
    succeeds, a call raises ``NotImplementedError`` naming the kernel and the package that has it."""

    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"{package}.{name} ({what}) is not provided by triton_xpu_attn, which serves attention "
            f"kernels only; install the real {package.replace('_', '-')} package for it"
        )

    missing.__name__ = missing.__qualname__ = name
    missing.missing_op = True
    return missing
