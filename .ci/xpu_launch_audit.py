#!/usr/bin/env python3
"""Record the SPIR-V that serving-size launches compile for Intel GPUs, for the native-code audit.

Runs the public ops at the problem sizes the XPU config files are tuned for (the tuner's buckets and
problems of paged attention, varlen prefill, MLA decode and prefill, quick set) and at DeepSeek's
sparse-MLA sizes (V3.2 bf16 prefill h 128 and decode h 16 / 128, V3.2 fp8 decode, V4), with
triton-xpu compiling for the target through ``tests/xpu_opencl`` in compile-only mode: each launch
is specialised, compiled and recorded exactly as on the GPU (config lookup, launcher heuristics,
integer and alignment specialisation), and nothing is executed. ``.ci/xpu_launched_native.py`` then
builds the recorded modules to native code.

    .venv-xpu/bin/python .ci/xpu_launch_audit.py --target pvc --record DIR
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


def sparse_cases(torch, ops, dev):
    """DeepSeek sparse MLA launches: (name, call)."""
    gen = torch.Generator().manual_seed(0)
    d_qk, d_v, topk = 576, 512, 2048

    def indices(rows, pool):
        return torch.stack([torch.randperm(pool, generator=gen)[:topk] for _ in range(rows)]).to(torch.int32)

    def prefill(s_q, h, s_kv):
        return lambda: _prefill(s_q, h, s_kv)

    def decode(B, q_len, h, fp8):
        return lambda: _decode(B, q_len, h, fp8)

    def _prefill(s_q, h, s_kv):
        q = torch.randn(s_q, h, d_qk, generator=gen).to(torch.bfloat16)
        kv = torch.randn(s_kv, 1, d_qk, generator=gen).to(torch.bfloat16)
        idx = indices(1, s_kv).expand(s_q, topk)[:, None].contiguous()
        return ops.flash_mla_sparse_fwd(q, kv, idx, d_qk**-0.5, d_v)

    def _decode(B, q_len, h, fp8):
        page, share = 64, 4096
        pages = B * share // page
        if fp8:  # DeepSeek-V3.2's 656-byte fp8 records
            cache = torch.randint(0, 120, (pages, page, 1, 656), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
        else:
            cache = torch.randn(pages, page, 1, d_qk, generator=gen).to(torch.bfloat16)
        q = torch.randn(B, q_len, h, d_qk, generator=gen).to(torch.bfloat16)
        idx = indices(B * q_len, share).view(B, q_len, topk)
        return ops.flash_mla_with_kvcache(q, cache, None, None, d_v, None, None, d_qk**-0.5, False, fp8, idx)

    yield "sparse prefill bf16 h128", prefill(64, 128, 8192)
    yield "sparse prefill bf16 h16", prefill(64, 16, 8192)
    for B, q_len, h in ((1, 1, 128), (32, 2, 16), (128, 1, 128)):
        yield f"sparse decode bf16 B{B} q{q_len} h{h}", decode(B, q_len, h, False)
    for B, q_len, h in ((8, 1, 128), (32, 2, 16)):
        yield f"sparse decode fp8 B{B} q{q_len} h{h}", decode(B, q_len, h, True)


def tuner_cases(tuner, tune, dev):
    """The tuner's quick buckets of the ops the XPU config files tune: (name, call)."""
    for op, spec in tuner.TUNING_SPECS.items():
        for fields in spec.buckets(True):
            problem = spec.problems(fields, True)[0]
            yield f"{op} {tune.bucket_key(fields)}", (
                lambda problem=problem, fields=fields, spec=spec: spec.run(spec.make(problem, fields, dev)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, choices=("pvc", "bmg"))
    ap.add_argument("--record", required=True, help="folder for the recorded modules (XPU_OPENCL_RECORD)")
    ap.add_argument("-k", help="only cases whose name contains this")
    args = ap.parse_args(argv)

    os.environ["XPU_OPENCL_RECORD"] = str(pathlib.Path(args.record).resolve())
    os.environ["XPU_OPENCL_COMPILE_ONLY"] = "1"
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO))
    from xpu_opencl import harness

    harness.activate(args.target)
    import torch

    import triton_xpu_attn as ops
    from triton_xpu_attn import tune, tuner

    dev = torch.device("cpu")
    failed = done = 0
    t0 = time.perf_counter()
    import itertools

    for name, call in itertools.chain(tuner_cases(tuner, tune, dev), sparse_cases(torch, ops, dev)):
        if args.k and args.k not in name:
            continue
        t = time.perf_counter()
        try:
            call()
            done += 1
            print(f"{name:<60} compiled ({time.perf_counter() - t:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"{name:<60} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
    print(f"xpu-launch-audit [{args.target}]: {done} passed, {failed} failed ({time.perf_counter() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
