"""Facts about the package's source that issue 31 asks to keep, checked over the code.

* one calibration function (a budget and a strategy to a noise scale), one budget to
  sensitivity-norm mapping, one noise-variance formula;
* no package named in two layers (``tests/unit/test_architecture.py`` has the layers);
* no bare ``raise ValueError`` / ``raise TypeError``: every error a user can meet is a
  :class:`dpdask.errors.DPDaskError` (each still derives from the builtin it replaced).

Each check reads the source with :mod:`ast` (not by importing it) and has a negative
control: a fake package holding one violation, which the check must report.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest

import dpdask

from .test_architecture import LAYERS

ROOT = pathlib.Path(dpdask.__file__).parent

#: The bare ``raise ValueError`` / ``raise TypeError`` left in the package. It may only
#: fall: lower it when you convert one (the test says when it is above the count).
BARE_RAISES_ALLOWED = 0

#: Modules allowed to define the one calibration, the one norm mapping and the one
#: variance formula.
CALIBRATION_HOME = "privacy/_calibration.py"
NORM_HOME = "privacy/_mechanisms.py"
VARIANCE_HOME = "noise/_variance.py"


@functools.cache
def _sources(root: pathlib.Path) -> dict[str, ast.Module]:
    """Every module under ``root``, parsed once per root (the checks share it)."""
    return {
        str(p.relative_to(root)): ast.parse(p.read_text(), filename=str(p))
        for p in sorted(root.rglob("*.py"))
    }


def bare_raises(root: pathlib.Path) -> list[str]:
    """``file:line`` of every ``raise ValueError(...)`` / ``raise TypeError`` (bare names)."""
    out = []
    for rel, tree in _sources(root).items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id in ("ValueError", "TypeError"):
                    out.append(f"{rel}:{node.lineno} raises {exc.id}")
    return out


def _defs(root: pathlib.Path, names: set[str]) -> list[str]:
    """Module-level functions named in ``names``, as ``file: name``."""
    return [
        f"{rel}: {node.name}"
        for rel, tree in _sources(root).items()
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in names
    ]


def calibrations(root: pathlib.Path) -> list[str]:
    """Where a budget becomes a noise scale: module-level ``calibrate`` / ``noise_scale``
    / ``calibrate_*`` functions."""
    found = []
    for rel, tree in _sources(root).items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and (
                node.name in ("calibrate", "noise_scale") or node.name.startswith("calibrate_")
            ):
                found.append(f"{rel}: {node.name}")
    return found


def norm_mappings(root: pathlib.Path) -> list[str]:
    """Where a mechanism or budget is mapped to a sensitivity norm: a dict literal with
    both a Laplace and a Gaussian key, or a conditional ``1 if ... else 2`` (or the
    reverse) whose test names a mechanism or a budget type."""
    words = ("laplace", "gaussian", "pure", "zcdp", "approx", "mechanism")
    found = []
    for rel, tree in _sources(root).items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if "laplace" in keys and "gaussian" in keys:
                    vals = {v.value for v in node.values if isinstance(v, ast.Constant)}
                    if vals <= {1, 2}:
                        found.append(f"{rel}:{node.lineno} dict")
            elif isinstance(node, ast.IfExp):
                pair = (node.body, node.orelse)
                if all(isinstance(v, ast.Constant) for v in pair) and {
                    pair[0].value,  # type: ignore[attr-defined]
                    pair[1].value,  # type: ignore[attr-defined]
                } == {1, 2}:
                    test = ast.unparse(node.test).lower()
                    if any(w in test for w in words):
                        found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    return found


def variance_formulas(root: pathlib.Path) -> list[str]:
    """Where a noise variance is computed from a scale: ``2 * <scale> ** 2`` (Laplace)."""
    found = []
    for rel, tree in _sources(root).items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Mult)
                and isinstance(node.left, ast.Constant)
                and node.left.value == 2
                and isinstance(node.right, ast.BinOp)
                and isinstance(node.right.op, ast.Pow)
                and isinstance(node.right.right, ast.Constant)
                and node.right.right.value == 2
                and "scale" in ast.unparse(node.right.left).lower()
            ):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_bare_value_or_type_error():
    found = bare_raises(ROOT)
    assert len(found) <= BARE_RAISES_ALLOWED, (
        f"{len(found)} bare raises (allowed {BARE_RAISES_ALLOWED}); raise a "
        "dpdask.errors class instead:\n" + "\n".join(found[:40])
    )
    if len(found) < BARE_RAISES_ALLOWED:
        pytest.fail(f"only {len(found)} bare raises left: lower BARE_RAISES_ALLOWED to it")


def test_one_calibration_function():
    """``privacy.calibrate`` (built on ``privacy.noise_scale``, beside it) is the one
    place a budget becomes a noise scale; ``privacy.mechanism_for`` the one place a
    budget picks its mechanism."""
    found = calibrations(ROOT)
    assert f"{CALIBRATION_HOME}: calibrate" in found
    assert all(f.startswith(f"{CALIBRATION_HOME}:") for f in found), found
    assert _defs(ROOT, {"mechanism_for"}) == [f"{CALIBRATION_HOME}: mechanism_for"]


def test_one_budget_to_norm_mapping():
    found = norm_mappings(ROOT)
    assert len(found) == 1 and found[0].startswith(f"{NORM_HOME}:"), "\n".join(found)


def test_one_variance_formula():
    """``noise.draw_variance`` is the one formula; nothing else squares a scale."""
    assert _defs(ROOT, {"draw_variance"}) == [f"{VARIANCE_HOME}: draw_variance"]
    found = [f for f in variance_formulas(ROOT) if not f.startswith(f"{VARIANCE_HOME}:")]
    assert not found, "use dpdask.noise.draw_variance:\n" + "\n".join(found)


def test_no_package_in_two_layers():
    seen: dict[str, int] = {}
    twice = []
    for i, layer in enumerate(LAYERS):
        for pkg in layer:
            if pkg in seen:
                twice.append(f"{pkg}: layers {seen[pkg]} and {i}")
            seen[pkg] = i
    assert not twice, twice


def test_the_checks_see_a_violation(tmp_path):
    """Each check reports a violation planted in a fake package."""
    (tmp_path / "a.py").write_text(
        "def calibrate(b, s):\n"
        "    raise ValueError('x')\n"
        "def noise_scale(m, s, b):\n"
        "    p = 1 if m == 'laplace' else 2\n"
        "    return 2 * scale ** 2\n"
        "NORM = {'laplace': 1, 'gaussian': 2}\n"
        "def f(x):\n"
        "    raise TypeError\n"
    )
    assert bare_raises(tmp_path) == ["a.py:2 raises ValueError", "a.py:8 raises TypeError"]
    assert calibrations(tmp_path) == ["a.py: calibrate", "a.py: noise_scale"]
    assert len(norm_mappings(tmp_path)) == 2
    assert variance_formulas(tmp_path) == ["a.py:5 2 * scale ** 2"]
