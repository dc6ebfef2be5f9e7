"""Shared test helpers: optional-dependency and shared-data skips."""

from __future__ import annotations

import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def _importorskip(modname: str) -> tuple[bool, pytest.MarkDecorator]:
    try:
        importlib.import_module(modname)
        has = True
    except ImportError:
        has = False
    return has, pytest.mark.skipif(not has, reason=f"requires {modname}")


has_cvxpy, requires_cvxpy = _importorskip("cvxpy")
has_shared_data = SHARED_DATA.is_dir()
requires_shared_data = pytest.mark.skipif(
    not has_shared_data, reason=f"requires the shared data folder at {SHARED_DATA}"
)


def shared_data(*parts: str) -> pathlib.Path:
    """Path to a file in ``../shared/data`` (tests using it carry ``requires_shared_data``)."""
    return SHARED_DATA.joinpath(*parts)
