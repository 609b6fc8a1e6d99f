"""Stand-ins for the modules an engine's import chain asks for but its attention path never runs,
shared by the engine harnesses (tests/sglang_harness.py, tests/vllm_harness.py).

A :class:`StandIns` answers imports of its stubbed top-level names with permissive placeholder
modules (any attribute is a class, a call on a function returns it unchanged, iteration is empty),
maps aliases onto real modules (``regex`` -> ``re``), and does so only inside :meth:`StandIns.active`:
afterwards its finder leaves ``sys.meta_path`` and its stub modules leave ``sys.modules`` (the
engine's modules keep their references). Real packages an engine brings in its own site folder
(``own``) are kept apart the same way: they leave ``sys.modules`` at the end of the block and come
back at its next start, so that one engine's real package never answers another engine's stubbed
name in the same pytest run; the engine's site folders (:meth:`StandIns.add_site`) are on
``sys.path`` only inside the block too, so that another engine's ``try: import vllm`` fails as it
would where that engine is not installed.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types

import torch


class _Empty:
    """Container protocol of a stub (on its class through the metaclass, and on its instances):
    empty, writes ignored."""

    def __iter__(self):
        return iter(())

    def __setitem__(self, key, value):
        pass

    def __contains__(self, key):
        return False

    def __len__(self):
        return 0


def _called(make, args, kwargs):
    """A stub called with one function and nothing else is a decorator: leave the function alone."""
    if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _StubMeta):
        return args[0]
    return make()


class _StubMeta(_Empty, type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__") and name != "__class_validators__":
            raise AttributeError(name)
        return stub_class(name)

    def __call__(cls, *args, **kwargs):
        return _called(super().__call__, args, kwargs)

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


class _Stub(_Empty, metaclass=_StubMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return stub_class(name)

    def __call__(self, *args, **kwargs):
        return _called(_Stub, args, kwargs)

    def __getitem__(self, key):
        return _Stub()

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        """A stub used as a field type of a real pydantic model validates anything."""
        from pydantic_core import core_schema

        return core_schema.any_schema()


def stub_class(name):
    """A fresh placeholder class named ``name``."""
    return _StubMeta(name, (_Stub,), {})


class StubModule(types.ModuleType):
    """A placeholder module: every missing attribute is a placeholder class."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = stub_class(name)
        setattr(self, name, value)
        return value


def _top(name: str) -> str:
    return name.partition(".")[0]


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stub modules for the top-level names ``stubs`` (name -> why), aliases (name -> real module
    name) and the engine's own real packages ``own`` (top-level names), active inside
    :meth:`active` only."""

    def __init__(self, stubs: dict[str, str], aliases: dict[str, str] | None = None, own=()):
        self.stubs = dict(stubs)
        self.aliases = dict(aliases or {})
        self.own = frozenset(own)
        self.sites: list[str] = []
        self._kept: dict[str, types.ModuleType] = {}

    def add_site(self, site: str) -> None:
        """Put ``site`` on ``sys.path`` (last) inside :meth:`active` blocks, from now on."""
        if site not in self.sites:
            self.sites.append(site)
        add_site(site)

    # importlib protocol --------------------------------------------------------------------
    def find_spec(self, fullname, path=None, target=None):
        if _top(fullname) in self.stubs:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__version__ = "0.0.0"

    # ---------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def active(self):
        """Answer the stubbed and aliased names (and bring back the engine's own packages) for
        the duration of the block."""
        sys.meta_path.insert(0, self)
        for site in self.sites:
            add_site(site)
        for name, module in self._kept.items():
            sys.modules.setdefault(name, module)
        self._kept.clear()
        for name, target in self.aliases.items():
            sys.modules.setdefault(name, importlib.import_module(target))
        try:
            yield self
        finally:
            sys.meta_path.remove(self)
            for site in self.sites:
                if site in sys.path:
                    sys.path.remove(site)
            for name in list(sys.modules):
                module = sys.modules[name]
                top = _top(name)
                if top in self.stubs and isinstance(module, StubModule):
                    del sys.modules[name]
                elif name in self.aliases:
                    del sys.modules[name]
                elif top in self.own and not isinstance(module, StubModule):
                    self._kept[name] = sys.modules.pop(name)


@contextlib.contextmanager
def cuda_hidden():
    """Engines pick CUDA-only import paths when they see a CUDA device; on XPU they see none.
    Hide CUDA while their modules import, so that a GPU run takes the same import chain as the XPU
    target and the CPU; our kernels still run on the GPU afterwards."""
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = real


def add_site(site: str) -> None:
    """Make ``site`` importable (after everything already on ``sys.path``)."""
    if site not in sys.path:
        sys.path.append(site)


def site_from_env(variable: str, package: str) -> str | None:
    """The folder the environment variable ``variable`` names, if it holds ``package``."""
    site = os.environ.get(variable)
    return site if site and os.path.isdir(os.path.join(site, package)) else None


def install_engine(variable: str, package: str, compat_name: str, script: str, add=add_site) -> str:
    """Make the engine ``package`` importable from its site folder (``add(site)``) and install our
    compat module ``compat_name`` in place of its kernel package; returns the site. Raises
    RuntimeError naming ``script`` (what builds the site) when ``variable`` names none."""
    site = site_from_env(variable, package)
    if site is None:
        raise RuntimeError(f"{variable} does not name a folder holding {package} (build it with {script})")
    import triton_xpu_attn.compat

    add(site)
    report = triton_xpu_attn.compat.install([compat_name])
    assert report[compat_name] in ("installed", "already installed"), report
    return site
