"""Drop-in module names for the engines: ``sgl_kernel`` (sglang's XPU backend) and
``vllm_xpu_kernels`` (vLLM's XPU platform), served by triton_xpu_attn.

One call makes the engines' own ``import sgl_kernel`` / ``import vllm_xpu_kernels`` (and every
submodule, e.g. ``sgl_kernel.flash_attn``) resolve to the modules in this package, without editing
the engine::

    import triton_xpu_attn.compat
    triton_xpu_attn.compat.install()          # before the engine imports its attention backend
    # {'sgl_kernel': 'installed', 'vllm_xpu_kernels': 'installed'}

``install`` never shadows a package that is really installed (found on ``sys.path`` or already
imported) unless ``force=True``; ``overlay=True`` keeps the real package (sgl-kernel-xpu /
vllm-xpu-kernels bring norms, activations, MoE and quantization kernels too) and replaces only its
attention functions with ours. It reports what it did per name. The compat modules only re-export
and adapt triton_xpu_attn's ops (argument conventions, return arity); they hold no kernels.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

# engine-facing top-level name -> module of this package that serves it
COMPAT_MODULES = {
    "sgl_kernel": "triton_xpu_attn.compat.sgl_kernel",
    "vllm_xpu_kernels": "triton_xpu_attn.compat.vllm_xpu_kernels",
}

# attention names that overlay=True puts on a real installed package: module -> names
_TOPK = ("fast_topk_v2", "fast_topk_transform_fused", "fast_topk_transform_ragged_fused", "topk_transform_512",
         "topk_transform_512_v2")
OVERLAY_NAMES = {
    "sgl_kernel": (
        "flash_mla_decode", "flash_mla_decode_get_workspace_size", "flash_mla_get_workspace_size",
        "flash_mla_prefill", "flash_mla_prefill_get_workspace_size", "merge_state_v2",
        # DeepSeek sparse attention (sglang imports these from the root on XPU)
        "flash_mla_sparse_fwd", "flash_mla_with_kvcache", "fp8_paged_mqa_logits_triton", *_TOPK,
    ),
    "sgl_kernel.flash_attn": ("flash_attn_varlen_func", "flash_attn_with_kvcache"),
    # submodules a real package may lack (older sgl-kernel-xpu): skipped there
    "sgl_kernel.attention": ("flash_mla_sparse_fwd", "flash_mla_with_kvcache"),
    "sgl_kernel.nsa": ("fp8_mqa_logits", "fp8_paged_mqa_logits"),
    "sgl_kernel.top_k": _TOPK,
    "sgl_kernel.sparse_flash_attn": ("convert_vertical_slash_indexes", "convert_vertical_slash_indexes_mergehead",
                                     "sparse_attn_func", "sparse_attn_varlen_func"),
    "vllm_xpu_kernels.flash_attn_interface": ("flash_attn_varlen_func",),
}

__all__ = ["COMPAT_MODULES", "OVERLAY_NAMES", "install", "installed", "uninstall"]


class _AliasLoader(importlib.abc.Loader):
    """Loads ``alias`` as the already-importable module ``target`` (the same module object)."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._target_spec = module.__spec__
        return module

    def exec_module(self, module):
        # the target ran its own code when it was imported; importlib set __spec__ to the alias's
        # spec on the shared module object: give the module its own back
        module.__spec__ = self._target_spec


class _CompatFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that maps ``<name>`` and ``<name>.<sub>`` to our compat modules."""

    def __init__(self):
        self.names: dict[str, str] = {}  # top-level alias -> target package

    def find_spec(self, fullname, path=None, target=None):
        top, _, rest = fullname.partition(".")
        if top not in self.names:
            return None
        target_name = self.names[top] + ("." + rest if rest else "")
        if importlib.util.find_spec(target_name) is None:
            return None  # no such submodule in the compat package: the usual ImportError follows
        return importlib.util.spec_from_loader(
            fullname, _AliasLoader(target_name), is_package=rest == "" or _is_package(target_name)
        )


def _is_package(module_name: str) -> bool:
    spec = importlib.util.find_spec(module_name)
    return spec is not None and spec.submodule_search_locations is not None


_FINDER = _CompatFinder()


def _real_location(name: str) -> str | None:
    """Where a real (not ours) ``name`` would be imported from, or None."""
    module = sys.modules.get(name)
    if module is not None:
        if _FINDER.names.get(name) is not None and getattr(module, "__name__", "") == _FINDER.names[name]:
            return None  # our own alias, imported earlier
        return getattr(module, "__file__", None) or repr(module)
    was_active = _FINDER in sys.meta_path
    if was_active:
        sys.meta_path.remove(_FINDER)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    finally:
        if was_active:
            sys.meta_path.insert(0, _FINDER)
    if spec is None:
        return None
    return spec.origin or (list(spec.submodule_search_locations or []) or [name])[0]


_OVERLAID: dict[tuple[str, str], object] = {}  # (module, name) -> the real package's attribute


def _overlay(name: str) -> str:
    """Put our attention functions on the real package ``name`` (its other kernels stay)."""
    done = []
    for module_name, attrs in OVERLAY_NAMES.items():
        if module_name.partition(".")[0] != name:
            continue
        try:
            real_module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue  # the real package has no such submodule: nothing of it to replace
        ours = importlib.import_module(COMPAT_MODULES[name] + module_name[len(name):])
        for attr in attrs:
            _OVERLAID.setdefault((module_name, attr), getattr(real_module, attr, None))
            setattr(real_module, attr, getattr(ours, attr))
            done.append(f"{module_name}.{attr}")
    return ", ".join(done)


def install(names=None, *, force: bool = False, overlay: bool = False) -> dict[str, str]:
    """Make ``import sgl_kernel`` / ``import vllm_xpu_kernels`` resolve to triton_xpu_attn's
    compat modules (a finder at the front of ``sys.meta_path``; idempotent).

    Where the real package is installed (sgl-kernel-xpu or vllm-xpu-kernels on an XPU machine,
    which also carry norms, activations, MoE and quantization kernels), ``overlay=True`` keeps it
    and replaces only its attention functions (``OVERLAY_NAMES``) with ours. Call it before the
    engine imports its attention backend: ``from sgl_kernel import ...`` binds names at import.

    Parameters
    ----------
    names : iterable of str, optional
        Which of ``COMPAT_MODULES`` (``"sgl_kernel"``, ``"vllm_xpu_kernels"``) to install;
        default all of them.
    force : bool
        Shadow a real installed package of that name too (its already-imported modules are
        dropped from ``sys.modules``, so later imports get ours).
    overlay : bool
        With a real package installed: keep it, replace its attention functions with ours.
        Without one: the same as the default (our module serves the name).

    Returns
    -------
    dict[str, str]
        Per name: ``"installed"``, ``"already installed"``, ``"overlaid on <path>: <names>"``, or
        ``"skipped: real package at <path> (force=True shadows it, overlay=True keeps it and
        replaces its attention functions)"``.
    """
    if force and overlay:
        raise ValueError("force and overlay: choose one (force replaces the real package, overlay keeps it)")
    if names is None:
        names = tuple(COMPAT_MODULES)
    elif isinstance(names, str):
        names = (names,)
    report = {}
    for name in names:
        if name not in COMPAT_MODULES:
            raise ValueError(f"names: unknown compat module {name!r}; expected one of {sorted(COMPAT_MODULES)}")
        if name in _FINDER.names:
            report[name] = "already installed"
            continue
        real = _real_location(name)
        if real is not None and overlay:
            report[name] = f"overlaid on {real}: {_overlay(name)}"
            continue
        if real is not None and not force:
            report[name] = (
                f"skipped: real package at {real} (force=True shadows it, overlay=True keeps it and replaces "
                "its attention functions)"
            )
            continue
        if real is not None:  # force: forget the real modules so the next import finds ours
            for module_name in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[module_name]
        _FINDER.names[name] = COMPAT_MODULES[name]
        report[name] = "installed"
    if _FINDER.names and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    importlib.invalidate_caches()
    return report


def installed() -> dict[str, str]:
    """The names :func:`install` currently serves, mapped to the modules that serve them."""
    return dict(_FINDER.names)


def uninstall(names=None) -> list[str]:
    """Undo :func:`install` for ``names`` (default all): drop the finder entry and the aliased
    modules from ``sys.modules``, give an overlaid real package its own functions back. Returns
    the names undone."""
    if names is None:
        names = tuple(_FINDER.names) + tuple({m.partition(".")[0] for m, _ in _OVERLAID} - set(_FINDER.names))
    elif isinstance(names, str):
        names = (names,)
    removed = []
    for name in names:
        overlaid = [key for key in _OVERLAID if key[0].partition(".")[0] == name]
        for module_name, attr in overlaid:
            original = _OVERLAID.pop((module_name, attr))
            module = sys.modules.get(module_name)
            if module is not None:
                if original is None:
                    delattr(module, attr)
                else:
                    setattr(module, attr, original)
        if overlaid:
            removed.append(name)
        if _FINDER.names.pop(name, None) is None:
            continue
        for module_name in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module_name]
        removed.append(name)
    if not _FINDER.names and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    return removed
