"""Shared test utilities: poisoning, tolerances, random paged caches."""
from __future__ import annotations

import torch

from conftest import DEVICE, INTERPRET, SMALL  # noqa: F401
from triton_xpu_attn import device as _device
from triton_xpu_attn import reference as ref

#: relative-error bound per dtype of the op's inputs (the guide's standard)
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}

#: input dtypes of the float ops (under the interpreter the launchers run bf16 in fp32:
#: ``_common.interpreter_float32``)
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32]

#: the K/V loads a paged-attention config can ask for: masked pointers, host tensor descriptors
#: (whole tiles; Triton >= 3.4) and block pointers (every tile inside one page, visible rows
#: through the boundary check: the XPU path; Triton < 3.9, so compiled runs and older interpreters),
#: these also with the XPU tile options: the score dot over 16-column head-dim chunks, and one
#: head's tokens per program (``pack_gqa`` off); and device-side tensor descriptors over the same
#: visible rows (Triton >= 3.4: the interpreter and compiled runs; the XPU default where Intel's
#: Triton has them), also with the score dot over 16-column head-dim chunks
KV_LOADS = ["pointer", "descriptor"] + (
    ["block_ptr", "block_ptr_chunks", "block_ptr_one_head"] if _device.block_pointers() else []) + (
    ["device_desc", "device_desc_chunks"] if _device.device_descriptors() else [])


def kv_load_config(kv_load: str) -> dict:
    """The config keys that ask for ``kv_load`` (one of ``KV_LOADS``)."""
    block_ptr = kv_load.startswith("block_ptr")
    config = dict(kv_desc=kv_load == "descriptor", kv_block_ptr=block_ptr,
                  kv_device_desc=kv_load.startswith("device_desc"))
    if kv_load in ("block_ptr_chunks", "device_desc_chunks"):
        config["score_chunk"] = 16
    if kv_load == "block_ptr_one_head":
        config.update(pack_gqa=False, score_chunk=32)
    return config


def to_device(t, device=DEVICE):
    """``t`` on ``device`` with its strides and the bytes between its elements kept (its whole
    storage copied; anything but a tensor, or a tensor already there, as given): ``Tensor.to``
    packs a view with gaps (pages apart, heads apart, padded page strides), so the compiled op
    would never see one."""
    if not isinstance(t, torch.Tensor) or t.device.type == torch.device(device).type:
        return t
    storage = t.untyped_storage()
    whole = torch.empty(0, dtype=t.dtype).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    return whole.to(device, copy=True).as_strided(t.shape, t.stride(), t.storage_offset())


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill with a value no kernel produces, so an unwritten element fails the comparison."""
    if t.dtype.is_floating_point:
        return t.fill_(float("nan"))
    return t.fill_(-123456)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out holds NaN)."""
    out = out.double().cpu()
    ref = ref.double().cpu()
    if torch.isnan(out).any():
        return float("nan")
    denom = ref.norm().item()
    num = (out - ref).norm().item()
    return num / denom if denom > 0 else num


def assert_close(out, ref, dtype, what="output"):
    err = rel_error(out, ref)
    tol = TOLERANCE[dtype]
    assert err == err and err < tol, f"{what}: relative error {err:.3e} exceeds {tol:.0e} for {dtype}"


def invisible_slots(num_pages, page_size, page_table, q_lens, kv_lens, causal=False, window=(-1, -1)) -> torch.Tensor:
    """``[num_pages, page_size]`` bool: the cache slots no query may see (left of every query's
    window, past each request's length, in pages no request uses): a serving engine may have
    freed them and left NaN or inf there (vLLM PRs 47305, 53628)."""
    seen = torch.zeros(num_pages * page_size, dtype=torch.bool)
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens)):
        keys = ref.visible_keys(int(q_len), int(kv_len), causal, window).any(0).nonzero()[:, 0]
        pages = page_table[b].cpu().long()[keys // page_size]
        seen[pages * page_size + keys % page_size] = True
    return ~seen.view(num_pages, page_size)


#: the engines' usual (D, Dv) pairs
COMMON_HEAD_DIMS = [(64, 64), (80, 80), (96, 96), (128, 128), (192, 128), (256, 256), (512, 512)]


def head_dim_pairs(max_dim: int = 512):
    """(D, Dv): the usual pairs, or any multiples of 8 up to ``max_dim`` (equal or not)."""
    from hypothesis import strategies as st

    any_dim = st.integers(1, max_dim // 8).map(lambda k: 8 * k)
    return st.one_of(st.sampled_from(COMMON_HEAD_DIMS), any_dim.map(lambda d: (d, d)), st.tuples(any_dim, any_dim))


class GridRecorder:
    """Stands in for a ``@triton.jit`` kernel of an ops module (``monkeypatch.setattr(module, name,
    GridRecorder(kernel))``): records each launch's grid and checks it against CUDA's limits (axis
    0 at most 2^31 - 1, axes 1 and 2 at most 65535) and, with ``max_programs``, against a test's
    own bound, before the real kernel launches: a runaway grid fails at once instead of being
    interpreted program by program. Everything else (``warmup``, ...) goes to the kernel."""

    def __init__(self, kernel, max_programs: int | None = None):
        self.kernel, self.max_programs, self.grids = kernel, max_programs, []

    def __getitem__(self, grid):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        self.grids.append(grid)
        assert 1 <= grid[0] <= 2**31 - 1 and 1 <= grid[1] <= 65535 and 1 <= grid[2] <= 65535, f"grid {grid}"
        if self.max_programs is not None:
            assert grid[0] * grid[1] * grid[2] <= self.max_programs, f"grid {grid}: over {self.max_programs} programs"
        return self.kernel[grid]

    def __getattr__(self, name):
        return getattr(self.kernel, name)


def capture_graph(api, run, warmups: int = 1):
    """Run ``run`` ``warmups`` times on a side stream (compiling its kernels), then capture it in a
    device graph; returns ``(graph, outputs of the captured call)``."""
    stream = api.Stream()
    stream.wait_stream(api.current_stream())
    with api.stream(stream):
        for _ in range(warmups):
            run()  # compiles outside the capture
    api.current_stream().wait_stream(stream)
    api.synchronize()
    graph = api.CUDAGraph() if api is torch.cuda else api.XPUGraph()
    with api.graph(graph):
        outputs = run()
    return graph, outputs


def replay_without_host_sync(api, graph) -> None:
    """Replay a captured device graph; on CUDA any host sync inside it raises (sync debug mode)."""
    if api is torch.cuda:
        torch.cuda.set_sync_debug_mode("error")
    try:
        graph.replay()
    finally:
        if api is torch.cuda:
            torch.cuda.set_sync_debug_mode("default")
    api.synchronize()
