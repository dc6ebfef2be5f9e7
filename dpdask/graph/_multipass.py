"""Multi-pass top-down estimation with constraints in the release graph.

``release(..., reconstruct="topdown", passes=..., constraints=...)`` (issue 33): the
fused top-down path of :mod:`dpdask.graph._topdown` (one task per chunk of whole
families, measurements never leaving it), with every fit a multi-pass constrained fit:

* the top level's units (no parent) by
  :func:`~dpdask.reconstruct.topdown.fit_family_passes` with ``parent=None``
  (:func:`multipass_top_block`), so a top-level invariant such as the state's total is
  an equality of the top fit;
* every family, inside its parent's final estimate, by the same passes
  (:func:`multipass_family_block`): pass ``k`` fits the level's measurements of the
  pass's queries, subject to the parent's cells, the children's constraints and every
  earlier pass's answers within its slack. Level by level, every level's measurements of
  each pass's queries are used, as :func:`~dpdask.reconstruct.topdown.passes_tree` does
  on a small in-memory hierarchy;
* what a pass with ``below`` fits (the default total pass of every level but the finest,
  :mod:`dpdask.graph._pass_options`): every one of the unit's measurements, and one
  extra row per unit, the levels below's estimate of its total
  (:mod:`dpdask.graph._subtree`, a sweep before the fits), so a tract's total uses its
  blocks' measurements as bottom-up least squares does, and its non-negative fit too;
* what another pass before the last fits (:class:`_Objective`): the least-squares
  estimates of its queries from *all* the unit's measurements, ``Q G^+ A^T W y`` with
  their variances ``diag(Q G^+ Q^T)`` as weights (``G = A^T W A``), rather than the
  strategy's rows that are the queries themselves (a pass whose queries are not
  estimable falls back to its rows). The last pass fits every measurement;
* with ``integer`` every fit is rounded by
  :func:`~dpdask.reconstruct.topdown.round_constrained`, keeping its parent, its
  constraints and its passes' answers (within 1).

Constraints are public (from the agency's invariants and the units' public attributes):
:func:`level_constraints` completes them up the hierarchy (a level's bounds meet the sum
of its children's, :meth:`~dpdask.reconstruct.topdown.Constraints.aggregate`), so an
invariant of a level holds at every level above, and checks them with
:func:`~dpdask.reconstruct.topdown.check_hierarchy` before anything is charged. Each task
gets its chunk's rows (:meth:`~dpdask.reconstruct.topdown.Constraints.take`); the
simulation of the estimator's error (:mod:`dpdask.graph._simulate`) runs the same tasks,
with the same constraints and passes.

The ``passes`` option is resolved to each level's passes by
:func:`~dpdask.graph._pass_options.resolve_passes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import sparse
from dask.base import tokenize

from dpdask.errors import ArgumentError, ArgumentTypeError, ShapeError
from dpdask.graph._blas import task_blas
from dpdask.graph._blocks import ChunkContext, measure_block, trim_heap, tune_allocator
from dpdask.graph._chunked import (
    ChunkedConstraints,
    chunked_levels,
    constraint_counts,
    level_chunk_constraints,
)
from dpdask.graph._pass_options import one_fit, zeros_only
from dpdask.graph._subtree import below_rows
from dpdask.graph._topdown_blocks import (
    _fitter,
    _info,
    _report,
    parent_chunks,
    parent_rows,
    record_rounding,
    spine_family,
)
from dpdask.graph._unbiased import Unbiased, write_unbiased
from dpdask.reconstruct.topdown import (
    Constraints,
    Pass,
    check_family,
    check_hierarchy,
    fit_family_passes,
    round_constrained,
    subtree_row,
    take_extra,
)

if TYPE_CHECKING:
    from dpdask.graph._release import Release
    from dpdask.graph._topdown import LevelShared

__all__ = [
    "MULTIPASS_LABEL",
    "level_constraints",
    "multipass_family_block",
    "multipass_task",
    "multipass_top_block",
    "passes_token",
]

MULTIPASS_LABEL = "multi-pass top-down with constraints"
"""The estimator's name in labels (:mod:`dpdask.graph._uncertainty`)."""


_OBJECTIVES: dict[str, _Objective] = {}  # per worker process: each level's, built once


@dataclass(frozen=True, eq=False)
class _Objective:
    """A level's fit by passes on its measurements and, for every pass but the last,
    the least-squares estimates of the pass's queries from all of them (module notes):
    the strategy ``A`` with those queries' rows below it, the rows' weights, the passes
    on those rows and ``P``, ``(m, r)``: ``y @ P`` are the estimates from ``y``."""

    A: np.ndarray
    weights: np.ndarray
    passes: tuple[Pass, ...]
    P: np.ndarray

    def measurements(self, y: np.ndarray) -> np.ndarray:
        """The rows the passes fit: ``y`` and the estimates of the passes' queries."""
        out: np.ndarray = np.hstack([y, y @ self.P])
        return out


def _build(A: np.ndarray, weight: float, passes: Sequence[Pass]) -> _Objective:
    m = A.shape[0]
    G = weight * (A.T @ A)
    need = any(not ps.below for ps in passes[:-1])  # a pass fitted from estimates
    Gp = np.linalg.pinv(G, hermitian=True) if need else G
    rows: list[np.ndarray] = []
    blocks: list[np.ndarray] = []
    variances: list[np.ndarray] = []
    out: list[Pass] = []
    start = m
    for k, ps in enumerate(passes):
        Q = np.atleast_2d(np.asarray(ps.queries, dtype=float))
        last = k == len(passes) - 1
        if (
            last
            or ps.below
            or not np.allclose(Q @ Gp @ G, Q, rtol=0, atol=1e-8 * max(1.0, np.abs(Q).max()))
        ):  # its own rows (the last: every one), or when Q is not estimable
            keep = np.arange(m) if last or ps.rows is None else ps.rows
            out.append(Pass(ps.queries, keep, ps.slack, ps.name, ps.below))
            continue
        B = Q @ Gp  # (q, n): estimates Q G^+ A^T W y, variances diag(Q G^+ Q^T)
        blocks.append(weight * (A @ B.T))
        variances.append(np.maximum(np.einsum("ij,ij->i", B, Q), 1e-300))
        rows.append(Q)
        out.append(Pass(ps.queries, np.arange(start, start + Q.shape[0]), ps.slack, ps.name))
        start += Q.shape[0]
    if not rows:
        return _Objective(A, np.full(m, weight), tuple(out), np.zeros((m, 0)))
    w = np.concatenate([np.full(m, weight), 1.0 / np.concatenate(variances)])
    return _Objective(np.vstack([A, *rows]), w, tuple(out), np.hstack(blocks))


def _objective(plan: Any, passes: Sequence[Pass], token: str) -> _Objective:
    obj = _OBJECTIVES.get(token)
    if obj is None:
        A = np.asarray(plan.strategy.dense(), dtype=float)
        obj = _OBJECTIVES[token] = _build(A, 1.0 / float(plan.row_variance), passes)
    return obj


def _union_queries(cs: Sequence[Constraints]) -> tuple[np.ndarray, tuple[str, ...]]:
    """The query rows of every level's constraints, each once (same row and label)."""
    rows: list[np.ndarray] = []
    labels: list[str] = []
    for c in cs:
        for q, lab in zip(c.queries, c.labels, strict=True):
            if not any(
                lab == x and np.array_equal(q, r) for r, x in zip(rows, labels, strict=True)
            ):
                rows.append(np.asarray(q, dtype=float))
                labels.append(lab)
    n = cs[0].n
    return (np.stack(rows) if rows else np.zeros((0, n))), tuple(labels)


def _expand(c: Constraints, Q: np.ndarray, labels: tuple[str, ...]) -> Constraints:
    """``c`` on the query rows ``Q`` (unbounded on the rows it does not have)."""
    lo = np.full((c.k, Q.shape[0]), -np.inf)
    hi = np.full((c.k, Q.shape[0]), np.inf)
    for j, (q, lab) in enumerate(zip(c.queries, c.labels, strict=True)):
        r = next(
            i for i, (row, x) in enumerate(zip(Q, labels, strict=True))
            if x == lab and np.array_equal(row, q)
        )  # fmt: skip
        lo[:, r] = np.maximum(lo[:, r], c.lo[:, j])
        hi[:, r] = np.minimum(hi[:, r], c.hi[:, j])
    return Constraints(c.lower, c.upper, Q, lo, hi, c.units, labels)


def _meet(a: Constraints, b: Constraints) -> Constraints:
    """Both constraints at once (same units, same query rows)."""
    return Constraints(
        np.maximum(a.lower, b.lower), np.minimum(a.upper, b.upper), a.queries,
        np.maximum(a.lo, b.lo), np.minimum(a.hi, b.hi), a.units, a.labels,
    )  # fmt: skip


def level_constraints(
    given: Mapping[str, Constraints | ChunkedConstraints] | None,
    levels: Sequence[str],
    units: Sequence[Sequence[str]],
    parents: Sequence[np.ndarray],
    n: int,
) -> Mapping[str, Constraints | ChunkedConstraints] | None:
    """Every released level's constraints (module notes): the ones ``given`` (by level
    name, a row per unit in the geography's order) met with the sum of the level
    below's, on the same query rows at every level; checked from public input alone.
    Chunked constraints (:class:`~dpdask.graph._chunked.ChunkedConstraints`, one per
    level, complete up the hierarchy) are checked and kept as they are
    (:func:`~dpdask.graph._chunked.chunked_levels`): nothing is built densely.

    Parameters
    ----------
    given : mapping of str to Constraints, or None
        The caller's, for some of the released levels.
    levels : sequence of str
        The released levels, coarsest first.
    units : sequence of sequence of str
        Each level's unit ids (for messages).
    parents : sequence of ndarray
        Each level's parent index in the level above (all but the coarsest).
    n : int
        The domain's cells.

    Raises
    ------
    ArgumentError, ArgumentTypeError, ShapeError
        For a level that is not released, something that is not a ``Constraints``, or
        one of the wrong shape.
    DataError
        For conflicting constraints (:func:`~dpdask.reconstruct.topdown.check_hierarchy`),
        naming the unit.
    """
    if given is None:
        return None
    if not isinstance(given, Mapping):
        raise ArgumentTypeError("constraints must map level names to Constraints")
    unknown = sorted(set(given) - set(levels))
    if unknown:
        raise ArgumentError(f"constraints: {unknown} are not released levels {list(levels)}")
    if any(not isinstance(c, Constraints) for c in given.values()):
        return chunked_levels(given, levels, units, n)
    dense = {lv: c for lv, c in given.items() if isinstance(c, Constraints)}  # all of them
    for lv, c in dense.items():
        k = len(units[list(levels).index(lv)])
        if (c.k, c.n) != (k, n):
            raise ShapeError(
                f"constraints[{lv!r}] holds {c.k} units of {c.n} cells; the level has {k} units "
                f"of {n} cells"
            )
    Q, labels = _union_queries(list(dense.values()))
    L = len(levels)
    out: list[Constraints] = [Constraints.none(0, n)] * L
    for i in range(L - 1, -1, -1):
        ids = tuple(str(u) for u in units[i])
        mine = dense.get(levels[i])
        here = _expand(Constraints.none(len(ids), n, ids) if mine is None else mine, Q, labels)
        if i + 1 < L:
            below = out[i + 1].aggregate(np.asarray(parents[i], dtype=np.int64), ids)
            here = _meet(here, below)
        out[i] = here
    check_hierarchy(out, [np.asarray(p, dtype=np.int64) for p in parents])
    return dict(zip(levels, out, strict=True))


def _rounding_passes(passes: Sequence[Pass]) -> Sequence[Pass] | None:
    """The passes the rounder keeps: a single pass over the cells keeps the total
    (the rounder's default), as the default passes do."""
    return None if len(passes) == 1 and passes[0].name == "cells" else passes


def multipass_top_block(
    x: Any,
    key: Any,
    plan: Any,
    passes: Sequence[Pass],
    cons: Constraints | None,
    ctx: ChunkContext,
    chunk: int,
    token: str,
    integer: bool,
    report_dir: str | None,
    unbiased: Unbiased | None = None,
    measure: Any = None,
    below: tuple[np.ndarray, np.ndarray] | None = None,
) -> sparse.COO:
    """The top level's units of one chunk, each fitted pass by pass within its
    constraints (no parent); rounded with ``integer``. ``below``: the units' subtree
    sums and variances (:mod:`~dpdask.graph._subtree`)."""
    tune_allocator()
    trim_heap()
    y = (measure or measure_block)(x, plan, key, ctx, _info(chunk))
    write_unbiased(plan.strategy, y, unbiased, chunk)
    with task_blas():
        obj = _objective(plan, passes, token)
        n = plan.strategy.shape[1]
        # the default passes are one fit (_one_fit): the total pass's is the detail pass's
        todo = obj.passes[:1] if one_fit(passes, n) else obj.passes
        est = fit_family_passes(
            obj.A, obj.measurements(np.asarray(y, dtype=float)), None, cons,
            passes=todo, weights=obj.weights, parent_name="the top level",
            extra=None if below is None else subtree_row(*below, n),
        )  # fmt: skip
        X = np.maximum(est.x, 0.0)
        if integer:
            Xr = round_constrained(X, None, cons, passes=_rounding_passes(passes)).astype(float)
            gap = float(np.abs(Xr.sum(axis=1) - X.sum(axis=1)).max(initial=0.0))
            record_rounding(report_dir, ctx.level, chunk, gap)
            X = Xr
    failed = [{"pass": p.name, **r.to_dict()} for p, r in zip(todo, est.reports, strict=True)
              if not r.converged]  # fmt: skip
    _report(report_dir, ctx.level, chunk, failed)
    return sparse.COO.from_numpy(X)


def multipass_family_block(
    x: Any,
    key: Any,
    parent_blocks: list[Any],
    parent_starts: list[int],
    parents: np.ndarray,
    plan: Any,
    passes: Sequence[Pass],
    cons: Constraints | None,
    ctx: ChunkContext,
    chunk: int,
    token: str,
    integer: bool,
    report_dir: str | None,
    unbiased: Unbiased | None = None,
    measure: Any = None,
    below: tuple[np.ndarray, np.ndarray] | None = None,
) -> sparse.COO:
    """The children of every family of one chunk, fitted pass by pass inside their
    parent's final estimate and within their constraints (``cons``: the chunk's units'),
    as :func:`~dpdask.graph._topdown_blocks.family_block` does without them; ``below``
    as for :func:`multipass_top_block`."""
    tune_allocator()
    trim_heap()
    parents = np.asarray(parents, dtype=np.int64)
    first, last = int(parents[0]), int(parents[-1])
    P = parent_rows(parent_blocks, parent_starts, first, last)
    y = np.asarray(
        (measure or measure_block)(x, plan, key, ctx, _info(chunk)),
        dtype=float,
    )
    write_unbiased(plan.strategy, y, unbiased, chunk)
    g, n = y.shape[0], plan.strategy.shape[1]
    X = np.zeros((g, n))
    failed: list[dict[str, Any]] = []
    gap = 0.0  # the largest |integer - fractional| unit total (with ``integer``)
    starts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]])
    with task_blas():
        obj = _objective(plan, passes, token)
        Y = obj.measurements(y)
        extra = None if below is None else subtree_row(*below, n)
        plain = one_fit(passes, n)
        for a, b in zip(starts, [*starts[1:], g], strict=True):
            p = P[[int(parents[a]) - first]].toarray().reshape(-1)
            if integer:
                p = np.rint(p)
            kids = None if cons is None else cons.take(np.arange(a, b))
            name = f"{ctx.level} parent {int(parents[a])}"
            if spine_family(y, a, b):  # its estimate: the parent's, within its constraints
                if kids is not None:
                    check_family(p, kids, parent_name=name)
                X[a] = p
                continue
            zeros = zeros_only(kids) if plain else None
            held = None if zeros is None or not zeros.any() else zeros
            fit = None if zeros is None else _fitter(plan.strategy, 1 / plan.row_variance, token)
            if fit is not None and ((held is None and extra is None) or fit.method == "fista"):
                # today's top-down fit, exactly, with the structural zeros held
                if kids is not None:
                    check_family(p, kids, parent_name=name)
                tot = None if extra is None else (extra[1][a:b, 0], extra[2][a:b, 0])
                est0 = fit.on_support(p, Y=y[a:b], fixed=held, totals=tot)
                Xf = np.zeros((b - a, n))
                Xf[:, np.asarray(est0.idx)] = est0.x
                reports = [("cells", est0.report)]
            else:
                est = fit_family_passes(
                    obj.A, Y[a:b], p, kids, passes=obj.passes, weights=obj.weights,
                    parent_name=name, extra=take_extra(extra, slice(a, b)),
                )  # fmt: skip
                Xf = est.x
                reports = [(ps.name, r) for ps, r in zip(passes, est.reports, strict=True)]
            X[a:b] = Xf
            if integer:
                X[a:b] = round_constrained(
                    Xf, p, kids, passes=_rounding_passes(passes), parent_name=name
                )
                gap = max(gap, float(np.abs(X[a:b].sum(axis=1) - Xf.sum(axis=1)).max()))
            failed += [{"parent": int(parents[a]), "pass": nm, **r.to_dict()}
                       for nm, r in reports if not r.converged]  # fmt: skip
    if integer:
        record_rounding(report_dir, ctx.level, chunk, gap)
    _report(report_dir, ctx.level, chunk, failed)
    return sparse.COO.from_numpy(X)


def passes_token(fit_token: str, passes: Sequence[Pass]) -> str:
    """What a worker's cached objective of a level depends on: its strategy and noise
    (``fit_token``) and its passes."""
    return tokenize(
        fit_token, [(p.name, p.slack, p.rows, np.shape(p.queries), float(np.sum(p.queries)),
                     p.below) for p in passes],
    )  # fmt: skip


def multipass_task(
    rel: Release,
    i: int,
    L: Any,
    bounds: np.ndarray,
    block: Any,
    sk: Any,
    prev: tuple[str, np.ndarray] | None,
    k: int,
    ctx: ChunkContext,
    shared: LevelShared,
    reports: str | None,
    measure: Any = None,
    below: str | None = None,
) -> tuple[Any, ...]:
    """The task that measures and fits chunk ``k`` of level ``i`` by passes, within the
    chunk's constraints (arguments as :func:`~dpdask.graph._topdown.fit_task`)."""
    passes, token, unbiased = shared.passes, shared.token, shared.unbiased
    if rel.passes is None or passes is None:  # pragma: no cover - fit_task's guard
        raise ShapeError("a multi-pass task needs the release's passes")
    # the chunk's rows of its level's constraints (None: non-negativity alone)
    cons = level_chunk_constraints(rel.constraints, L.name, int(bounds[k]), int(bounds[k + 1]))
    sums = None  # the chunk's subtree sums, sliced from the sweep's task
    if below is not None and any(p.below for p in rel.passes[L.name]) and i + 1 < len(rel.released):
        sums = (below_rows, below, i, int(bounds[k]), int(bounds[k + 1]))
    if prev is None:
        return (
            multipass_top_block, block, sk, shared.plan, passes, cons, ctx, k, token,
            rel.integer, reports, unbiased, measure, sums,
        )  # fmt: skip
    p = rel.lc.parents[i - 1][bounds[k] : bounds[k + 1]]
    keys, starts = parent_chunks(p, *prev)
    return (
        multipass_family_block, block, sk, keys, starts,
        p, shared.plan, passes, cons, ctx, k, token, rel.integer, reports, unbiased, measure, sums,
    )  # fmt: skip


def multipass_summary(rel: Release) -> dict[str, Any]:
    """What :meth:`Release.summary` says of a multi-pass release's passes and
    constraints (nothing for another release)."""
    if rel.passes is None:
        return {}
    cons = {} if rel.constraints is None else rel.constraints
    return {
        "passes": {lv: [p.name for p in ps] for lv, ps in rel.passes.items()},
        "slack": rel.slack,
        "constraints": {
            lv: {
                "queries": list(c.labels),
                **constraint_counts(c),
            }
            for lv, c in cons.items()
        },
    }
