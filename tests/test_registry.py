"""The XPU compile registry (``_common.COMPILE_VARIANTS``) is complete and truthful.

* Every kernel -- a ``@triton.jit`` function whose name ends with ``_kernel`` -- defined in any module
  of ``triton_xpu_attn`` is registered with ``register_xpu_compile`` at least once, so
  ``.ci/xpu_compile_check.py`` compiles it for Intel GPUs. ``@triton.jit`` helpers (names not ending
  in ``_kernel``) are only called from kernels and are compiled as part of them.
* Every variant's ``dots`` equals the number of ``tl.dot`` calls in the kernel's source, counting the
  dots at distinct source locations, helpers included (the check asserts that many DPAS dots).

Works with the interpreter (``InterpretedFunction``) and compiled mode (``JITFunction``), and sees
through ``@triton.autotune`` / ``@triton.heuristics`` wrappers.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest
import triton.language as tl

import triton_xpu_attn
from triton_xpu_attn import device as _device
from triton_xpu_attn._common import COMPILE_VARIANTS


def _py_function(obj):
    """The plain Python function under a @triton.jit / autotune / heuristics object."""
    seen = 0
    while not inspect.isfunction(obj) and hasattr(obj, "fn") and seen < 8:
        obj = obj.fn
        seen += 1
    return obj if inspect.isfunction(obj) else None


def _is_jit(obj) -> bool:
    """A @triton.jit function (JITFunction, or InterpretedFunction under TRITON_INTERPRET=1),
    possibly wrapped by @triton.autotune / @triton.heuristics."""
    if inspect.isfunction(obj) or not hasattr(obj, "fn"):
        return False
    return type(obj).__module__.startswith("triton.") and _py_function(obj) is not None


def _modules():
    mods = [triton_xpu_attn]
    for info in pkgutil.walk_packages(triton_xpu_attn.__path__, prefix="triton_xpu_attn."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # importing it would run the command line
        mods.append(importlib.import_module(info.name))
    return mods


def _defined_kernels():
    """(qualified name, python function) of every *_kernel JIT function defined in the package."""
    found = {}
    for mod in _modules():
        for obj in vars(mod).values():
            if not _is_jit(obj):
                continue
            fn = _py_function(obj)
            if fn.__module__ == mod.__name__ and fn.__name__.endswith("_kernel"):
                found[f"{fn.__module__}.{fn.__qualname__}"] = fn
    return found


def _resolve(node, namespace):
    """The object an ast Name / dotted Attribute refers to in ``namespace`` (None if unknown)."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, namespace)
        return getattr(base, node.attr, None) if base is not None else None
    return None


def _dot_sites(fn, _stack=()) -> set:
    """Source locations of the ``tl.dot`` calls in ``fn`` and in the JIT helpers it calls: what the
    XPU compile check counts in the compiled kernel (DPAS dots at distinct source locations)."""
    if fn in _stack:
        raise AssertionError(f"recursive @triton.jit call involving {fn.__name__}")
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    namespace = fn.__globals__
    sites = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = _resolve(node.func, namespace)
        if callee is tl.dot:
            sites.add((fn.__qualname__, node.lineno))
        elif callee is not None and _is_jit(callee):
            sites |= _dot_sites(_py_function(callee), _stack + (fn,))
        elif callee is None and isinstance(node.func, ast.Attribute) and node.func.attr == "dot":
            # unresolvable `<something>.dot(...)`: count it when spelled like the language call
            if isinstance(node.func.value, ast.Name) and node.func.value.id in ("tl", "language"):
                sites.add((fn.__qualname__, node.lineno))
    return sites


def _count_dots(fn) -> int:
    return len(_dot_sites(fn))


def _registered_functions():
    return {id(_py_function(v.kernel)) for v in COMPILE_VARIANTS}


def test_package_defines_kernels():
    assert _defined_kernels(), "no *_kernel @triton.jit function found in triton_xpu_attn (detection broken?)"


def test_every_kernel_is_registered():
    registered = _registered_functions()
    missing = sorted(name for name, fn in _defined_kernels().items() if id(fn) not in registered)
    assert not missing, (
        "kernels without a register_xpu_compile(...) entry (the XPU compile check would never compile "
        f"them): {missing}. Register a representative variant next to each kernel's definition."
    )


@pytest.mark.parametrize("variant", COMPILE_VARIANTS, ids=[v.label for v in COMPILE_VARIANTS])
def test_registered_dots_match_source(variant):
    fn = _py_function(variant.kernel)
    assert fn is not None, f"{variant.label}: registered object is not a @triton.jit function"
    expected = _count_dots(fn)
    assert variant.dots == expected, (
        f"{variant.label}: registered with dots={variant.dots}, but the kernel's source holds {expected} "
        "tl.dot call(s) at distinct source locations (helpers included); pass dots= to register_xpu_compile"
    )


@pytest.mark.parametrize("variant", COMPILE_VARIANTS, ids=[v.label for v in COMPILE_VARIANTS])
def test_registered_variant_is_well_formed(variant):
    fn = _py_function(variant.kernel)
    params = list(inspect.signature(fn).parameters)
    assert list(variant.signature) == params, f"{variant.label}: signature keys differ from the kernel's parameters"
    for name, ty in variant.signature.items():
        if ty == "constexpr":
            assert name in variant.constexprs, f"{variant.label}: constexpr {name} has no value"
        else:
            assert isinstance(ty, str) and ty, f"{variant.label}: {name} needs a Triton type string, got {ty!r}"
    assert variant.op is None or (isinstance(variant.op, str) and variant.op), f"{variant.label}: bad op {variant.op!r}"


def test_variants_declared_2d_load_kv_through_block_pointers():
    """A variant declared to read K/V by 2D block reads (``block_2d``; the native audit fails
    without them) compiles the block-pointer K/V loads (paged ``KV_LOAD = 2``, MLA
    ``LATENT_CHUNK > 0``) with one stage, which triton-xpu 3.3's pipeliner needs for block
    pointers whose address comes from a page id."""
    declared = [v for v in COMPILE_VARIANTS if v.block_2d]
    assert declared, "no variant is declared to read K/V by 2D block reads"
    assert any("LATENT_CHUNK" in v.constexprs for v in declared), "no MLA variant reads its latent tile in 2D"
    for v in declared:
        assert v.constexprs.get("KV_LOAD") == 2 or v.constexprs.get("LATENT_CHUNK", 0) > 0, v.label
        assert v.options.get("num_stages") == 1, v.label
        page = v.constexprs.get("PAGE_SIZE")
        assert page == 0 or page >= v.constexprs["BLOCK_N"], f"{v.label}: a key tile must lie in one page"


@pytest.mark.parametrize("decode_like", [True, False])
@pytest.mark.parametrize("head_dim", [64, 80, 128, 192, 256, 512])
@pytest.mark.parametrize("page_size", [0, 1, 2, 8, 16, 32, 64, 256])
def test_xpu_tiles_read_kv_in_2d_wherever_a_tile_fits_a_page(decode_like, head_dim, page_size):
    """The XPU tiles (heuristic and shipped files) ask for 2D K/V reads (device-side descriptors
    and block pointers: the launcher takes whichever this Triton builds) exactly where every key
    tile lies in one page or the K/V rows are contiguous, keep K^T / V tiles at most 32 keys (64
    fill the 256-GRF file: bench/results/xpu_codegen.md), 256 GRF, one stage with block pointers,
    and at most 32 warps (the backend's limit at 256 GRF); above D = 256 the output channels go in
    128-wide slices across programs (whole 512-channel rows spilled 13-17 KB, 128: 0 B)."""
    from triton_xpu_attn.ops.paged_attention import xpu_tiles

    cfg = xpu_tiles(decode_like, head_dim, page_size)
    fits = page_size == 0 or page_size >= cfg["BLOCK_N"]
    assert cfg["kv_block_ptr"] == fits and cfg["kv_device_desc"] == fits
    assert cfg["BLOCK_N"] <= (32 if head_dim <= 128 else 16)
    assert cfg["grf_mode"] == "256" and cfg["num_warps"] <= 32
    assert cfg["num_stages"] == (1 if fits else 2)
    if page_size >= 16:
        assert fits, "pages of 16+ tokens read K/V in 2D"
    assert cfg.get("BLOCK_DV", 0) == (256 if head_dim > 256 else 0)
    if head_dim > 256:  # the cost model's pick (bench/results/xpu/cost_model.md): 2 slices, chunked score dot
        assert cfg["score_chunk"] == 128 and cfg["num_warps"] == (2 if decode_like else 8)
        assert xpu_tiles(decode_like, head_dim, page_size, fp8_kv=True)["BLOCK_DV"] == 128


@pytest.mark.parametrize("rows", [1, 16, 32, 64, 128])
@pytest.mark.parametrize("latent", [256, 512])
@pytest.mark.parametrize("ragged", [False, True])
def test_mla_xpu_tiles_keep_the_latent_tile_and_accumulator_small(rows, latent, ragged):
    """MLA on XPU (heuristics and shipped files): 16-key latent tiles, 256 GRF, at most 32 warps;
    over pages the latent tile through block pointers in 32-64-channel chunks (2D block reads) on
    one stage, per-token gathers without. R = 512 decode over pages takes the cost model's picks
    (bench/results/xpu/cost_model.md); elsewhere 16-32 rows and 64 output channels a program."""
    from triton_xpu_attn.ops.mla import latent_chunk, xpu_tiles

    for gather in (False, True):
        cfg = xpu_tiles(rows, latent, ragged, gather)
        assert cfg["grf_mode"] == "256" and cfg["num_warps"] <= 32 and cfg["BLOCK_N"] == 16
        assert cfg["num_stages"] == (2 if gather else 1)
        if latent == 512 and not (ragged or gather):
            # the cost model's picks: 8 rows a warp (no dot repeated), 128-channel slices to 32 rows
            assert cfg["BLOCK_H"] == 8 * cfg["num_warps"] == min(max(16, rows), 128)
            assert cfg["BLOCK_DV"] == (128 if rows <= 32 else 64)
            assert cfg["latent_chunk"] == (32 if rows <= 16 else 64)
        else:
            assert cfg["BLOCK_H"] in (16, 32) and cfg["BLOCK_DV"] == 64
            assert cfg.get("latent_chunk", 0) == (0 if gather else 64)
    cfg = xpu_tiles(rows, latent, ragged)
    block_ptrs = 64 if _device.block_pointers() else 0
    block_ptrs = cfg["latent_chunk"] if _device.block_pointers() else 0
    assert latent_chunk(cfg, 16, 16, latent, (None,)) == block_ptrs, "pages of whole tiles: 2D latent reads"
    assert latent_chunk(cfg, 8, 16, latent, (None,)) == 0, "a key tile over two pages gathers rows"
    assert latent_chunk(cfg, 64, 16, latent, ("descriptor",)) == 0, "tensor descriptors win where made"
    assert latent_chunk(cfg, 16, 16, latent, (None,), device_desc=True) == cfg["latent_chunk"], "descriptors: 2D too"
    assert latent_chunk(cfg, 8, 16, latent, (None,), device_desc=True) == 0


def test_xpu_tiles_decode_fp8_caches_on_16_warps():
    """fp8 caches decode on 16-key tiles and 16 warps on XPU (32 keys on 8 warps spill 320-448 B
    at D = 128: the 8-bit K^T beside its dequantised copy)."""
    from triton_xpu_attn.ops.paged_attention import xpu_tiles

    fp8 = xpu_tiles(True, 128, 64, fp8_kv=True)
    assert (fp8["num_warps"], fp8["BLOCK_N"]) == (16, 16) and fp8["kv_block_ptr"]
    assert xpu_tiles(True, 128, 64)["num_warps"] == 8


@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("fp8_kv", [False, True])
def test_xpu_tiles_above_d128_unpack_gqa_prefill_and_chunk_fp8_scores(head_dim, fp8_kv):
    """Above D = 128 on XPU: prefill tiles hold one head's tokens (``pack_gqa`` off: packed
    (token, head) rows read q by gathers and spilled 4.3-7.0 KB at D = 256), and fp8 decode runs
    the score dot in 128-column chunks on 32-key tiles (one dot spilled 8.4-8.8 KB); nothing
    changes at D <= 128. The launcher passes the chunk only to block-pointer launches narrower
    than the head (``score_chunk``)."""
    from triton_xpu_attn.ops.paged_attention import query_heads_per_block, score_chunk, xpu_tiles

    wide = head_dim > 128
    prefill, decode = xpu_tiles(False, head_dim, 64, fp8_kv), xpu_tiles(True, head_dim, 64, fp8_kv)
    assert prefill.get("pack_gqa", True) is not wide and "pack_gqa" not in decode
    assert query_heads_per_block(8, None, prefill) == (1 if wide else 8)
    assert decode.get("score_chunk", 0) == (128 if wide and fp8_kv else 0)
    assert "score_chunk" not in prefill
    if wide and fp8_kv:
        assert decode["BLOCK_N"] == 32 and xpu_tiles(True, head_dim, 16, True)["BLOCK_N"] == 16
        assert score_chunk(decode, 2, head_dim) == 128
        assert score_chunk(decode, 0, head_dim) == 0, "pointer loads keep one score dot"
        assert score_chunk({"score_chunk": 256}, 2, head_dim) == 0, "a chunk as wide as the head is one dot"


def test_mla_and_d512_xpu_tiles_are_the_cost_models_picks():
    """The XPU defaults of MLA decode (H = 16-128), GQA at D = 512 and D = 576 / Dv = 512 decode are
    what the cost model picks from the committed native-code facts (bench/experiments/xpu_cost_model.py),
    on PVC and BMG code."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    import json

    from bench.experiments import xpu_cost_model as cm

    facts = json.loads(cm.FACTS.read_text())
    shipped = cm.shipped_tiles()
    picks = cm.choices(facts)
    assert len(picks) == 14
    for (family, problem, _target), (alt, _row) in picks.items():
        assert shipped[(family, problem)] == alt["name"], (family, problem)


def test_native_loop_work_reads_the_key_loop_of_igc_assembly():
    """``.ci/xpu_native.loop_work``: dpas, their multiply-adds and spill + fill bytes of the loop
    (the back edge whose blocks hold the most dpas) from IGC's assembly, PVC and Xe2 spill forms."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / ".ci"))
    import xpu_native

    asm = "\n".join([
        "// B000: Preds:{},  Succs:{B001}",
        "        dpas.8x8 (16|M0)         r7:f          null:f            r63:bf            r15.0:bf",
        "// B001: Preds:{B000, B002},  Succs:{B002}",
        "        dpas.8x8 (16|M0)         r7:f          r7:f              r63:bf            r15.0:bf",
        "(W)     send.dc0 (16|M0)  null r0 r9:2 0x0 0x020F2000 // wr:1h+2, rd:0; hword scratch block write x4 //  scratch space spill:  from offset[0x32];",
        "// B002: Preds:{B001},  Succs:{B001, B003}",
        "        dpas.8x4 (16|M0)         r7:f          r7:f              r63:hf            r15.0:hf",
        "(W)     load.ugm.d32x64t.a32 (1|M0)  r19:4 ss[a0.2][r6:1-0x10000] // fill from offset[0*64] of ?;",
        "// B003: Preds:{B002},  Succs:{}",
        "(W)     store.ugm.d32x16t.a32 (1|M0)  ss[a0.2][r6:1-0x10000] r19:1 // spill to offset[0*64] of ?;",
    ])
    assert xpu_native.loop_work(asm) == (2, 8 * 2 * 8 * 16 + 8 * 2 * 4 * 16, 4 * 32 + 64 * 4)
    assert xpu_native.loop_work("no blocks") == (0, 0, 0)
