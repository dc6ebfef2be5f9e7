"""Fitness-for-use on a symmetric Kronecker workload, in its small invariant algebra.

When permuting the values inside given *blocks* of each attribute maps the workload's
rows onto rows with the same target (the 2,016-cell P.L. 94 histogram with the
Bureau's eleven query groups and per-group targets: any permutation of the 63 races,
of the two Hispanic and two voting-age values, and of the hhgq types inside household
{0}, institutional {1..4} and noninstitutional {5..7}), Problem 1 is convex and
invariant, so an optimal covariance ``Sigma`` commutes with every such permutation.
Those matrices form an algebra that splits into small blocks: per attribute, the
*block-average* space (one coordinate per block, where ``Sigma`` acts as a full
``m x m`` matrix) and, for every block of two or more values, its zero-sum space (where
``Sigma`` is a scalar); over the product domain, one ``D_c x D_c`` matrix ``K_c`` per
choice ``c`` of a component for every attribute. On the P.L. 94 histogram that is 64
numbers instead of 2,016 x 2,016.

A query row ``x = (x) x_a`` has ``x^T Sigma x = sum_c z_c^T K_c z_c`` with ``z_c`` the
Kronecker product of each attribute's coordinates of ``x_a`` in component ``c_a`` (the
block averages, or the norm of the projection on a zero-sum space), and a cell's
privacy profile is ``sum_c z_c^T K_c^{-1} z_c``; so every variance and profile is
computed exactly from the ``K_c``. :func:`solve_symmetric` minimises
``max profile x max variance / target`` over the ``K_c`` (SLSQP from the least-squares
covariance of a given strategy, or the identity) and returns the covariance rescaled to
meet every target; the caller's plan re-checks the targets on the dense strategy.
Only the privacy cost's *upper* bound is certified (the solution is feasible); the
symmetric reduction makes it optimal when the symmetry holds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.optimize as so

from dpdask.errors import ArgumentError
from dpdask.linalg import LinearQuery
from dpdask.strategy._terms import KronTerms, kron_terms

__all__ = ["SymmetricSolution", "solve_symmetric"]

_LOG_BOUND = 40.0  # bounds on the parameters (logs of Cholesky diagonals and entries)


@dataclass
class _Attribute:
    """One attribute's blocks and the orthonormal coordinates of its components."""

    n: int
    blocks: list[np.ndarray]
    avg: np.ndarray = field(init=False)  # n x m: columns 1_block / sqrt(size)
    zero_sum: list[np.ndarray] = field(init=False)  # the blocks of two or more values

    def __post_init__(self) -> None:
        seen = np.sort(np.concatenate(self.blocks))
        if not np.array_equal(seen, np.arange(self.n)):
            raise ArgumentError(f"the blocks {self.blocks} do not partition 0..{self.n - 1}")
        self.avg = np.zeros((self.n, len(self.blocks)))
        for b, idx in enumerate(self.blocks):
            self.avg[idx, b] = 1.0 / math.sqrt(idx.size)
        self.zero_sum = [idx for idx in self.blocks if idx.size > 1]

    @property
    def dims(self) -> list[int]:
        return [len(self.blocks)] + [1] * len(self.zero_sum)

    def coordinates(self, X: np.ndarray) -> list[np.ndarray]:
        """Each component's coordinates of the rows of ``X`` (rows x dim)."""
        out = [X @ self.avg]
        for idx in self.zero_sum:
            sub = X[:, idx]
            sq = (sub * sub).sum(axis=1) - sub.sum(axis=1) ** 2 / idx.size
            out.append(np.sqrt(np.maximum(sq, 0.0))[:, None])
        return out

    def projector(self, comp: int) -> np.ndarray:
        """The orthogonal projector of component ``comp`` (``n x n``), zero-sum parts only."""
        idx = self.zero_sum[comp - 1]
        P = np.zeros((self.n, self.n))
        P[np.ix_(idx, idx)] = np.eye(idx.size) - 1.0 / idx.size
        return P


def _row_kron(parts: Sequence[np.ndarray]) -> np.ndarray:
    Z = parts[0]
    for F in parts[1:]:
        Z = (Z[:, None, :, None] * F[None, :, None, :]).reshape(Z.shape[0] * F.shape[0], -1)
    return Z


class _Features:
    """The coordinates ``z_c`` of a set of rows, deduplicated."""

    def __init__(self, per_choice: list[np.ndarray]):
        stacked = np.concatenate(per_choice, axis=1)
        _, first, inverse = np.unique(
            np.round(stacked, 12), axis=0, return_index=True, return_inverse=True
        )
        self.inverse = inverse.reshape(-1)
        self.Z = [Z[first] for Z in per_choice]

    def quad(self, Ks: Sequence[np.ndarray]) -> np.ndarray:
        out: np.ndarray = sum(
            np.einsum("rd,de,re->r", Z, K, Z) for Z, K in zip(self.Z, Ks, strict=True)
        )
        return out


@dataclass
class SymmetricSolution:
    """A covariance in the invariant algebra that meets every target.

    Attributes
    ----------
    blocks : list of ndarray
        ``K_c`` for every choice of components (``choices``), scaled so that the
        largest variance / target is 1.
    privacy_cost : float
        ``sqrt(max profile)``: the mechanism's cost; ``rho = cost^2 / 2``.
    max_ratio : float
        The largest variance / target of the returned covariance (1 up to rounding).
    start_cost : float
        The privacy cost of the starting covariance, rescaled to the targets.
    info : dict
        Solver record (iterations, message).
    """

    attributes: list[_Attribute]
    choices: list[tuple[int, ...]]
    blocks: list[np.ndarray]
    privacy_cost: float
    max_ratio: float
    start_cost: float
    info: dict[str, Any]

    def inverse_dense(self) -> np.ndarray:
        """``Sigma^-1`` as a dense ``N x N`` matrix (the whitened strategy's Gram)."""
        N = math.prod(a.n for a in self.attributes)
        out = np.zeros((N, N))
        for c, K in zip(self.choices, self.blocks, strict=True):
            Kinv = np.linalg.inv(K)
            mats, scalar = [], True
            for a, ci in zip(self.attributes, c, strict=True):
                if ci > 0:
                    mats.append(a.projector(ci))
                elif a.avg.shape[1] > 1:  # the one attribute where K_c is a matrix
                    mats.append(a.avg @ Kinv @ a.avg.T)
                    scalar = False
                else:
                    mats.append(a.avg @ a.avg.T)
            term = _kron_all(mats)
            out += float(Kinv[0, 0]) * term if scalar else term
        return out


def _kron_all(mats: Sequence[np.ndarray]) -> np.ndarray:
    out = mats[0]
    for M in mats[1:]:
        out = np.kron(out, M)
    return out


def _features(
    attrs: list[_Attribute], factors: Sequence[np.ndarray], choices: list[tuple[int, ...]]
) -> list[np.ndarray]:
    coords = [a.coordinates(F) for a, F in zip(attrs, factors, strict=True)]
    return [_row_kron([coords[i][ci] for i, ci in enumerate(c)]) for c in choices]


def _start_blocks(
    attrs: list[_Attribute], choices: list[tuple[int, ...]], start: KronTerms | None
) -> list[np.ndarray]:
    """``K_c`` of ``(A^T A)^-1`` for a strategy given as Kronecker terms (the identity if none)."""
    if start is None:
        return [np.eye(_dim(attrs, c)) for c in choices]
    grams = [np.zeros((_dim(attrs, c),) * 2) for c in choices]
    for j in range(start.k):
        dense = [np.asarray(f.dense(), dtype=float) for f in start.factors[j]]
        for g, c in zip(grams, choices, strict=True):
            parts = []
            for a, F, ci in zip(attrs, dense, c, strict=True):
                G = F.T @ F
                if ci == 0:
                    parts.append(a.avg.T @ G @ a.avg)
                else:
                    P = a.projector(ci)
                    parts.append(np.array([[np.trace(P @ G @ P) / (np.trace(P))]]))
            g += start.weights[j] ** 2 * _kron_all(parts)
    return [np.linalg.inv(g) for g in grams]


def _dim(attrs: list[_Attribute], c: tuple[int, ...]) -> int:
    return math.prod(a.dims[ci] for a, ci in zip(attrs, c, strict=True))


def solve_symmetric(
    workload: LinearQuery,
    targets: np.ndarray,
    blocks: Sequence[Sequence[Sequence[int]]],
    *,
    start: LinearQuery | None = None,
    maxiter: int = 300,
) -> SymmetricSolution:
    """Problem 1 (least privacy cost meeting ``targets``) in the invariant algebra.

    Parameters
    ----------
    workload : LinearQuery
        A Kronecker product or a union of them, on the attributes ``blocks`` describe.
    targets : ndarray
        One variance target per query (constant on the symmetry's orbits for the
        result to be optimal; met in any case).
    blocks : sequence of sequence of sequence of int
        Per attribute, a partition of its values into blocks (at most one attribute
        with more than one block).
    start : LinearQuery, optional
        A strategy whose least-squares covariance starts the search (a Kronecker
        product or union of them); default the identity.
    maxiter : int
        SLSQP iterations.

    Returns
    -------
    SymmetricSolution

    Raises
    ------
    dpdask.errors.ArgumentError
        If the blocks do not fit the workload or several attributes have several blocks.
    """
    attrs = [_Attribute(len(np.concatenate(b)), [np.asarray(x) for x in b]) for b in blocks]
    if sum(len(a.blocks) > 1 for a in attrs) > 1:
        raise ArgumentError("at most one attribute may have more than one block")
    sizes = tuple(a.n for a in attrs)
    terms = kron_terms(workload, sizes)
    c = np.asarray(targets, dtype=float).reshape(-1)
    if c.shape != (workload.shape[0],) or not (np.isfinite(c).all() and (c > 0).all()):
        raise ArgumentError(f"expected {workload.shape[0]} positive finite targets")
    choices = list(itertools.product(*(range(len(a.dims)) for a in attrs)))
    # every query row's coordinates (term by term, rows in C order), and every cell's
    per_choice: list[list[np.ndarray]] = [[] for _ in choices]
    for j in range(terms.k):
        dense = [np.asarray(f.dense(), dtype=float) for f in terms.factors[j]]
        for acc, Z in zip(per_choice, _features(attrs, dense, choices), strict=True):
            acc.append(abs(terms.weights[j]) * Z)
    queries = _Features([np.concatenate(z) for z in per_choice])
    qtargets = np.full(len(queries.Z[0]), np.inf)
    np.minimum.at(qtargets, queries.inverse, c)
    cells = _Features(_features(attrs, [np.eye(n) for n in sizes], choices))
    dims = [_dim(attrs, ch) for ch in choices]
    tri = [np.tril_indices(d) for d in dims]

    def factors(theta: np.ndarray) -> list[np.ndarray]:
        out, k = [], 0
        for d, (r, col) in zip(dims, tri, strict=True):
            L = np.zeros((d, d))
            L[r, col] = theta[k : k + r.size]
            L[np.diag_indices(d)] = np.exp(np.diag(L))
            out.append(L)
            k += r.size
        return out

    def unpack(theta: np.ndarray) -> list[np.ndarray]:
        return [L @ L.T for L in factors(theta)]

    def pack(Ks: list[np.ndarray]) -> np.ndarray:
        parts = []
        for K, (r, col) in zip(Ks, tri, strict=True):
            L = np.linalg.cholesky(K)
            L[np.diag_indices(L.shape[0])] = np.log(np.diag(L))
            parts.append(L[r, col])
        return np.concatenate(parts)

    def gradient(feats: _Features, Ls: list[np.ndarray], inverse: bool) -> np.ndarray:
        """d (sum_c z^T K_c^{+-1} z) / d theta for every deduplicated row."""
        cols = []
        for Z, L, (r, col) in zip(feats.Z, Ls, tri, strict=True):
            if inverse:
                Y = np.linalg.solve(L @ L.T, Z.T).T
                M = -2.0 * Y[:, :, None] * (Y @ L)[:, None, :]
            else:
                M = 2.0 * Z[:, :, None] * (Z @ L)[:, None, :]
            g = M[:, r, col]
            g[:, r == col] *= np.diag(L)[r[r == col]]
            cols.append(g)
        return np.concatenate(cols, axis=1)

    def cost2(Ks: list[np.ndarray]) -> tuple[float, float]:
        prof = cells.quad([np.linalg.inv(K) for K in Ks]).max()
        ratio = (queries.quad(Ks) / qtargets).max()
        return float(prof), float(ratio)

    def objective(theta: np.ndarray) -> float:
        Ks = unpack(theta)
        prof, ratio = cost2(Ks)
        return math.log(prof) + math.log(ratio)

    K0 = _start_blocks(attrs, choices, None if start is None else kron_terms(start, sizes))
    p0, r0 = cost2(K0)

    # the epigraph form, scale fixed by the targets: minimise s with
    # log profile <= s and log(variance / target) <= 0
    def cons(x: np.ndarray) -> np.ndarray:
        Ks = unpack(x[:-1])
        lp = np.log(cells.quad([np.linalg.inv(K) for K in Ks]))
        lr = np.log(queries.quad(Ks) / qtargets)
        return np.concatenate([x[-1] - lp, -lr])

    def cons_jac(x: np.ndarray) -> np.ndarray:
        Ls = factors(x[:-1])
        Ks = [L @ L.T for L in Ls]
        prof = cells.quad([np.linalg.inv(K) for K in Ks])
        var = queries.quad(Ks)
        gp = gradient(cells, Ls, True) / prof[:, None]
        gv = gradient(queries, Ls, False) / var[:, None]
        top = np.hstack([-gp, np.ones((gp.shape[0], 1))])
        bottom = np.hstack([-gv, np.zeros((gv.shape[0], 1))])
        return np.vstack([top, bottom])

    K0 = [K / r0 for K in K0]  # the start meets every target
    theta0 = pack(K0)
    x0 = np.concatenate([theta0, [math.log(p0 * r0)]])
    bounds = [(-_LOG_BOUND, _LOG_BOUND)] * x0.size
    res = so.minimize(
        lambda x: x[-1],
        x0,
        jac=lambda x: np.concatenate([np.zeros(x.size - 1), [1.0]]),
        bounds=bounds,
        constraints=[{"type": "ineq", "fun": cons, "jac": cons_jac}],
        method="SLSQP",
        options={"maxiter": maxiter, "ftol": 1e-9},
    )
    best = theta0
    if np.isfinite(res.x).all():
        try:
            if objective(res.x[:-1]) < objective(theta0):
                best = res.x[:-1]
        except np.linalg.LinAlgError:  # a singular step: keep the start
            pass
    Ks = unpack(best)
    prof, ratio = cost2(Ks)
    Ks = [K / ratio for K in Ks]  # every target met, the largest exactly
    prof, ratio = cost2(Ks)
    return SymmetricSolution(
        attributes=attrs,
        choices=choices,
        blocks=Ks,
        privacy_cost=math.sqrt(prof),
        max_ratio=ratio,
        start_cost=math.sqrt(p0 * r0),
        info={
            "iterations": int(res.nit),
            "message": str(res.message),
            "success": bool(res.success),
        },
    )
