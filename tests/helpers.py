"""Shared test utilities: poisoning, tolerances, random paged caches."""
from __future__ import annotations

import torch

from conftest import DEVICE, INTERPRET  # noqa: F401

#: relative-error bound per dtype of the op's inputs (the guide's standard)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}

#: dtypes the interpreter computes correctly (its bf16 arithmetic is broken: bf16 runs on the GPU)
FLOAT_DTYPES = [torch.float16, torch.float32] if INTERPRET else [torch.float16, torch.bfloat16, torch.float32]


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with a value no kernel produces, so an unwritten element fails the comparison."""
    if t.dtype.is_floating_point:
        return t.fill_(float("nan"))
    return t.fill_(-123456)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out holds NaN)."""
    out = out.double().cpu()
    ref = ref.double().cpu()
    if torch.isnan(out).any():
        return float("nan")
    denom = ref.norm().item()
    num = (out - ref).norm().item()
    return num / denom if denom > 0 else num


def assert_close(out, ref, dtype, what="output"):
    err = rel_error(out, ref)
    tol = TOLERANCE[dtype]
    assert err == err and err < tol, f"{what}: relative error {err:.3e} exceeds {tol:.0e} for {dtype}"
