"""The self-check (`python -m triton_xpu_attn`) passes and reports every op."""
import runpy
import sys

import pytest


def test_self_check_passes_and_lists_every_op(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["triton_xpu_attn"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("triton_xpu_attn", run_name="__main__")
    out = capsys.readouterr().out
    assert exit_info.value.code == 0, out
    for op in ("flash_attn_with_kvcache", "flash_attn_varlen_func", "merge_state_v2", "normalize_page_table", "translate_loc_from_full_to_swa",
               "make_local_attention_virtual_batches", "prepare_swa_spec_page_table", "flash_mla_decode", "flash_mla_prefill", "merge_state",
               "flash_mla_sparse_fwd", "flash_mla_with_kvcache"):
        assert op in out
    assert "12 passed, 0 failed" in out


def test_self_check_says_what_its_compute_unit_count_is(capsys, monkeypatch):
    """Under the interpreter the compute-unit count is nominal (the split
    heuristics' assumption) and the header says so beside the real core count."""
    import os

    from triton_xpu_attn import device

    monkeypatch.setattr(sys, "argv", ["triton_xpu_attn"])
    with pytest.raises(SystemExit):
        runpy.run_module("triton_xpu_attn", run_name="__main__")
    header = capsys.readouterr().out.splitlines()[0]
    units = device.compute_units()
    if device.backend() == "interpreter":
        assert f"({units} nominal compute units, what split counts assume here; {os.cpu_count()} CPU cores)" in header
    else:
        assert f"({units} compute units)" in header
