"""Stand-ins for non-attention kernels that the engines import at module level."""
from __future__ import annotations


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


def op_defined(namespace: str, name: str) -> bool:
    """Whether ``torch.ops.<namespace>.<name>`` already has a schema (the real extension loaded, or
    an earlier registration): the compat extension modules then register nothing over it."""
    import torch

    try:
        torch._C._dispatch_find_schema_or_throw(f"{namespace}::{name}", "")
    except RuntimeError:
        return False
    return True
