"""Register use of a kernel change, judged without a GPU: the compiled specializations a benchmark
grid launches, captured once on the GPU, recompiled from an old and today's copy of a module for
the same target with the same Triton, and compared by ptxas' register, spill and shared-memory
counts. A change that grows the registers of a decode kernel moves occupancy and the automatic
split count (experiments/bounded_metadata.txt), so this runs before any timing.

    # on the GPU machine (captures the specializations of the decode / prefill / MLA grids):
    python3 bench/experiments/register_specs.py capture $OUT/specs.json
    # anywhere, with the Triton the GPU runs first on PYTHONPATH (e.g. a triton==3.6.0 wheel unpacked):
    TRITON_INTERPRET=0 python3 bench/experiments/register_specs.py compare specs.json[.gz] OLD_COPY.py [module]

The H100 capture at 6d217b1 (torch 2.11, Triton 3.6; 77 paged + 10 MLA specializations) is
``bench/results/NVIDIA_H100_80GB_HBM3/experiments/register_specs_6d217b1.json.gz``; ptxas' counts
of HEAD's module matched the GPU's (registers, spills, shared memory) on all of them.

``module``: ``paged_attention`` (default), ``mla`` (the MLA kernel of decode and prefill) or ``page_table``: which
module's kernels the old copy replaces. A kernel argument the capture lacks (one added since) is
compiled as ``i32``, a constexpr as its default, else 0 (the CUDA choice of ``INTEL_GPU``). ``SPECS_MATCH=REGEX``: only the specializations whose label matches;
``SPECS_SET='{"NAME": value}'``: constexprs forced on today's copy (what turning a knob on costs).
"""
from __future__ import annotations

import gzip
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

OPTION_KEYS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"repr": repr(value)}


def capture(path: str) -> int:
    import torch

    import triton_xpu_attn as ours
    from bench import bench_mla_decode as bench_mla
    from bench import bench_mla_prefill as bench_mla_prefill
    from bench import bench_paged_attention as bench_paged
    from triton_xpu_attn.ops import mla, page_table, paged_attention

    dev = "cuda"
    for Hq, Hkv, D in bench_paged.GRID_SHAPES:
        for B in (1, 16, 64, 128):
            for L in (1024, 8192):
                for P in bench_paged.GRID_P:
                    case = bench_paged.make_case(B, Hq, Hkv, D, L, P, dev)
                    for q_len in (1, 4):
                        bench_paged.run_ours(case, D**-0.5, q_len)()
    # prefill-shaped calls (ragged q, paged and contiguous K/V), the peers' prefill shapes
    for P in (1, 16, 64, 256):
        B, S, L, Hq, Hkv, D = 2, 1024, 2048, 32, 8, 128
        k = torch.randn(B * L // P + 1, P, Hkv, D, device=dev, dtype=torch.bfloat16)
        table = torch.arange(B * L // P, device=dev, dtype=torch.int32).view(B, -1)
        q = torch.randn(B * S, Hq, D, device=dev, dtype=torch.bfloat16)
        cu = torch.tensor([0, S, 2 * S], device=dev, dtype=torch.int32)
        lens = torch.full((B,), L, device=dev, dtype=torch.int32)
        ours.flash_attn_with_kvcache(q, k, k, cache_seqlens=lens, page_table=table, cu_seqlens_q=cu,
                                     max_seqlen_q=S, causal=True)
    kv = torch.randn(2 * 2048, 8, 128, device=dev, dtype=torch.bfloat16)
    q = torch.randn(2 * 1024, 32, 128, device=dev, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 1024, 2048], device=dev, dtype=torch.int32)
    cu_k = torch.tensor([0, 2048, 4096], device=dev, dtype=torch.int32)
    ours.flash_attn_varlen_func(q, kv, kv, cu_q, cu_k, 1024, 2048, causal=True)
    R = bench_mla.R
    for B in (1, 64):
        for H in bench_mla.GRID_H:
            for P in bench_mla.GRID_P:
                kv4, q, table, _, seqlens = bench_mla.make_case(B, H, 4096, P, torch.device(dev), torch.bfloat16)
                ws = torch.empty(ours.flash_mla_get_workspace_size(4096, B, H, P, -1, device=torch.device(dev)),
                                 dtype=torch.uint8, device=dev)
                ours.flash_mla_decode(q[..., :R].contiguous(), q[..., R:].contiguous(), kv4, seqlens, table, ws,
                                      192**-0.5, -1)
    for H in bench_mla_prefill.GRID_H:
        for P in bench_mla_prefill.GRID_P:
            q, cache, cu, seq_lens, table = bench_mla_prefill.make_case(2, H, 512, 1024, P, dev, torch.bfloat16)
            ws = torch.empty(ours.flash_mla_prefill_get_workspace_size(1024, 2, H, P, -1), dtype=torch.uint8,
                             device=dev)
            ours.flash_mla_prefill(q[..., :R].contiguous(), q[..., R:].contiguous(), cache, cu, seq_lens, 512, table,
                                   ws, 192**-0.5, causal=True)
    torch.cuda.synchronize()

    kernels = [paged_attention._paged_attention_kernel, mla._mla_attention_kernel,
               page_table._normalize_page_table_kernel]
    specs = []
    for fn in kernels:
        names = fn.arg_names
        for caches in fn.device_caches.values():
            for compiled in caches[0].values():
                src = compiled.src
                specs.append(dict(
                    kernel=fn.__name__,
                    signature=dict(src.signature),
                    constants={names[k[0]] if len(k) == 1 else repr(k): _plain(v) for k, v in src.constants.items()},
                    attrs={names[k[0]] if len(k) == 1 else repr(k): v for k, v in src.attrs.items()},
                    options={key: getattr(compiled.metadata, key) for key in OPTION_KEYS
                             if getattr(compiled.metadata, key, None) is not None},
                    gpu=dict(regs=compiled.n_regs, spills=compiled.n_spills, shared=compiled.metadata.shared),
                ))
    pathlib.Path(path).write_text(json.dumps(specs, indent=1))
    print(f"{len(specs)} specializations -> {path}")
    return 0


def _ptxas_counts(ptx: str, arch: str) -> tuple[int, int, int]:
    """(registers, spill stores + loads in bytes, static shared bytes) from ``ptxas -v``."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "k.ptx"
        src.write_text(ptx)
        out = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill", out))
    return regs, spills, 0


def _resident(regs: int, shared: int, warps: int) -> int:
    """Programs an H100 SM holds at once (bench/residency.py's rule and limits)."""
    from bench.residency import H100_SM, resident_programs

    return resident_programs(regs, shared, warps, H100_SM)


def _compile(fn, spec: dict, target, forced: dict | None = None):
    import triton
    from triton.compiler import ASTSource

    names = fn.arg_names
    signature, constexprs = {}, {}
    for name in names:
        if name in (forced or {}):
            constexprs[name] = forced[name]
            signature[name] = "constexpr"
        elif name in spec["constants"]:
            value = spec["constants"][name]
            if isinstance(value, dict):
                raise ValueError(f"constant {name} = {value['repr']} is not replayable")
            constexprs[name] = value
            signature[name] = "constexpr"
        elif name in spec["signature"]:
            signature[name] = spec["signature"][name]
        elif fn.params[names.index(name)].is_constexpr:  # a constexpr added since the capture: its
            param = fn.params[names.index(name)]          # default, else 0 (off: the CUDA path)
            has_default = param.default is not inspect.Parameter.empty
            constexprs[name] = (param.default.value if hasattr(param.default, "value") else param.default) if has_default else 0
            signature[name] = "constexpr"
        else:  # a runtime argument added since the capture
            signature[name] = "i32"
    for name, value in spec["signature"].items():
        if value == "constexpr" and name in names and name not in constexprs:
            param = fn.params[names.index(name)]
            constexprs[name] = param.default.value if hasattr(param.default, "value") else param.default
    attrs = {(names.index(k),): v for k, v in spec["attrs"].items() if k in names}
    src = ASTSource(fn, signature, {(names.index(k),): v for k, v in constexprs.items()}, attrs)
    compiled = triton.compile(src, target=target, options=dict(spec["options"]))
    return compiled


#: kernels renamed since a capture: old name -> today's
_RENAMED = {"_mla_decode_kernel": "_mla_attention_kernel"}


def compare(specs_path: str, old_path: str, module: str = "paged_attention") -> int:
    os.environ["TRITON_INTERPRET"] = "0"
    import importlib

    from triton.backends.compiler import GPUTarget

    from sweeps import load_old_op

    target = GPUTarget("cuda", 90, 32)
    today = importlib.import_module(f"triton_xpu_attn.ops.{module}")
    old = load_old_op(old_path, module)
    raw = pathlib.Path(specs_path).read_bytes()
    specs = json.loads(gzip.decompress(raw) if specs_path.endswith(".gz") else raw)
    grown = compared = 0
    seen = set()
    forced = json.loads(os.environ.get("SPECS_SET", "{}"))  # constexprs forced on today's copy (a knob's cost)
    for spec in specs:
        fn_name = _RENAMED.get(spec["kernel"], spec["kernel"])
        if not hasattr(today, fn_name):
            continue
        key = json.dumps([spec["constants"], spec["options"]], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        label = " ".join(f"{k}={v}" for k, v in sorted(spec["constants"].items())
                         if k.isupper() and not isinstance(v, dict)) + f" w{spec['options'].get('num_warps')}"
        if os.environ.get("SPECS_MATCH") and not re.search(os.environ["SPECS_MATCH"], label):
            continue
        compared += 1
        counts = []
        for mod in (old, today):
            try:
                compiled = _compile(getattr(mod, fn_name), spec, target, forced if mod is today else None)
                counts.append(_ptxas_counts(compiled.asm["ptx"], "sm_90a") + (compiled.metadata.shared,))
            except Exception as exc:  # noqa: BLE001
                counts.append(f"not compiled: {type(exc).__name__}: {str(exc)[:60]}")
        same = counts[0] == counts[1]
        worse = ""
        if all(isinstance(c, tuple) for c in counts):
            warps = spec["options"].get("num_warps", 4)
            (r0, s0, _, m0), (r1, s1, _, m1) = counts
            o0, o1 = _resident(r0, m0, warps), _resident(r1, m1, warps)
            counts = [c + (o,) for c, o in zip(counts, (o0, o1))]
            if o1 < o0 or s1 > s0:
                grown += 1
                worse = "  <-- fewer resident programs or more spills"
        old_c, new_c = ((f"{c[0]} regs {c[1]} B spill {c[3]} B shared, {c[4]} resident" if isinstance(c, tuple)
                         else c) for c in counts)
        print(f"{fn_name} {label}: gpu {spec['gpu']} | old {old_c} | new {new_c}"
              f"{worse or ('' if same else '  (differs)')}", flush=True)
    print(f"{compared} specializations compared, {grown} with fewer resident programs (H100) or more spills")
    return 0 if grown == 0 else 1


if __name__ == "__main__":
    if sys.argv[1] == "capture":
        sys.exit(capture(sys.argv[2]))
    sys.exit(compare(*sys.argv[2:]))
