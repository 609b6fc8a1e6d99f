"""Drop-in module names for the engines: ``sgl_kernel`` (sglang's XPU backend) and
``vllm_xpu_kernels`` (vLLM's XPU platform), served by triton_xpu_attn.

One call makes the engines' own ``import sgl_kernel`` / ``import vllm_xpu_kernels`` (and every
submodule, e.g. ``sgl_kernel.flash_attn``) resolve to the modules in this package, without editing
the engine::

    import triton_xpu_attn.compat
    triton_xpu_attn.compat.install()          # before the engine imports its attention backend
    # {'sgl_kernel': 'installed', 'vllm_xpu_kernels': 'installed'}

``install`` never shadows a package that is really installed (found on ``sys.path`` or already
imported) unless ``force=True``; it reports what it did per name. The compat modules only re-export
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

__all__ = ["COMPAT_MODULES", "install", "installed", "uninstall"]


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


def install(names=None, *, force: bool = False) -> dict[str, str]:
    """Make ``import sgl_kernel`` / ``import vllm_xpu_kernels`` resolve to triton_xpu_attn's
    compat modules (a finder at the front of ``sys.meta_path``; idempotent).

    Parameters
    ----------
    names : iterable of str, optional
        Which of ``COMPAT_MODULES`` (``"sgl_kernel"``, ``"vllm_xpu_kernels"``) to install;
        default all of them.
    force : bool
        Shadow a real installed package of that name too (its already-imported modules are
        dropped from ``sys.modules``, so later imports get ours).

    Returns
    -------
    dict[str, str]
        Per name: ``"installed"``, ``"already installed"``, or
        ``"skipped: real package at <path> (force=True shadows it)"``.
    """
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
        if real is not None and not force:
            report[name] = f"skipped: real package at {real} (force=True shadows it)"
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
    modules from ``sys.modules``. Returns the names removed."""
    if names is None:
        names = tuple(_FINDER.names)
    elif isinstance(names, str):
        names = (names,)
    removed = []
    for name in names:
        if _FINDER.names.pop(name, None) is None:
            continue
        for module_name in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module_name]
        removed.append(name)
    if not _FINDER.names and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    return removed
