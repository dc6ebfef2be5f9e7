"""The checks every part of a release spec is read with; each raises a one-line
:class:`~dpdask.errors.SpecError` naming the (dotted) field."""

from __future__ import annotations

import inspect
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dpdask.errors import SpecError
from dpdask.specs import as_mapping, check_keys  # the checks every kind of spec shares

__all__ = [
    "SYNTHETIC_BLOCKS",
    "as_bool",
    "as_mapping",
    "as_path",
    "check_keys",
    "keywords",
    "positive_int",
    "require",
    "synthetic_blocks_options",
]

#: ``data: {format: synthetic-blocks}``: each option, its default and its least value
SYNTHETIC_BLOCKS: dict[str, tuple[int, int]] = {
    "blocks": (25_000, 1),
    "persons": (1_000_000, 0),
    "seed": (0, 0),
}


def require(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] is None:
        raise SpecError(f"{where}: missing required field {key!r}")
    return d[key]


def as_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(f"{where}: expected true or false, got {value!r}")
    return value


def as_path(value: Any, base: pathlib.Path, where: str) -> pathlib.Path:
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise SpecError(f"{where}: expected a path, got {value!r}")
    p = pathlib.Path(os.path.expandvars(os.path.expanduser(str(value))))
    return p if p.is_absolute() else (base / p).resolve()


def keywords(fn: Callable[..., Any], skip: Iterable[str]) -> list[str]:
    """The parameters of ``fn`` that can be given by keyword, less ``skip``."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    skip = set(skip)
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind in kinds and p.name not in skip]


def positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{where}: expected a positive integer, got {value!r}")
    return value


def synthetic_blocks_options(d: Mapping[str, Any]) -> dict[str, int]:
    """``blocks``, ``persons`` and ``seed`` of synthetic blocks, defaults filled in; a
    :class:`SpecError` naming ``data.<key>`` for a value that is not an integer at least
    its least value."""
    out = {}
    for key, (default, least) in SYNTHETIC_BLOCKS.items():
        value = d.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise SpecError(f"data.{key}: expected an integer >= {least}, got {value!r}")
        out[key] = value
    return out
