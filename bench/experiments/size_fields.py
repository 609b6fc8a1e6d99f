"""What the head-dim rule of the config lookup (``tune.lookup(no_larger=("d", "dv"))``: a bucket
tuned at smaller head dims never serves larger ones) would change for decode and drafts on this
device if it applied there too: head dims above the tuned files' (D = 256 on CUDA, whose files hold
d = 64/128 buckets) move from the nearest d = 128 entry to the built-in heuristic. (The launcher
applies the rule to prefill lookups only.) Per case both lookups are timed (CUDA-graph replays;
pairs timed nearest, rule, rule, nearest, best of each kept) and the outputs compared. GPU only.

    python bench/experiments/size_fields.py
    python bench/experiments/size_fields.py --old-file OLD.json   # an older config file against the shipped one

``--old-file``: the same cases, each timed on the lookup of an older copy of this device's config file
(given as the user's file, ``$TRITON_XPU_ATTN_CONFIG_DIR``) and on the shipped file's, e.g. before and
after the tuner has D = 256 buckets.
"""
from __future__ import annotations

import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import triton_xpu_attn as ours  # noqa: E402  (first: selects the backend before triton loads)
import torch  # noqa: E402
import triton  # noqa: E402

from bench.common import graph_ms, rel_err  # noqa: E402
from triton_xpu_attn import tune  # noqa: E402

#: (Hq, Hkv, D, B, L, P, q_len): Gemma-2/3-like heads (D = 256) at decode and q_len-4 drafts
CASES = [(hq, hkv, 256, B, L, P, q) for hq, hkv in ((8, 4), (16, 8)) for B in (1, 16, 64) for L in (1024, 8192)
         for P in (1, 16, 64) for q in (1, 4)]


_LOOKUP = tune.lookup


def _policy(no_larger: tuple):
    """Every lookup with ``no_larger`` forced (the launcher reads ``tune.lookup`` at each call)."""
    def lookup(op, fields, heuristic, **kw):
        return _LOOKUP(op, fields, heuristic, **{**kw, "no_larger": no_larger})
    tune.lookup = lookup
    tune.clear_cache()


def _files(old_file: str):
    """A policy that looks up ``old_file`` (as the user's config file) or, given None, the shipped file."""
    import os
    import shutil
    import tempfile

    folder = pathlib.Path(tempfile.mkdtemp()) / "cuda"
    folder.mkdir()
    from triton_xpu_attn import device as _device

    shutil.copy(old_file, folder / f"{_device.device_key()}.json")

    def policy(use_old: bool):
        if use_old:
            os.environ[tune.CONFIG_DIR_ENV] = str(folder.parent)
        else:
            os.environ.pop(tune.CONFIG_DIR_ENV, None)
        tune.clear_cache()
    return policy


def main() -> None:
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    old_file = sys.argv[sys.argv.index("--old-file") + 1] if "--old-file" in sys.argv else None
    names = ("old file", "shipped") if old_file else ("nearest", "rule")
    policy = _files(old_file) if old_file else None
    rule = ("d", "dv")
    ratios = []
    for hq, hkv, D, B, L, P, q_len in CASES:
        torch.manual_seed(0)
        n = -(-L // P)
        k = torch.randn(B * n + 1, P, hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        table = torch.randperm(B * n + 1, device="cuda")[: B * n].view(B, n).to(torch.int32)
        q = torch.randn(B, q_len, hq, D, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((B,), L, device="cuda", dtype=torch.int32)

        def call():
            return ours.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, page_table=table, causal=True)

        times, outs, sources = {}, {}, {}
        a, b = names
        for name in (a, b, b, a):
            if policy:
                policy(name == a)
            else:
                _policy(() if name == a else rule)
            outs[name] = call()
            sources[name] = tune.LAST_SOURCE.get("paged_attention")
            times[name] = min(times.get(name, float("inf")), graph_ms(call, 10, 50) * 1e3)
        ratio = times[a] / times[b]
        ratios.append(ratio)
        print(f"{hq}/{hkv}/{D} B={B} L={L} P={P} q_len={q_len}: {a} {times[a]:.1f} us [{sources[a]}] | "
              f"{b} {times[b]:.1f} us [{sources[b]}] | {b}/{a} speed {ratio:.3f} "
              f"(outputs differ by {rel_err(outs[b], outs[a]):.1e})", flush=True)
    tune.lookup = _LOOKUP
    if policy:
        policy(False)
    tune.clear_cache()
    print(f"{b}/{a} speed: geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} "
          f"min {min(ratios):.3f} max {max(ratios):.3f} over {len(ratios)} cases")


if __name__ == "__main__":
    main()
