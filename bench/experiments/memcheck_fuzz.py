"""Memory safety with ``validate=False``: each case calls one op with index
metadata no engine should pass (page ids outside the pool, offsets outside q/out, lengths past a
slice, pool indices past ``req_to_token``) in a process of its own under compute-sanitizer's
memcheck, which reports every read or write outside an allocation.

    python bench/experiments/memcheck_fuzz.py            # every case, each under compute-sanitizer
    python bench/experiments/memcheck_fuzz.py CASE       # one case, in this process (what the driver runs)

Needs a CUDA GPU and ``compute-sanitizer`` on PATH (or under /usr/local/cuda*/bin). Prints one line a
case: the sanitizer's error count (and its first error) or the process's exit status. Caching is off
(``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) so an access past a tensor leaves its allocation.
"""
from __future__ import annotations

import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cases():
    import torch

    import triton_xpu_attn as T

    dev = "cuda"
    i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=dev)  # noqa: E731
    r = lambda *s: torch.randn(*s, device=dev, dtype=torch.bfloat16)  # noqa: E731

    def paged(table, cu=(0, 1, 3), total_q=3, lens=(5, 7), max_q=None):
        return lambda: T.flash_attn_with_kvcache(
            r(total_q, 8, 128), r(6, 16, 2, 128), r(6, 16, 2, 128), cache_seqlens=i32(list(lens)),
            page_table=i32(table), cu_seqlens_q=i32(list(cu)), max_seqlen_q=max_q)

    def decode(table):
        return lambda: T.flash_attn_with_kvcache(r(2, 1, 8, 128), r(6, 16, 2, 128), r(6, 16, 2, 128),
                                                 cache_seqlens=i32([20, 30]), page_table=i32(table))

    def varlen(cu_q, cu_k, total_q=3, total_k=6, seqused=None):
        return lambda: T.flash_attn_varlen_func(r(total_q, 8, 128), r(total_k, 2, 128), r(total_k, 2, 128), i32(cu_q),
                                                i32(cu_k), 4, 4, seqused_k=None if seqused is None else i32(seqused))

    def mla(table, lens=(70, 100)):
        return lambda: T.flash_mla_decode(r(2, 16, 512), r(2, 16, 64), r(4, 64, 576), i32(list(lens)), i32(table),
                                          None, 0.1, 1)

    def mla_prefill(cu, table=((0, 1), (2, 3)), total_q=5):
        return lambda: T.flash_mla_prefill(r(total_q, 16, 512), r(total_q, 16, 64), r(4, 64, 576), i32(cu), i32([70, 100]),
                                           4, i32([list(t) for t in table]), None, 0.1)

    def normalize(pool_indices):
        return lambda: T.normalize_page_table(torch.arange(64, dtype=torch.int32, device=dev).view(2, 32),
                                              i32(pool_indices), i32([16, 16]), 4)

    gen = torch.Generator(device="cpu").manual_seed(29)

    def wild(rows, cols, pool):
        """A page table of ids drawn from the whole int32 range, a few inside the pool."""
        t = torch.randint(-2**31, 2**31 - 1, (rows, cols), generator=gen, dtype=torch.int64)
        t[:, ::2] = torch.randint(0, pool, (rows, (cols + 1) // 2), generator=gen)
        return t.to(torch.int32).tolist()

    def fuzz_decode(page, splits=0, q_len=1):
        pool, cols = 8, 256 // page
        return lambda: T.flash_attn_with_kvcache(
            r(3, q_len, 8, 128), r(pool, page, 2, 128), r(pool, page, 2, 128), cache_seqlens=i32([256, 100, 7]),
            page_table=i32(wild(3, cols, pool)), num_splits=splits)

    def fuzz_prefill(page, q_len=128):
        pool, cols = 8, 512 // page
        return lambda: T.flash_attn_with_kvcache(
            r(2 * q_len, 8, 128), r(pool, page, 2, 128), r(pool, page, 2, 128), cache_seqlens=i32([512, 300]),
            page_table=i32(wild(2, cols, pool)), cu_seqlens_q=i32([0, q_len, 2 * q_len]), max_seqlen_q=q_len,
            causal=True)

    def fuzz_mla(page):
        pool, cols = 4, 256 // page
        return lambda: T.flash_mla_decode(r(2, 16, 512), r(2, 16, 64), r(pool, page, 576), i32([256, 90]),
                                          i32(wild(2, cols, pool)), None, 0.1, 1)

    def local(qsl, lens, table_cols=10, max_vb=64):
        return lambda: T.make_local_attention_virtual_batches(
            4, i32(qsl), i32(lens), torch.arange(3 * table_cols, dtype=torch.int32, device=dev).view(3, table_cols), 2,
            max_virtual_batches=max_vb)[0]

    def swa(len_a, len_b, start_a=None, cols=5):
        return lambda: T.prepare_swa_spec_page_table(
            torch.zeros(2, cols, dtype=torch.int32, device=dev), i32([[4, 5, 6]]), i32([[7], [8]]), i32(len_a),
            i32(len_b), 2, seq_start_a=None if start_a is None else i32(start_a))

    def translate(locs):
        mapping = torch.arange(20, dtype=torch.int64, device=dev)
        mapping[-1] = -1
        return lambda: T.translate_loc_from_full_to_swa(mapping, torch.tensor(locs, dtype=torch.int64, device=dev))

    return {
        "local_query_start_loc_decreasing": local([0, 14, 4, 19], [6, 17, 9]),
        "local_seq_lens_past_table": local([0, 4, 14, 19], [6, 2**30, 9], table_cols=2),
        "local_seq_lens_negative": local([0, 4, 14, 19], [6, -40, 9]),
        "local_max_virtual_batches_too_small": local([0, 4, 14, 19], [6, 17, 9], max_vb=3),
        "swa_lengths_past_tables": swa([2**20], [7, -3]),
        "swa_start_past_table": swa([3], [1, 1], start_a=[2**30]),
        "swa_start_negative": swa([3], [1, 1], start_a=[-5]),
        "translate_locs_outside_mapping": translate([-2**40, -1, 19, 20, 2**40]),
        "fuzz_decode_p1": fuzz_decode(1),
        "fuzz_decode_p16_split4": fuzz_decode(16, 4),
        "fuzz_decode_p64_draft4": fuzz_decode(64, q_len=4),
        "fuzz_prefill_p1": fuzz_prefill(1),
        "fuzz_prefill_p16": fuzz_prefill(16),
        "fuzz_prefill_p64_descriptors": fuzz_prefill(64),
        "fuzz_mla_p1": fuzz_mla(1),
        "fuzz_mla_p64": fuzz_mla(64),
        "mla_page_id_2pow30": mla([[0, 2**30], [1, 2]]),
        "mla_prefill_cu_q_negative": mla_prefill([0, 2, -3]),
        "varlen_cu_k_negative": varlen([0, 1, 3], [0, -4, 6]),
        "normalize_pool_index_minus_1": normalize([-1, 1]),
        "paged_ok": decode([[0, 1], [2, 3]]),
        "paged_page_id_num_pages": decode([[0, 6], [2, 3]]),
        "paged_page_id_minus_1": decode([[0, -1], [2, 3]]),
        "paged_page_id_2pow30": decode([[0, 2**30], [2, 3]]),
        "paged_cu_q_negative": paged([[0, 1], [2, 3]], cu=(0, 1, -2)),
        "paged_cu_q_past_q": paged([[0, 1], [2, 3]], cu=(0, 3, 7)),
        "paged_max_q_too_small": paged([[0, 1], [2, 3]], cu=(0, 1, 3), max_q=1),
        "varlen_cu_k_past_k": varlen([0, 1, 3], [0, 2, 50]),
        "varlen_cu_q_past_q": varlen([0, 2, 9], [0, 2, 6]),
        "mla_page_id_num_pages": mla([[0, 4], [1, 2]]),
        "mla_page_id_minus_1": mla([[0, -1], [1, 2]]),
        "mla_prefill_cu_q_past_q": mla_prefill([0, 2, 9]),
        "mla_prefill_page_id_num_pages": mla_prefill([0, 2, 5], table=((0, 4), (2, 3))),
        "normalize_pool_index_past_table": normalize([0, 5]),
    }


def run_case(name: str) -> None:
    import torch

    out = _cases()[name]()
    torch.cuda.synchronize()
    first = out[0] if isinstance(out, tuple) else out
    print(f"{name}: ran, output finite: {bool(torch.isfinite(first.float()).all())}")


def _sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    paths = sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")) + sorted(
        glob.glob(str(pathlib.Path(sys.prefix) / "lib/python*/site-packages/nvidia/*/bin/compute-sanitizer")))
    return paths[-1] if paths else None


def main() -> int:
    sanitizer = _sanitizer()
    if sanitizer is None:
        print("compute-sanitizer not found")
        return 2
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", TRITON_INTERPRET="0")
    print(f"{sanitizer} --tool memcheck, one process a case, validate=False")
    bad = 0
    for name in sorted(_cases_names()):
        proc = subprocess.run([sanitizer, "--tool", "memcheck", "--print-limit", "3", sys.executable, __file__, name],
                              capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
        text = proc.stdout + proc.stderr
        errors = re.search(r"ERROR SUMMARY: (\d+) error", text)
        first = re.search(r"=+ (Invalid [^\n]*|Program hit [^\n]*)", text)
        ran = re.search(rf"^{name}: ran[^\n]*", text, re.M)
        count = int(errors.group(1)) if errors else -1
        bad += count != 0
        print(f"{name}: {count} memcheck error(s), exit {proc.returncode}; "
              f"{ran.group(0) if ran else 'did not finish'}{'; first: ' + first.group(1) if first else ''}")
    return 0 if bad == 0 else 1


def _cases_names():
    sys.path.insert(0, str(ROOT))
    return list(_cases())


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if len(sys.argv) > 1:
        run_case(sys.argv[1])
    else:
        sys.exit(main())
