"""Repeats of single cells of the peers' GQA decode grid in one process, to put a run-to-run spread
beside a ratio near 1.00x (GPU only). Each repeat builds the case afresh (new random pages and
values) and times ours, FlashInfer (at its 16-token pages, as the grid does) and dense SDPA from
CUDA-graph replays, through ``peers_bench.gqa_case`` itself; sglang's kernel is timed too (the
case runs it).

    PYTHONPATH=$PWD python3 bench/experiments/peer_repeat.py .peers [REPEATS] [CELLS_JSON]

CELLS_JSON: [[B, Hq, Hkv, D, L, P], ...] (default the grid's two B = 64 8k-key one-token-page cells).
"""
from __future__ import annotations

import json
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import triton_xpu_attn  # noqa: E402, F401  (before triton: on a CPU it selects the interpreter)


def main(peers_dir: str, repeats: str = "3", cells_json: str = "") -> None:
    sys.path.insert(0, str(pathlib.Path(peers_dir).resolve()))
    import peers_bench as pb

    pb.GRAPHS = True
    sgl = pb.sgl_loader.load(str(pathlib.Path(peers_dir) / "sglang"))
    fi = pb.flashinfer_peer.setup(str(pathlib.Path(peers_dir) / "flashinfer"))
    import torch
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__} flashinfer {fi.__version__}")
    cells = json.loads(cells_json or "[[64,32,8,128,8192,1],[64,64,8,128,8192,1]]")
    for B, Hq, Hkv, D, L, P in cells:
        ratios = []
        for i in range(int(repeats)):
            row, _, _ = pb.gqa_case((sgl, None, fi), B, Hq, Hkv, D, L, P)
            ours, flashinfer, sdpa = (row[k][0] * 1e3 for k in ("ours", "flashinfer", "sdpa_dense"))
            ratios.append(flashinfer / ours)
            print(f"B={B} {Hq}/{Hkv}/{D} L={L} P={P} repeat {i}: ours {ours:.1f} us, flashinfer[{row['flashinfer'][2]}] "
                  f"{flashinfer:.1f} us, sdpa_dense {sdpa:.1f} us: ours/flashinfer {flashinfer / ours:.4f}x", flush=True)
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"B={B} {Hq}/{Hkv}/{D} L={L} P={P}: ours/flashinfer min {min(ratios):.4f}x max {max(ratios):.4f}x "
              f"geomean {geo:.4f}x over {len(ratios)} repeats", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
