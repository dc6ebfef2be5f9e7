"""The residual plan: ``dpdask.select(W, zCDP(...), strategy="residual")``.

A :class:`ResidualPlan` is a :class:`~dpdask.strategy.Plan` whose strategy is the
union over residuals ``A`` of ``sqrt(u_A) (x)_i (H_i if i in A else 1^T)``, with
``H_i`` the orthonormal Helmert basis of the complement of the ones vector
(:func:`helmert`), measured with one Gaussian ``sigma`` (``plan.noise_scale``) on
every row. Row ``r`` of residual ``A`` then reads ``H_A m_A`` with noise variance
``s_A^2 = sigma^2 / u_A``: the per-residual noise scales live in the row weights,
so the Plan interface (one noise scale per plan) expresses them unchanged.

Its error figures come from the residual algebra (:mod:`._workload`), exact and
without an error analysis of the union; the strategy and workload operators are
built only when asked for (a 100-attribute workload has 166,751 of them).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import PlanError
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Ones, VStack
from dpdask.privacy import Budget, Calibration, calibrate, mechanism_for, zCDP
from dpdask.strategy.analysis import svd_bound
from dpdask.strategy.plan import Plan
from dpdask.strategy.residual._solve import ResidualSolution
from dpdask.strategy.residual._workload import MarginalWorkload, marginal_covariance

__all__ = [
    "ResidualPlan",
    "helmert",
    "helmert_integer",
    "helmert_scales",
    "helmert_transpose",
    "marginal_operator",
    "residual_operator",
]

SVD_BOUND_MAX_D = 16
"""The SVD bound is computed over the ``2^d`` subsets: only up to this many attributes."""


def helmert(n: int) -> np.ndarray:
    """An ``(n - 1) x n`` matrix with orthonormal rows orthogonal to the ones vector.

    Row ``k`` (``k = 1 .. n-1``) is ``(1, ..., 1, -k, 0, ..., 0) / sqrt(k (k + 1))``.

    Examples
    --------
    >>> H = helmert(3)
    >>> bool(np.allclose(H @ H.T, np.eye(2)) and np.allclose(H.sum(axis=1), 0))
    True
    """
    H = np.zeros((n - 1, n))
    for k in range(1, n):
        H[k - 1, :k] = 1.0
        H[k - 1, k] = -float(k)
        H[k - 1] /= math.sqrt(k * (k + 1))
    return H


def helmert_scales(n: int) -> np.ndarray:
    """The row scales ``1 / sqrt(k (k + 1))`` of :func:`helmert` (``k = 1 .. n-1``)."""
    k = np.arange(1, n, dtype=float)
    return 1.0 / np.sqrt(k * (k + 1.0))


def _along(ndim: int, axis: int, sl: slice) -> tuple[slice, ...]:
    return tuple(sl if k == axis else slice(None) for k in range(ndim))


def _column(values: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = values.size
    return values.reshape(shape)


def helmert_integer(x: np.ndarray, axis: int) -> np.ndarray:
    """``B x`` along ``axis``, with ``B`` :func:`helmert` before its row scales: row ``k``
    is ``(1, ..., 1, -k, 0, ..., 0)``. In O(n) per line (a running sum), exact on
    integers (no overflow: ``|B x|`` is at most ``2 (n - 1) max|x|`` per axis)."""
    x = np.asarray(x)
    n = x.shape[axis]
    out = np.cumsum(x[_along(x.ndim, axis, slice(None, -1))], axis=axis)
    k = _column(np.arange(1, n, dtype=x.dtype), x.ndim, axis)
    out -= k * x[_along(x.ndim, axis, slice(1, None))]
    return out


def helmert_transpose(z: np.ndarray, axis: int) -> np.ndarray:
    """``H^T z`` along ``axis`` (:func:`helmert`), in O(n) per line: entry ``j`` is
    ``sum_{k > j} w_k - j w_j`` with ``w_k = z_k / sqrt(k (k + 1))``."""
    z = np.asarray(z, dtype=float)
    d, n = z.ndim, z.shape[axis] + 1
    w = z * _column(helmert_scales(n), d, axis)
    shape = list(z.shape)
    shape[axis] = n
    out = np.zeros(shape)
    # suffix sums: out[j] = w[j+1] + ... + w[n-1] (w indexed 1 .. n-1)
    out[_along(d, axis, slice(None, -1))] = np.flip(np.cumsum(np.flip(w, axis), axis=axis), axis)
    out[_along(d, axis, slice(1, None))] -= _column(np.arange(1, n, dtype=float), d, axis) * w
    return out


def residual_operator(sizes: tuple[int, ...], residual: tuple[int, ...]) -> Kron:
    """``(x)_i (H_i if i in A else 1^T)``: the rows measured for residual ``A``."""
    return Kron([Dense(helmert(n)) if i in residual else Ones(n) for i, n in enumerate(sizes)])


def marginal_operator(sizes: tuple[int, ...], subset: tuple[int, ...]) -> Kron:
    """``(x)_i (I if i in S else 1^T)``: the marginal on ``S``."""
    return Kron([Identity(n) if i in subset else Ones(n) for i, n in enumerate(sizes)])


class _ClosedForm:
    """The residual strategy's L2 sensitivity, known in closed form (no operator)."""

    def __init__(self, l2: float) -> None:
        self.l2 = l2

    def sensitivity(self, p: int) -> float:
        if p != 2:
            raise PlanError(f"the residual strategy's L{p} sensitivity is not computed")
        return self.l2


class ResidualPlan(Plan):
    """A plan measuring the residuals of a marginal workload (see the module docstring).

    Parameters
    ----------
    marginals : MarginalWorkload
        The workload's marginals and weights.
    solution : ResidualSolution
        The residual precisions (any positive scale: the budget fixes the noise).
    privacy : zCDP or ApproxDP
        The budget; pure DP has no residual plan (Laplace noise: use HDMM).
    domain : Domain, optional
    workload : LinearQuery, optional
        The workload operator, when the caller has one (else built on demand in
        the marginals' order).
    template, info
        As for :class:`~dpdask.strategy.Plan`.

    Raises
    ------
    PlanError
        For a pure-DP budget or a domain that does not match the marginals.
    """

    kind = "residual"

    def __init__(
        self,
        marginals: MarginalWorkload,
        solution: ResidualSolution,
        privacy: Budget,
        *,
        domain: Domain | None = None,
        workload: LinearQuery | None = None,
        template: str = "residual",
        info: dict[str, Any] | None = None,
    ):
        if mechanism_for(privacy) != "gaussian":
            raise PlanError(
                "the residual strategy adds Gaussian noise: give a zCDP or (epsilon, delta) "
                "budget (pure DP keeps HDMM's strategies)"
            )
        if domain is not None and tuple(domain.shape) != marginals.sizes:
            raise PlanError(f"the domain {domain.shape} does not match {marginals.sizes}")
        u = np.asarray(solution.precision, dtype=float)
        if u.shape != (len(marginals.residuals),) or not np.all(np.isfinite(u)) or np.any(u <= 0):
            raise PlanError("every residual needs a positive finite precision")
        self.marginals = marginals
        self.solution = solution
        self.precision = u
        self.privacy = privacy
        self.domain = domain
        self.groups = None
        self.template = str(template)
        self.info = dict(info or {})
        self.sizes = marginals.sizes
        sens = math.sqrt(marginals.sensitivity2(u))  # closed form: no strategy is built
        if not math.isfinite(sens) or sens <= 0:
            raise PlanError(f"the residual strategy's L2 sensitivity is {sens}")
        self.calibration = calibrate(privacy, _ClosedForm(sens))
        self.mechanism = self.calibration.mechanism
        self.sensitivity = self.calibration.sensitivity
        self.noise_scale = self.calibration.scale
        self._workload = workload
        self._strategy: LinearQuery | None = None
        self._analysis_cache = None

    def _measured(self, operator: bool) -> tuple[LinearQuery | None, Calibration]:
        """A level plan measures the residual strategy as it is, calibrated on the
        closed-form sensitivity (no operator is built) unless ``operator``."""
        return None, calibrate(self.privacy, self.strategy) if operator else self.calibration

    # -- operators, on demand ------------------------------------------------
    @property
    def workload(self) -> LinearQuery:  # type: ignore[override]
        if self._workload is None:
            W = self.marginals
            parts = [marginal_operator(W.sizes, s) for s in W.sets()]
            self._workload = VStack(parts, weights=list(W.weights), names=list(W.names))
        return self._workload

    @property
    def strategy(self) -> LinearQuery:  # type: ignore[override]
        if self._strategy is None:
            W = self.marginals
            parts = [residual_operator(W.sizes, a) for a in W.residual_sets()]
            self._strategy = VStack(parts, weights=list(np.sqrt(self.precision)))
        return self._strategy

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_analysis_cache": None}

    # -- the residual figures ------------------------------------------------
    def residual_variances(self) -> np.ndarray:
        """``s_A^2``: noise variance per cell of each residual's ``A``-marginal, as measured."""
        return self.noise_variance / self.precision

    def marginal_variances(self) -> np.ndarray:
        """Per-cell variance of every marginal (all cells of a marginal share it), unweighted."""
        return self.noise_variance * self.marginals.cell_variances(self.precision)

    def covariance(self, attrs: Sequence[int], other: Sequence[int] | None = None) -> np.ndarray:
        """``Cov(M_S, M_T)`` of the reconstructed marginals (dense; unweighted).

        Any marginals whose subsets are all measured, not only the workload's.
        """
        S = tuple(sorted({int(i) for i in attrs}))
        T = S if other is None else tuple(sorted({int(i) for i in other}))
        s2 = dict(zip(self.marginals.residual_sets(), self.residual_variances(), strict=True))
        shared = set(S) & set(T)
        sizes = self.marginals.sizes  # the plan's sizes
        needed = [A for A in _subsets(S) + _subsets(T) if all(sizes[i] > 1 for i in A)]
        missing = [A for A in needed if A not in s2]
        if missing:
            raise PlanError(f"residual {missing[0]} is not measured by this plan")
        return marginal_covariance(sizes, {A: v for A, v in s2.items() if set(A) <= shared}, S, T)

    def _terms(self) -> tuple[np.ndarray, np.ndarray]:
        """Per workload term (as given, repeats kept): the merged marginal and its weight."""
        W = self.marginals
        if self._workload is None:  # the operator is built from the merged marginals
            return np.arange(W.m), W.weights
        return W.source, W.source_weights

    def error_by_term(self) -> np.ndarray:
        """Expected total squared error of each workload term (repeated marginals apart)."""
        idx, w = self._terms()
        out: np.ndarray = w**2 * self.marginals.cells()[idx] * self.marginal_variances()[idx]
        return out

    def expected_error(self) -> float:
        return float(self.error_by_term().sum())

    def query_variances(self) -> np.ndarray:
        idx, w = self._terms()
        return np.repeat(w**2 * self.marginal_variances()[idx], self.marginals.cells()[idx])

    def svd_bound(self) -> float | None:
        if self.marginals.d > SVD_BOUND_MAX_D:
            return None
        s = svd_bound(self.workload, sizes=self.sizes)
        return None if s is None else self._unit_variance() * s

    def identity_error(self) -> float:
        W = self.marginals
        N = math.prod(W.sizes)
        return self._unit_variance() * float(N * np.sum(W.weights**2))

    def _summary_dict(self) -> dict[str, Any]:
        W = self.marginals
        by_term = W.weights**2 * W.cells() * self.marginal_variances()
        total = float(by_term.sum())
        queries = float(np.sum(W.cells()))
        bound = self.svd_bound()
        ident = self.identity_error()
        mv = W.weights**2 * self.marginal_variances()
        parts = [
            {
                "part": W.names[j],
                "queries": int(W.cells()[j]),
                "squared_error": float(by_term[j]),
                "max_variance": float(mv[j]),
                "rmse": math.sqrt(float(mv[j])),
            }
            for j in range(W.m)
        ]
        return {
            "template": self.template,
            "mechanism": self.mechanism,
            "privacy": self.privacy.to_dict(),
            "domain": self.domain.to_dict() if self.domain is not None else None,
            "queries": int(queries),
            "cells": math.prod(W.sizes),
            "strategy_rows": int(np.sum(np.exp(_log_rows(W)))),
            "sensitivity": self.sensitivity,
            "noise_scale": self.noise_scale,
            "expected_total_squared_error": total,
            "rmse_per_query": math.sqrt(total / queries),
            "error_is_upper_bound": False,
            "svd_bound": bound,
            "ratio_to_svd_bound": None if not bound else total / bound,
            "identity_total_squared_error": ident,
            "identity_rmse_ratio": math.sqrt(ident / total) if total > 0 else None,
            "parts": parts,
            "selection": self.info,
        }

    def __repr__(self) -> str:
        return (
            f"ResidualPlan({self.marginals.m} marginals, {len(self.precision)} residuals, "
            f"noise_scale={self.noise_scale:.6g}, objective={self.solution.objective!r})"
        )

    # -- persistence -----------------------------------------------------------
    def _save_extra(self, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
        arrays["residual_subsets"] = self.marginals.subsets
        arrays["residual_weights"] = self.marginals.weights
        arrays["residual_precision"] = self.precision
        return {"kind": self.kind, "objective": self.solution.objective}

    @classmethod
    def _from_saved(
        cls, doc: dict[str, Any], arrays: dict[str, np.ndarray], **kwargs: Any
    ) -> ResidualPlan:
        sizes = kwargs["sizes"]
        W = MarginalWorkload(sizes, arrays["residual_subsets"], arrays["residual_weights"])
        u = arrays["residual_precision"]
        sol = ResidualSolution(u, doc.get("objective", "sum"), math.nan, math.nan)
        return cls(
            W,
            sol,
            kwargs["privacy"],
            domain=kwargs.get("domain"),
            workload=kwargs.get("workload"),
            template=kwargs.get("template", "residual"),
            info=kwargs.get("info"),
        )

    def least_budget(self) -> zCDP:
        """The zCDP budget at which this plan's noise is the unit noise of its precisions.

        For a targets solution (:func:`.solve_targets`) that is the least budget
        meeting the targets: ``rho = sum_A c_A u_A / 2``, rounded up.
        """
        return zCDP(Fraction(self.sensitivity**2 * (1 + 1e-9)) / 2)


def _subsets(S: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [c for r in range(len(S) + 1) for c in itertools.combinations(S, r)]


def _log_rows(W: MarginalWorkload) -> np.ndarray:
    n = np.append(np.asarray(W.sizes, dtype=float) - 1.0, 1.0)
    out: np.ndarray = np.log(n[W.residuals]).sum(axis=1)
    return out
