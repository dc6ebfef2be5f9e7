"""Unbiased least-squares answers beside a non-linear estimator's post-processed ones.

A top-down (or integer), NNLS, WNNLS or ADMM estimate is not linear in the
measurements: its error is not the least-squares variance. Beside it, every level
publishes the least-squares answer
from that level's measurements alone, ``Q A^+ y`` per unit (``A`` the level's measured
strategy, ``y`` the unit's noisy measurements, ``Q`` some workload queries), which is
unbiased (``Q A^+ A = Q`` for queries in the row space of ``A``; always so for a
strategy of full column rank), with its exact variance
``sigma^2 diag(Q A^+ A^+^T Q^T)`` at the noise actually drawn (``sigma^2`` the plan's
:attr:`~dpdask.strategy.Plan.row_variance`, :func:`dpdask.noise.draw_variance`).

Top-down: the answers are computed in the task that measures the chunk
(``measure-reconstruct-<level>``, :mod:`dpdask.graph._topdown_blocks`), so the
measurements still never leave it, and checkpointed beside its estimate. NNLS, WNNLS
and ADMM (:mod:`dpdask.graph._graph`): a task per chunk (``unbiased-<level>``) from the
measurements, or from the fused least-squares estimate ``x + A^+ z`` (which is
``A^+ y``), checkpointed before the chunk's marker. What is
published, per level (a group ``<level>/unbiased``)::

    estimate   float64 (geography, unbiased_query)   the unbiased answers (persons)
    variance   float64 (unbiased_query,)             their exact variances (persons^2)
    unbiased_query        str (unbiased_query,)      the query's workload_query label
    unbiased_group        str (unbiased_query,)      its workload group
    unbiased_description  str (unbiased_query,)      what it counts

Which queries (:func:`unbiased_queries`): the workload's query groups (the parts of a
stacked workload) in order, each kept while the level's units times the kept queries
stay within ``limit`` (default :data:`UNBIASED_LIMIT`), and always the total; the group
attribute ``skipped_groups`` lists the others. ``A^+`` is formed densely, once per
worker process and level, where the strategy has at most :data:`DENSE_PINV_ENTRIES`
entries; above that nothing is published and the group's attribute ``skipped`` says why.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from dask.base import tokenize

from dpdask.graph._blas import task_blas
from dpdask.graph._checkpoint import read_chunks
from dpdask.graph._output import LevelGroup, add_array
from dpdask.graph._uncertainty import LINEAR, UNBIASED, uncertainty_attrs
from dpdask.linalg import LinearQuery, Ones, VStack, apply_rows
from dpdask.publish import query_descriptions, query_labels

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = [
    "DENSE_PINV_ENTRIES",
    "QUERY",
    "UNBIASED_LIMIT",
    "Unbiased",
    "first",
    "publish_unbiased",
    "unbiased_answers",
    "unbiased_levels",
    "unbiased_matrix",
    "unbiased_queries",
    "unbiased_variances",
    "write_unbiased",
    "write_unbiased_cells",
    "write_unbiased_measured",
]

UNBIASED_LIMIT = 2**23
"""Default bound on a level's units times unbiased queries (64 MiB of answers)."""

DENSE_PINV_ENTRIES = 2**24
"""Largest measured strategy (rows times cells) whose pseudo-inverse is formed densely."""

TOTAL_LABEL = "total"
QUERY = "unbiased_query"
"""The dimension of a level's unbiased answers (not ``workload_query``: a subset of it)."""

_MATRICES: dict[str, np.ndarray] = {}  # per worker process: (Q A^+)^T per level
# per worker process: (A, chol(A^T A)) per level of few units (None: not full rank)
_FACTORS: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
_KEEP = 2  # matrices kept per process (levels are measured mostly in order)
_MAX_CONDITION = 1e10  # Gram matrices above this condition number go through the SVD


@dataclass(frozen=True)
class Unbiased:
    """The unbiased queries of one level and where their answers are checkpointed.

    Attributes
    ----------
    queries : LinearQuery
        ``Q``: the kept workload groups (weighted as in the workload), the total first
        when the workload has no group named ``total``.
    labels, groups, descriptions : tuple of str
        Each row's label (the workload's), group and description.
    skipped : tuple of str
        The workload groups left out (units times queries above the limit).
    token : str
        Identifies ``(Q A^+)^T`` in a worker's cache.
    folder : str
        The level's folder of checkpointed answers (``<k>.npy``).
    dense : bool
        Whether ``A`` is small enough to form ``A^+`` (:data:`DENSE_PINV_ENTRIES`);
        nothing is computed otherwise.
    formed : bool
        Whether the level's units are many enough that forming ``(Q A^+)^T`` once costs
        less than answering each unit from the Cholesky factor of ``A^T A``
        (:func:`unbiased_answers`); one decision for every task of the level.
    """

    queries: LinearQuery
    labels: tuple[str, ...]
    groups: tuple[str, ...]
    descriptions: tuple[str, ...]
    skipped: tuple[str, ...]
    token: str
    folder: str
    dense: bool = True
    formed: bool = True


def _parts(W: LinearQuery) -> list[tuple[str, LinearQuery, float]]:
    if not isinstance(W, VStack):
        return [("query", W, 1.0)]
    names = W.names or tuple(f"part{k + 1}" for k in range(len(W.parts)))
    return [(str(n), p, float(w)) for n, p, w in zip(names, W.parts, W.weights, strict=True)]


def unbiased_queries(
    W: LinearQuery,
    strategy: LinearQuery,
    n_units: int,
    limit: int = UNBIASED_LIMIT,
    domain: Any = None,
    folder: str = "",
) -> Unbiased:
    """The queries whose unbiased answers a level of ``n_units`` units publishes (module
    notes): whole workload groups in order while ``n_units`` times the queries kept stay
    within ``limit``, and always the total; for the measured ``strategy`` (which the
    answers are computed for: :func:`unbiased_answers` must get the same).

    Examples
    --------
    >>> from dpdask.linalg import Identity
    >>> from dpdask.workloads import ri2010
    >>> u = unbiased_queries(ri2010(), Identity(16), 1000, limit=1000 * 11)
    >>> u.labels[:4], u.skipped
    (('total_001', 'votingage_001', 'votingage_002', 'raceeth_001'), ('identity',))
    """
    parts = _parts(W)
    labels = query_labels(W, domain)
    try:
        descriptions = query_descriptions(W, domain) if domain is not None else [""] * len(labels)
    except (ValueError, NotImplementedError):  # pragma: no cover - unlabelled workload
        descriptions = [""] * len(labels)
    n = W.shape[1]
    keep: list[tuple[LinearQuery, float]] = []
    rows: list[tuple[str, str, str]] = []
    skipped: list[str] = []
    start = 0
    has_total = any(name == TOTAL_LABEL and p.shape[0] == 1 for name, p, _ in parts)
    if not has_total:
        keep.append((Ones(n), 1.0))
        rows.append((TOTAL_LABEL, TOTAL_LABEL, "total (all cells)"))
    for name, part, weight in parts:
        q = part.shape[0]
        span = range(start, start + q)
        start += q
        is_total = name == TOTAL_LABEL and q == 1
        if not is_total and n_units * (len(rows) + q) > limit:
            skipped.append(name)
            continue
        keep.append((part, weight))
        rows += [(labels[i], name, descriptions[i]) for i in span]
    Q = VStack([p for p, _ in keep], weights=[w for _, w in keep])
    token = tokenize("unbiased", strategy, [r[0] for r in rows], Q)
    m, q = strategy.shape[0], Q.shape[0]
    dense = m * n <= DENSE_PINV_ENTRIES
    # flops: forming (Q A^+)^T (two triangular solves and a product with A) once, against
    # A^T y, two triangular solves and Q per unit
    formed = n_units * (m * n + 2 * n * n + n * q) >= 2 * n * n * q + m * n * q
    return Unbiased(
        Q, tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows),
        tuple(skipped), token, folder, dense, formed,
    )  # fmt: skip


def unbiased_matrix(strategy: LinearQuery, Q: LinearQuery) -> np.ndarray | None:
    """``(Q A^+)^T`` (measured rows by queries), or None when ``A`` is too large to form
    densely (:data:`DENSE_PINV_ENTRIES`).

    For ``A`` of full column rank and a well-conditioned Gram matrix, ``A^+ = (A^T
    A)^{-1} A^T`` by a Cholesky factorisation (a tenth of the time of an SVD on the
    2,016-cell domain); otherwise by NumPy's SVD pseudo-inverse.
    """
    from scipy import linalg

    m, n = strategy.shape
    if m * n > DENSE_PINV_ENTRIES:
        return None
    factor = _gram_cholesky(strategy)
    with task_blas():
        Qt = _transposed(Q, n)
        if factor is not None:
            A, L = factor
            return np.ascontiguousarray(A @ linalg.cho_solve((L, True), Qt, check_finite=False))
        P = np.linalg.pinv(np.asarray(strategy.dense(), dtype=np.float64))  # (n, m)
        return np.ascontiguousarray(P.T @ Qt)


def _transposed(Q: LinearQuery, n: int) -> np.ndarray:
    """``Q^T`` ``(n, q)``, dense."""
    return np.ascontiguousarray(apply_rows(Q, np.eye(n)))


def _matrix(strategy: LinearQuery, u: Unbiased) -> np.ndarray | None:
    """``(Q A^+)^T``, once per worker process (``u.token`` names ``Q`` and ``A``); None
    where ``A^+`` is not formed (``u.dense``: one decision for every task and the
    publication)."""
    if not u.dense:
        return None
    M = _MATRICES.get(u.token)
    if M is None:
        M = unbiased_matrix(strategy, u.queries)
        if M is not None:
            while len(_MATRICES) >= _KEEP:
                _MATRICES.pop(next(iter(_MATRICES)))
            _MATRICES[u.token] = M
    return M


def unbiased_levels(rel: Release, work: pathlib.Path) -> list[Unbiased | None]:
    """Each level's unbiased queries, checkpointed in ``work / "unbiased" / <level>``:
    for the estimators whose published estimate is not least squares (top-down, NNLS,
    WNNLS, ADMM); None for least squares (its estimate is) and without noise."""
    if not rel.noise or rel.reconstruct in LINEAR:
        return [None] * len(rel.released)
    spine = rel.spine  # a spine level is not measured (:mod:`._spine`): none
    return [
        unbiased_queries(
            L.plan.workload, L.plan.strategy, rel.store.geography.n_units(L.name),
            rel.unbiased_limit, rel.domain, str(work / "unbiased" / L.name),
        )
        if spine is None or spine.levels[i].measured
        else None
        for i, L in enumerate(rel.released)
    ]  # fmt: skip


def unbiased_answers(strategy: LinearQuery, y: np.ndarray, u: Unbiased) -> np.ndarray | None:
    """``Q A^+ y`` for every unit (row) of measurements ``y`` ``(g, m)``: ``(g, q)``.

    A level of few units (``u.formed`` false) is answered as ``Q G^{-1} A^T y`` from the
    Cholesky factor of ``G = A^T A`` (kept per worker process); a level of many, and a
    rank-deficient or ill-conditioned ``A``, through ``(Q A^+)^T``, formed once."""
    if u.dense and not u.formed:
        factor = _factor(strategy, u)
        if factor is not None:
            from scipy import linalg

            A, L = factor
            with task_blas():
                Aty = np.asarray(y, dtype=np.float64).reshape(y.shape[0], -1) @ A  # (g, n)
                x = linalg.cho_solve((L, True), Aty.T, check_finite=False)  # (n, g)
                return apply_rows(u.queries, np.ascontiguousarray(x.T))
    M = _matrix(strategy, u)
    if M is None:
        return None
    with task_blas():
        out: np.ndarray = np.asarray(y, dtype=np.float64).reshape(y.shape[0], -1) @ M
    return out


def unbiased_variances(
    strategy: LinearQuery, u: Unbiased, row_variance: float
) -> np.ndarray | None:
    """The exact variance of every unbiased answer: ``sigma^2 diag(Q A^+ A^+^T Q^T)``.

    From ``(Q A^+)^T`` where this process holds it (its tasks ran here); otherwise
    without forming it: for ``A`` of full column rank and a well-conditioned Gram
    matrix ``G = A^T A = L L^T``, ``A^+ A^+^T = G^{-1}``, so the variances are the
    squared column norms of ``L^{-1} Q^T``: one triangular solve, where forming the
    matrix takes two and a product with ``A`` (a fifth of the time on the 2,016-cell
    domain, in the client that publishes them).
    """
    from scipy import linalg

    if not u.dense:
        return None
    M = _MATRICES.get(u.token)
    factor = _factor(strategy, u) if M is None else None
    if factor is not None:
        with task_blas():
            M = linalg.solve_triangular(
                factor[1], _transposed(u.queries, strategy.shape[1]), lower=True,
                check_finite=False,
            )  # fmt: skip
    elif M is None:  # rank-deficient or ill-conditioned: the pseudo-inverse
        M = _matrix(strategy, u)
    if M is None:  # pragma: no cover - u.dense: A is formed
        return None
    out: np.ndarray = float(row_variance) * np.einsum("ij,ij->j", M, M)
    return out


def _gram_cholesky(strategy: LinearQuery) -> tuple[np.ndarray, np.ndarray] | None:
    """``(A, L)``: the dense strategy and the lower Cholesky factor of ``A^T A``; None
    when ``A`` is rank-deficient or its Gram matrix ill-conditioned (condition number
    above :data:`_MAX_CONDITION`: the pseudo-inverse's SVD then)."""
    from scipy import linalg

    with task_blas():
        A = np.asarray(strategy.dense(), dtype=np.float64)
        try:
            L = linalg.cholesky(A.T @ A, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            return None
        d = np.abs(np.diag(L))
        if d.min() <= 0 or (d.max() / d.min()) ** 2 > _MAX_CONDITION:
            return None
        return A, L


def _factor(strategy: LinearQuery, u: Unbiased) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_gram_cholesky`, once per process and level (``u.token``): the answers of a
    level of few units and the published variances share it."""
    if u.token not in _FACTORS:
        while len(_FACTORS) >= _KEEP:
            _FACTORS.pop(next(iter(_FACTORS)))
        _FACTORS[u.token] = _gram_cholesky(strategy)
    return _FACTORS[u.token]


def write_unbiased(strategy: LinearQuery, y: np.ndarray, u: Unbiased | None, chunk: int) -> None:
    """Checkpoint the unbiased answers of one chunk's measurements ``y`` (in its task)."""
    if u is None:
        return
    answers = unbiased_answers(strategy, y, u)
    if answers is not None:
        _save(answers, u, chunk)


def write_unbiased_cells(block: np.ndarray, u: Unbiased, chunk: int) -> int:
    """Checkpoint the unbiased answers of one chunk of least-squares cell estimates
    ``A^+ y`` (a least-squares release's fused ``x + A^+ z``): ``Q`` applied to them."""
    if not u.dense:  # no exact variance to publish them with (publish_unbiased)
        return chunk
    with task_blas():
        cells = np.asarray(block, dtype=np.float64).reshape(block.shape[0], -1)
        _save(np.asarray(apply_rows(u.queries, cells), dtype=np.float64), u, chunk)
    return chunk


def write_unbiased_measured(strategy: LinearQuery, y: np.ndarray, u: Unbiased, chunk: int) -> int:
    """:func:`write_unbiased` as a task of its own (returns ``chunk``)."""
    write_unbiased(strategy, y, u, chunk)
    return chunk


def first(value: Any, *after: Any) -> Any:
    """``value``, once the tasks ``after`` are done (orders a checkpoint's marker after
    the unbiased answers of its chunk)."""
    return value


def _save(answers: np.ndarray, u: Unbiased, chunk: int) -> None:
    path = pathlib.Path(u.folder) / f"{chunk}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        np.save(f, answers)
    tmp.replace(path)


def publish_unbiased(
    lg: LevelGroup, u: Unbiased | None, plan: Any, chunks: tuple[int, ...], word: str
) -> list[tuple[Any, Any]]:
    """A level's ``unbiased`` group (module notes): the labels and variances written at
    once, and the checkpointed answers paired with their target (for
    :func:`dask.array.store`)."""
    if u is None:
        lg.group.attrs["unbiased"] = "none published: no noise"
        return []
    variance = unbiased_variances(plan.strategy, u, plan.row_variance)
    g = lg.group.create_group("unbiased")
    if variance is None:
        g.attrs["skipped"] = (
            f"the measured strategy ({plan.strategy.shape[0]} x {plan.strategy.shape[1]}) "
            f"is above {DENSE_PINV_ENTRIES} entries: no dense pseudo-inverse"
        )
        return []
    g.attrs.update(
        {
            "long_name": "unbiased (least squares, this level's measurements)",
            "skipped_groups": list(u.skipped),
            "limit": "units x queries at most the release's unbiased_limit; the total always",
        }
    )
    sub = LevelGroup(g, (), [], u.queries, None, None)
    for name, values, long_name in (
        (QUERY, u.labels, "workload query (its label in the level's workload_query)"),
        ("unbiased_group", u.groups, "workload query group"),
        ("unbiased_description", u.descriptions, "what the query counts"),
    ):
        g.create_array(
            name, shape=(len(values),), dtype=str, dimension_names=(QUERY,),
            attributes={"long_name": long_name},
        )[:] = np.asarray(values, dtype=str)  # fmt: skip
    sub.coords += ["unbiased_group", "unbiased_description"]
    label = uncertainty_attrs(UNBIASED, plan, False)
    add_array(sub, "variance", variance, (QUERY,), "persons^2",
              "exact variance of the unbiased answer (every unit of the level)",
              attrs=label)  # fmt: skip
    q = len(u.labels)
    answers = read_chunks(
        pathlib.Path(u.folder), chunks, (q,), f"unbiased-{word}-{tokenize(u.folder, chunks)}"
    )
    pair = add_array(sub, "estimate", answers, ("geography", QUERY), "persons",
                     "unbiased (least squares, this level's measurements)",
                     attrs={"estimator": UNBIASED})  # fmt: skip
    return [] if pair is None else [pair]
