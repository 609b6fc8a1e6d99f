"""Compiled-kernel facts and Nsight Compute readings of the cells that miss their targets (GPU only).

    python bench/experiments/profile.py stats      # registers, spills, shared memory, dot instructions
    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \
        python bench/experiments/profile.py ncu    # one profiled call per cell (cudaProfilerStart/Stop)
    ... profile.py ncu|stats '[[Hq, Hkv, D, B, L, P], ...]'   # these paged cells only

Cells: the paged-attention cells under 85% of the copy roofline (267 MB: 8/1/128 B=16 L=32k and
32/8/64 B=16 L=8k; 67 MB: 8/1/128 B=16 L=8k), the B=1 cell, a cell that meets the target
(64/8/128 B=16 L=8k) for contrast, MLA's compute-bound cell (H=128, B=64, L=4k) and its
memory-bound H=16 cell, plus a device copy of 268 MB (a memcpy, not a kernel: ncu lists nothing
for it).
"""
from __future__ import annotations

import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.experiments.sweeps import mla_case, paged_case  # noqa: E402
from triton_xpu_attn.ops import merge_state, mla, paged_attention  # noqa: E402

PAGED = [(8, 1, 128, 16, 32768, 16), (32, 8, 64, 16, 8192, 16), (8, 1, 128, 16, 8192, 64),
         (32, 8, 128, 1, 8192, 64), (64, 8, 128, 16, 8192, 64)]
MLA = [(64, 128, 4096, 64), (64, 16, 4096, 1)]


def calls():
    for Hq, Hkv, D, B, L, P in PAGED:
        yield f"paged {Hq}/{Hkv}/{D} B={B} L={L} P={P}", paged_case(Hq, Hkv, D, B, L, P)
    if CELLS_GIVEN:
        return
    for B, H, L, P in MLA:
        yield f"mla H={H} B={B} L={L} P={P}", mla_case(B, H, L, P)(0)
    x = torch.empty(268 * 2**20 // 2, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    yield "copy 268 MB (134 MB read + 134 MB written)", lambda: y.copy_(x)


def compiled(jit_fn):
    """Every compiled variant of a @triton.jit function held in its caches (Triton 3.x layout)."""
    for entry in jit_fn.device_caches.values():
        yield from entry[0].values()


def stats():
    for name, fn in calls():
        fn()
        torch.cuda.synchronize()
        print(name, flush=True)
    for jit_fn in (paged_attention._paged_attention_kernel, mla._mla_attention_kernel, merge_state._combine_splits_kernel):
        for k in compiled(jit_fn):
            if hasattr(k, "_init_handles"):
                k._init_handles()
            ptx = k.asm.get("ptx", "")
            try:
                names = k.src.fn.arg_names
                consts = {names[key[0]]: v for key, v in k.src.constants.items() if len(key) == 1 and names[key[0]].isupper()}
            except Exception:  # another Triton's cache layout
                consts = {}
            print(f"{jit_fn.__name__}: regs {k.n_regs} spills {k.n_spills} shared {k.metadata.shared} "
                  f"warps {k.metadata.num_warps} stages {k.metadata.num_stages} | wgmma {len(re.findall(r'wgmma.mma_async', ptx))} "
                  f"mma.sync {len(re.findall(r'mma.sync', ptx))} cp.async {len(re.findall(r'cp.async.cg|cp.async.ca', ptx))} "
                  f"ld.global.v4 {len(re.findall(r'ld.global[.a-z0-9]*.v4', ptx))} ld.global {len(re.findall(r'ld.global', ptx))} | {consts}",
                  flush=True)


def ncu():
    todo = list(calls())
    for name, fn in todo:  # compile and warm outside the profiled range
        fn()
        fn()
    torch.cuda.synchronize()
    for name, fn in todo:
        print("=== " + name, flush=True)
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


CELLS_GIVEN = len(sys.argv) > 2
if CELLS_GIVEN:
    PAGED = [tuple(cell) for cell in json.loads(sys.argv[2])]

if __name__ == "__main__":
    print(torch.cuda.get_device_name())
    {"stats": stats, "ncu": ncu}[sys.argv[1]]()
