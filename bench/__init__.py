"""Benchmarks of triton_xpu_attn: one script per op (``bench_*.py``), shared helpers in
``common.py``, and the suite ``python -m bench`` (``run.py``) that runs them all and writes
``bench/results/<device_key>/`` (per-op CSV + markdown, ``summary.md``, ``roofline.png``).

Nothing is imported here: every entry point imports ``triton_xpu_attn`` before torch/triton
(on a machine without a GPU it must select Triton's interpreter first).
"""
