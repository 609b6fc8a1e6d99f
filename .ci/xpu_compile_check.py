#!/usr/bin/env python3
"""Ahead-of-time XPU compile check: compile every registered kernel variant for Intel PVC and BMG,
without an Intel GPU.

Run it with a Python that has Intel's Triton (``triton-xpu``) plus torch (CPU) and numpy; the
package need not be installed there (the repository root is put on ``sys.path``)::

    .venv-xpu/bin/python .ci/xpu_compile_check.py            # everything
    .venv-xpu/bin/python .ci/xpu_compile_check.py --list     # what would be compiled
    .venv-xpu/bin/python .ci/xpu_compile_check.py -k merge   # only variants whose label contains "merge"

What is compiled:
* every entry of ``triton_xpu_attn._common.COMPILE_VARIANTS`` (each kernel registers itself with
  ``register_xpu_compile`` where it is defined), for the targets ``pvc`` and ``bmg``;
* for each ``autotune_configs/xpu/*.json``: every op the file names, for the file's target (from its
  ``device_name``), once per distinct config: the config's launch options (``num_warps``,
  ``num_stages``, ``grf_mode``, ...) and, for ops listed in ``CONFIG_CONSTEXPRS``, the block sizes
  the launcher derives from the config and its bucket (tile sizes, head dim, rows per program), on
  the registered variant (``op=<name>``) that fits the bucket; identical compiles are shared across
  files of one target. Other ops get the file's launch options on each of their variants.

Every compile is specialised as a launch specialises it: pointers 16-byte aligned and the row
strides and head dims of the attention kernels divisible by 16 (``tt.divisibility``, ``ALIGNED``),
without which the compiler sees scalar gathers and never a 2D block read.

Checks per compile: SPIR-V is produced and non-empty; every ``tt.dot`` in the TTGIR carries the DPAS
layout (``#triton_intel_gpu.dpas``) and the number of dots (distinct source locations) equals the
variant's ``dots``; a large-GRF request reaches the build flags.

With ``--native OCLOC_ROOT`` (Intel's offline compiler, unpacked by ``.ci/ocloc_env.sh``) each
compile is also built to native code for its target and read (``.ci/xpu_native.py``): spill bytes
per thread at the GRF mode the launch uses (after triton-xpu's driver's 256-GRF rebuild when the
kernel asks for no mode and spills more than 1000 bytes), GRF, SLM, instructions, 2D block
loads/stores, DPAS and gathers. It fails when an attention kernel (a variant with dots, or a config
of a config file) spills more than its allowance (``SPILL_ALLOWANCE``: 0 but for the recorded misses)
or a variant declared to read K/V in 2D (``block_2d``) has no 2D block read. ``--table PATH`` writes
the table (bench/results/xpu_codegen.md); a variant that declares a launch (``register_xpu_compile(launch=)``)
also gets the work of that launch there: DPAS multiply-adds and K/V bytes of all its programs beside
the algorithm's minimum, and the spill traffic of one loop iteration (``launch_work``). Exit status 1
on any failure.
See shared/notes/xpu_compile.md and xpu_native.md for the recipes.
"""
from __future__ import annotations

import os

# An explicit setting wins over the package's own choice (it picks the interpreter when no GPU is
# present), and must be in place before triton or the package is imported.
os.environ["TRITON_INTERPRET"] = "0"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# A fresh compile cache per run (unless the caller chose one): every variant is really compiled,
# and nothing is shared with other Triton installs on the machine.
if "TRITON_CACHE_DIR" not in os.environ:
    import atexit  # noqa: E402
    import shutil  # noqa: E402

    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="xpu_compile_check_cache_")
    atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"], ignore_errors=True)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

sys.path.insert(0, str(REPO / ".ci"))
import xpu_native  # noqa: E402

# --------------------------------------------------------------------------------------------
# Targets: the dict torch.xpu.get_device_capability() would return on each device, shared with the
# OpenCL CPU device's driver (tests/xpu_opencl/driver.py), which runs the same compiles.
# --------------------------------------------------------------------------------------------
from tests.xpu_opencl.driver import TARGETS  # noqa: E402
from tests.xpu_opencl.harness import install_arch_parser_stub  # noqa: E402

WARP_SIZE = 16  # ignored by the backend (its sub-group size option decides: tune.xpu_launch_options); 16 as on the devices


def gpu_target(name: str) -> GPUTarget:
    return GPUTarget("xpu", dict(TARGETS[name]), WARP_SIZE)


def target_for_device(device_name: str) -> str:
    """Compile target of a config file's device: "Max" -> pvc; Battlemage (B580/B570/B60/B50/Arc B) -> bmg."""
    if "Max" in device_name:
        return "pvc"
    if re.search(r"\bArc\S*\s+A\d", device_name):  # Alchemist (dg2): no target dict, no DPAS
        raise ValueError(f"device {device_name!r} is an Arc A-series (dg2) GPU: no compile target for it")
    if re.search(r"\bB(580|570|60|50)\b", device_name) or "Arc" in device_name:
        return "bmg"
    raise ValueError(f"cannot tell the compile target (pvc or bmg) of device {device_name!r}")


#: config knobs that set launch options (a config of none of them compiles as the variant does)
LAUNCH_KNOBS = ("num_warps", "num_stages", "grf_mode", "sub_group_size")


def launch_options(options: dict, dots: int) -> dict:
    """A compile's options as a launch passes them: ``tune.xpu_launch_options`` (the launchers'
    spelling for the installed Intel Triton, checked against its options dataclass: the
    sub-group size of kernels with dots, 16, as ``warp_size`` or ``threads_per_warp``;
    ``grf_mode`` as it spells it), over any other option of ``options``."""
    from triton_xpu_attn import tune

    spelled = tune.xpu_launch_options(options, dots=dots > 0)
    rest = {k: v for k, v in options.items() if k not in LAUNCH_KNOBS}
    return {**rest, **spelled}


# --------------------------------------------------------------------------------------------
# TTGIR inspection
# --------------------------------------------------------------------------------------------
_ALIAS_RE = re.compile(r"^(#[\w.$-]+)\s*=\s*(#[\w.]+)", re.M)
_DOT_RE = re.compile(r"=\s*tt\.dot\s.*->\s*tensor<[^,>]*,\s*(#[\w.$-]+)[^>]*>\s*(loc\(.*\))?\s*$", re.M)


def count_dots(ttgir: str) -> tuple[int, int, int]:
    """(dots in the TTGIR, dots with a DPAS result layout, DPAS dots at distinct source locations).

    Dots are counted by source location so that an unrolled loop (tl.static_range) counts once.
    """
    aliases = dict(_ALIAS_RE.findall(ttgir))
    total = dpas = 0
    dpas_locs = set()
    for m in _DOT_RE.finditer(ttgir):
        total += 1
        enc = m.group(1)
        if aliases.get(enc, enc).startswith("#triton_intel_gpu.dpas"):
            dpas += 1
            dpas_locs.add(m.group(2) or f"op{total}")
    # dots whose line the regex did not parse still count towards the total
    total = max(total, len(re.findall(r"=\s*tt\.dot\s", ttgir)))
    return total, dpas, len(dpas_locs)


# --------------------------------------------------------------------------------------------
# Launch specialisation and native-code gates
# --------------------------------------------------------------------------------------------
#: integer arguments a launch passes divisible by 16 (Triton's JIT then marks them
#: ``tt.divisibility=16``): the row strides of q / K / V / out / partials and the head dims of the
#: attention kernels (page-table, LSE and scale strides are left out: any value occurs)
ALIGNED = re.compile(r"^(stride_(q|k|v|o|kv|qn|qp|po)_\w+|head_dim(_v)?)$")

#: (kernel, which of its compiles, spill bytes per thread they may have, why): the zero-spill target
#: is missed there, and the gate stops any growth. Measured alternatives:
#: bench/results/xpu_native/tiles.txt. Everything else: 0.
SPILL_ALLOWANCE = [
    ("_paged_attention_kernel", lambda c, label: c.get("BLOCK_D", 0) > 128 and "fp8" in label, 6 * 1024,
     "head dim 256 over an fp8 cache: the 8-bit K^T has no 2D read and is gathered beside its 16-bit copy "
     "(8.4-8.8 KB at 8-32 warps with one score dot). With the score dot in 128-column chunks on 32-key tiles: "
     "pvc 0 B, bmg 1.2-1.4 KB (its byte gathers; 64-column chunks and 8-32 warps the same); 16-key tiles "
     "(16-token pages: a block-pointer tile lies in one page) 4.5-4.6 KB"),
    ("_mla_attention_kernel", lambda c, label: c.get("BLOCK_DV") == 128 and c.get("R") == 512 and c.get("LATENT_CHUNK", 0) > 0,
     3 * 1024,
     "R = 512 decode at 16-32 rows in 128-channel slices (mla.xpu_tiles, the cost model's pick: "
     "bench/results/xpu/cost_model.md): 2.0-2.9 KB, about 3 KB of spill traffic a thread per key tile, "
     "beside 64-channel slices (0 B) that read the latent tile 8 times instead of 4"),
]


def spill_allowance(job) -> int | None:
    """Spill bytes a compile may have: 0 for attention kernels (dots) unless ``SPILL_ALLOWANCE``
    allows more; None (not gated) for kernels without dots."""
    if job.variant.dots == 0:
        return None
    constexprs = {**job.variant.constexprs, **job.constexprs}
    return max([n for kernel, which, n, _ in SPILL_ALLOWANCE
                if kernel == kernel_name(job) and which(constexprs, job.variant.label)], default=0)


def launch_attrs(signature: dict, arg_names: list) -> dict:
    """``ASTSource.attrs`` as a launch gives them: pointers and ``ALIGNED`` integers divisible by 16."""
    attrs = {}
    for i, name in enumerate(arg_names):
        ty = signature[name]
        if ty == "constexpr":
            continue
        if ty.startswith("*") or (ty.startswith("i") and ALIGNED.match(name)):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def kernel_name(job) -> str:
    return job.variant.label.split("[", 1)[0]


# --------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Job:
    variant: object  # triton_xpu_attn._common.CompileVariant
    target: str
    options: dict
    source: str = "registry"  # or the config file's name
    constexprs: dict = dataclasses.field(default_factory=dict)  # overrides of the variant's constexprs

    @property
    def name(self) -> str:
        return self.variant.label + ("" if self.source == "registry" else f"@{self.source}")


def import_all_modules() -> list[str]:
    """Import triton_xpu_attn and every module under it (so every kernel registers itself, even in
    a module the package's __init__ does not import yet); returns the module names."""
    import importlib
    import pkgutil

    import triton_xpu_attn

    names = ["triton_xpu_attn"]
    for info in pkgutil.walk_packages(triton_xpu_attn.__path__, prefix="triton_xpu_attn."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # importing it would run the command line
        importlib.import_module(info.name)
        names.append(info.name)
    return names


def jit_function(kernel):
    """The JITFunction to compile: unwraps @triton.autotune / @triton.heuristics."""
    from triton.runtime.jit import JITFunction

    k = kernel
    while not isinstance(k, JITFunction) and hasattr(k, "fn"):
        k = k.fn
    if not isinstance(k, JITFunction):
        raise TypeError(f"{kernel!r} is not a @triton.jit function (got {type(k).__name__})")
    return k


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _paged_attention_constexprs(fields: dict, cfg: dict, variants: list) -> tuple[object, dict]:
    """(variant, constexprs) the paged-attention launcher would compile for a bucket and config:
    decode buckets (q_len 1) on a decode variant, prefill on the prefill one, fp8 caches on the
    fp8 variant; the bucket's head dims and page size (``p = 256`` of a varlen bucket: contiguous
    K/V), the KV tile, query rows (heads per block x query tokens) and K/V loads
    (``paged_attention._kv_load``: device-side descriptors or block pointers, whichever this
    Triton builds, where the config asks and the tile fits a page) as ``flash_attn_with_kvcache``
    derives them; ``num_stages`` 1 with either, as the launcher sets it on XPU."""
    from triton_xpu_attn.ops import paged_attention

    q, fp8 = fields.get("q", "decode"), str(fields.get("dtype", "")).startswith("float8")
    decode_like = q in ("decode", "draft")

    def fits(v):  # the first registered variant of the kind: the plain one (softcap, sinks... in the registry)
        label = v.label.split("[", 1)[-1]
        kind = "decode" if decode_like else "prefill" if q == "prefill" else "varlen"
        return label.startswith(kind) and ("fp8" in label) == fp8

    variant = next((v for v in variants if fits(v)), None) or next(
        (v for v in variants if v.label.split("[", 1)[-1].startswith(q)), variants[0])
    out = dict(variant.constexprs)
    if "BLOCK_N" in cfg:
        out["BLOCK_N"] = int(cfg["BLOCK_N"])
    if "d" in fields:
        out["BLOCK_D"] = _pow2(fields["d"])
        out["BLOCK_DV"] = _pow2(fields.get("dv", fields["d"]))
    if "p" in fields:
        out["PAGE_SIZE"] = 0 if q == "varlen" else int(fields["p"])
    if "g" in fields:
        heads = paged_attention.query_heads_per_block(fields["g"], 1 if q == "decode" else None, cfg)
        out["HEADS_PER_BLOCK"] = heads
        block_q = 1 if decode_like else max(1, int(cfg.get("BLOCK_M", 64)) // heads)
        out["BLOCK_Q"] = max(block_q, 16 // heads)  # tl.dot needs M >= 16
    out["HOIST_GATHER"] = not decode_like
    out["KV_LOAD"] = paged_attention._kv_load(out["PAGE_SIZE"], {"BLOCK_N": out["BLOCK_N"], **cfg}, None)
    out["SCORE_CHUNK"] = paged_attention.score_chunk(cfg, out["KV_LOAD"], out["BLOCK_D"])
    if out["KV_LOAD"] in (2, 3):
        out["num_stages"] = 1
    return variant, {k: v for k, v in out.items() if variant.constexprs.get(k) != v}


def _mla_constexprs(fields: dict, cfg: dict, variants: list) -> tuple[object, dict]:
    """(variant, constexprs) for an MLA decode bucket: a variant of the bucket's latent width R with a
    16-bit cache; BLOCK_H / BLOCK_N / BLOCK_DV as ``flash_mla_decode`` clamps them, and the
    block-pointer latent chunks (``mla.latent_chunk``) where the config asks for them."""
    r = fields.get("r")
    variant = next((v for v in variants if v.constexprs.get("R") == r and "fp8" not in v.label), None) or next(
        (v for v in variants if v.constexprs.get("R") == r), variants[0])
    block_r = variant.constexprs["BLOCK_R"]
    out = {}
    if "BLOCK_H" in cfg:
        out["BLOCK_H"] = max(16, int(cfg["BLOCK_H"]))
    if "BLOCK_N" in cfg:
        out["BLOCK_N"] = max(16, int(cfg["BLOCK_N"]))
    if "BLOCK_DV" in cfg:
        out["BLOCK_DV"] = max(16, min(int(cfg["BLOCK_DV"] or block_r), block_r))
    if fields.get("kv") == "gather":  # the launcher's gather buckets: pages shorter than 16 tokens
        out["PAGE_SIZE"] = 1
    from triton_xpu_attn.ops import mla

    merged = {**variant.constexprs, **out}
    out["LATENT_CHUNK"] = mla.latent_chunk(cfg, merged["PAGE_SIZE"], merged["BLOCK_N"], block_r, (None,))
    if out["LATENT_CHUNK"]:
        out["num_stages"] = 1  # block-pointer latent tiles: one stage on XPU, as the launcher sets it
    return variant, {k: v for k, v in out.items() if variant.constexprs.get(k) != v}


#: op -> (bucket fields, config, the op's variants) -> (variant to compile, constexpr overrides)
CONFIG_CONSTEXPRS = {
    "paged_attention": _paged_attention_constexprs,
    "mla_decode": _mla_constexprs,
    "mla_prefill": _mla_constexprs,  # the same kernel in its ragged mode, the same knobs
}


def config_jobs(variants) -> tuple[list[Job], list[str]]:
    """Jobs from autotune_configs/xpu/*.json, and errors found while reading those files."""
    from triton_xpu_attn.tune import parse_bucket  # imported by now (the registry import loaded it)

    jobs, errors = [], []
    seen = set()  # (target, variant, options, constexprs): one compile serves every file and bucket
    for path in sorted((REPO / "autotune_configs" / "xpu").glob("*.json")):
        try:
            data = json.loads(path.read_text())
            target = target_for_device(data.get("device_name") or path.stem)
            ops = data.get("ops")
            if not isinstance(ops, dict):
                raise ValueError('no "ops" object')
        except Exception as e:  # noqa: BLE001
            errors.append(f"{path.name}: {type(e).__name__}: {e}")
            continue
        for op, buckets in ops.items():
            mine = [v for v in variants if getattr(v, "op", None) == op]
            if not mine:
                errors.append(f"{path.name}: op {op!r} has no compile variant registered with op={op!r}")
                continue
            for bucket, cfg in (buckets or {}).items():
                if not isinstance(cfg, dict):
                    errors.append(f"{path.name}: {op}[{bucket}] is not an object")
                    continue
                knobs = {k: cfg[k] for k in LAUNCH_KNOBS if k in cfg}
                try:  # spelled as the launchers spell them (a mode this Triton lacks, 256 GRF above 32 warps: errors)
                    launch = launch_options(knobs, dots=1) if knobs else {}
                except ValueError as e:
                    errors.append(f"{path.name}: {op}[{bucket}]: {e}")
                    continue
                pairs = [(v, {}) for v in mine]
                if op in CONFIG_CONSTEXPRS and bucket != "default":
                    try:
                        pairs = [CONFIG_CONSTEXPRS[op](parse_bucket(bucket), cfg, mine)]
                    except Exception as e:  # noqa: BLE001
                        errors.append(f"{path.name}: {op}[{bucket}]: {type(e).__name__}: {e}")
                        continue
                for v, consts in pairs:
                    mine_launch = launch if v.dots or not launch else launch_options(knobs, dots=0)  # sub-group: dots only
                    if not mine_launch and not consts:
                        continue
                    if "num_stages" in consts:  # a launch option the launcher derives (block pointers: 1)
                        consts = dict(consts)
                        mine_launch = {**mine_launch, "num_stages": consts.pop("num_stages")}
                    key = (target, v.label, tuple(sorted(mine_launch.items())), tuple(sorted(consts.items())))
                    if key in seen:
                        continue
                    seen.add(key)
                    jobs.append(Job(v, target, {**launch_options(v.options, v.dots), **mine_launch},
                                    source=f"{path.name}:{bucket}", constexprs=consts))
    return jobs, errors


def compile_job(job: Job) -> dict:
    v = job.variant
    fn = jit_function(v.kernel)
    # triton-xpu 3.3's ASTSource: signature keyed by parameter name with "constexpr" entries for
    # constexpr parameters; constexprs keyed by name (it converts names to (index,) tuples).
    arg_names = list(fn.arg_names)
    signature = {name: v.signature[name] for name in arg_names}
    merged = {**v.constexprs, **job.constexprs}
    constexprs = {name: merged[name] for name in arg_names if name in merged}
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                                    attrs=launch_attrs(signature, arg_names))
    t0 = time.perf_counter()
    compiled = triton.compile(src, target=gpu_target(job.target), options=dict(job.options))
    seconds = time.perf_counter() - t0
    asm = compiled.asm
    spv = asm.get("spv")
    problems = []
    if not spv:
        problems.append(f"no SPIR-V produced (asm keys: {sorted(asm)})")
    total, dpas, dpas_sites = count_dots(asm.get("ttgir", ""))
    if total != dpas:
        problems.append(f"{total - dpas} of {total} tt.dot ops lack the DPAS layout (FMA fallback)")
    if dpas_sites != v.dots:
        problems.append(f"expected {v.dots} dot(s) lowered with DPAS, found {dpas_sites}")
    mode = job.options.get("grf_mode")
    if mode in ("large", "256") and "256-GRF" not in str(getattr(compiled.metadata, "build_flags", "")):
        problems.append(f"grf_mode={mode!r} did not reach the build flags ({compiled.metadata.build_flags!r})")
    return dict(spv=spv, build_flags=str(getattr(compiled.metadata, "build_flags", "") or ""),
                slm=int(getattr(compiled.metadata, "shared", 0) or 0), spv_bytes=len(spv or b""), dpas=dpas_sites,
                seconds=seconds, problems=problems)


def native_job(ocloc, job: Job, r: dict) -> dict:
    """Native code of a compiled job (``xpu_native.launched``) and the gate's problems."""
    first, rebuilt = xpu_native.launched(ocloc, r["spv"], job.target, r["build_flags"])
    final = rebuilt or first
    problems = []
    allowance = spill_allowance(job)
    if allowance is not None and final.spill > allowance:
        what = "target 0" if allowance == 0 else f"allowance {allowance} B, SPILL_ALLOWANCE"
        problems.append(f"spills {final.spill} B per thread at {final.grf} GRF ({what})")
    constexprs = {**job.variant.constexprs, **job.constexprs}
    # a job of a 2D-declared variant loads K/V through block pointers or device-side descriptors
    # (a config may ask for pointers)
    block_pointer_kv = constexprs.get("KV_LOAD") in (2, 3) or constexprs.get("LATENT_CHUNK", 0) > 0
    if job.variant.block_2d and block_pointer_kv and final.block2d_loads == 0:
        problems.append(f"declared to read {'/'.join(job.variant.block_2d)} by 2D block reads, has none")
    return dict(first=first, final=final, problems=problems)


def launch_work(job, native) -> dict | None:
    """The work of the launch a registered variant declares (``register_xpu_compile(launch=)``),
    from its native code: DPAS multiply-adds (the key loop's, per thread and iteration, times the
    warps, the iterations and the programs) and K/V bytes loaded (per program and iteration times
    the same), each beside the algorithm's minimum, and the spill + fill bytes of one iteration of
    one program (all its threads). None for config-file compiles and variants without a launch."""
    if job.source != "registry" or job.variant.launch is None:
        return None
    shape = job.variant.launch({**job.variant.constexprs, **job.constexprs})
    warps = job.options.get("num_warps", 4)
    steps = shape.programs * shape.iterations
    macs = native.loop_macs * warps * steps
    loaded = shape.loaded_bytes * steps
    return dict(shape=shape, warps=warps, dpas=native.loop_dpas * warps * steps, macs=macs,
                work_x=macs / shape.min_macs, bytes=loaded, bytes_x=loaded / shape.min_bytes,
                spill_iter=native.loop_spill_bytes * warps)


def write_table(path: pathlib.Path, rows: list, ocloc_version: str, seconds: float) -> None:
    """The native-code table (markdown) of every compile, with the versions and the commit."""
    import subprocess

    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "triton_xpu_attn",
                                "autotune_configs", ".ci"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit, dirty = "?", ""
    lines = [
        "# XPU native code of every registered kernel variant and shipped XPU config",
        "",
        f"Written by `.ci/xpu_compile_check.py --native` ({time.strftime('%Y-%m-%d')}, commit {commit}"
        f"{' with uncommitted kernel/config changes' if dirty else ''}): triton-xpu {triton.__version__} -> SPIR-V, "
        f"then Intel's `ocloc` ({ocloc_version}) -> native PVC / BMG code, read from IGC's shader dump. "
        "Compiler facts on a CPU-only machine, not speeds: no Intel GPU ran any of this.",
        "",
        "Columns: `spill` bytes per hardware thread at the GRF mode the launch uses (`->` the driver's 256-GRF rebuild "
        "of a kernel that asks for no mode and spills > 1000 B); `2D ld/st` `load_block2d` / `store_block2d` "
        "instructions; `gathers` `load.ugm` messages; `SLM` bytes per work-group (Triton's layout conversions and "
        "reductions); `gate` the CI gate (spill over the allowance, a declared 2D read missing).",
        "",
        "Work of a launch, for variants that declare one (`register_xpu_compile(launch=)`; `launch` the problem: "
        "B requests, H query heads (/ KV heads, D head dim), q query tokens, L cached keys, s KV splits): "
        "`DPAS/launch` the key loop's dpas instructions per thread times warps, loop iterations and programs; "
        "`work x min` their multiply-adds over the algorithm's minimum (each score and P @ V product once; "
        "more where a channel split repeats the score dot, warps repeat a dot, or rows are padded); "
        "`K/V MB` bytes the programs load from the cache (no reuse between programs assumed) and `bytes x min` "
        "over each K/V byte once per KV head; `spill B/iter` spill + fill bytes of one loop iteration of one "
        "program (all its threads). The cost model over these columns: bench/experiments/xpu_cost_model.py.",
        "",
        "| kernel | target | warps | GRF | spill B | 2D ld | 2D st | dpas | gathers | SLM B | instructions | launch "
        "| DPAS/launch | work x min | K/V MB | bytes x min | spill B/iter | gate |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for job, r, n in rows:
        first, final = n["first"], n["final"]
        spill = f"{first.spill} -> {final.spill}" if final is not first else f"{final.spill}"
        w = launch_work(job, final)
        work = (f"{w['shape'].shape} | {w['dpas']} | {w['work_x']:.2f} | {w['bytes'] / 1e6:.1f} | {w['bytes_x']:.2f} | "
                f"{w['spill_iter']}" if w else "- | - | - | - | - | -")
        lines.append(
            f"| `{job.name.replace('|', ',')}` | {job.target} | {job.options.get('num_warps', 4)} | {final.grf} | {spill} | "
            f"{final.block2d_loads} | {final.block2d_stores} | {final.dpas} | {final.gathers} | {r['slm']} | "
            f"{final.instructions} | {work} | {'FAIL: ' + '; '.join(n['problems']) if n['problems'] else 'ok'} |")
    failed = sum(1 for _, _, n in rows if n["problems"])
    lines += ["", f"{len(rows)} compiles in {seconds:.0f} s; {failed} over a gate.", "",
              "Spill allowances (`SPILL_ALLOWANCE`; every other attention compile must spill 0 B):", ""]
    lines += [f"- `{kernel}`, {n} B: {why}" for kernel, _, n, why in SPILL_ALLOWANCE]
    lines.append("")
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list what would be compiled, compile nothing")
    ap.add_argument("-k", metavar="SUBSTRING", help="only variants whose label (or config source) contains SUBSTRING")
    ap.add_argument("--targets", default="pvc,bmg", help="comma-separated registry targets (default: pvc,bmg)")
    ap.add_argument("--native", metavar="OCLOC_ROOT", help="also build native code with the ocloc unpacked there "
                    "(.ci/ocloc_env.sh) and gate spills and 2D block reads")
    ap.add_argument("--table", metavar="PATH", help="with --native: write the native-code table (markdown) there")
    ap.add_argument("--jobs", type=int, default=2, help="ocloc builds at once (default 2)")
    ap.add_argument("--native-registry-only", action="store_true",
                    help="with --native: native code for the registered variants only (config files: SPIR-V "
                    "checks only), for a quick look")
    args = ap.parse_args(argv)

    print(f"triton {triton.__version__} ({pathlib.Path(triton.__file__).parent}); TRITON_INTERPRET=0", flush=True)
    ocloc = None
    if args.native:
        try:
            ocloc = xpu_native.Ocloc(args.native)
        except FileNotFoundError as e:
            print(f"FAILED: {e}", file=sys.stderr)
            return 1
        print(f"native code: {ocloc.exe} ({ocloc.version()})", flush=True)
    try:
        install_arch_parser_stub()
        import_all_modules()  # every kernel registers itself where it is defined
        from triton_xpu_attn._common import COMPILE_VARIANTS
    except Exception:  # noqa: BLE001
        print("FAILED before compiling: setting up / importing triton_xpu_attn raised:", file=sys.stderr)
        traceback.print_exc()
        return 1

    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        print(f"unknown target(s) {unknown}; known: {sorted(TARGETS)}", file=sys.stderr)
        return 2
    variants = list(COMPILE_VARIANTS)
    jobs = [Job(v, t, launch_options(v.options, v.dots)) for v in variants for t in targets]
    cfg_jobs, errors = config_jobs(variants)
    jobs += cfg_jobs
    if args.k:
        jobs = [j for j in jobs if args.k in j.name]

    if args.list:
        for j in jobs:
            print(f"{j.name:<60} {j.target:<4} dots={j.variant.dots} options={j.options}"
                  + (f" constexprs={j.constexprs}" if j.constexprs else ""))
        for e in errors:
            print(f"CONFIG ERROR: {e}")
        return 1 if errors else 0
    if not jobs and not errors:
        print("nothing to compile" + (f" (no variant matches -k {args.k!r})" if args.k else ""), file=sys.stderr)
        return 1

    failures = [f"config: {e}" for e in errors]
    width = max([len(j.name) for j in jobs] + [6])
    native_cols = f"  {'spill B':>13}  {'2D ld':>5}  {'GRF':>3}" if ocloc else ""
    header = f"{'kernel':<{width}}  {'target':<6}  {'SPIR-V B':>9}  {'dots exp/DPAS':>13}  {'seconds':>7}{native_cols}  result"
    print(header)
    print("-" * len(header))
    t_all = time.perf_counter()
    failed_jobs = 0
    rows = []

    def report(j, r, n):
        nonlocal failed_jobs
        problems = r["problems"] + (n["problems"] if n else [])
        ok = not problems
        failed_jobs += not ok
        dots = f"{j.variant.dots}/{r['dpas']}"
        cols = ""
        if n:
            final = n["final"]
            spill = f"{n['first'].spill}->{final.spill}" if final is not n["first"] else str(final.spill)
            cols = f"  {spill:>13}  {final.block2d_loads:>5}  {final.grf:>3}"
            rows.append((j, r, n))
        print(f"{j.name:<{width}}  {j.target:<6}  {r['spv_bytes']:>9}  {dots:>13}  {r['seconds']:>7.2f}{cols}  "
              f"{'ok' if ok else 'FAIL'}", flush=True)
        for p in problems:
            failures.append(f"{j.name} [{j.target}]: {p}")
            print(f"    {p}", flush=True)

    from concurrent.futures import ThreadPoolExecutor

    pending = []  # (job, compile result, future of the native build) in job order
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        def drain(keep: int) -> None:
            while len(pending) > keep:
                j, r, fut = pending.pop(0)
                try:
                    n = fut.result() if fut is not None else None
                except Exception as e:  # noqa: BLE001
                    n = None
                    r["problems"].append(f"native build: {type(e).__name__}: {str(e).strip()[-800:]}")
                report(j, r, n)

        for j in jobs:
            try:
                r = compile_job(j)
            except Exception as e:  # noqa: BLE001
                drain(0)
                msg = f"{type(e).__name__}: {str(e).strip() or repr(e)}"
                failures.append(f"{j.name} [{j.target}]: {msg}")
                failed_jobs += 1
                print(f"{j.name:<{width}}  {j.target:<6}  {'-':>9}  {f'{j.variant.dots}/-':>13}  {'-':>7}  FAIL", flush=True)
                print("    " + "\n    ".join(traceback.format_exc().rstrip().splitlines()[-15:]), flush=True)
                continue
            native = ocloc is not None and r["spv"] and not (args.native_registry_only and j.source != "registry")
            fut = pool.submit(native_job, ocloc, j, r) if native else None
            pending.append((j, r, fut))
            drain(2 * max(1, args.jobs))  # Triton compiles ahead of the native builds, in order
        drain(0)
    seconds = time.perf_counter() - t_all
    print("-" * len(header))
    n = len(jobs)
    print(f"{n} compile(s) of {len({id(j.variant) for j in jobs})} variant(s) in {seconds:.1f} s; "
          f"{len(failures)} failure(s)")
    if ocloc is not None and args.table:
        write_table(pathlib.Path(args.table), rows, ocloc.version().splitlines()[0], seconds)
        print(f"native-code table written to {args.table}")
    if failures:
        print("FAILURES:")
        for f in failures:
            print(f"  {f}")
    # closing line: compiles that passed / failed (a bad config file counts as one failure)
    print(f"xpu-compile: {n - failed_jobs} passed, {failed_jobs + len(errors)} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
