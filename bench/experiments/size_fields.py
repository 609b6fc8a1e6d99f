"""What the head-dim rule of the config lookup (``tune.lookup(no_larger=("d", "dv"))``: a bucket
tuned at smaller head dims never serves larger ones) would change for decode and drafts on this
device if it applied there too: head dims above the tuned files' (D = 256 on CUDA, whose files hold
d = 64/128 buckets) move from the nearest d = 128 entry to the built-in heuristic. (The launcher
applies the rule to prefill lookups only.) Per case both lookups are timed (CUDA-graph replays;
pairs timed nearest, rule, rule, nearest, best of each kept) and the outputs compared. GPU only.

    python bench/experiments/size_fields.py
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


def main() -> None:
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
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
        for name, fields in (("nearest", ()), ("rule", rule), ("rule", rule), ("nearest", ())):
            _policy(fields)
            outs[name] = call()
            sources[name] = tune.LAST_SOURCE.get("paged_attention")
            times[name] = min(times.get(name, float("inf")), graph_ms(call, 10, 50) * 1e3)
        ratio = times["nearest"] / times["rule"]
        ratios.append(ratio)
        print(f"{hq}/{hkv}/{D} B={B} L={L} P={P} q_len={q_len}: nearest {times['nearest']:.1f} us [{sources['nearest']}] | "
              f"rule {times['rule']:.1f} us [{sources['rule']}] | rule/nearest speed {ratio:.3f} "
              f"(outputs differ by {rel_err(outs['rule'], outs['nearest']):.1e})", flush=True)
    tune.lookup = _LOOKUP
    tune.clear_cache()
    print(f"rule/nearest speed: geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} "
          f"min {min(ratios):.3f} max {max(ratios):.3f} over {len(ratios)} cases")


if __name__ == "__main__":
    main()
