#!/usr/bin/env python3
"""Write the shipped Intel XPU config files ``autotune_configs/xpu/<device_key>.json``.

No Intel GPU was available, so these files are *seeded*, not measured: every entry follows a rule
taken from Intel's own tuning of attention kernels (see ``SOURCE`` below and
shared/notes/perf_anchors.md sections 1.4, 3 and 5), and each file says ``measured_on_hardware:
false``. ``.ci/xpu_compile_check.py`` compiles every distinct config of these files for the file's
target (pvc or bmg). Running the tuner on the device (``python -m triton_xpu_attn.tuner``) replaces
them with measured files.

    python autotune_configs/seed_xpu_configs.py [--out autotune_configs]

Bucket keys are built exactly as the launchers build them (``tune.bucket_key``):
paged attention ``d, dv, g, p, q, w, dtype``; MLA decode ``rows, r, w, kv, dtype``. The rules do not
depend on the work bucket ``w`` or (below 32 rows) the group size, so each file holds one ``w``
and two ``g`` values; ``tune.lookup``'s nearest-bucket fallback then serves every other value
(it compares numeric fields on a log scale and requires the text fields, ``q`` and ``dtype``, to
match, which is why every cache dtype is listed).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from triton_xpu_attn.device import normalize_device_key  # noqa: E402
from triton_xpu_attn.ops.mla import xpu_tiles as mla_xpu_tiles  # noqa: E402
from triton_xpu_attn.ops.paged_attention import xpu_tiles  # noqa: E402
from triton_xpu_attn.tune import bucket_key  # noqa: E402

# device name (torch.xpu.get_device_name()) -> compile target, Xe-cores per torch device, peaks
# per torch device (perf_anchors 3.1: Intel benchmarks/gpu_info.json, vllm-xpu-kernels presets;
# a Max 1550 torch device is one stack: half the card's 3276.8 GB/s)
DEVICES = {
    "Intel(R) Data Center GPU Max 1550": dict(target="pvc", xe_cores=64, bf16_tflops=419.43, memory_gbs=1638.4),
    "Intel(R) Data Center GPU Max 1100": dict(target="pvc", xe_cores=56, bf16_tflops=355.53, memory_gbs=1228.8),
    "Intel(R) Arc(TM) B580 Graphics": dict(target="bmg", xe_cores=20, bf16_tflops=116.74, memory_gbs=456.0),
    "Intel(R) Arc(TM) Pro B60 Graphics": dict(target="bmg", xe_cores=20, bf16_tflops=98.0, memory_gbs=456.0),
}

SUB_GROUP_SIZE = 16  # DPAS lowers only at 16 lanes; tune.launch_options states it (warp_size / threads_per_warp)
LARGE_GRF = "256"  # spelled for triton-xpu >= 3.6; tune.launch_options respells it 'large' for older Triton
KV_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")
Q_DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (1, 16, 32, 64)  # 128 and 256 fall back to 64 (same rule: 64-token tiles)
GROUPS = (8, 64)  # decode rows per tile: <= 16 (g <= 16) or 32-64 (g >= 32)
WORK = 4  # the rules do not depend on the work bucket

SOURCE = (
    "Seeded by hand from Intel's tuning of attention kernels for PVC and BMG; NOT measured on this device. "
    "Paged attention: tiles from triton_xpu_attn.ops.paged_attention.xpu_tiles, chosen on the native code "
    "(triton-xpu 3.3 -> ocloc; bench/results/xpu_codegen.md) for 2D block reads of K/V (tiles inside one page, "
    "one stage: device-side tensor descriptors where Triton builds them, kv_device_desc, else block pointers, "
    "kv_block_ptr) and no spill at grf_mode 256: 32-key tiles at head dim <= 128, 16 above "
    "and at 16-token pages and for fp8 caches; 8 sub-groups for decode (16 for fp8), 16 for 128-row prefill tiles "
    "(64 rows at head dim > 128). "
    "Splits: about 2 work-groups per Xe-core (waves=2; Xe-cores = gpu_subslice_count), at least 4 tiles "
    "(256 tokens) per split and at most 32 splits (vllm-xpu-kernels get_num_splits caps). "
    "MLA decode: tiles from triton_xpu_attn.ops.mla.xpu_tiles (no spill in the native code): 16 or 32 rows, "
    "16-key tiles, output channels split across programs (128 at R = 512 over pages, 64 at R = 256 and over per-token "
    "gathers), 8 sub-groups, grf_mode 256. "
    "grf_mode is written '256' (triton-xpu >= 3.6); the launcher respells it 'large' for older Triton. "
    "num_warps stays <= 32 with 256 GRF (the backend rejects more). sub_group_size is the launches' sub-group "
    "size (DPAS needs 16), spelled warp_size or threads_per_warp for the installed Triton. Sources: shared/notes/perf_anchors.md sections 1.2, 1.4, "
    "2.4, 3.4 and 5 (intel/intel-xpu-backend-for-triton benchmarks, vllm-xpu-kernels, sgl-kernel-xpu)."
)


def paged_config(d: int, g: int, p: int, q: str, dtype: str) -> dict:
    """Tiles from ``paged_attention.xpu_tiles`` (the XPU heuristic: 2D block reads, no spill in
    the native code), the XPU split policy on top."""
    cfg = xpu_tiles(q == "decode", d, p, dtype.startswith("float8"))
    cfg.update(waves=2, min_split_tokens=256, max_splits=32, sub_group_size=SUB_GROUP_SIZE)
    return cfg


def mla_config(rows: int, r: int, kv: str) -> dict:
    """MLA decode tiles from ``mla.xpu_tiles`` (no spill in the native code)."""
    return dict(mla_xpu_tiles(rows, r, gather=kv == "gather"), sub_group_size=SUB_GROUP_SIZE)


def file_for(name: str, info: dict) -> dict:
    paged = {}
    for d in HEAD_DIMS:
        for g in GROUPS:
            for p in PAGE_SIZES:
                for q in ("decode", "prefill"):
                    for dtype in KV_DTYPES:
                        fields = dict(d=d, dv=d, g=g, p=p, q=q, w=WORK, dtype=dtype)
                        paged[bucket_key(fields)] = paged_config(d, g, p, q, dtype)
    # untuned dtypes (float32 caches): keep the heuristic's tiles, use the XPU split policy
    paged["default"] = dict(waves=2, min_split_tokens=256, max_splits=32)
    mla = {}
    for rows in (16, 32, 64, 128):
        for r in (512, 256):
            for dtype in Q_DTYPES:
                for kv in ("page", "gather"):
                    mla[bucket_key(dict(rows=rows, r=r, w=WORK, kv=kv, dtype=dtype))] = mla_config(rows, r, kv)
    return {
        "device_name": name,
        "device_key": normalize_device_key(name),
        "backend": "xpu",
        "target": info["target"],
        "compute_units": info["xe_cores"],
        "peaks": dict(bf16_tflops=info["bf16_tflops"], memory_gbs=info["memory_gbs"],
                      source="per torch device; shared/notes/perf_anchors.md 3.1"),
        "triton_version": "3.6.0",
        "torch_version": "not measured",
        "date": "2026-11-21",
        "measured_on_hardware": False,
        "tuned_with": "autotune_configs/seed_xpu_configs.py (rules from Intel's guidance; no timing)",
        "source": SOURCE,
        "ops": {"paged_attention": paged, "mla_decode": mla},
        "gain_over_heuristic": {},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "autotune_configs"))
    args = ap.parse_args(argv)
    folder = pathlib.Path(args.out) / "xpu"
    folder.mkdir(parents=True, exist_ok=True)
    for name, info in DEVICES.items():
        data = file_for(name, info)
        path = folder / f"{data['device_key']}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({sum(len(v) for v in data['ops'].values())} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
