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
    for op in ("flash_attn_with_kvcache", "flash_attn_varlen_func", "merge_state_v2", "normalize_page_table",
               "translate_loc_from_full_to_swa", "make_local_attention_virtual_batches", "prepare_swa_spec_page_table",
               "flash_mla_decode", "flash_mla_prefill"):
        assert op in out
    assert "9 passed, 0 failed" in out
