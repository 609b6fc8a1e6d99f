"""Is a kernel change invisible to the code a launch compiles? Compiles every registered variant
of ``_paged_attention_kernel`` (``_common.COMPILE_VARIANTS``, plus prefill-shaped tiles, the
tensor-descriptor paths and, where no softcap or K descale is set, the softmax scale inside the
exponent as CUDA launches them) from an old copy of ``ops/paged_attention.py`` and from today's module
for an NVIDIA target (sm_90, no GPU needed: Triton's own compiler), and compares the PTX with
debug information stripped. ``identical`` means the change cannot move a timing of that variant,
so no GPU A/B is needed for it.

    TRITON_INTERPRET=0 python bench/experiments/ptx_identity.py OLD_COPY.py
    TRITON_INTERPRET=0 python bench/experiments/ptx_identity.py OLD_MLA_COPY.py mla

The second form compares ``_mla_attention_kernel`` (ops/mla.py) the same way: every
registered variant with the XPU-only ``LATENT_CHUNK`` at 0, and as CUDA's whole-channel tiles.

    TRITON_INTERPRET=0 python bench/experiments/ptx_identity.py OLD_COPY.py --kernel index_order:_bucket_order_kernel \
        [--also '{"CHUNK": 256}' ...]

The third form compares any kernel of ``ops/<module>.py`` (an old copy of that module against
today's): every registered variant as registered, and again with each ``--also`` dict of
constexprs over it (the tiles CUDA launches, where they differ from the registered XPU ones).

Use the Triton the GPU runs (e.g. put a triton==3.6.0 wheel's folder first on PYTHONPATH): PTX
from another Triton version says nothing about that GPU's code.
"""
from __future__ import annotations

import os
import pathlib
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"  # compile for a GPU target even on a machine without one
ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sweeps import load_old_op  # noqa: E402
from triton_xpu_attn import _common  # noqa: E402
from triton_xpu_attn.ops import paged_attention as today  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
_DEBUG = (".loc", ".file", "//", "$L__", ".b8", ".b32", ".b64")


def ptx(module, variant, extra: dict, options: dict, desc_rows: int | None = None,
        kernel_name: str = "_paged_attention_kernel") -> str:
    """PTX of ``module``'s kernel at ``variant``'s signature with ``extra`` constexprs, debug lines
    removed; ``desc_rows``: K/V tensor descriptors of ``[desc_rows, BLOCK_D]`` blocks (``KV_DESC``)."""
    signature, constexprs = dict(variant.signature), {**variant.constexprs, **extra}
    fn = getattr(module, kernel_name)
    params = fn.arg_names
    if kernel_name != "_paged_attention_kernel":
        constexprs["LATENT_CHUNK"] = 0  # XPU's block-pointer latent tiles: not a CUDA path
        return _compiled_ptx(fn, signature, constexprs, params, options, kernel_name)
    # K/V loads as CUDA launches them: pointers, or tensor descriptors (KV_DESC before KV_LOAD
    # replaced it); the XPU block pointers (KV_LOAD = 2) of some registered variants are not a CUDA path
    constexprs["KV_LOAD"] = 1 if desc_rows else 0
    if desc_rows:
        for name in ("k_desc", "v_desc"):
            signature[name] = f"tensordesc<bf16[{desc_rows},{constexprs['BLOCK_D']}]>"
            constexprs.pop(name, None)
        constexprs["KV_DESC"] = True
    # a constexpr the module's kernel does not have (one added since) is left out: the old kernel
    # compiles its own code, so a variant that sets it to a non-default value reads DIFFERENT
    return _compiled_ptx(module._paged_attention_kernel, signature, constexprs, params, options,
                         "_paged_attention_kernel")


def _compiled_ptx(fn, signature: dict, constexprs: dict, params: list, options: dict, kernel_name: str) -> str:
    for name in [n for n in constexprs if n not in params]:
        constexprs.pop(name)
        signature.pop(name, None)
    for name in [n for n in signature if n not in params]:  # a runtime argument added since
        signature.pop(name)
    for name in constexprs:
        signature[name] = "constexpr"
    kernel = triton.compile(ASTSource(fn, signature, constexprs), target=TARGET, options=options)
    text = re.sub(kernel_name + r"\w*", "K", kernel.asm["ptx"])
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith(_DEBUG))


def main_mla(path: str) -> int:
    """``_mla_attention_kernel`` of an old copy of ops/mla.py (or of ops/mla_decode.py from before
    the MLA module split, whose kernel was ``_mla_decode_kernel``) against today's."""
    from triton_xpu_attn.ops import mla as today_mla

    old = load_old_op(path, "mla")
    old_name = "_mla_attention_kernel" if hasattr(old, "_mla_attention_kernel") else "_mla_decode_kernel"
    variants = [v for v in _common.COMPILE_VARIANTS if v.kernel is today_mla._mla_attention_kernel]
    print(f"triton {triton.__version__}, target {TARGET}: {path} vs today's ops/mla.py")
    different = 0
    for v in variants:  # as registered (XPU tiles, LATENT_CHUNK 0) and as CUDA's whole-channel tiles
        cuda = dict(BLOCK_DV=v.constexprs["BLOCK_R"], BLOCK_N=64, BLOCK_H=64)
        for label, extra in ((v.label, {}), (v.label + " as CUDA 64x64", cuda)):
            a = ptx(old, v, extra, dict(num_warps=4, num_stages=2), kernel_name=old_name)
            b = ptx(today_mla, v, extra, dict(num_warps=4, num_stages=2), kernel_name="_mla_attention_kernel")
            different += a != b
            print(f"{label}: {'identical' if a == b else 'DIFFERENT'} PTX")
    return 0 if different == 0 else 1


def main_kernel(path: str, spec: str, also: list[dict]) -> int:
    """``ops/<module>.py``'s ``kernel`` from an old copy of the module against today's."""
    import importlib

    module_name, kernel_name = spec.split(":")
    today_mod = importlib.import_module(f"triton_xpu_attn.ops.{module_name}")
    old = load_old_op(path, module_name)
    variants = [v for v in _common.COMPILE_VARIANTS if v.kernel is getattr(today_mod, kernel_name)]
    print(f"triton {triton.__version__}, target {TARGET}: {path} vs today's ops/{module_name}.py, {kernel_name}")
    fn_old, fn_new = getattr(old, kernel_name), getattr(today_mod, kernel_name)
    different = 0
    for v in variants:
        options = {k: v.options[k] for k in ("num_warps", "num_stages") if k in v.options}
        for extra in [{}, *also]:
            a = _compiled_ptx(fn_old, dict(v.signature), {**v.constexprs, **extra}, fn_old.arg_names, options, kernel_name)
            b = _compiled_ptx(fn_new, dict(v.signature), {**v.constexprs, **extra}, fn_new.arg_names, options, kernel_name)
            different += a != b
            print(f"{v.label} {extra or ''}: {'identical' if a == b else 'DIFFERENT'} PTX")
    return 0 if different == 0 and variants else 1


def main() -> int:
    old = load_old_op(sys.argv[1])
    variants = [v for v in _common.COMPILE_VARIANTS if v.kernel is today._paged_attention_kernel]
    prefill = dict(BLOCK_Q=16, HEADS_PER_BLOCK=4, BLOCK_N=64, SPLIT_KV=False, Q_MAPPING=1)
    cases = []
    # CUDA launches apply the softmax scale inside the exponent where no softcap or K descale is set
    in_exp = dict(SCALE_IN_EXP=True)
    for v in variants:  # as registered (decode, drafts, pointer prefill), and as a 64-row prefill tile
        cases.append((v.label, v, {}, dict(num_warps=4, num_stages=2), None))
        cases.append((v.label + " as prefill 64x64", v, prefill, dict(num_warps=4, num_stages=2), None))
        if not (v.constexprs.get("HAS_SOFTCAP") or v.constexprs.get("HAS_K_DESCALE")):
            cases.append((v.label + " scale in exp", v, in_exp, dict(num_warps=4, num_stages=2), None))
    base = next(v for v in variants if v.constexprs.get("PAGE_SIZE") == 0 and v.constexprs.get("BLOCK_D") == 128)
    for page, rows in ((64, 64), (256, 64), (32, 32), (0, 64)):  # descriptor paths (Triton >= 3.4)
        for label, extra in (("", {}), (" scale in exp", in_exp)):
            cases.append((f"descriptors P={page}{label}", base,
                          dict(prefill, BLOCK_D=128, BLOCK_DV=128, PAGE_SIZE=page, **extra),
                          dict(num_warps=4, num_stages=3), rows))
    print(f"triton {triton.__version__}, target {TARGET}: {sys.argv[1]} vs today's ops/paged_attention.py")
    different = 0
    for label, v, extra, options, rows in cases:
        try:
            a, b = ptx(old, v, extra, options, rows), ptx(today, v, extra, options, rows)
        except Exception as exc:  # noqa: BLE001  (e.g. descriptors on a Triton without them)
            print(f"{label}: not compiled ({type(exc).__name__}: {str(exc)[:80]})")
            continue
        same = a == b
        different += not same
        print(f"{label}: {'identical' if same else 'DIFFERENT'} PTX")
    return 0 if different == 0 else 1


if __name__ == "__main__":
    if sys.argv[2:3] == ["--kernel"]:
        import json

        extras = [json.loads(sys.argv[i + 1]) for i, a in enumerate(sys.argv) if a == "--also"]
        sys.exit(main_kernel(sys.argv[1], sys.argv[3], extras))
    sys.exit(main_mla(sys.argv[1]) if sys.argv[2:3] in (["mla"], ["mla_decode"]) else main())
