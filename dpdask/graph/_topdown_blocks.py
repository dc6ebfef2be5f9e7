"""The per-chunk work of a top-down release: measure, then fit (NumPy and sparse in and out).

These functions run inside Dask tasks (:mod:`dpdask.graph._topdown`). Each measures
one chunk of one level with the chunk's keyed noise (the chunk's
:class:`~dpdask.noise.StreamKey`, never the release's key) and fits it at once, so that
measurements never leave the task and never reach the disk: what is kept is the fitted
estimate, a :class:`sparse.COO` block ``(g, n)`` (geographies by flat cells).

* :func:`top_block`: the top level, non-negative least squares per unit (in the metric
  of the level's strategy, from its least-squares estimate when the strategy has a
  structured pseudo-inverse of full column rank, else from the measurements), rounded
  to the nearest integers with ``integer``;
* :func:`family_block`: a chunk of whole families of a finer level, the children of
  each parent fitted jointly inside the parent's support
  (:func:`dpdask.reconstruct.topdown.children_fitter`, ``on_support``), with
  ``integer`` rounded by the controlled rounding of
  :func:`dpdask.reconstruct.topdown.round_children` against the integer parent.

A task's measurement is the one :func:`~dpdask.graph._blocks.measure_block` takes for
its chunk (same identity, same stream), so a retried or resumed task reproduces it bit
for bit. Fits that stop before converging are reported in ``report_dir``.

With ``unbiased`` (:class:`~dpdask.graph._unbiased.Unbiased`) a task also checkpoints
the least-squares answers of its measurements (:func:`~dpdask.graph._unbiased.write_unbiased`),
so that they are computed where the measurements live. ``measure`` replaces
:func:`~dpdask.graph._blocks.measure_block` (same arguments): the simulation of the
estimator's error (:mod:`dpdask.graph._simulate`) runs the same fits on noise drawn
around the published estimate.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import sparse
from scipy import sparse as sp

from dpdask.errors import ShapeError
from dpdask.graph import _plans
from dpdask.graph._blas import task_blas
from dpdask.graph._blocks import ChunkContext, measure_block, trim_heap, tune_allocator
from dpdask.graph._unbiased import Unbiased, write_unbiased
from dpdask.linalg import LinearQuery
from dpdask.reconstruct import nnls
from dpdask.reconstruct.nnls import nonnegative_fitter
from dpdask.reconstruct.topdown import (
    KEEP_TOTALS_CELLS,
    children_fitter,
    round_children,
    round_top,
)

__all__ = ["family_block", "parent_rows", "record_rounding", "spine_family", "top_block"]

_FITTERS: dict[str, Any] = {}  # per worker process: what a level's fits share


def _info(chunk: int) -> dict[Any, Any]:
    """The ``block_info`` that names chunk ``chunk`` to :func:`measure_block`."""
    return {0: {"chunk-location": (chunk, 0)}}


def _report(report_dir: str | None, level: str, chunk: int, failed: list[dict[str, Any]]) -> None:
    if not failed or report_dir is None:
        return
    info = {"level": level, "chunk": chunk, **failed[0], "units": len(failed)}
    path = pathlib.Path(report_dir) / f"{level}-{chunk}.json"
    path.write_text(json.dumps(info, default=str))


def spine_family(y: np.ndarray, a: int | np.integer[Any], b: int | np.integer[Any]) -> bool:
    """Whether the family of units ``a:b`` of a chunk's measurements ``y`` is a spine
    unit: its parent's only child, whose measurement the spine option discarded (NaN,
    :func:`~dpdask.graph._spine.discarded`); its estimate is its parent's."""
    return b - a == 1 and bool(np.isnan(y[a]).all())


def record_rounding(report_dir: str | None, level: str, chunk: int, gap: float) -> None:
    """Keep a chunk's rounding gap, the largest ``|integer - fractional|`` unit total of
    its fits, beside the reports (``<work>/rounding``; the release's summary gives each
    level's largest, ``rounding_gap``)."""
    if report_dir is None:
        return
    folder = pathlib.Path(report_dir).parent / "rounding"
    folder.mkdir(exist_ok=True)
    info = {"level": level, "chunk": chunk, "gap": gap}
    (folder / f"{level}-{chunk}.json").write_text(json.dumps(info))


def _coo(
    rows: list[Any], cells: list[Any], values: list[Any], shape: tuple[int, int]
) -> sparse.COO:
    """The chunk's entries, families in order, each row-major over its sorted support:
    sorted and unique, which the flags tell the constructor (it then skips a check that
    costs a numba compilation in every worker)."""
    if not rows:
        coords, data = np.zeros((2, 0), dtype=np.int64), np.zeros(0)
    else:
        coords = np.stack([np.concatenate(rows), np.concatenate(cells)]).astype(np.int64)
        data = np.concatenate(values).astype(np.float64)
    return sparse.COO(coords, data, shape=shape, sorted=True, has_duplicates=False)


def top_block(
    x: Any,
    key: Any,
    plan: Any,
    ctx: ChunkContext,
    chunk: int,
    integer: bool,
    report_dir: str | None,
    unbiased: Unbiased | None = None,
    measure: Any = None,
) -> sparse.COO:
    """The top level's non-negative (integer with ``integer``) estimates of one chunk
    (module notes for ``unbiased`` and ``measure``)."""
    tune_allocator()
    trim_heap()
    y = (measure or measure_block)(x, plan, key, ctx, _info(chunk))
    write_unbiased(plan.strategy, y, unbiased, chunk)
    g, n = y.shape[0], plan.strategy.shape[1]
    weight = 1.0 / plan.row_variance
    with task_blas():
        # fused least squares is A^+ y: fit it in the strategy's metric
        pinv = _plans.structured_inverse(plan) if _plans.fused(plan, "ls") else None
        if pinv is not None:
            z = np.asarray(pinv.apply(y), dtype=np.float64).reshape(g, n)
            fit = nonnegative_fitter(plan.strategy, weight)
            ests = [fit(row) for row in z]
        else:
            ests = [nnls(plan.strategy, row, weight) for row in y]
    X = np.stack([np.maximum(np.asarray(e.x, dtype=np.float64), 0.0) for e in ests])
    failed = [
        {"row": r, **e.report.to_dict()} for r, e in enumerate(ests) if not e.report.converged
    ]
    _report(report_dir, ctx.level, chunk, failed)
    if integer:
        X = round_top(X).astype(np.float64)
    return sparse.COO.from_numpy(X)


def parent_rows(blocks: list[Any], starts: list[int], first: int, last: int) -> sp.csr_array:
    """Rows ``first..last`` (global indices) of a level, from its blocks that cover them
    (``starts[j]``: the global index of block ``j``'s first row), as one CSR array."""
    pieces = []
    for block, start in zip(blocks, starts, strict=True):
        csr = sp.csr_array(block.tocsr() if hasattr(block, "tocsr") else block)
        lo, hi = max(first, start), min(last + 1, start + csr.shape[0])
        if hi > lo:
            pieces.append(csr[lo - start : hi - start])
    out = sp.vstack(pieces, format="csr") if len(pieces) > 1 else pieces[0]
    if out.shape[0] != last - first + 1:
        raise ShapeError(f"parent blocks hold {out.shape[0]} of rows {first}..{last}")
    return sp.csr_array(out)


def parent_chunks(
    parents: np.ndarray, name: str, starts: np.ndarray
) -> tuple[list[tuple[str, int]], list[int]]:
    """The task keys ``(name, j)`` and first rows of the level above's chunks that hold
    ``parents`` (non-decreasing global indices; ``starts``: each chunk's first row), the
    arguments :func:`parent_rows` reads them back from."""
    js = range(
        int(np.searchsorted(starts, parents[0], side="right") - 1),
        int(np.searchsorted(starts, parents[-1], side="right")),
    )
    return [(name, j) for j in js], [int(starts[j]) for j in js]


def _fitter(A: LinearQuery, weight: float, token: str) -> Any:
    fit = _FITTERS.get(token)
    if fit is None:
        fit = _FITTERS[token] = children_fitter(A, weight)
    return fit


def _on_support(fit: Any, parent: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any]:
    """The children's fit on the parent's support: ``(idx, x (K, |S|), report)``."""
    est = fit.on_support(parent, Y=Y)
    return np.asarray(est.idx), np.asarray(est.x, dtype=np.float64), est.report


@dataclass(frozen=True)
class _Copied:
    """The report of a child copied from its parent (:mod:`~dpdask.graph._spine`)."""

    converged: bool = True


def _copy(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any]:
    """An only child's estimate on the parent's support: the parent's, exactly."""
    idx = np.flatnonzero(parent)
    return idx, parent[idx][None, :].astype(np.float64), _Copied()


def family_block(
    x: Any,
    key: Any,
    parent_blocks: list[Any],
    parent_starts: list[int],
    parents: np.ndarray,
    plan: Any,
    ctx: ChunkContext,
    chunk: int,
    token: str,
    integer: bool,
    report_dir: str | None,
    unbiased: Unbiased | None = None,
    measure: Any = None,
) -> sparse.COO:
    """The children of every family of one chunk, measured and fitted inside their parents.

    ``parents`` holds each of the chunk's units' parent (global index in the level
    above, non-decreasing; a family is never split between chunks); ``parent_blocks``
    are the blocks of the level above that hold those parents (``parent_starts``: the
    global index of each block's first row).
    """
    tune_allocator()
    trim_heap()
    parents = np.asarray(parents, dtype=np.int64)
    first, last = int(parents[0]), int(parents[-1])
    P = parent_rows(parent_blocks, parent_starts, first, last)
    y = (measure or measure_block)(x, plan, key, ctx, _info(chunk))
    write_unbiased(plan.strategy, y, unbiased, chunk)
    g, n = y.shape[0], plan.strategy.shape[1]
    fit = _fitter(plan.strategy, 1.0 / plan.row_variance, token)
    rows: list[np.ndarray] = []
    cells: list[np.ndarray] = []
    values: list[np.ndarray] = []
    failed = []
    starts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]])
    with task_blas():
        for a, b in zip(starts, [*starts[1:], g], strict=True):
            p = P[[int(parents[a]) - first]].toarray().reshape(-1)
            spine = spine_family(y, a, b)  # its estimate: the parent's
            idx, X, report = _copy(p) if spine else _on_support(fit, p, y[a:b])
            if integer and not spine:
                X = round_children(X, np.rint(p[idx]), keep_totals=n >= KEEP_TOTALS_CELLS)
                X = X.astype(np.float64)
            r, c = np.nonzero(X)
            rows.append(a + r)
            cells.append(idx[c])
            values.append(X[r, c])
            if not report.converged:
                failed.append({"parent": int(parents[a]), **report.to_dict()})
    _report(report_dir, ctx.level, chunk, failed)
    return _coo(rows, cells, values, (g, n))
