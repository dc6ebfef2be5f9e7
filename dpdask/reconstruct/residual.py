"""Reconstruction in marginal space from noisy residuals (the residual strategy).

For residual ``A`` (a sorted tuple of attribute indices) the canonical measurement is
``q_A = P_A (m_A + e_A)``: the ``A``-marginal plus independent noise of variance
``s_A^2`` per cell, centred along every axis of ``A`` (``P_i = I - J / n_i``). Every
way of measuring a residual maps to it exactly: a noisy ``A``-marginal
(:meth:`ResidualEstimates.from_noisy_marginals`), the rows of a
:class:`~dpdask.strategy.residual.ResidualPlan`'s strategy
(:meth:`ResidualEstimates.from_plan`). From them every marginal ``S`` whose subsets
were all measured is ::

    M_S = sum_{A subset of S} expand_{S \\ A}(q_A) / N_{S \\ A}

which is the generalised least-squares estimate (the residuals' row spaces are
orthogonal, so least squares decouples residual by residual). The estimates are
consistent: summing ``M_S`` over ``S \\ T`` gives ``M_T`` exactly, since a centred
residual sums to zero along its axes. Covariances are exact ::

    Cov(M_S, M_T) = sum_{A subset of S and T} s_A^2 (x)_i F_i

with ``F_i = P_i`` on ``A``, ``J / n_i^2`` on ``(S and T) \\ A``, the column
``1 / n_i`` on ``S \\ T`` and the row ``1 / n_i`` on ``T \\ S``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from dpdask.errors import ArgumentError, ShapeError
from dpdask.strategy.residual import ResidualPlan, helmert_transpose, marginal_covariance

__all__ = ["ResidualEstimates", "apply_axes", "centre"]


def apply_axes(T: np.ndarray, mats: Sequence[np.ndarray | None], start: int = 0) -> np.ndarray:
    """Apply ``mats[j]`` along axis ``start + j`` of ``T`` (``None``: leave the axis)."""
    out = np.asarray(T, dtype=float)
    for j, M in enumerate(mats):
        k = start + j
        if M is not None:
            out = np.moveaxis(np.tensordot(M, out, axes=([1], [k])), 0, k)
    return out


def centre(T: np.ndarray, start: int = 0) -> np.ndarray:
    """``P_A T``: subtract the mean along every axis from ``start`` on."""
    out = np.asarray(T, dtype=float)
    for k in range(start, out.ndim):
        out = out - out.mean(axis=k, keepdims=True)
    return out


def _key(attrs: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted({int(i) for i in attrs}))


class ResidualEstimates:
    """Noisy residuals, and every marginal (with its covariance) they determine.

    Parameters
    ----------
    sizes : sequence of int
        Attribute sizes.
    residuals : mapping of tuple of int to ndarray
        ``q_A`` of every measured residual ``A``: shape ``(n_i for i in A)``, or
        ``(g, *(n_i for i in A))`` for ``g`` geographies at once, centred along
        every attribute axis (checked).
    variances : mapping of tuple of int to float
        ``s_A^2``, the noise variance per cell of the ``A``-marginal before centring
        (the same for every geography).
    geographies : int, optional
        ``g`` when the residuals have a leading geography axis; the marginals then
        have it too.

    Raises
    ------
    ValueError
        If a residual has the wrong shape, is not centred, or has no variance.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        residuals: Mapping[tuple[int, ...], np.ndarray],
        variances: Mapping[tuple[int, ...], float],
        geographies: int | None = None,
    ):
        self.sizes = tuple(int(n) for n in sizes)
        self.lead: tuple[int, ...] = () if geographies is None else (int(geographies),)
        self.q: dict[tuple[int, ...], np.ndarray] = {}
        self.s2: dict[tuple[int, ...], float] = {}
        b = len(self.lead)
        for A, qa in residuals.items():
            key = _key(A)
            arr = np.asarray(qa, dtype=float)
            shape = self.lead + tuple(self.sizes[i] for i in key)
            if arr.shape != shape:
                raise ShapeError(f"residual {key} has shape {arr.shape}, expected {shape}")
            scale = max(1.0, float(np.abs(arr).max(initial=0.0)))
            for k in range(b, arr.ndim):
                if np.abs(arr.sum(axis=k)).max(initial=0.0) > 1e-8 * scale * arr.shape[k]:
                    raise ArgumentError(f"residual {key} is not centred along axis {k}")
            if key not in variances and A not in variances:
                raise ArgumentError(f"residual {key} has no noise variance")
            v = float(variances[A] if A in variances else variances[key])
            if not math.isfinite(v) or v < 0:
                raise ArgumentError(f"residual {key}: noise variance {v} must be finite, >= 0")
            self.q[key], self.s2[key] = arr, v

    # -- constructors ------------------------------------------------------------
    @classmethod
    def from_noisy_marginals(
        cls,
        sizes: Sequence[int],
        marginals: Mapping[tuple[int, ...], np.ndarray],
        variances: Mapping[tuple[int, ...], float],
        geographies: int | None = None,
    ) -> ResidualEstimates:
        """From noisy ``A``-marginals ``m_A + e_A`` (i.i.d. noise of variance ``s_A^2``).

        Each marginal is flat or shaped, after a leading axis of ``geographies``.
        """
        sizes = tuple(int(n) for n in sizes)
        lead = () if geographies is None else (int(geographies),)
        q = {}
        for A, y in marginals.items():
            key = _key(A)
            arr = np.asarray(y, dtype=float).reshape(lead + tuple(sizes[i] for i in key))
            q[key] = centre(arr, len(lead))
        return cls(sizes, q, {_key(A): v for A, v in variances.items()}, geographies)

    @classmethod
    def from_plan(
        cls, plan: ResidualPlan, y: np.ndarray, noise_variance: float | None = None
    ) -> ResidualEstimates:
        """From ``y = A x + noise``, the noisy rows of ``plan.strategy``.

        ``y`` has shape ``(rows,)`` for one geography or ``(g, rows)`` for ``g``.
        ``noise_variance`` is the variance of the noise drawn on every row (default:
        the plan's ``noise_scale ** 2``; the lattice's when measured on it), so residual
        ``A`` has ``noise_variance / u_A``.
        """
        W = plan.marginals
        y = np.asarray(y, dtype=float)
        if y.ndim not in (1, 2):
            raise ShapeError(f"measurements must be (rows,) or (geographies, rows), got {y.shape}")
        lead = y.shape[:-1]
        n = y.shape[-1]
        s2 = plan.residual_variances()
        if noise_variance is not None:
            s2 = float(noise_variance) / np.asarray(plan.precision, dtype=float)
        q, var, at = {}, {}, 0
        for j, A in enumerate(W.residual_sets()):
            shape = tuple(W.sizes[i] - 1 for i in A)
            rows = math.prod(shape)
            if at + rows > n:
                raise ShapeError(f"{n} measurements, fewer than the plan's strategy rows")
            z = y[..., at : at + rows].reshape(lead + shape) / math.sqrt(plan.precision[j])
            at += rows
            for k in range(len(A)):
                z = helmert_transpose(z, len(lead) + k)
            q[A] = z
            var[A] = float(s2[j])
        if at != n:
            raise ShapeError(f"{n} measurements but the plan's strategy has {at} rows")
        return cls(W.sizes, q, var, lead[0] if lead else None)

    # -- estimates -----------------------------------------------------------------
    def _parts(self, S: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The measured subsets of ``S`` (all of them, or raise)."""
        out = []
        for r in range(len(S) + 1):
            for mask in itertools.combinations(S, r):
                if any(self.sizes[i] == 1 for i in mask):
                    continue  # an attribute of one value has an empty residual
                if mask not in self.q:
                    raise ArgumentError(
                        f"marginal {S} needs residual {mask}, which was not measured"
                    )
                out.append(mask)
        return out

    def marginal(self, attrs: Iterable[int]) -> np.ndarray:
        """The estimate of the marginal on ``attrs``: shape ``(n_i for i in sorted attrs)``.

        With geographies, a leading axis of them.
        """
        S = _key(attrs)
        shape = self.lead + tuple(self.sizes[i] for i in S)
        out = np.zeros(shape)
        for A in self._parts(S):
            q = self.q[A]
            idx = (Ellipsis, *(slice(None) if i in A else np.newaxis for i in S))
            rest = math.prod(self.sizes[i] for i in S if i not in A)
            out += q[idx] / rest
        return out

    def variance(self, attrs: Iterable[int]) -> float:
        """The variance of every cell of the marginal on ``attrs`` (all equal)."""
        S = _key(attrs)
        v = 0.0
        for A in self._parts(S):
            c = math.prod((self.sizes[i] - 1) / self.sizes[i] for i in A)
            rest = math.prod(self.sizes[i] for i in S if i not in A)
            v += self.s2[A] * c / rest**2
        return v

    def covariance(self, attrs: Iterable[int], other: Iterable[int] | None = None) -> np.ndarray:
        """``Cov(M_S, M_T)`` as a dense ``N_S x N_T`` matrix (C order of each marginal)."""
        S = _key(attrs)
        T = S if other is None else _key(other)
        shared = set(self._parts(S)) & set(self._parts(T))
        return marginal_covariance(self.sizes, {A: self.s2[A] for A in shared}, S, T)

    def nonnegative(
        self,
        sets: Iterable[Iterable[int]] | None = None,
        *,
        tol: float = 1e-9,
        maxiter: int = 20000,
        rho: float | None = None,
    ) -> ResidualEstimates:
        """Consistent marginals that are non-negative on ``sets`` (local non-negativity).

        Finds residuals ``r`` minimising ``sum_A ||r_A - q_A||^2 / s_A^2`` (the
        measurements' own metric) subject to every marginal in ``sets`` being
        non-negative, by ADMM with the tables ``Z_S >= 0`` split off: residuals of
        different subsets are orthogonal in every marginal, so the residual step is
        diagonal. The result is again a :class:`ResidualEstimates` (its marginals
        agree exactly on shared sub-marginals); its tables on ``sets`` are
        non-negative to ``tol`` times the largest cell. Variances are those of the
        unconstrained estimate (the projection is not linear).

        Parameters
        ----------
        sets : iterable of iterable of int, optional
            The marginals kept non-negative (default: the largest measured ones).
        tol : float
            Relative tolerance of the ADMM residuals.
        maxiter : int
        rho : float, optional
            The ADMM penalty (default: the mean precision ``1 / s_A^2``).
        """
        S_list = self._maximal() if sets is None else [_key(S) for S in sets]
        keys = sorted({A for S in S_list for A in self._parts(S)}, key=lambda a: (len(a), a))
        prec = {A: 1.0 / max(self.s2[A], 1e-300) for A in keys}
        rho = float(np.mean([min(p, 1e12) for p in prec.values()])) if rho is None else rho
        rest = {
            S: {A: math.prod(self.sizes[i] for i in S if i not in A) for A in self._parts(S)}
            for S in S_list
        }
        denom = {A: prec[A] + rho * sum(1.0 / r[A] for r in rest.values() if A in r) for A in keys}
        r = {A: self.q[A].copy() for A in keys}
        g = self.lead[0] if self.lead else None
        est = ResidualEstimates(self.sizes, r, {A: self.s2[A] for A in keys}, g)
        b = len(self.lead)
        T = {S: est.marginal(S) for S in S_list}
        Z = {S: np.maximum(T[S], 0.0) for S in S_list}
        U = {S: np.zeros_like(T[S]) for S in S_list}
        scale = max(1.0, max(float(np.abs(t).max()) for t in T.values()))
        for _ in range(maxiter):
            acc = {A: prec[A] * self.q[A] for A in keys}
            for S in S_list:
                Y = Z[S] - U[S]
                for A, nrest in rest[S].items():
                    drop = tuple(b + k for k, i in enumerate(S) if i not in A)
                    summed = Y.sum(axis=drop) if drop else Y
                    acc[A] = acc[A] + rho * centre(summed, b) / nrest
            est.q = {A: acc[A] / denom[A] for A in keys}
            T = {S: est.marginal(S) for S in S_list}
            primal = dual = 0.0
            for S in S_list:
                Znew = np.maximum(T[S] + U[S], 0.0)
                dual = max(dual, float(np.abs(Znew - Z[S]).max()))
                Z[S] = Znew
                U[S] += T[S] - Z[S]
                primal = max(primal, float(np.abs(T[S] - Z[S]).max()))
            if primal <= tol * scale and dual <= tol * scale:
                break
        return est

    def _maximal(self) -> list[tuple[int, ...]]:
        keys = list(self.q)
        return [A for A in keys if not any(set(A) < set(B) for B in keys)]

    def marginals(self, sets: Iterable[Iterable[int]]) -> dict[tuple[int, ...], np.ndarray]:
        """Several marginals at once, keyed by their sorted attribute tuples."""
        return {_key(S): self.marginal(S) for S in sets}

    def __repr__(self) -> str:
        return f"ResidualEstimates({len(self.q)} residuals over sizes {self.sizes})"
