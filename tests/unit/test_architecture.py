"""The package's boundaries, checked over its import graph (ARCHITECTURE.md).

* Layers: a package imports only packages of its own or a lower layer, and the
  packages of one layer import each other without cycles.
* Privacy: no module imports another package's private module
  (``dpdask.<other>._name``); what crosses a package boundary is public.
* Size: no module is over 500 lines.

Imports inside functions count: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import pathlib
import re
from collections import defaultdict

import pytest

import dpdask

ROOT = pathlib.Path(dpdask.__file__).parent

# lower layers first; a package may import its own layer (acyclically) or lower ones
LAYERS: list[set[str]] = [
    {"errors", "config", "domain", "linalg"},
    {"census", "noise", "privacy", "specs"},
    {"workloads", "datasets"},
    {"strategy", "reconstruct", "measure"},
    {"publish", "ldp"},
    {"store", "graph", "sums"},
    {"pipeline", "dashboard", "report", "reader"},
    {"cli", "testing", "session", "__init__", "__main__"},
]
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
MAX_LINES = 500


def _modules() -> list[pathlib.Path]:
    return sorted(ROOT.rglob("*.py"))


def _package(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def _imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return [m for m in found if m.startswith("dpdask.")]


def _graph() -> dict[str, dict[str, list[str]]]:
    """``{package: {imported package: [modules that import it]}}``."""
    deps: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in _modules():
        pkg = _package(path)
        for mod in _imports(path):
            target = mod.split(".")[1]
            known = (ROOT / target).is_dir() or (ROOT / f"{target}.py").exists()
            if known and target != pkg:
                deps[pkg][target].append(str(path.relative_to(ROOT)))
    return deps


def test_every_package_has_a_layer():
    packages = {_package(p) for p in _modules()}
    assert packages <= set(LAYER), f"add to LAYERS: {sorted(packages - set(LAYER))}"


def test_no_upward_imports():
    upward = [
        f"{pkg} (layer {LAYER[pkg]}) imports {target} (layer {LAYER[target]}) in {where[0]}"
        for pkg, targets in _graph().items()
        for target, where in targets.items()
        if LAYER.get(target, -1) > LAYER.get(pkg, 99)
    ]
    assert not upward, "\n".join(upward)


def test_no_cycles_between_packages():
    graph = {pkg: set(targets) for pkg, targets in _graph().items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for pkg in sorted(graph):
        if pkg not in state:
            visit(pkg, [pkg])
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles)


def test_no_import_of_another_packages_private_module():
    bad = []
    for path in _modules():
        pkg = _package(path)
        for mod in _imports(path):
            parts = mod.split(".")
            if parts[1] == pkg:
                continue
            # dpdask.<other>.<...>._private at any depth below the package
            if any(p.startswith("_") and not p.startswith("__") for p in parts[2:]):
                head = ROOT.joinpath(*parts[1:])
                if head.with_suffix(".py").exists() or head.is_dir():
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_size(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{lines} lines: split it along its concepts"


def test_the_checks_see_a_violation(tmp_path, monkeypatch):
    """The graph walker finds an upward import and a private import when there is one."""
    fake = tmp_path / "dpdask"
    (fake / "linalg").mkdir(parents=True)
    (fake / "graph").mkdir()
    (fake / "linalg" / "bad.py").write_text("from dpdask.graph._x import y\n")
    (fake / "graph" / "_x.py").write_text("y = 1\n")
    monkeypatch.setattr(f"{__name__}.ROOT", fake)
    graph = _graph()
    assert set(graph["linalg"]["graph"]) == {"linalg/bad.py"}
    with pytest.raises(AssertionError, match=re.escape("linalg (layer 0) imports graph")):
        test_no_upward_imports()
    with pytest.raises(AssertionError, match=re.escape("imports dpdask.graph._x")):
        test_no_import_of_another_packages_private_module()
