"""Benchmark: make_local_attention_virtual_batches on the device vs the numpy reference path.

    python bench/bench_local_attention.py [--quick] [--out DIR] [--chunk 8192] [--page-size 64]

The baseline is what sglang / vLLM do today: vLLM's numpy algorithm on host arrays
(``triton_xpu_attn.reference.make_local_attention_virtual_batches``; the block table is gathered on
the device with index arrays copied from the host) plus the host->device copies of
``cu_seqlens_q_local`` and ``seqlens_k_local`` that the backend then makes. Measured against it:

* ``eager``: device inputs, outputs sized by one device->host read of V;
* ``numpy_io``: the sglang drop-in call (numpy inputs and numpy lengths out, so H2D + D2H copies);
* ``graph_mode``: ``max_virtual_batches`` = the exact bound, no host sync (eager launches);
* ``cuda_graph``: the graph-mode call captured in a CUDA graph and replayed (CUDA only).

Batches: B in {1, 64, 512} requests holding T query tokens in all (T = B is pure decode, up to
64k tokens of mixed prefill), each request with a random context of up to 32k tokens before its
queries; Llama 4's chunk (8192) and page size 64 by default. Times are medians of
``triton.testing.do_bench`` (GPU) or of wall-clock repeats (``--quick`` under the CPU interpreter,
a smoke test only). Prints a markdown table and writes ``local_attention.csv`` / ``.md`` / ``.json``
to ``--out/<device_key>/`` (default bench/results/; quick runs in quick/).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton_xpu_attn  # noqa: E402,F401  (selects the interpreter on a CPU-only machine)
from triton_xpu_attn import device as tdevice  # noqa: E402
from triton_xpu_attn import make_local_attention_virtual_batches, max_local_attention_virtual_batches  # noqa: E402
from triton_xpu_attn import reference as ref  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench import common  # noqa: E402

MAX_CONTEXT = 32768


def _time_ms(fn, quick: bool) -> float:
    """Median milliseconds: do_bench on a GPU, wall-clock repeats under the interpreter."""
    return common.bench_ms(fn, warmup=25, rep=100, repeats=2 if quick else 5)


def _case(batch: int, tokens: int, chunk: int, page_size: int, max_context: int, rng: np.random.Generator):
    """Host arrays (query_start_loc, seq_lens) and a random page-granular table on the host."""
    q_lens = np.ones(batch, dtype=np.int64)  # every request at least one query ...
    if tokens > batch:  # ... the rest split at random
        q_lens += rng.multinomial(tokens - batch, rng.dirichlet(np.ones(batch)))
    seq_lens = q_lens + rng.integers(0, max_context + 1, batch)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    max_pages = -(-int(seq_lens.max()) // page_size)
    table = torch.from_numpy(rng.integers(1, 1 << 20, (batch, max_pages), dtype=np.int32))
    return qsl, seq_lens.astype(np.int32), table


def _same(a, b) -> bool:
    return all(np.array_equal(np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x),
                              np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y)) for x, y in zip(a, b))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU interpreter smoke test)")
    parser.add_argument("--out", default=str(common.RESULTS_DIR), help="results folder (a <device_key>/ folder is made in it)")
    parser.add_argument("--chunk", type=int, default=None, help="attn_chunk_size (default 8192; 64 with --quick)")
    parser.add_argument("--page-size", type=int, default=None, help="page size (default 64; 16 with --quick)")
    args = parser.parse_args(argv)

    device = tdevice.default_device()
    backend = tdevice.backend()
    chunk = args.chunk or (64 if args.quick else 8192)
    page_size = args.page_size or (16 if args.quick else 64)
    if args.quick:
        cases, max_context = [(1, 1), (4, 40)], 200
    else:
        cases = [(b, t) for b in (1, 64, 512) for t in (b, 8192, 65536) if t >= b]
        max_context = MAX_CONTEXT
    rng = np.random.default_rng(0)
    use_graphs = backend == "cuda"
    if not args.quick:
        print(common.header(), flush=True)
    results = []
    for batch, tokens in cases:
        qsl_np, seq_np, table = _case(batch, tokens, chunk, page_size, max_context, rng)
        bt = table.to(device)
        qsl, seq = torch.from_numpy(qsl_np).to(device), torch.from_numpy(seq_np).to(device)
        bound = max_local_attention_virtual_batches(batch, tokens, chunk)

        def numpy_ref():
            sq, cu, sk, btl = ref.make_local_attention_virtual_batches(chunk, qsl_np, seq_np, bt, page_size)
            # what the backend does next: move the lengths to the device
            return sq, torch.from_numpy(cu).to(device), torch.from_numpy(sk).to(device), btl

        eager = lambda: make_local_attention_virtual_batches(chunk, qsl, seq, bt, page_size)  # noqa: E731
        numpy_io = lambda: make_local_attention_virtual_batches(chunk, qsl_np, seq_np, bt, page_size)  # noqa: E731
        graph_mode = lambda: make_local_attention_virtual_batches(  # noqa: E731
            chunk, qsl, seq, bt, page_size, max_virtual_batches=bound
        )

        expected = numpy_ref()
        virtual = len(expected[0])
        if not (_same(eager(), expected) and _same(numpy_io(), expected)):
            raise AssertionError(f"mismatch at B={batch} T={tokens}")
        padded = ref.make_local_attention_virtual_batches(chunk, qsl_np, seq_np, bt, page_size, max_virtual_batches=bound)
        if not _same(graph_mode(), padded):
            raise AssertionError(f"graph-mode mismatch at B={batch} T={tokens}")

        t_ref = _time_ms(numpy_ref, args.quick)
        t_eager = _time_ms(eager, args.quick)
        t_numpy_io = _time_ms(numpy_io, args.quick)
        t_graph_mode = _time_ms(graph_mode, args.quick)
        t_cuda_graph = float("nan")
        if use_graphs:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                graph_mode()  # warm-up off the capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = graph_mode()
            graph.replay()
            torch.cuda.synchronize()
            if not _same(outs, padded):
                raise AssertionError(f"CUDA-graph replay mismatch at B={batch} T={tokens}")
            t_cuda_graph = _time_ms(graph.replay, args.quick)
        us = lambda ms: round(ms * 1e3, 1)  # noqa: E731
        best = t_cuda_graph if use_graphs else t_graph_mode
        table_out = padded[3]
        results.append(
            dict(
                B=batch, total_q=tokens, chunk=chunk, page_size=page_size, V=virtual, V_bound=bound,
                numpy_ref_us=us(t_ref), eager_us=us(t_eager), numpy_io_us=us(t_numpy_io),
                graph_mode_us=us(t_graph_mode), cuda_graph_us=us(t_cuda_graph),
                speedup_eager=round(t_ref / t_eager, 1), speedup_graph_mode=round(t_ref / t_graph_mode, 1),
                speedup_cuda_graph=round(t_ref / t_cuda_graph, 1) if use_graphs else float("nan"),
                speedup=round(t_ref / best, 2), time_us=us(best),
                # block table read + written, and three int32 lengths per virtual batch
                bytes=2 * table_out.numel() * table_out.element_size() + 12 * bound, flops=0,
            )
        )

    name = {"cuda": lambda: torch.cuda.get_device_name(), "xpu": lambda: torch.xpu.get_device_name()}.get(backend, lambda: backend)()
    common.print_table(f"make_local_attention_virtual_batches on {name} (median us; baseline = numpy reference + H2D copies)", results)
    common.write_results(
        "local_attention", results, out=args.out, quick=args.quick,
        title=f"make_local_attention_virtual_batches (chunk {chunk}, page {page_size})",
        notes="Median us. Baseline `numpy_ref`: vLLM's numpy algorithm on host arrays plus the H2D copies of the "
              "lengths. `eager`: device inputs; `numpy_io`: the sglang drop-in call (numpy in and out); `graph_mode`: "
              "max_virtual_batches given, no host sync; `cuda_graph`: graph_mode replayed from a CUDA graph. "
              "`speedup` = numpy_ref / our graph-safe time (CUDA graph where available); `bytes` = block table read "
              "+ written.",
        headline_kw=dict(speedup="speedup", peer="numpy reference + H2D copies"),
    )


if __name__ == "__main__":
    sys.exit(main())
