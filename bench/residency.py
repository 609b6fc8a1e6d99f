"""How many programs of each attention kernel an SM holds, per benchmark case: the guard against a
change that silently costs time. Two regressions passed unseen before it: a launcher change moved
the 32/8/128 P = 16 decode tile from 128 to 164 registers (4 -> 3 programs per SM, 1.14x slower,
f738dd4), and the page-id clamp of 3977965 took the 8-warp 32/8/64 P = 64 prefill tile from 128 to
132 registers (2 -> 1 programs per SM, 1.47x slower).

A decode kernel reads K/V at the bandwidth its resident programs keep in flight, a prefill tile
hides its loads behind the other programs' dots; registers and shared memory decide how many fit.
This launches every decode and draft case of the paged benchmark's grid, and the prefill tiles
(head dims 64/128/256/512, pages of 1/16/64 tokens, with and without a sliding window), once
(eager), notes each kernel launched through Triton's launch hook, and reads the compiled kernel's
registers, spills and shared memory. ``--write`` records them next to the device's results
(``decode_residency.json``, ``prefill_residency.json``); ``--check`` (and
``tests/test_residency.py`` on a GPU) compares against those records and fails naming every case
with fewer resident programs or more spills.

    python3 -m bench.residency --write   # after a change measured to be no slower (sweeps.py ab_paged, ab_prefill.py)
    python3 -m bench.residency --check [--kind decode|prefill]

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

import triton_xpu_attn as ours  # noqa: E402
from bench import bench_paged_attention as bench_paged  # noqa: E402
from bench import bench_prefill  # noqa: E402
from triton_xpu_attn import device as _device  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
CASE_L = (1024, 8192)  # splits change the kernel's specialization below 8k keys; longer ones do not
Q_LENS = (1, 4)  # decode and a 4-token draft
# prefill tiles: full prefill of one 2k-token request (the heuristic's 1k+-query tiles), 32/8 heads
PREFILL_D = (64, 128, 256, 512)
PREFILL_P = (1, 16, 64)
PREFILL_WINDOWS = ((-1, -1), (256, 0))
PREFILL_L = 2048
KINDS = ("decode", "prefill")


def record_path(device=None, kind: str = "decode") -> pathlib.Path:
    return RESULTS / _device.device_key(device) / f"{kind}_residency.json"


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


def _decode_calls(device):
    """(label, call) of every decode and draft case of the paged benchmark's grid."""
    for Hq, Hkv, D in bench_paged.GRID_SHAPES:
        for B in bench_paged.GRID_B:
            for L in CASE_L:
                for P in bench_paged.GRID_P:
                    case = bench_paged.make_case(B, Hq, Hkv, D, L, P, device)
                    for q_len in Q_LENS:
                        yield f"{Hq}/{Hkv}/{D} B={B} L={L} P={P} q{q_len}", bench_paged.run_ours(case, D**-0.5, q_len)
                    del case


def _prefill_calls(device):
    """(label, call) of the prefill tiles: causal full prefill of ``PREFILL_L`` queries, 32/8 heads, bf16."""
    B, Hq, Hkv, L = 1, 32, 8, PREFILL_L
    for D in PREFILL_D:
        dense = bench_prefill.make_dense(B, L, L, Hq, Hkv, D, device, torch.bfloat16)
        for P in PREFILL_P:
            paged = bench_prefill.make_paged(dense, P)
            for window in PREFILL_WINDOWS:
                yield (f"{Hq}/{Hkv}/{D} B={B} L={L} P={P} window={window[0]}",
                       lambda: ours.flash_attn_with_kvcache(
                           dense["q"], paged["k_cache"], paged["v_cache"], cache_seqlens=dense["seqlens"],
                           page_table=paged["table"], cu_seqlens_q=dense["cu_q"], max_seqlen_q=L,
                           softmax_scale=D**-0.5, causal=True, window_size=window))
            del paged
        del dense


def measure(kind: str = "decode") -> dict:
    """``{case label: [{kernel, regs, spills, shared, warps, resident}, ...]}`` over the decode grid
    (``kind`` "decode") or the prefill tiles ("prefill")."""
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
        for label, call in (_decode_calls if kind == "decode" else _prefill_calls)(device):
            launched.clear()
            call()
            kernels = _compiled_kernels()
            rows[label] = [
                dict(kernel=kernels[h][0], regs=kernels[h][1].n_regs, spills=kernels[h][1].n_spills,
                     shared=kernels[h][1].metadata.shared, warps=kernels[h][1].metadata.num_warps,
                     resident=resident_programs(kernels[h][1].n_regs, kernels[h][1].metadata.shared,
                                                kernels[h][1].metadata.num_warps, props))
                for h in launched if h in kernels]
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


def check(kind: str = "decode") -> tuple[str, list[str]]:
    """(what was compared, the cases that got worse); nothing compared without a record for this
    device and Triton version."""
    path = record_path(kind=kind)
    if not path.exists():
        return f"no record {path}", []
    record = json.loads(path.read_text())
    if record["triton_version"] != triton.__version__:
        return f"record {path.name} is for Triton {record['triton_version']}, this is {triton.__version__}", []
    rows = measure(kind)
    return f"{len(rows)} cases against {path}", compare(record["cases"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.residency", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="record this commit's kernels for this device")
    mode.add_argument("--check", action="store_true", help="compare with the record; exit 1 if any case got worse")
    parser.add_argument("--kind", choices=KINDS, action="append", help="decode and/or prefill (default both)")
    args = parser.parse_args(argv)
    failed = False
    for kind in args.kind or KINDS:
        if args.write:
            rows = measure(kind)
            path = record_path(kind=kind)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(dict(device=_device.device_name(), triton_version=triton.__version__,
                                            torch_version=torch.__version__, cases=rows), indent=1, sort_keys=True))
            print(f"{len(rows)} cases -> {path}")
            continue
        what, worse = check(kind)
        print(what)
        for line in worse:
            print("WORSE " + line)
        failed |= bool(worse)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
