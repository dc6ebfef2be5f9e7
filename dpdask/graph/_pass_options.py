"""The ``passes`` option of a multi-pass top-down release, as each level's passes.

:func:`resolve_passes` turns what ``release(passes=...)`` takes into each level's
:class:`~dpdask.reconstruct.topdown.Pass` list (:mod:`dpdask.graph._multipass`):

* ``"default"``: at every level but the finest, the total first, from the unit's own
  measurements (all of them: a block's detailed cells, summed, hold far more of its
  total's information than its total row) and the levels below's estimate of it
  (``below``, :mod:`dpdask.graph._subtree`), then every cell within it; at the finest
  level, with nothing below, the two passes are one fit;
* a list of query groups of the level's workload (names from
  :func:`~dpdask.graph._simulate.group_rows`, a group or a list of groups per pass), each
  pass fitted from the strategy rows that measure its queries (rows in the row space of
  the pass's queries not used by an earlier pass), then a last pass over every cell from
  the remaining rows;
* a mapping of level names to their own ``Pass`` lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError
from dpdask.reconstruct.topdown import Constraints, Pass

if TYPE_CHECKING:
    from dpdask.strategy import Plan

__all__ = ["PassesOption", "one_fit", "resolve_passes", "zeros_only"]

PassesOption = str | Sequence[str | Sequence[str]] | Mapping[str, Sequence[Pass]] | None
"""What ``release(passes=...)`` takes (module notes; a mapping gives each level's passes)."""


def _in_row_space(A: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """Which rows of ``A`` lie in the row space of ``Q`` (a measurement of its queries)."""
    basis, _ = np.linalg.qr(Q.T)  # (n, r) orthonormal columns spanning Q's rows
    rest = A - (A @ basis) @ basis.T
    scale = np.maximum(np.abs(A).max(axis=1), 1.0)
    out: np.ndarray = np.abs(rest).max(axis=1) <= 1e-9 * scale
    return out


def _group_passes(A: np.ndarray, W: Any, groups: Sequence[Any], slack: float) -> list[Pass]:
    from dpdask.graph._simulate import group_rows

    named = dict(group_rows(W))
    m, n = A.shape
    used = np.zeros(m, dtype=bool)
    out: list[Pass] = []
    for k, g in enumerate(groups):
        names = [g] if isinstance(g, str) else list(g)
        unknown = [x for x in names if x not in named]
        if not names or unknown:
            raise ArgumentError(
                f"passes[{k}]: {unknown or names!r} is not a query group of the workload "
                f"(its groups: {sorted(named)})"
            )
        rows = np.concatenate([named[x] for x in names])
        Q = np.asarray(W.dense(), dtype=float)[rows] if hasattr(W, "dense") else W[rows]
        mine = _in_row_space(A, Q) & ~used
        used |= mine
        out.append(Pass(Q, np.flatnonzero(mine) if mine.any() else None, slack, "+".join(names)))
    rest = np.flatnonzero(~used)
    out.append(Pass(np.eye(n), rest if rest.size and used.any() else None, 0.0, "detail"))
    return out


def _default(n: int, slack: float, finest: bool) -> tuple[Pass, ...]:
    """The default passes (module notes): the total from the unit's measurements and the
    levels below's, then every cell within it; at the finest level (nothing below) the
    two are one fit."""
    if finest:
        return (Pass(np.eye(n), None, 0.0, "cells"),)
    return (Pass(np.ones((1, n)), None, slack, "total", below=True),
            Pass(np.eye(n), None, 0.0, "detail"))  # fmt: skip


def resolve_passes(
    passes: PassesOption, slack: float, plans: Mapping[str, Plan], multipass: bool
) -> dict[str, tuple[Pass, ...]] | None:
    """Each level's passes for the ``passes`` option (module notes); None when the
    release is today's top-down (``passes`` None and no constraints). With constraints
    and ``passes`` None: one pass, the constrained fit of every measurement."""
    if not (isinstance(slack, int | float) and not isinstance(slack, bool)):
        raise ArgumentTypeError(f"slack must be a number, got {slack!r}")
    if not (np.isfinite(slack) and slack >= 0):
        raise ArgumentError(f"slack must be finite and >= 0, got {slack!r}")
    if passes is None:
        if not multipass:
            return None
        return {
            lv: (Pass(np.eye(p.strategy.shape[1]), None, 0.0, "cells"),) for lv, p in plans.items()
        }
    if isinstance(passes, Mapping):
        missing = sorted(set(plans) - set(passes))
        if missing:
            raise ArgumentError(f"passes: no passes for levels {missing}")
        out = {}
        for lv in plans:
            got = tuple(passes[lv])
            if not got or not all(isinstance(p, Pass) for p in got):
                raise ArgumentTypeError(f"passes[{lv!r}]: need a non-empty list of Pass")
            out[lv] = got
        return out
    if isinstance(passes, str):
        if passes != "default":
            raise ArgumentError(f"passes={passes!r}: 'default' or a list of query groups")
        finest = list(plans)[-1]
        return {lv: _default(p.strategy.shape[1], float(slack), lv == finest)
                for lv, p in plans.items()}  # fmt: skip
    groups = list(passes)
    if not groups:
        raise ArgumentError("passes: need at least one query group")
    return {
        lv: tuple(
            _group_passes(np.asarray(p.strategy.dense(), dtype=float), p.workload, groups, slack)
        )
        for lv, p in plans.items()
    }


def one_fit(passes: Sequence[Pass], n: int) -> bool:
    """Whether the passes are one fit: a single pass over every cell, or the default
    total (with the levels below, slack 0) then detail: the total pass's fit already
    minimises the detail pass's objective among the fits with its totals (the extra
    rows are constant there), so the second pass returns it."""
    if len(passes) == 1:
        return passes[0].rows is None and passes[0].name == "cells"
    if len(passes) != 2:
        return False
    tot, det = passes
    return bool(
        tot.below and tot.slack == 0 and tot.rows is None and det.rows is None
        and np.shape(tot.queries) == (1, n) and (np.asarray(tot.queries) == 1).all()
        and np.shape(det.queries) == (n, n) and np.array_equal(det.queries, np.eye(n))
    )  # fmt: skip


def zeros_only(c: Constraints | None) -> np.ndarray | None:
    """The pairs ``c`` holds at zero, ``(k, n)`` bool, when it asks for nothing else than
    non-negativity and structural zeros (then a family is fitted as today's top-down
    fits it, :func:`~dpdask.graph._topdown_blocks.family_block`, with those pairs held
    at zero); None when it asks for more."""
    if c is None:
        return np.zeros((0, 0), dtype=bool)
    pos = np.asarray((c.queries >= 0).all(axis=1), dtype=bool)
    zeros = c.upper == 0
    simple = (
        (c.lower == 0).all() and (zeros | np.isinf(c.upper)).all() and np.isinf(c.hi).all()
        and (pos[None, :] & (c.lo <= 0) | np.isneginf(c.lo)).all()
    )  # fmt: skip
    return zeros if simple else None
