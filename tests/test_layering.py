"""The package's imports run one way: compat -> ops -> tune / device / _common, with no cycle
between any two of its modules (imports inside functions included: a lazy import hides a cycle
from the interpreter, not from the design)."""
from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "triton_xpu_attn"


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its source. ``from .. import device``
    names the module ``device``, not the package: a name that is a module counts as that module."""
    paths = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph = {name: set() for name in paths}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                target = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
                modules = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in paths]
                found = modules if len(modules) == len(node.names) else [target, *modules]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            graph[name].update(m for m in found if m in paths and m != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_lazy_import_cycle(tmp_path):
    """The check itself: two modules importing each other, one of them inside a function, form a
    cycle; a third importing both does not join it."""
    package = tmp_path / "pkg"
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ops" / "__init__.py").write_text("")
    (package / "device.py").write_text("")
    (package / "ops" / "a.py").write_text("from .. import device\nfrom . import b\n")
    (package / "ops" / "b.py").write_text("def f():\n    from .a import g\n")
    (package / "ops" / "c.py").write_text("from .a import g\nfrom .b import f\n")
    graph = import_graph(package)
    assert graph["pkg.ops.a"] == {"pkg.device", "pkg.ops.b"}
    assert cycles(graph) == [["pkg.ops.a", "pkg.ops.b"]]


def test_no_import_cycle_between_package_modules():
    assert cycles(import_graph()) == []


def test_imports_run_from_compat_to_ops_to_the_shared_layer():
    """ops never import compat (compat adapts ops, not the reverse) or the custom-op
    registrations; tune, device and _common import no op and no compat module."""
    graph = import_graph()
    upward = []
    for module, imported in graph.items():
        for target in imported:
            if ".ops." in module and (".compat" in target or target.endswith((".custom_ops", ".tuner"))):
                upward.append((module, target))
            if module.endswith((".tune", ".device", "._common")) and (".ops" in target or ".compat" in target):
                upward.append((module, target))
    assert upward == []
