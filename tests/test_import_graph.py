"""The package's modules form no import cycle, and the runtime never imports the engines.

Every ``import`` and ``from ... import`` in every module of the installed package counts, at
module level or inside a function (a lazy import is still a dependency), resolved to the
package's own modules. Importing ``a.b.c`` depends on ``a.b`` too (its ``__init__`` runs first),
except where ``a.b`` is the importer's own package (that has run before the importer).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import aggdec

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

PACKAGE = "aggdec"


def package_modules() -> dict[str, Path]:
    """Every module of the package, as installed (its subpackages live at the repository root,
    mapped by pyproject's package-dir): each package pyproject lists, and its modules."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    packages = pyproject["tool"]["setuptools"]["packages"]
    modules: dict[str, Path] = {}
    for name in packages:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None and spec.submodule_search_locations, name
        modules[name] = Path(spec.origin)
        for location in spec.submodule_search_locations:
            for path in sorted(Path(location).glob("*.py")):
                if path.stem != "__init__":
                    modules[f"{name}.{path.stem}"] = path
            for path in sorted(Path(location).iterdir()):  # a subpackage pyproject forgot would not install
                if (path / "__init__.py").is_file():
                    assert f"{name}.{path.name}" in packages, f"{name}.{path.name} is missing from pyproject's packages"
    return modules


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports (each name resolved to the deepest known module)."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    ancestors = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        # importing a.b.c runs a.b's __init__ first (the importer's own packages have run already)
        while target and target != name and target not in ancestors:
            found.add(target)
            target = target.rpartition(".")[0]

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith(PACKAGE):
                continue
            for alias in node.names:  # `from pkg import sub` imports the submodule
                candidate = f"{module}.{alias.name}"
                add(candidate if candidate in known else module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert {"aggdec.cli", "aggdec.runtime.generator", "aggdec.runtime.decoding.loop", "aggdec.engines.trt",
            "aggdec.serve.app", "aggdec.bench.runner", "aggdec.export.pipeline"} <= set(graph)
    assert "aggdec.runtime.decoding.loop" in graph["aggdec.runtime.generator"]  # relative imports resolve
    assert "aggdec.runtime.errors" in graph["aggdec.engines.trt"]  # absolute ones too


def test_no_module_imports_itself_through_others():
    assert cycles(import_graph()) == []


def test_the_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_runtime_never_imports_the_engines_or_the_cli():
    """runtime/ is the torch-free, TensorRT-free core: TensorRT registers itself with it
    (aggdec.engines), never the other way round."""
    graph = import_graph()
    offenders = {name: sorted(t for t in targets if not t.startswith("aggdec.runtime") and t != "aggdec")
                 for name, targets in graph.items() if name.startswith("aggdec.runtime")}
    assert {name: targets for name, targets in offenders.items() if targets} == {}
    assert aggdec.__name__ == PACKAGE
