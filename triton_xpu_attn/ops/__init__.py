"""One module per op: its @triton.jit kernels at the top, its launcher(s) below."""
