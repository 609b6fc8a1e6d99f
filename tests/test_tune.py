"""Config lookup (user file, shipped file, nearest bucket, fallback family, heuristic) and the
bucket family the paged-attention launcher asks for. Runs anywhere: file lookups are exercised
with the backend and device key stubbed, the launcher's request is recorded, not timed."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import DEVICE
from triton_xpu_attn import flash_attn_with_kvcache, tune
from triton_xpu_attn import tuner
from triton_xpu_attn.ops import paged_launch as pa_mod

HEURISTIC = dict(BLOCK_N=64, num_warps=4, num_stages=2)


def _fields(q="decode", w=4, p=16, d=128, dv=128):
    return dict(d=d, dv=dv, g=4, p=p, q=q, w=w, dtype="bfloat16")


@pytest.fixture
def config_file(tmp_path, monkeypatch):
    """Write ``table`` as the user config file of a fake CUDA device; lookups read it."""
    monkeypatch.setenv(tune.CONFIG_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(tune._device, "backend", lambda: "cuda")
    monkeypatch.setattr(tune._device, "device_key", lambda device=None: "FAKE_GPU")
    monkeypatch.setattr(tune, "_SHIPPED_DIRS", ())

    def write(table: dict) -> None:
        folder = tmp_path / "cuda"
        folder.mkdir(exist_ok=True)
        (folder / "FAKE_GPU.json").write_text(json.dumps({"ops": {"paged_attention": table}}))
        tune.clear_cache()

    yield write
    tune.clear_cache()


def test_exact_bucket_overrides_only_its_keys(config_file):
    config_file({tune.bucket_key(_fields()): {"BLOCK_N": 128}})
    got = tune.lookup("paged_attention", _fields(), HEURISTIC)
    assert got == {**HEURISTIC, "BLOCK_N": 128}
    assert tune.LAST_SOURCE["paged_attention"] == "user:FAKE_GPU.json"


def test_nearest_bucket_needs_equal_text_fields(config_file):
    config_file({tune.bucket_key(_fields(w=16)): {"BLOCK_N": 32}})
    assert tune.lookup("paged_attention", _fields(w=4), HEURISTIC)["BLOCK_N"] == 32  # numeric: nearest
    assert tune.lookup("paged_attention", _fields(q="prefill"), HEURISTIC) == HEURISTIC  # text differs


def test_nearest_bucket_no_larger_head_dims(config_file):
    """``no_larger``: a tile tuned at D = 128 may not fit D = 256 (shared memory), so larger head
    dims get the heuristic, smaller ones may take the nearest larger bucket's config; without it
    the nearest bucket serves any head dim."""
    config_file({tune.bucket_key(_fields(q="prefill", w=4)): {"BLOCK_N": 64, "num_stages": 3}})
    strict = dict(no_larger=("d", "dv"))
    assert tune.lookup("paged_attention", _fields(q="prefill", w=4, d=256, dv=256), HEURISTIC, **strict) == HEURISTIC
    assert tune.lookup("paged_attention", _fields(q="prefill", w=4, d=128, dv=256), HEURISTIC, **strict) == HEURISTIC
    assert tune.lookup("paged_attention", _fields(q="prefill", w=8, d=64, dv=64), HEURISTIC, **strict)["num_stages"] == 3
    assert tune.lookup("paged_attention", _fields(q="prefill", w=4, d=256, dv=256), HEURISTIC)["num_stages"] == 3


def test_fallback_family_used_only_without_own_buckets(config_file):
    decode, draft = _fields(q="decode"), _fields(q="draft")
    config_file({tune.bucket_key(decode): {"BLOCK_N": 128}})
    # a file tuned before drafts had buckets: drafts take the decode entry, not the heuristic
    got = tune.lookup("paged_attention", draft, HEURISTIC, fallback={"q": "decode"})
    assert got["BLOCK_N"] == 128
    assert "(as " in tune.LAST_SOURCE["paged_attention"]
    assert tune.lookup("paged_attention", draft, HEURISTIC) == HEURISTIC  # no fallback asked: heuristic
    # once the file has draft buckets, they win over the fallback (even a nearest one)
    config_file({tune.bucket_key(decode): {"BLOCK_N": 128}, tune.bucket_key(_fields(q="draft", w=16)): {"num_stages": 3}})
    got = tune.lookup("paged_attention", draft, HEURISTIC, fallback={"q": "decode"})
    assert got == {**HEURISTIC, "num_stages": 3}


@pytest.mark.parametrize("q_len,family", [(1, "decode"), (4, "draft"), (16, "draft"), (32, "prefill")])
def test_launcher_bucket_family(monkeypatch, q_len, family):
    asked = []
    real = tune.lookup

    def recording(op, fields, heuristic, **kw):
        if op == "paged_attention":
            asked.append((fields["q"], kw.get("fallback"), kw.get("no_larger")))
        return real(op, fields, heuristic, **kw)

    monkeypatch.setattr(pa_mod.tune, "lookup", recording)
    B, P, Hkv, D = 2, 16, 1, 64
    k = torch.randn(B * 4, P, Hkv, D, device=DEVICE, dtype=torch.float16)
    table = torch.arange(B * 4, device=DEVICE, dtype=torch.int32).view(B, 4)
    q = torch.randn(B, q_len, 4, D, device=DEVICE, dtype=torch.float16)
    lens = torch.full((B,), 64, device=DEVICE, dtype=torch.int32)
    flash_attn_with_kvcache(q, k, k, cache_seqlens=lens, page_table=table, causal=True)
    # prefill tiles are never taken from a bucket of smaller head dims (shared memory)
    assert asked == [(family, {"q": "decode"} if family == "draft" else None, ("d", "dv") if family == "prefill" else ())]


def test_tuner_covers_prefill_page_sizes():
    """Prefill buckets at token-granular tables, 16-token pages and one-tile pages (a P = 1 prefill
    must not take a 16-token page's tile), and varlen buckets, at a small and a saturating work."""
    buckets = tuner.TUNING_SPECS["paged_attention"].buckets(False)
    prefill = {(b["p"], b["w"]) for b in buckets if b["q"] == "prefill"}
    assert prefill == {(p, w) for p in (1, 16, 64) for w in (4, 32)}
    assert {b["w"] for b in buckets if b["q"] == "varlen"} == {4, 32}


def test_tuner_covers_drafts_at_four_queries():
    buckets = tuner.TUNING_SPECS["paged_attention"].buckets(True)
    drafts = [b for b in buckets if b["q"] == "draft"]
    assert drafts and len(drafts) == len([b for b in buckets if b["q"] == "decode"])
    problems = tuner.TUNING_SPECS["paged_attention"].problems(drafts[0], True)
    assert problems and all(p["q_len"] == 4 for p in problems)


def test_tuner_covers_head_dim_256_and_single_requests(monkeypatch):
    """D = 256 decode/draft buckets exist (without them Gemma's heads took a D = 128 tile), and the
    smallest work bucket, which also serves single requests, times them beside its small batch."""
    from triton_xpu_attn import device as _device

    spec = tuner.TUNING_SPECS["paged_attention"]
    d256 = [b for b in spec.buckets(False) if b["d"] == 256]
    assert {b["q"] for b in d256} == {"decode", "draft"} and {b["p"] for b in d256} == {1, 16, 64, 128}
    monkeypatch.setattr(_device, "compute_units", lambda device=None: 132)
    for q in ("decode", "draft"):
        small = spec.problems(dict(d256[0], q=q, w=1), False)
        assert {p["B"] for p in small} == {1, 4} and {p["L"] for p in small if p["B"] == 1} == {1024, 8192}
        assert all(p["B"] > 1 for p in spec.problems(dict(d256[0], q=q, w=4), False))


def test_only_selects_buckets_by_any_of_several_values():
    buckets = tuner.TUNING_SPECS["paged_attention"].buckets(False)
    chosen = tuner.select_buckets(buckets, {"q": ("draft",), "g": ("8",), "p": ("1", "64")})
    assert chosen, "the filter kept nothing"
    assert {(b["q"], b["g"]) for b in chosen} == {("draft", 8)}
    assert {b["p"] for b in chosen} == {1, 64}
    expected = [b for b in buckets if b["q"] == "draft" and b["g"] == 8 and b["p"] in (1, 64)]
    assert chosen == expected
    # a single value given as text or int selects like a one-value tuple (no substring match: "1" is not "16")
    assert tuner.select_buckets(buckets, {"p": "1"}) == tuner.select_buckets(buckets, {"p": 1}) == [b for b in buckets if b["p"] == 1]
    assert tuner.select_buckets(buckets, None) == buckets


def test_only_parsing_rejects_malformed_items(capsys):
    for bad in ("q", "=draft", "q="):
        with pytest.raises(SystemExit):
            tuner.main(["--only", bad])
        assert "expected FIELD=VALUE" in capsys.readouterr().err



def test_ops_never_import_the_tuner():
    """The dependency runs one way. Importing the package (every op, the custom
    ops, the lookup) leaves the tuner unimported, and no module of the package but the tuner's
    entry point names it; the tuner imports the ops (and runs as `python -m triton_xpu_attn.tuner`)."""
    import ast
    import pathlib
    import subprocess
    import sys

    probe = ("import sys, triton_xpu_attn, triton_xpu_attn.tune; "
             "print('triton_xpu_attn.tuner' in sys.modules, 'triton_xpu_attn.tune' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                            cwd=pathlib.Path(__file__).resolve().parents[1])
    assert result.stdout.split() == ["False", "True"], result.stdout + result.stderr
    package = pathlib.Path(tune.__file__).resolve().parent
    importers = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.split(".")[-1] == "tuner" for n in names):
                importers.append(str(path.relative_to(package)))
    assert importers == [], importers  # the tuner sits above ops/: nothing in the package imports it
    assert tuner.flash_attn_with_kvcache is not None and "paged_attention" in tuner.TUNING_SPECS


def test_tuner_entry_point_runs():
    """`python -m triton_xpu_attn.tuner --help` runs."""
    import pathlib
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "triton_xpu_attn.tuner", "--help"], capture_output=True, text=True,
                            cwd=pathlib.Path(__file__).resolve().parents[1])
    assert result.returncode == 0 and "--only" in result.stdout, result.stderr


@pytest.mark.parametrize("entry, what", [
    ({"BLOCK_N": 0}, "BLOCK_N"), ({"BLOCK_N": 48}, "BLOCK_N"), ({"BLOCK_N": "64"}, "BLOCK_N"),
    ({"num_warps": 3}, "num_warps"), ({"num_stages": 0}, "num_stages"), ({"kv_desc": "yes"}, "kv_desc"),
    ({"BLOCK_DV": 48}, "BLOCK_DV"), ({"grf_mode": "huge"}, "grf_mode"), ([64, 4], "object"),
    ({"score_chunk": 24}, "score_chunk"), ({"score_chunk": 8}, "score_chunk"), ({"pack_gqa": 0}, "pack_gqa"),
    ({"latent_chunk": 40}, "latent_chunk"), ({"kv_device_desc": 1}, "kv_device_desc"),
])
def test_malformed_entry_is_skipped_with_one_warning_naming_file_and_bucket(config_file, entry, what):
    """A bad entry never reaches a kernel (a Triton compile error) nor raises a bare TypeError:
    it is skipped with one warning naming the file, the op and the bucket; the heuristic serves."""
    bucket = tune.bucket_key(_fields())
    config_file({bucket: entry})
    with pytest.warns(tune.ConfigFileWarning) as record:
        got = tune.lookup("paged_attention", _fields(), HEURISTIC)
    assert got == HEURISTIC and tune.LAST_SOURCE["paged_attention"] == "heuristic"
    message = str(record[0].message)
    assert "FAKE_GPU.json" in message and f"paged_attention[{bucket}]" in message and what in message
    tune._MEMO.clear()
    import warnings as _w
    with _w.catch_warnings():
        _w.simplefilter("error")
        tune.lookup("paged_attention", _fields(), HEURISTIC)  # warned once per file and entry


def test_malformed_entry_leaves_the_good_ones_in_use(config_file):
    good = tune.bucket_key(_fields(w=16))
    config_file({tune.bucket_key(_fields()): {"BLOCK_N": 48}, good: {"BLOCK_N": 32}})
    with pytest.warns(tune.ConfigFileWarning):
        got = tune.lookup("paged_attention", _fields(), HEURISTIC)
    assert got["BLOCK_N"] == 32 and "nearest" in tune.LAST_SOURCE["paged_attention"]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"ops": []}', '{"ops": {"paged_attention": [1]}}'])
def test_malformed_file_is_skipped_with_one_warning_naming_it(config_file, tmp_path, text):
    """Truncated or empty JSON, a list instead of an object, an op that is not an object of
    entries: the file is skipped with a warning naming it (the next file or the heuristic serves)."""
    config_file({})
    (tmp_path / "cuda" / "FAKE_GPU.json").write_text(text)
    tune.clear_cache()
    with pytest.warns(tune.ConfigFileWarning, match="FAKE_GPU.json"):
        got = tune.lookup("paged_attention", _fields(), HEURISTIC)
    assert got == HEURISTIC


def test_shipped_config_files_are_well_formed():
    """Every entry of every shipped file passes the same check the lookup applies."""
    import pathlib

    files = sorted((pathlib.Path(__file__).resolve().parent.parent / "autotune_configs").glob("*/*.json"))
    assert files
    for path in files:
        for op, table in json.loads(path.read_text())["ops"].items():
            for bucket, entry in table.items():
                assert tune.entry_problem(entry) is None, f"{path.name}: {op}[{bucket}]: {tune.entry_problem(entry)}"


def test_a_rerun_never_replaces_an_entry_with_a_slower_one():
    """The tuner's guard against slower re-runs: the file's previous entry is timed beside the
    candidates and replaced only by one MIN_TUNED_GAIN faster; the heuristic wins near-ties."""
    gain = tuner.MIN_TUNED_GAIN
    prev, new = {"BLOCK_N": 32}, {"BLOCK_N": 128}
    # the best candidate is clearly faster than the previous entry and the heuristic: taken
    assert tuner.choose_entry(100.0, prev, 90.0, new, 80.0)[:2] == (new, 80.0)
    # a near-tie with the previous entry keeps it (a re-run on another day must not churn the file)
    entry, us, note = tuner.choose_entry(100.0, prev, 90.0, new, 90.0 / gain + 0.5)
    assert (entry, us) == (prev, 90.0) and "previous entry kept" in note
    # a previous entry that no longer beats the heuristic is dropped, and says so
    entry, us, note = tuner.choose_entry(100.0, prev, 99.0, new, 99.0)
    assert (entry, us) == ({}, 100.0) and "dropped" in note
    # no previous entry: the heuristic unless the best is clearly faster
    assert tuner.choose_entry(100.0, None, None, new, 99.0)[:2] == ({}, 100.0)
    assert tuner.choose_entry(100.0, None, None, new, 90.0)[:2] == (new, 90.0)
    # a previous entry that now fails to run is dropped; a failed heuristic takes the best
    assert tuner.choose_entry(100.0, prev, None, new, 99.0)[0] == {}
    assert tuner.choose_entry(None, None, None, new, 99.0)[:2] == (new, 99.0)


def test_maxnreg_is_a_cuda_only_launch_option():
    """A config's register cap reaches a CUDA launch and nothing else (XPU and the interpreter
    reject the option); a bad value in a file is refused naming the knob."""
    from unittest import mock

    with mock.patch.object(tune._device, "backend", return_value="cuda"):
        assert tune.launch_options({"num_warps": 4, "maxnreg": 128}) == {"num_warps": 4, "maxnreg": 128}
    for backend in ("xpu", "interpreter"):
        with mock.patch.object(tune._device, "backend", return_value=backend):
            assert "maxnreg" not in tune.launch_options({"num_warps": 4, "maxnreg": 128})
    assert "maxnreg" in tune.entry_problem({"maxnreg": 0})
    assert tune.entry_problem({"maxnreg": 128}) is None


@pytest.mark.parametrize("config, knob, bad", [
    (dict(BLOCK_H=16, BLOCK_N=24, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1), "BLOCK_N", 24),
    (dict(BLOCK_H=8, BLOCK_N=16, SCORE_CHUNK=0, BLOCK_DV=0, num_warps=4, num_stages=1), "BLOCK_H", 8),
    (dict(BLOCK_H=16, BLOCK_N=16, SCORE_CHUNK=48, BLOCK_DV=0, num_warps=4, num_stages=1), "SCORE_CHUNK", 48),
])
def test_override_tiles_are_checked_by_the_op_naming_the_knob(config, knob, bad):
    """A tile an override (which no file check sees) gives the sparse MLA op is refused by the op
    itself, the message naming the op and the knob."""
    from triton_xpu_attn.ops.mla_sparse import sparse_tiles
    with tune.override("mla_sparse", config), pytest.raises(ValueError) as err:
        sparse_tiles(16, 1, 576, 512, torch.bfloat16, torch.device("cpu"))
    assert str(err.value) == f"mla_sparse config: {knob} must be a power of two >= 16, got {bad}"


def test_config_pow2_accepts_powers_of_two_and_refuses_the_rest():
    from triton_xpu_attn._common import config_pow2
    assert config_pow2("op", "BLOCK_K", 64) == 64 and config_pow2("op", "BLOCK_K", 16.0) == 16
    assert config_pow2("op", "BLOCK_Q", 1, low=1) == 1
    for bad in (0, 8, 24, 96, -16):
        with pytest.raises(ValueError, match=f"op config: BLOCK_K must be a power of two >= 16, got {bad}"):
            config_pow2("op", "BLOCK_K", bad)
