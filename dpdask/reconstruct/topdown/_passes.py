"""Multi-pass top-down estimation: queries by priority, each pass kept by the next.

A :class:`Pass` names the queries whose answers it fixes (``queries``, ``(q, n)``), the
strategy rows its objective uses (``rows``: the measurements of those queries) and the
``slack`` within which later passes keep its answers (0: exactly). For one family
(:func:`fit_family_passes`), pass ``k`` is the constrained fit
(:func:`~dpdask.reconstruct.topdown.fit_constrained_children`) of the rows ``rows_k``
alone, subject to the family's constraints, the parent's cells and every earlier pass's
answers within its slack; its answers ``Q_k x_c`` are then added to the constraints. The
last pass's fit is the family's estimate. The default (:func:`default_passes`): pass 1
the total from the strategy's total rows, pass 2 the cells from the rest (the Census
Bureau's order: the total alone first, then everything else constrained to it).

:func:`passes_tree` runs it top-down over a small in-memory hierarchy: the top level's
units without a parent, then every family from its parent's final cells, so each pass
uses every level's measurements of its queries, level by level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import LinearQuery
from dpdask.reconstruct._report import ConvergenceReport
from dpdask.reconstruct.topdown._constrained import (
    Extra,
    _weights,
    dense_strategy,
    fit_constrained_children,
    take_extra,
    weighted_gram,
)
from dpdask.reconstruct.topdown._constrained_rounding import round_constrained
from dpdask.reconstruct.topdown._constraints import Constraints
from dpdask.reconstruct.topdown._families import _group
from dpdask.reconstruct.topdown._packed import pack_binary, unpack
from dpdask.reconstruct.topdown._subtree import (
    known_totals,
    subtree_row,
    subtree_sums,
    total_estimator,
)

__all__ = ["Pass", "PassesEstimate", "default_passes", "fit_family_passes", "passes_tree"]


@dataclass(frozen=True, eq=False)
class Pass:
    """One pass of a multi-pass fit (module notes).

    Attributes
    ----------
    queries : ndarray
        ``(q, n)`` the queries whose answers this pass fixes for the later passes.
    rows : ndarray or None
        Indices of the strategy rows in this pass's objective (None: every row).
    slack : float
        Later passes keep each answer within this distance (0: equality).
    name : str
        For labels and messages.
    below : bool
        The objective also holds each child's extra rows (``extra`` of
        :func:`fit_family_passes`: the levels below's estimate of its total,
        :mod:`~dpdask.reconstruct.topdown._subtree`).
    """

    queries: np.ndarray
    rows: np.ndarray | None = None
    slack: float = 0.0
    name: str = "pass"
    below: bool = False

    def __post_init__(self) -> None:
        if not (np.isfinite(self.slack) and self.slack >= 0):
            raise ArgumentError(f"pass {self.name!r}: slack must be finite and >= 0")

    def __getstate__(self) -> dict[str, Any]:
        # sent to every worker of a release: 0/1 query rows (the cells' identity, dense:
        # 32 MB on the 2,016-cell domain) as bits
        return {**self.__dict__, "queries": pack_binary(np.asarray(self.queries))}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({**state, "queries": unpack(state["queries"])})


@dataclass
class PassesEstimate:
    """What :func:`fit_family_passes` returns.

    Attributes
    ----------
    x : ndarray
        ``(K, n)`` the last pass's fit.
    answers : list of ndarray
        Per pass, ``(K, q_k)`` its answers, kept by every later pass within its slack.
    reports : list of ConvergenceReport
        Per pass.
    """

    x: np.ndarray
    answers: list[np.ndarray] = field(default_factory=list)
    reports: list[ConvergenceReport] = field(default_factory=list)


def total_rows(A: LinearQuery | np.ndarray) -> np.ndarray:
    """Indices of the strategy rows that are a multiple of the total (every entry equal,
    not zero)."""
    Ad = dense_strategy(A)
    same = np.isclose(Ad, Ad[:, :1], rtol=0, atol=1e-12 * np.abs(Ad).max(initial=1.0)).all(1)
    out: np.ndarray = np.flatnonzero(same & (Ad[:, 0] != 0))
    return out


def default_passes(A: LinearQuery | np.ndarray, slack: float = 0.0) -> list[Pass]:
    """Pass 1 the total (from the strategy's total rows, or every row if it has none),
    pass 2 the cells (from the other rows, or every row).

    Parameters
    ----------
    A : LinearQuery or ndarray
        The level's strategy.
    slack : float
        The total's slack in pass 2.
    """
    Ad = dense_strategy(A)
    m, n = Ad.shape
    tot = total_rows(Ad)
    rest = np.setdiff1d(np.arange(m), tot)
    first = tot if tot.size else None
    second = rest if tot.size and rest.size else None
    return [
        Pass(np.ones((1, n)), first, slack, "total"),
        Pass(np.eye(n), second, 0.0, "detail"),
    ]


def fit_family_passes(
    A: LinearQuery | np.ndarray,
    Y: np.ndarray,
    parent: np.ndarray | None,
    constraints: Constraints | None = None,
    *,
    passes: Sequence[Pass] | None = None,
    weights: np.ndarray | float | None = None,
    parent_name: str = "the parent",
    extra: Extra | None = None,
) -> PassesEstimate:
    """One family fitted pass by pass (module notes).

    Parameters
    ----------
    A, Y, parent, constraints, weights, parent_name
        As for :func:`~dpdask.reconstruct.topdown.fit_constrained_children`.
    passes : sequence of Pass, optional
        Default :func:`default_passes` of ``A``.
    extra : tuple of ndarray, optional
        The children's extra rows, in the objective of the passes with ``below``
        (:func:`~dpdask.reconstruct.topdown.fit_constrained_children`).

    Returns
    -------
    PassesEstimate

    Raises
    ------
    DataError, PlanError
        As for :func:`~dpdask.reconstruct.topdown.fit_constrained_children`, in any pass.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Total, VStack
    >>> A = VStack([Total(2), Identity(2)])
    >>> Y = np.array([[4.0, 3.0, 3.0], [2.0, 0.0, 0.0]])
    >>> est = fit_family_passes(A, Y, np.array([3.0, 3.0]))
    >>> np.round(est.answers[0], 6).tolist(), np.round(est.x.sum(axis=1), 6).tolist()
    ([[4.0], [2.0]], [4.0, 2.0])
    """
    return _fit_prepared(_prepare(A, weights, passes), Y, parent, constraints, parent_name, extra)


@dataclass(frozen=True, eq=False)
class _Prepared:
    """A level's passes with their strategy rows and weights sliced once (shared by the
    level's families)."""

    n: int
    m: int
    passes: list[tuple[Pass, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    # (pass, its queries, its rows, the strategy's rows, their weights, their Gram)


def _prepare(
    A: LinearQuery | np.ndarray, weights: np.ndarray | float | None, passes: Sequence[Pass] | None
) -> _Prepared:
    Ad = dense_strategy(A)
    m, n = Ad.shape
    w = _weights(weights, m)
    todo = list(default_passes(Ad) if passes is None else passes)
    if not todo:
        raise ArgumentError("need at least one pass")
    out = []
    for ps in todo:
        Qk = np.atleast_2d(np.asarray(ps.queries, dtype=float))
        if Qk.shape[1] != n:
            raise ShapeError(f"pass {ps.name!r}: queries must have {n} columns")
        rows = np.arange(m) if ps.rows is None else np.asarray(ps.rows, dtype=np.int64)
        if rows.size == 0 or rows.min() < 0 or rows.max() >= m:
            raise ShapeError(f"pass {ps.name!r}: rows must be indices of the strategy's rows")
        sliced = Ad if ps.rows is None else Ad[rows]
        out.append((ps, Qk, rows, sliced, w[rows], weighted_gram(sliced, w[rows])))
    return _Prepared(n, m, out)


def _fit_prepared(
    prep: _Prepared, Y: np.ndarray, parent: np.ndarray | None,
    constraints: Constraints | None, parent_name: str, extra: Extra | None = None,
) -> PassesEstimate:  # fmt: skip
    Yb = np.asarray(Y, dtype=float)
    if Yb.ndim != 2 or Yb.shape[1] != prep.m:
        raise ShapeError(f"measurements have shape {Yb.shape}; expected (K, {prep.m})")
    K = Yb.shape[0]
    cons = Constraints.none(K, prep.n, None) if constraints is None else constraints
    out = PassesEstimate(np.zeros((K, prep.n)))
    for i, (ps, Qk, rows, Ak, wk, gram) in enumerate(prep.passes):
        ident = Qk.shape[0] == Qk.shape[1] and np.count_nonzero(Qk) == Qk.shape[0]
        ident = ident and bool((np.diagonal(Qk) == 1).all())  # the cells: answers are x
        est = fit_constrained_children(
            Ak, Yb if ps.rows is None else Yb[:, rows], parent, cons, weights=wk,
            check=i == 0, parent_name=parent_name, gram=gram,
            extra=extra if ps.below else None,
        )  # fmt: skip
        ans = est.x if ident else est.x @ Qk.T
        out.answers.append(ans)
        out.reports.append(est.report)
        out.x = est.x
        if i + 1 < len(prep.passes):
            labels = [f"{ps.name} answer {r}" for r in range(Qk.shape[0])]
            cons = cons.with_queries(Qk, ans - ps.slack, ans + ps.slack, labels)
    return out


def passes_tree(
    strategies: Sequence[LinearQuery | np.ndarray],
    measurements: Sequence[np.ndarray],
    parents: Sequence[np.ndarray],
    *,
    weights: Sequence[np.ndarray | float | None] | None = None,
    constraints: Sequence[Constraints | None] | None = None,
    passes: Sequence[Sequence[Pass] | None] | None = None,
    integer: bool = False,
) -> list[PassesEstimate]:
    """Multi-pass top-down estimates of a small in-memory hierarchy.

    Parameters
    ----------
    strategies, measurements, parents, weights
        As for :func:`~dpdask.reconstruct.topdown.topdown_tree` (coarsest level first).
    constraints : sequence, optional
        Per level, the units' :class:`Constraints` (or None: non-negativity). A parent
        level's invariants must agree with its children's (e.g. the children's
        :meth:`Constraints.aggregate`).
    passes : sequence, optional
        Per level, its passes (None: :func:`default_passes` of the level's strategy).
    integer : bool
        Integer output: each level's fit rounded by
        :func:`~dpdask.reconstruct.topdown.round_constrained` (keeping its passes'
        answers within 1, its constraints and its integer parent) before the next
        level splits it.

    Returns
    -------
    list of PassesEstimate
        Per level: ``x`` ``(units, n)`` (``int64`` when ``integer``), and per pass the
        units' fractional answers.
    """
    L = len(strategies)
    if L == 0 or len(measurements) != L or len(parents) != L - 1:
        raise ArgumentError("need one strategy and one measurement array per level, L - 1 parents")
    w = [None] * L if weights is None else list(weights)
    cs = [None] * L if constraints is None else list(constraints)
    ps = [None] * L if passes is None else list(passes)
    if len(w) != L or len(cs) != L or len(ps) != L:
        raise ShapeError("need one weights, constraints and passes entry per level")

    preps = [_prepare(strategies[lvl], w[lvl], ps[lvl]) for lvl in range(L)]

    def level_passes(lvl: int) -> list[Pass]:
        return [p[0] for p in preps[lvl].passes]

    extras = _subtree_rows(strategies, measurements, parents, w, cs, preps)
    top = _fit_prepared(preps[0], measurements[0], None, cs[0], "the top level", extras[0])
    if integer:
        top.x = round_constrained(top.x, None, cs[0], passes=level_passes(0))
    out = [top]
    for lvl in range(1, L):
        Yl = np.asarray(measurements[lvl], dtype=float)
        prev = out[-1]
        groups = _group(parents[lvl - 1], prev.x.shape[0], Yl.shape[0], lvl)
        n = prev.x.shape[1]
        c_lvl = cs[lvl]
        X = np.zeros((Yl.shape[0], n), dtype=np.int64 if integer else float)
        answers: list[np.ndarray] | None = None
        reports: list[ConvergenceReport] = []
        for pi, ch in enumerate(groups):
            if ch.size == 0:
                continue
            est = _fit_prepared(
                preps[lvl], Yl[ch], prev.x[pi], None if c_lvl is None else c_lvl.take(ch),
                f"level {lvl - 1} unit {pi}", take_extra(extras[lvl], ch),
            )  # fmt: skip
            X[ch] = (
                round_constrained(
                    est.x, prev.x[pi], None if c_lvl is None else c_lvl.take(ch),
                    passes=level_passes(lvl), parent_name=f"level {lvl - 1} unit {pi}",
                )
                if integer
                else est.x
            )  # fmt: skip
            if answers is None:
                answers = [np.zeros((Yl.shape[0], a.shape[1])) for a in est.answers]
            for a, got in zip(answers, est.answers, strict=True):
                a[ch] = got
            reports.extend(est.reports)
        out.append(PassesEstimate(X, answers or [], reports))
    return out


def _subtree_rows(
    strategies: Sequence[LinearQuery | np.ndarray], measurements: Sequence[np.ndarray],
    parents: Sequence[np.ndarray], weights: Sequence[np.ndarray | float | None],
    constraints: Sequence[Constraints | None], preps: Sequence[_Prepared],
) -> list[Extra | None]:  # fmt: skip
    """Each level's extra rows, the levels below's estimates of its units' totals
    (:mod:`~dpdask.reconstruct.topdown._subtree`), where a pass of the level wants them."""
    L = len(strategies)
    wants = [any(p[0].below for p in prep.passes) for prep in preps]
    out: list[Extra | None] = [None] * L
    if L < 2 or not any(wants[:-1]):
        return out
    own = []
    for lvl in range(1, L):
        Ad = dense_strategy(strategies[lvl])
        Y = np.asarray(measurements[lvl], dtype=float)
        est = total_estimator(Ad, _weights(weights[lvl], Ad.shape[0]))
        u, s = (Y @ est[0], np.full(Y.shape[0], est[1])) if est else (
            np.zeros(Y.shape[0]), np.full(Y.shape[0], np.inf))  # fmt: skip
        c = constraints[lvl]
        if c is not None:
            known, value = known_totals(c)
            u, s = np.where(known, value, u), np.where(known, 0.0, s)
        own.append((u, s))
    sizes = [np.asarray(m).shape[0] for m in measurements]
    sums = subtree_sums(own, parents, sizes)
    n = preps[0].n
    for lvl in range(L - 1):
        if wants[lvl]:
            out[lvl] = subtree_row(*sums[lvl], n)
    return out
