"""MLA decode at head dim 576 (512 latent + 64 rope, V = the first 512 channels) through the
attention calls vLLM makes on XPU, beside our MLA decode and FlashInfer's MLA, on the same bytes.

One latent cache ``[pages, P, 1, 576]`` bf16 (random page order) per case; every row reads it:

- ``varlen``: vLLM's call, ``vllm_xpu_kernels.flash_attn_interface.flash_attn_varlen_func`` (our
  compat module) with ``k`` the cache and ``v = k.narrow(-1, 0, 512)``, ``block_table`` + ``seqused_k``
  (the op's latent route onto the MLA kernels);
- ``kvcache``: ``flash_attn_with_kvcache`` with the same K / V (the same route, no compat layer);
- ``paged576``: the same call with the latent route turned off: the paged kernel at D = 576
  (512-channel tiles and the 64-channel tail of the score dot, ``D_TAIL``), reading K and V;
- ``mla``: ``flash_mla_decode`` on the cache (automatic KV splits);
- ``flashinfer``: FlashInfer's ``BatchMLAPagedAttentionWrapper`` (fa3 / fa2, the faster one) on the
  same cache seen as ``[pages, P, 576]`` (``--peers DIR``: ``flashinfer_peer.py`` and its bundle,
  bench/README.md "Peers"; CUDA only).

Each is checked against a float32 reference on the first requests (rel err > 0.05: WRONG, not
timed), then timed eager and as a CUDA-graph replay (the replay counts). Prints per case time,
GB/s (cache bytes read once / time) and TFLOP/s (2 B H L (576 + 512) / time), and each row's time
over ``mla``'s; writes CSV + markdown + JSON to --out/<device_key>/ (quick runs in quick/).

usage:
  python bench/bench_head_dim_576.py [--quick] [--out DIR] [--peers DIR] [--time-budget S] [--from-case N]

On a machine without a GPU, one tiny case runs through the Triton interpreter as a smoke test.
"""
from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import triton_xpu_attn as ours  # noqa: E402  (selects the interpreter on a machine without a GPU)
from triton_xpu_attn import device as _device  # noqa: E402
from triton_xpu_attn.compat.vllm_xpu_kernels.flash_attn_interface import flash_attn_varlen_func  # noqa: E402
from triton_xpu_attn.ops import paged_latent  # noqa: E402

import torch  # noqa: E402

from bench import common  # noqa: E402

R, DR = 512, 64
#: (B, H, L, P): vLLM's DeepSeek decode at TP8 (16 heads) and TP1 (128 heads)
GRID = [(B, H, L, P) for H in (16, 128) for B in (1, 16, 64, 128) for L in (1024, 4096, 16384) for P in (64, 16)]
QUICK = [(64, 16, 4096, 64), (64, 128, 4096, 64), (1, 16, 16384, 64), (128, 16, 1024, 16)]
NAMES = ("varlen", "kvcache", "paged576", "mla", "flashinfer")


def make_case(B, H, L, page, dev, dtype, gen):
    n = -(-L // page)
    num_pages = B * n + 8
    table = torch.randperm(num_pages, generator=gen)[: B * n].view(B, n).to(torch.int32).to(dev)
    cache = torch.randn(num_pages, page, 1, R + DR, generator=gen).to(dtype).to(dev)
    q = torch.randn(B, H, R + DR, generator=gen).to(dtype).to(dev)
    return q, cache, table, torch.full((B,), L, dtype=torch.int32, device=dev)


def reference(q, cache, table, L, scale, rows=4):
    """float32 attention of the first ``rows`` requests: K the whole rows, V their first 512 channels."""
    page = cache.shape[1]
    out = []
    for b in range(min(rows, q.shape[0])):
        keys = cache[table[b].long()].reshape(-1, R + DR)[:L].float()
        p = (q[b].float() @ keys.T * scale).softmax(-1)
        out.append(p @ keys[:, :R])
    del page
    return torch.stack(out)


class _PagedKernelOnly:
    """The latent route turned off for the calls inside (the paged kernel takes them)."""

    def __enter__(self):
        self.saved = paged_latent.takes_latent_route
        paged_latent.takes_latent_route = lambda *a, **k: False

    def __exit__(self, *exc):
        paged_latent.takes_latent_route = self.saved


def run_case(fi, peers_script, B, H, L, page, dev, dtype):
    gen = torch.Generator().manual_seed(B * 7 + H + L + page)
    q, cache, table, seqlens = make_case(B, H, L, page, dev, dtype, gen)
    scale = (R + DR) ** -0.5
    ref = reference(q, cache, table, L, scale)
    rows_ref = ref.shape[0]
    v = cache.narrow(-1, 0, R)
    cu = torch.arange(B + 1, dtype=torch.int32, device=dev)
    row = dict(B=B, H=H, L=L, page=page, bytes=B * L * (R + DR) * cache.element_size(),
               flops=2 * B * H * L * (R + DR + R))
    check = lambda out: common.rel_err(out[:rows_ref], ref)  # noqa: E731
    ws = torch.empty(ours.flash_mla_get_workspace_size(L, B, H, page, -1, device=dev), dtype=torch.uint8, device=dev)
    out = torch.empty(B, H, R, dtype=dtype, device=dev)

    def varlen():
        return flash_attn_varlen_func(q, cache, v, 1, cu, L, seqused_k=seqlens, block_table=table,
                                      softmax_scale=scale, out=out)

    def kvcache():
        return ours.flash_attn_with_kvcache(q, cache, v, cache_seqlens=seqlens, page_table=table, cu_seqlens_q=cu,
                                            max_seqlen_q=1, softmax_scale=scale, out=out)

    def paged576():
        with _PagedKernelOnly():
            return kvcache()

    def mla():
        return ours.flash_mla_decode(q, None, cache, seqlens, table, ws, scale, -1, head_dim_v=R)

    builders = {"varlen": lambda: varlen, "kvcache": lambda: kvcache, "paged576": lambda: paged576, "mla": lambda: mla}
    for name, make in builders.items():
        common.time_variants(name, {"bf16": make}, check, row)
    if fi is not None:
        flat = cache.view(cache.shape[0], page, R + DR)
        common.time_variants("flashinfer", {
            backend: (lambda backend=backend: peers_script.mla_decode(fi, q, flat, table, seqlens, scale, backend))
            for backend in ("fa3", "fa2")}, check, row)
    common.rate_columns(row, [n for n in NAMES if f"{n}_us" in row])
    for name in NAMES:
        t = row.get(f"{name}_time_us", float("nan"))
        row[f"{name}_GBs"] = row["bytes"] / t / 1e3 if common.finite(t) else float("nan")
        if common.finite(t) and common.finite(row.get("mla_time_us", float("nan"))):
            row[f"{name}_vs_mla"] = t / row["mla_time_us"]
    return row


def fmt_row(row) -> str:
    cells = [f"B={row['B']} H={row['H']} L={row['L']} P={row['page']}"]
    for name in NAMES:
        t = row.get(f"{name}_time_us", float("nan"))
        if common.finite(t):
            cells.append(f"{name} {t:.1f}us {row[f'{name}_GBs']:.0f}GB/s {row[f'{name}_TFLOPs']:.1f}TF"
                         + (f" x{row[f'{name}_vs_mla']:.2f}" if f"{name}_vs_mla" in row else ""))
        elif f"{name}_note" in row:
            cells.append(f"{name}: {row[f'{name}_note']}"[:120])
    return " | ".join(cells)


def main(argv=None):
    ap = common.flashinfer_bench_parser(__doc__.split("\n\n")[0], "the headline cases (on CPU: one tiny case)")
    ap.add_argument("--from-case", type=int, default=0, metavar="N",
                    help="start at case N of the grid (0-based; a grid left unfinished by --time-budget)")
    args = ap.parse_args(argv)
    dev = _device.default_device()
    if dev.type == "cpu":
        grid, dtype = [(2, 2, 40, 16)], torch.float32
    else:
        grid, dtype = (QUICK if args.quick else GRID), torch.bfloat16
    fi = common.load_flashinfer(args.peers)
    peers_script = common.flashinfer_peer_script(args.peers) if fi is not None else None
    common.set_time_budget(args.time_budget)
    print(common.header(), flush=True)
    rows, summary = [], []
    for index, (B, H, L, P) in enumerate(grid[args.from_case:], args.from_case):
        if common.out_of_time():
            summary.append(f"stopped after {index} of {len(grid)} cases: time budget (--time-budget) spent")
            break
        try:
            row = run_case(fi, peers_script, B, H, L, P, dev, dtype)
        except Exception as exc:  # noqa: BLE001  (keep the grid going: out of memory, ...)
            row = dict(B=B, H=H, L=L, page=P, note=repr(exc)[:160])
        rows.append(row)
        print(fmt_row(row), flush=True)
        common.free_memory()
    lines = (common.speedup_line(rows, f"{name}_vs_mla", f"{name} time / flash_mla_decode time")
             for name in ("varlen", "paged576", "flashinfer"))
    summary += [line for line in lines if line]
    print("\n".join(summary))
    common.write_results("head_dim_576", rows, out=args.out, quick=args.quick or dev.type == "cpu",
                         title="MLA decode at head dim 576 through varlen / kvcache, beside flash_mla_decode and FlashInfer",
                         summary=summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
