"""The checks every part of a spec is read with, and the one rule for ids."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from dpdask.errors import SpecError

__all__ = ["ID_RULE", "as_mapping", "check_id", "check_keys"]

#: release and dataset ids: a letter, then ASCII letters, digits, ``_``, ``.``, ``-``
ID_RULE = re.compile(r"\A[A-Za-z][A-Za-z0-9_.-]{0,199}\Z")


def check_id(value: Any, where: str) -> str:
    """``value`` if it is an id (:data:`ID_RULE`), else a :class:`SpecError` naming ``where``.

    Ids name ledger entries, work folders and published attributes: a path separator,
    ``..`` alone, a control or a direction-override character never gets through.

    Examples
    --------
    >>> check_id("wages-2026.v1", "release")
    'wages-2026.v1'
    >>> check_id("../../etc/x", "release")
    Traceback (most recent call last):
    ...
    dpdask.errors.SpecError: release: '../../etc/x' must start with a letter and use [A-Za-z0-9_.-] (at most 200 characters)
    """  # noqa: E501
    if not isinstance(value, str) or not ID_RULE.match(value):
        raise SpecError(
            f"{where}: {value!r} must start with a letter and use [A-Za-z0-9_.-] "
            "(at most 200 characters)"
        )
    return value


def check_keys(d: Mapping[Any, Any], allowed: Iterable[str], where: str) -> None:
    """Raise naming the first unknown key of ``d`` and the keys allowed there."""
    allowed = list(allowed)
    unknown = sorted((k for k in d if k not in allowed), key=str)
    if unknown:
        raise SpecError(f"{where}: unknown key {unknown[0]!r}; allowed: {allowed}")


def as_mapping(value: Any, where: str, what: str) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else a :class:`SpecError` naming ``where``."""
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: expected {what}, got {value!r}")
    return value
