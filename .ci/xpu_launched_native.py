#!/usr/bin/env python3
"""Native Intel code of the kernels real launches compiled: the SPIR-V modules the OpenCL CPU
device ran (recorded by ``tests/xpu_opencl/driver.py`` under ``XPU_OPENCL_RECORD``), each built to
PVC / BMG code with Intel's ``ocloc`` and read as ``.ci/xpu_compile_check.py --native`` reads its
ahead-of-time compiles (``.ci/xpu_native.py``): spill bytes, GRF, 2D block loads, DPAS, gathers.

These modules are specialised exactly as the launches specialised them (integers equal to 1,
divisibility by 16 of every argument as it was, the sub-group size and tile the launcher chose), so
the table is the code users get for those problems.

    .venv-xpu/bin/python .ci/xpu_launched_native.py RECORD_DIR --native OCLOC_ROOT --table PATH

Exit status 1 when an attention kernel (one with DPAS) spills more than ``.ci/xpu_compile_check.py``'s
allowance for it and ``--gate`` is given; the table always says so.
"""
from __future__ import annotations

import argparse
import ast
import json
import pathlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import xpu_native  # noqa: E402

#: constexprs shown in the table beside the kernel's name (the tile and the modes that shape it)
SHOWN = ("BLOCK_M", "BLOCK_N", "BLOCK_H", "BLOCK_Q", "BLOCK_D", "BLOCK_DV", "HEADS_PER_BLOCK", "KV_LOAD", "PAGE_SIZE",
         "SCORE_CHUNK", "LATENT_CHUNK", "R", "BLOCK_R", "LAYOUT", "MODE", "CAPACITY")


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def allowance(kernel: str, constexprs: dict, signature: dict, dpas: int) -> int | None:
    """Spill bytes per thread an attention kernel may have (``SPILL_ALLOWANCE`` of the compile
    check; 0 otherwise); None for kernels without DPAS (not gated)."""
    if dpas == 0:
        return None
    from xpu_compile_check import SPILL_ALLOWANCE

    fp8 = any("fp8" in str(v) for v in signature.values())  # an fp8 cache (the allowance's labels say "fp8")
    return max([n for name, which, n, _ in SPILL_ALLOWANCE
                if name == kernel and which(constexprs, "fp8" if fp8 else "")], default=0)


def registered_variants_run(records: list[dict]) -> list[tuple]:
    """(variant label, target, the first test whose launch matched it or "") for every registered
    compile variant (``_common.COMPILE_VARIANTS``) and target recorded: a launch matches when it is
    of the variant's kernel, with the variant's tile and modes (its constexprs among ``SHOWN``) and
    the element type of its first pointer (the data it reads); flags such as sinks or a top-k
    length, and the placeholder tensors of unused pointers, may differ."""
    import importlib
    import pkgutil

    sys.path.insert(0, str(HERE.parent))
    import triton_xpu_attn

    for info in pkgutil.walk_packages(triton_xpu_attn.__path__, prefix="triton_xpu_attn."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    from triton_xpu_attn._common import COMPILE_VARIANTS

    rows = []
    for target in sorted({r["target"] for r in records}):
        mine = [r for r in records if r["target"] == target]
        for v in COMPILE_VARIANTS:
            kernel = getattr(getattr(v.kernel, "fn", v.kernel), "__name__", "")
            tile = {k: val for k, val in v.constexprs.items() if k in SHOWN}
            first = next((k for k, ty in v.signature.items() if str(ty).startswith("*")), None)
            hit = ""
            for r in mine:
                if r["kernel"] != kernel or (first and r["signature"].get(first) != v.signature[first]):
                    continue
                consts = {k: _value(x) for k, x in r["constexprs"].items()}
                if all(consts.get(k, object()) == val for k, val in tile.items()):
                    hit = r.get("test") or "(a serving-size launch, compiled only)"
                    break
            rows.append((v.label, target, hit))
    return rows


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("record", help="the folder XPU_OPENCL_RECORD named (<target>/<kernel>-<sha>.spv + .json)")
    ap.add_argument("--native", required=True, metavar="OCLOC_ROOT", help="ocloc unpacked by .ci/ocloc_env.sh")
    ap.add_argument("--table", metavar="PATH", help="write the markdown table there")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--gate", action="store_true", help="exit 1 when an attention kernel spills past its allowance")
    args = ap.parse_args(argv)

    ocloc = xpu_native.Ocloc(args.native)
    modules = sorted(pathlib.Path(args.record).glob("*/*.spv"))
    if not modules:
        print(f"no recorded modules under {args.record}", file=sys.stderr)
        return 1
    t0 = time.perf_counter()

    def build(spv_path):
        info = json.loads(spv_path.with_suffix(".json").read_text())
        first, rebuilt = xpu_native.launched(ocloc, spv_path.read_bytes(), info["target"], info["build_flags"])
        return info, first, rebuilt or first

    rows, failed, records, broken = [], 0, [], []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for spv_path, fut in [(p, pool.submit(build, p)) for p in modules]:
            try:
                info, first, final = fut.result()
            except Exception as e:  # noqa: BLE001
                failed += 1
                why = next((line for line in str(e).splitlines() if "Error" in line), str(e).splitlines()[0])
                info = json.loads(spv_path.with_suffix(".json").read_text())
                shown = ", ".join(f"{k}={_value(info['constexprs'][k])}" for k in SHOWN if k in info["constexprs"])
                broken.append((info["kernel"], info["target"], shown, info["num_warps"], why.strip()[:160]))
                print(f"{spv_path.name}: native build failed: {type(e).__name__}: {str(e)[-400:]}", flush=True)
                continue
            records.append(info)
            constexprs = {k: _value(v) for k, v in info["constexprs"].items()}
            limit = allowance(info["kernel"], constexprs, info["signature"], final.dpas)
            over = limit is not None and final.spill > limit
            failed += over and args.gate
            shown = ", ".join(f"{k}={constexprs[k]}" for k in SHOWN if k in constexprs)
            spill = f"{first.spill} -> {final.spill}" if final is not first else f"{final.spill}"
            rows.append((info["kernel"], info["target"], shown, info["num_warps"], final, spill, info["shared"],
                         "over allowance" if over else "ok"))
            print(f"{info['kernel']:<34} {info['target']:<4} warps {info['num_warps']:>2} GRF {final.grf:>3} "
                  f"spill {spill:>9} 2D {final.block2d_loads:>3} dpas {final.dpas:>4}  {shown}", flush=True)
    seconds = time.perf_counter() - t0
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    if args.table:
        lines = [
            "# XPU native code of the kernels the OpenCL stage launched",
            "",
            f"Written by `.ci/xpu_launched_native.py` ({time.strftime('%Y-%m-%d')}, commit {_commit()}): the SPIR-V modules triton-xpu "
            "compiled for the launches of the OpenCL test stage (`.ci/run`, `tests/xpu_opencl/`), specialised as those "
            f"launches specialised them, built to native code with Intel's `ocloc` ({ocloc.version().splitlines()[0]}). "
            "Compiler facts on a CPU-only machine, not speeds.",
            "",
            "Columns as in `bench/results/xpu_codegen.md`; `constexprs` the tile and modes of the launch; `gate` an "
            "attention kernel (DPAS) spilling past `.ci/xpu_compile_check.py`'s allowance.",
            "",
            "| kernel | target | constexprs | warps | GRF | spill B | 2D ld | 2D st | dpas | gathers | SLM B | instructions | gate |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for kernel, target, shown, warps, n, spill, slm, gate in rows:
            lines.append(f"| `{kernel}` | {target} | {shown or '-'} | {warps} | {n.grf} | {spill} | {n.block2d_loads} | "
                         f"{n.block2d_stores} | {n.dpas} | {n.gathers} | {slm} | {n.instructions} | {gate} |")
        lines += ["", f"{len(rows)} modules in {seconds:.0f} s; {sum(r[-1] != 'ok' for r in rows)} over the allowance.", ""]
        if broken:
            lines += ["## Modules Intel's compiler did not build", "",
                      "| kernel | target | constexprs | warps | ocloc |", "|---|---|---|---|---|"]
            lines += [f"| `{k}` | {t} | {c or '-'} | {w} | {why} |" for k, t, c, w, why in sorted(set(broken))]
            lines.append("")
        coverage = registered_variants_run(records)
        ran = sum(1 for *_, hit in coverage if hit)
        lines += ["## Registered variants the launches ran", "",
                  f"{ran} of {len(coverage)} (variant, target) pairs had a launch of their kernel with their tile and "
                  "modes and the element type of their data (`registered_variants_run`), the first such launch named; "
                  "the others ran in other tiles or not at all.", "", "| variant | target | ran in |", "|---|---|---|"]
        lines += [f"| `{label.replace('|', ',')}` | {target} | {hit or '-'} |" for label, target, hit in coverage]
        lines.append("")
        pathlib.Path(args.table).write_text("\n".join(lines))
        print(f"table written to {args.table}")
    print(f"xpu-launched-native: {len(rows) - (failed if args.gate else 0)} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
