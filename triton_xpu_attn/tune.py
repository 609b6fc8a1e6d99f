"""Kernel configs: loading per-device config files and the built-in fallbacks (what the ops' launchers
call on every launch). The tuner that writes those files lives in :mod:`triton_xpu_attn.tuner`
(``python -m triton_xpu_attn.tuner``, above ``ops/``): it imports the ops to run their candidates,
and nothing the ops import imports it, so the dependency runs one way (ops -> this module;
tuner -> ops).

Lookup order for an op and a shape bucket:
1. ``$TRITON_XPU_ATTN_CONFIG_DIR/<backend>/<device_key>.json`` (a user's own tuning),
2. the shipped ``autotune_configs/<backend>/<device_key>.json`` (vLLM's convention: one JSON per
   device, named from the device name, recording the Triton version it was tuned with),
3. the op's built-in heuristic.
Within a file, an op maps bucket keys (``"d=128|g=4|p=16|..."``) to configs; a ``"default"``
entry serves buckets that were not tuned.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import pathlib
import warnings

from . import device as _device

CONFIG_DIR_ENV = "TRITON_XPU_ATTN_CONFIG_DIR"

#: where the shipped files live: inside the package when installed from a wheel
#: (``triton_xpu_attn.autotune_configs``), next to the package in a source checkout.
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
_SHIPPED_DIRS = (_PACKAGE_DIR / "autotune_configs", _PACKAGE_DIR.parent / "autotune_configs")

#: op name -> where its last lookup came from ("user:…", "shipped:…", "heuristic"); the self-check prints it.
LAST_SOURCE: dict[str, str] = {}


def bucket_key(fields: dict) -> str:
    """Stable text key of a shape bucket, e.g. ``{"d": 128, "g": 4}`` -> ``"d=128|g=4"``."""
    return "|".join(f"{k}={fields[k]}" for k in sorted(fields))


def pow2_bucket(n: int, lo: int = 1, hi: int = 1 << 20) -> int:
    """Round ``n`` up to a power of two inside ``[lo, hi]``: length and batch buckets."""
    b = lo
    while b < n and b < hi:
        b *= 2
    return b


def config_file_candidates(backend: str, key: str) -> list[tuple[str, pathlib.Path]]:
    found = []
    user = os.environ.get(CONFIG_DIR_ENV)
    if user:
        found.append(("user", pathlib.Path(user) / backend / f"{key}.json"))
    for d in _SHIPPED_DIRS:
        found.append(("shipped", d / backend / f"{key}.json"))
    return found


class ConfigFileWarning(UserWarning):
    """A config file or one of its entries is malformed: it is skipped (next file, or the heuristic)."""


def _warn(path, key: str, problem: str) -> None:
    """One warning per malformed file or entry: files are read once (``_load`` is cached)."""
    warnings.warn(f"config file {path}: {key}: {problem}; skipped (the built-in heuristic serves instead)",
                  ConfigFileWarning, stacklevel=5)


#: knobs a config entry may set, and what each must be (others, e.g. notes, are ignored)
_POW2_KNOBS = ("BLOCK_M", "BLOCK_N", "BLOCK_H", "num_warps")  # powers of two, BLOCK_* at least 16
_POSITIVE_KNOBS = ("num_stages", "min_split_tokens", "waves", "max_splits", "sub_group_size", "maxnreg",
                   "prefetch_from_tiles")
_BOOL_KNOBS = ("kv_desc", "kv_block_ptr", "kv_device_desc", "pack_gqa", "kept_heuristic")
_GRF_MODES = (None, "small", "large", "128", "256", "512", "auto", "default")


def entry_problem(entry) -> str | None:
    """What is wrong with a config entry (``None`` when it is usable): an object whose tile sizes
    and warps are powers of two (tiles >= 16, ``BLOCK_DV`` 0 = all channels), counts positive
    ints, switches booleans and ``grf_mode`` one Intel's Triton knows."""
    if not isinstance(entry, dict):
        return f"expected an object of knobs, got {type(entry).__name__}"
    for k, v in entry.items():
        is_int = isinstance(v, int) and not isinstance(v, bool)
        if k in _POW2_KNOBS:
            low = 16 if k.startswith("BLOCK_") else 1
            if not is_int or v < low or v & (v - 1):
                return f"{k} must be a power of two >= {low}, got {v!r}"
        elif k in ("BLOCK_DV", "score_chunk", "latent_chunk"):
            if not is_int or v < 0 or (v and (v < 16 or v & (v - 1))):
                what = "all channels" if k == "BLOCK_DV" else "one score dot"
                return f"{k} must be 0 ({what}) or a power of two >= 16, got {v!r}"
        elif k in _POSITIVE_KNOBS:
            if not is_int or v < 1:
                return f"{k} must be a positive int, got {v!r}"
        elif k in _BOOL_KNOBS:
            if not isinstance(v, bool):
                return f"{k} must be true or false, got {v!r}"
        elif k == "grf_mode" and v not in _GRF_MODES:
            return f"grf_mode must be one of {_GRF_MODES}, got {v!r}"
    return None


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict | None:
    """A config file's contents, or None where it is missing or malformed (not JSON, not an
    object, ``"ops"`` not an object: one warning naming the file). An op that is not an object of
    entries, and each malformed entry (``entry_problem``), is dropped with one warning naming the
    file and the key, so lookups only ever see usable entries."""
    p = pathlib.Path(path)
    if not p.is_file():
        return None
    try:
        with p.open() as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        _warn(p, "file", f"not a readable JSON file ({type(e).__name__}: {e})")
        return None
    if not isinstance(data, dict) or not isinstance(data.get("ops", {}), dict):
        _warn(p, "file", 'expected a JSON object with an "ops" object')
        return None
    ops = {}
    for op, table in data.get("ops", {}).items():
        if not isinstance(table, dict):
            _warn(p, f"ops.{op}", "expected an object of bucket entries")
            continue
        ops[op] = {}
        for bucket, entry in table.items():
            problem = entry_problem(entry)
            if problem is None:
                ops[op][bucket] = entry
            else:
                _warn(p, f"ops.{op}[{bucket}]", problem)
    return {**data, "ops": ops}


def clear_cache() -> None:
    """Forget loaded files and memoised lookups (after writing or changing config files)."""
    _load.cache_clear()
    _MEMO.clear()


def lookup(op: str, fields: dict, heuristic: dict, *, device=None, fallback: dict | None = None,
           no_larger: tuple = ()) -> dict:
    """Config for ``op`` at the bucket ``fields``: user file, shipped file, else ``heuristic``.

    Entries of a file config override the heuristic's keys (a file may tune only some knobs).
    ``fallback`` (field overrides, e.g. ``{"q": "decode"}``) names a related bucket family to use
    from a file that has no bucket of ``fields``' own text values (a file tuned before that family
    existed). ``no_larger`` names numeric fields (head dims) that a nearest bucket may not have
    smaller than ``fields``: a tile tuned at D = 128 need not fit D = 256. Results are memoised per
    (op, bucket, device): this runs on every launch.
    """
    forced = _OVERRIDES.get(op)
    if forced is not None:
        LAST_SOURCE[op] = "override"
        return {**heuristic, **forced}
    index = None
    if device is not None and getattr(device, "type", "cpu") != "cpu":
        index = device.index
    memo_key = (op, tuple(sorted(fields.items())), tuple(sorted(heuristic.items())), index,
                tuple(sorted((fallback or {}).items())), tuple(no_larger))
    hit = _MEMO.get(memo_key)
    if hit is None:
        hit = _MEMO[memo_key] = _lookup(op, fields, heuristic, device, fallback, no_larger)
    LAST_SOURCE[op] = hit[1]
    return dict(hit[0])


_MEMO: dict = {}
_OVERRIDES: dict[str, dict] = {}


@contextlib.contextmanager
def override(op: str, config: dict):
    """Force ``config`` for every launch of ``op`` inside the block (the tuner's candidates)."""
    previous = _OVERRIDES.get(op)
    _OVERRIDES[op] = dict(config)
    try:
        yield
    finally:
        if previous is None:
            _OVERRIDES.pop(op, None)
        else:
            _OVERRIDES[op] = previous


def parse_bucket(text: str) -> dict:
    """Inverse of :func:`bucket_key`: ``"d=128|g=4"`` -> ``{"d": 128, "g": 4}``."""
    out = {}
    for part in text.split("|"):
        k, _, v = part.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def nearest_bucket(table: dict, fields: dict, no_larger: tuple = ()) -> str | None:
    """The tuned bucket closest to ``fields``: text fields must match; numeric ones (all powers
    of two or small counts) are compared on a log scale, and those named in ``no_larger`` must not
    exceed the tuned bucket's (fields that size a tile's shared memory). ``None`` if nothing is
    comparable."""
    best, best_distance = None, float("inf")
    for text in table:
        if text == "default":
            continue
        other = parse_bucket(text)
        if set(other) != set(fields):
            continue
        distance = 0.0
        for k, v in fields.items():
            w = other[k]
            if isinstance(v, int) and isinstance(w, int):
                if k in no_larger and v > w:
                    distance = float("inf")
                    break
                distance += abs(math.log2(max(v, 1)) - math.log2(max(w, 1)))
            elif v != w:
                distance = float("inf")
                break
        if distance < best_distance:
            best, best_distance = text, distance
    return best


def _lookup(op: str, fields: dict, heuristic: dict, device, fallback: dict | None = None,
            no_larger: tuple = ()) -> tuple[dict, str]:
    backend = _device.backend()
    if backend != "interpreter":
        key = _device.device_key(device)
        wanted = [fields] + ([{**fields, **fallback}] if fallback else [])
        for kind, path in config_file_candidates(backend, key):
            data = _load(str(path))
            if not data:
                continue
            table = data["ops"].get(op, {})  # usable entries only (_load dropped the rest)
            for want in wanted:
                bucket = bucket_key(want)
                if bucket in table:
                    return {**heuristic, **table[bucket]}, f"{kind}:{path.name}" + ("" if want is fields else f" (as {bucket})")
                near = nearest_bucket(table, want, no_larger)
                if near is not None:
                    return {**heuristic, **table[near]}, f"{kind}:{path.name} (nearest: {near})"
            if "default" in table:
                return {**heuristic, **table["default"]}, f"{kind}:{path.name} (default)"
    return dict(heuristic), "heuristic"


def work_bucket(programs: int, compute_units: int) -> int:
    """How much parallel work a launch has, relative to the device: ``4 x programs / compute
    units`` rounded up to a power of two in 1..32. Split policies and tile sizes are tuned per
    work bucket (a single request and a batch of 128 want different configs)."""
    return pow2_bucket(-(-4 * programs // max(compute_units, 1)), 1, 32)


#: columns of an fp32 dot's accumulator one warp covers on Intel's FMA path (4 a work-item x 16
#: lanes): triton-xpu 3.3 computes an fp32 ``tl.dot`` (``input_precision="ieee"``, no DPAS) wrongly
#: when its accumulator repeats along N, i.e. N above 64 x warps (docs/xpu.md, "fp32 dots")
XPU_FP32_DOT_COLUMNS_PER_WARP = 64


def launch_options(config: dict, fp32_dot_columns: int = 0) -> dict:
    """Keyword options for a kernel launch from a config: ``num_warps``/``num_stages`` everywhere,
    ``maxnreg`` only on CUDA (a register cap per thread: it keeps a tile on the occupancy step where
    ptxas would take a few registers more, bench/residency.py); on XPU the options of
    :func:`xpu_launch_options` (sub-group size, ``grf_mode``), spelled for the installed Intel
    Triton (other backends reject them). The one place that spells launch options.

    ``fp32_dot_columns``: the widest N of the kernel's fp32 dots (0: it has none). On XPU the warps
    are raised to cover it (:data:`XPU_FP32_DOT_COLUMNS_PER_WARP`), so no accumulator repeats
    along N, which triton-xpu's FMA lowering gets wrong."""
    if _device.backend() == "xpu":
        if fp32_dot_columns > 0:
            needed = -(-int(fp32_dot_columns) // XPU_FP32_DOT_COLUMNS_PER_WARP)
            config = dict(config, num_warps=max(int(config.get("num_warps", 4)), needed))
        return xpu_launch_options(config)
    opts = {k: config[k] for k in ("num_warps", "num_stages") if k in config}
    if _device.backend() == "cuda" and config.get("maxnreg"):
        opts["maxnreg"] = config["maxnreg"]
    return opts


#: options already reported missing from the installed Intel Triton (one warning each)
_MISSING_OPTIONS: set = set()


def xpu_launch_options(config: dict, *, dots: bool = True, fields: dict | None = None) -> dict:
    """Options of an XPU launch from a config, in the installed Intel Triton's spelling, checked
    against its options dataclass. Intel's backend drops options it does not know without a word,
    so an option its dataclass lacks is left out with a ``RuntimeWarning`` (once per option)
    instead. ``.ci/xpu_compile_check.py`` compiles with these options too.

    Parameters
    ----------
    config : dict
        Knobs of a config: ``num_warps``, ``num_stages``, ``grf_mode`` (``device.xpu_grf_mode``'s
        spellings), ``sub_group_size`` (default 16: DPAS needs 16 lanes).
    dots : bool
        The kernel holds ``tl.dot``: state the sub-group size rather than leave it to the backend.
    fields : dict, optional
        The backend's options fields (``device.xpu_option_fields()`` unless given).

    Returns
    -------
    dict
        ``num_warps``, ``num_stages``, the sub-group size as ``warp_size`` (Intel's Triton from
        3.6) or ``threads_per_warp`` (3.3-3.5), ``grf_mode`` as this Triton spells it.

    Raises
    ------
    ValueError
        A ``grf_mode`` this Triton does not take, or 256/512 registers above 32 warps.
    """
    known = _device.xpu_option_fields() if fields is None else fields
    opts = {k: config[k] for k in ("num_warps", "num_stages") if k in config}
    if dots:
        name = _device.xpu_sub_group_option(fields)
        if name is not None:
            opts[name] = int(config.get("sub_group_size") or _device.XPU_DPAS_SUB_GROUP)
        else:
            _warn_missing("the sub-group size (warp_size / threads_per_warp)", known)
    if config.get("grf_mode"):
        mode = _device.xpu_grf_mode(str(config["grf_mode"]), config.get("num_warps"), fields)
        if known is None or "grf_mode" in known:
            opts["grf_mode"] = mode
        else:
            _warn_missing("grf_mode", known)
    return opts


def _warn_missing(option: str, known) -> None:
    if option not in _MISSING_OPTIONS:
        _MISSING_OPTIONS.add(option)
        warnings.warn(f"Intel Triton {_device.triton_version()} takes no {option} option (its options: "
                      f"{sorted(known or ())}): launched without it, the backend's default applies",
                      RuntimeWarning, stacklevel=3)
