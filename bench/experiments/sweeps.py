"""The decode A/B guard: an old copy of ops/paged_attention.py against the package on the paged
benchmark's grid (GPU; under the interpreter one tiny case, to check the script runs), and the module
loader the other A/B tools share (``ab_prefill.py``, ``ptx_identity.py``, ``register_specs.py``).

    python bench/experiments/sweeps.py ab_paged OLD_COPY_OF_OPS_PAGED_ATTENTION.py [SECONDS] [MATCH] [REPEATS] [CONFIG]

The sweeps that chose the split combine, split counts, tiles and grid order (ceiling, combine, splits,
q4, q4_rows, waves, mla_batch, mla_tiles, pa_tiles, read_ceiling, gather_ceiling, block_order, pdl,
wide_tiles) were decided; their outputs stay under ``bench/results/<device>/experiments/`` and their
code in commit ea194bc (``git show ea194bc:bench/experiments/sweeps.py``).
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import triton_xpu_attn as ours  # noqa: E402  (first: on a CPU it must select the interpreter before triton loads)

from bench import bench_paged_attention as bench_paged  # noqa: E402
from bench.common import bench_ms, capture_graph, geomean  # noqa: E402
from triton_xpu_attn import device as _device  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402

DEV = _device.default_device().type


def load_old_op(path, op="paged_attention"):
    """An old copy of ops/<op>.py imported as a module of the package, so its relative imports
    resolve (to today's device, tune, _common and merge_state)."""
    name = f"triton_xpu_attn.ops._{op}_old"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _forced(run, config):
    with tune.override("paged_attention", config):
        return run()


#: new/old time ratio above which ab_paged fails (run-to-run noise of graph replays: about 1%)
SLOWER = 1.03


def ab_paged(old_path, budget_s="240", match="", repeats="1", config=""):
    """Old (a copy of ops/paged_attention.py) vs new ``flash_attn_with_kvcache`` on the paged
    benchmark's decode grid (bench_paged_attention: every shape, batch, length and page size,
    smallest KV first: a run cut short by ``budget_s`` seconds drops the largest, bandwidth-bound
    cases) after a few q_len-4 draft cases. Per case: both captured in a graph, replays timed old,
    new, new, old (the faster of each kept); prints new/old, the min, max and geomean, the counts below
    0.98 and above 1.02, and exits 1 naming every case slower than ``SLOWER`` (1.03x).
    ``match``: only the cases whose label (e.g. ``64/8/128 B=64 L=8192 P=16 q4``) matches this regular
    expression; ``repeats``: timing pairs each way round (the min of each side is kept); ``config``: a JSON
    config forced on both (``tune.override``), else each case's shipped lookup (printed)."""
    old = load_old_op(old_path).flash_attn_with_kvcache
    drafts = [(8, 1, 128, 64, 8192, 16, 4), (32, 8, 128, 16, 8192, 64, 4), (64, 8, 128, 64, 8192, 16, 4),
              (32, 8, 64, 16, 32768, 1, 4), (8, 1, 128, 1, 32768, 64, 4)]
    grid = [(Hq, Hkv, D, B, L, P, 1) for Hq, Hkv, D in bench_paged.GRID_SHAPES for B in bench_paged.GRID_B
            for L in bench_paged.GRID_L for P in bench_paged.GRID_P]
    grid.sort(key=lambda c: c[1] * c[2] * c[3] * c[4])  # KV bytes per case
    if DEV == "cpu":  # interpreter: one tiny decode and draft case, to check the script runs
        drafts, grid = [(4, 1, 64, 1, 64, 16, 4)], [(4, 1, 64, 2, 64, 16, 1)]
    start, ratios = time.monotonic(), {}
    label = lambda c: f"{c[0]}/{c[1]}/{c[2]} B={c[3]} L={c[4]} P={c[5]} q{c[6]}"  # noqa: E731
    drafts, grid = ([c for c in cells if re.search(match, label(c))] for cells in (drafts, grid))
    for cell in drafts + grid:
        if time.monotonic() - start > float(budget_s):
            print(f"time budget spent: {len(ratios)} of {len(drafts) + len(grid)} cases timed", flush=True)
            break
        Hq, Hkv, D, B, L, P, q_len = cell
        case = bench_paged.make_case(B, Hq, Hkv, D, L, P, DEV)
        runs = {name: bench_paged.run_ours(case, D**-0.5, q_len, attn=attn)
                for name, attn in (("old", old), ("new", ours.flash_attn_with_kvcache))}
        if config:
            forced = json.loads(config)
            runs = {name: (lambda run=run: _forced(run, forced)) for name, run in runs.items()}
        diff = (runs["new"]().float() - runs["old"]().float()).abs().max().item()
        source = "forced " + config if config else tune.LAST_SOURCE.get("paged_attention")
        replays = {name: capture_graph(run) or run for name, run in runs.items()}
        times = {name: [] for name in replays}
        for order in (("old", "new"), ("new", "old")) * int(repeats):  # both ways round: the first of a pair runs faster
            for name in order:
                times[name].append(bench_ms(replays[name], warmup=5, rep=20) * 1e3)
        ratios[cell] = min(times["new"]) / min(times["old"])
        print(f"{label(cell)}: old {min(times['old']):.1f} us new {min(times['new']):.1f} us "
              f"new/old {ratios[cell]:.3f} max|diff| {diff:.1e} [{source}]", flush=True)
        del case, runs, replays
    values = list(ratios.values())
    print(f"new/old over {len(values)} cases: min {min(values):.3f} ({label(min(ratios, key=ratios.get))}), "
          f"max {max(values):.3f} ({label(max(ratios, key=ratios.get))}), geomean {geomean(values):.3f}, "
          f"faster (< 0.98): {sum(v < 0.98 for v in values)}, slower (> 1.02): {sum(v > 1.02 for v in values)}")
    # the guard: a slower case fails the run (new/old is a time ratio; a summary that printed only the
    # minimum once let a 1.15x regression at P = 16 pass unseen, decode_p16_regression.txt)
    slower = {label(c): r for c, r in ratios.items() if r > SLOWER}
    for text, r in sorted(slower.items(), key=lambda item: -item[1]):
        print(f"SLOWER {text}: new/old {r:.3f}")
    if slower:
        raise SystemExit(f"{len(slower)} case(s) slower than {SLOWER}x old: a regression until explained")


if __name__ == "__main__":
    print(_device.describe()["device"])
    {"ab_paged": ab_paged}[sys.argv[1]](*sys.argv[2:])
