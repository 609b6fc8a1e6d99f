"""How many programs of each decode kernel an SM holds, per benchmark case: the guard against a
change that silently costs decode time (issue 30 item 1: a launcher change moved the 32/8/128
P = 16 decode tile from 128 to 164 registers, 4 -> 3 programs per SM, 1.14x slower, and no test
saw it).

A decode kernel reads K/V at the bandwidth its resident programs keep in flight; its registers and
shared memory decide how many fit. This launches every decode and draft case of the paged
benchmark's grid once (eager), notes each kernel launched through Triton's launch hook, and reads
the compiled kernel's registers, spills and shared memory. ``--write`` records them next to the
device's results; ``--check`` (and ``tests/test_residency.py`` on a GPU) compares against that
record and fails naming every case with fewer resident programs or more spills.

    python3 -m bench.residency --write   # after a change measured to be no slower (sweeps.py ab_paged)
    python3 -m bench.residency --check

The record holds the Triton version it was compiled with; another version compiles other code,
so ``--check`` then says so and compares nothing.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import triton_xpu_attn  # noqa: F401  (first: on a CPU it selects the interpreter before triton loads)

import torch  # noqa: E402
import triton  # noqa: E402

from bench import bench_paged_attention as bench_paged  # noqa: E402
from triton_xpu_attn import device as _device  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
CASE_L = (1024, 8192)  # splits change the kernel's specialization below 8k keys; longer ones do not
Q_LENS = (1, 4)  # decode and a 4-token draft


def record_path(device=None) -> pathlib.Path:
    return RESULTS / _device.device_key(device) / "decode_residency.json"


#: an H100 SM's limits: registers, shared memory (bytes), programs and warps
H100_SM = dict(regs=65536, shared=233472, programs=32, warps=64)


def resident_programs(regs: int, shared: int, warps: int, props: dict) -> int:
    """Programs of ``warps`` warps an SM holds: registers (allocated per warp in units of 256),
    shared memory (1 KB reserved per program) and the per-SM program and warp limits."""
    per_warp = -(-regs * 32 // 256) * 256
    return min(props["regs"] // (per_warp * warps), props["shared"] // (shared + 1024),
               props["programs"], props["warps"] // warps)


def _sm_props(device) -> dict:
    """Per-SM limits (an H100's where this torch does not report one)."""
    p = torch.cuda.get_device_properties(device)
    return dict(regs=getattr(p, "regs_per_multiprocessor", H100_SM["regs"]),
                shared=getattr(p, "shared_memory_per_multiprocessor", H100_SM["shared"]),
                programs=getattr(p, "max_blocks_per_multi_processor", H100_SM["programs"]),
                warps=p.max_threads_per_multi_processor // 32)


def _compiled_kernels() -> dict:
    """``{CUfunction handle: (kernel name, CompiledKernel)}`` of every kernel the ops compiled."""
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("triton_xpu_attn.ops"):
            continue
        for attr, fn in vars(module).items():
            caches = getattr(fn, "device_caches", None)
            if not isinstance(caches, dict):
                continue
            for entry in caches.values():
                for compiled in entry[0].values():
                    compiled._init_handles()
                    found[compiled.function] = (attr, compiled)
    return found


def measure() -> dict:
    """``{case label: [{kernel, regs, spills, shared, warps, resident}, ...]}`` over the decode grid."""
    if _device.backend() != "cuda":
        raise SystemExit("bench.residency reads compiled CUDA kernels: run it on an NVIDIA GPU")
    device = _device.default_device()
    props = _sm_props(device)
    launched: list = []

    def hook(metadata):
        data = metadata.get() if hasattr(metadata, "get") else metadata
        launched.append(data["function"])

    triton.knobs.runtime.launch_enter_hook.add(hook)
    rows = {}
    try:
        for Hq, Hkv, D in bench_paged.GRID_SHAPES:
            for B in bench_paged.GRID_B:
                for L in CASE_L:
                    for P in bench_paged.GRID_P:
                        case = bench_paged.make_case(B, Hq, Hkv, D, L, P, device)
                        for q_len in Q_LENS:
                            launched.clear()
                            bench_paged.run_ours(case, D**-0.5, q_len)()
                            kernels = _compiled_kernels()
                            rows[f"{Hq}/{Hkv}/{D} B={B} L={L} P={P} q{q_len}"] = [
                                dict(kernel=kernels[h][0], regs=kernels[h][1].n_regs, spills=kernels[h][1].n_spills,
                                     shared=kernels[h][1].metadata.shared, warps=kernels[h][1].metadata.num_warps,
                                     resident=resident_programs(kernels[h][1].n_regs, kernels[h][1].metadata.shared,
                                                                kernels[h][1].metadata.num_warps, props))
                                for h in launched if h in kernels]
                        del case
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    return rows


def compare(record: dict, rows: dict) -> list[str]:
    """Cases whose kernels hold fewer programs per SM, or spill more, than the record says."""
    worse = []
    for label, kernels in rows.items():
        before = record.get(label)
        if before is None:
            continue
        for old, new in zip(before, kernels):
            if new["resident"] < old["resident"] or new["spills"] > old["spills"]:
                worse.append(f"{label} {new['kernel']}: {old['regs']} -> {new['regs']} registers, "
                             f"{old['spills']} -> {new['spills']} spills, {old['shared']} -> {new['shared']} B shared, "
                             f"{old['resident']} -> {new['resident']} programs per SM")
    return worse


def check() -> tuple[str, list[str]]:
    """(what was compared, the cases that got worse); nothing compared without a record for this
    device and Triton version."""
    path = record_path()
    if not path.exists():
        return f"no record {path}", []
    record = json.loads(path.read_text())
    if record["triton_version"] != triton.__version__:
        return f"record {path.name} is for Triton {record['triton_version']}, this is {triton.__version__}", []
    rows = measure()
    return f"{len(rows)} cases against {path}", compare(record["cases"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.residency", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="record this commit's kernels for this device")
    mode.add_argument("--check", action="store_true", help="compare with the record; exit 1 if any case got worse")
    args = parser.parse_args(argv)
    if args.write:
        rows = measure()
        path = record_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dict(device=_device.device_name(), triton_version=triton.__version__,
                                        torch_version=torch.__version__, cases=rows), indent=1, sort_keys=True))
        print(f"{len(rows)} cases -> {path}")
        return 0
    what, worse = check()
    print(what)
    for line in worse:
        print("WORSE " + line)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
