"""Fitness-for-use mechanisms: the covariance, its privacy cost, profile and variances.

A linear query mechanism (paper 000, Definition 1) is a factorisation ``W = L B`` of
the workload with a basis ``B`` of linearly independent rows and a noise covariance
``Sigma``; it releases ``L (B x + N(0, Sigma))``. Everything about it follows from
``(W, B, Sigma)``:

* privacy profile (Definition 2): ``sqrt(b_j^T Sigma^-1 b_j)`` for each column ``b_j``
  of ``B`` (each cell of the domain);
* privacy cost (Corollary 3.2): the largest entry of the profile. The mechanism is
  ``rho``-zCDP with ``rho = cost^2 / 2``, and (epsilon, delta)-DP exactly when the
  Gaussian mechanism with ``Delta_2 / sigma = cost`` is (Theorem 3.2);
* query variances: ``diag(L Sigma L^T)``.

Three shapes share one interface (:class:`FitnessResult`): a dense mechanism
(:class:`FitnessSolution`), a Kronecker product of per-attribute mechanisms
(:class:`KronFitnessSolution`, exact, see :mod:`dpdask.strategy.fitness._product`)
and a union of independently measured parts (:class:`UnionFitnessSolution`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.linalg as sla

from dpdask.errors import ArgumentError, PlanError
from dpdask.linalg import (
    Dense,
    Identity,
    Kron,
    LinearQuery,
    Product,
    VStack,
    check_dense_size,
    kron_vector,
)
from dpdask.privacy import ApproxDP, Budget, gaussian_delta, zCDP
from dpdask.strategy.fitness._terms import RowTerm

__all__ = ["FitnessResult", "FitnessSolution", "KronFitnessSolution", "UnionFitnessSolution"]

# Relative allowance for floating-point error in an evaluated privacy cost: budgets
# are charged for ``cost * (1 + COST_MARGIN)``.
COST_MARGIN = 1e-9


class FitnessResult:
    """Interface shared by the fitness-for-use mechanisms.

    Subclasses provide ``workload``, ``targets``, ``basis``, ``Sigma``, ``L``,
    :meth:`privacy_profile`, :meth:`query_variances`, :meth:`noise_factor` and
    :meth:`scaled`.
    """

    workload: LinearQuery
    targets: np.ndarray
    info: dict[str, Any]

    # -- to be provided -------------------------------------------------
    def privacy_profile(self) -> np.ndarray:
        """``sqrt(b_j^T Sigma^-1 b_j)`` for every column ``b_j`` of the basis (every cell)."""
        raise NotImplementedError

    def query_variances(self) -> np.ndarray:
        """``diag(L Sigma L^T)``: the variance of every workload answer."""
        raise NotImplementedError

    def scaled(self, factor: float) -> FitnessResult:
        """The same mechanism with covariance ``factor * Sigma``."""
        raise NotImplementedError

    def noise_factor(self) -> LinearQuery:
        """An ``r x r`` factor ``F`` with ``F F^T = Sigma`` (for correlated Gaussian noise)."""
        raise NotImplementedError

    @property
    def basis(self) -> LinearQuery:
        """``B`` (``r x d``): the queries measured, rows spanning the workload's row space."""
        raise NotImplementedError

    @property
    def Sigma(self) -> LinearQuery:
        """The noise covariance on ``B x`` (``r x r``)."""
        raise NotImplementedError

    @property
    def L(self) -> LinearQuery:
        """The representation ``L`` with ``W = L B``."""
        raise NotImplementedError

    @property
    def lower_bound(self) -> float:
        """A certified lower bound on the least squared privacy cost for ``targets``.

        Weak duality: for probability vectors ``u`` over cells and ``v`` over queries,
        no mechanism meeting the targets has squared privacy cost below
        ``||diag(v / c)^{1/2} W diag(u)^{1/2}||_*^2`` (nuclear norm). For a dense
        solution the certifying ``(u, v)`` are in ``info["dual_weights"]``.
        """
        return float(self.info.get("lower_bound", 0.0))

    # -- derived --------------------------------------------------------
    @property
    def privacy_cost(self) -> float:
        """``max_j sqrt(b_j^T Sigma^-1 b_j)`` (Corollary 3.2 of paper 000)."""
        return float(self.privacy_profile().max())

    def variance_ratios(self) -> np.ndarray:
        """Each query's variance divided by its target."""
        out: np.ndarray = self.query_variances() / self.targets
        return out

    @property
    def max_ratio(self) -> float:
        """The largest variance-to-target ratio (at most 1 when the targets are met)."""
        return float(self.variance_ratios().max())

    def total_variance(self) -> float:
        """The sum of the query variances (the matrix mechanism's objective)."""
        return float(self.query_variances().sum())

    @property
    def gap(self) -> float:
        """Certified relative gap of ``privacy_cost^2 * max_ratio`` to :attr:`lower_bound`."""
        lb = self.lower_bound
        return self.privacy_cost**2 * self.max_ratio / lb - 1.0 if lb > 0 else math.inf

    def _charged_cost(self) -> float:
        return self.privacy_cost * (1.0 + COST_MARGIN)

    def zcdp(self) -> zCDP:
        """The zCDP budget this mechanism consumes: ``rho = cost^2 / 2`` (rounded up).

        Paper 000 notes that the privacy cost plays the role of ``Delta_2 / sigma``, so
        the mechanism is ``cost^2 / 2``-zCDP (Bun and Steinke 2016, Prop. 1.6).
        """
        return zCDP(Fraction(self._charged_cost()) ** 2 / 2)

    def approx_dp(self, epsilon: float) -> ApproxDP:
        """The (epsilon, delta) guarantee at ``epsilon`` (exact Gaussian calibration, delta up)."""
        delta = gaussian_delta(self._charged_cost(), float(epsilon))
        return ApproxDP(epsilon, Fraction(math.nextafter(delta, 1.0)))

    def for_budget(self, budget: Budget) -> FitnessResult:
        """Problem 2: the covariance rescaled so that the mechanism spends exactly ``budget``.

        The shape of ``Sigma`` (hence which queries are relatively more accurate) is
        kept; by Theorem 3.1 of paper 000 a solution of Problem 1 rescaled this way
        solves Problem 2 for the same relative targets.

        Parameters
        ----------
        budget : zCDP or ApproxDP
            ``rho``-zCDP admits privacy cost ``sqrt(2 rho)``; (epsilon, delta)-DP the
            largest ``c`` with ``Phi(c/2 - eps/c) - e^eps Phi(-c/2 - eps/c) <= delta``.

        Raises
        ------
        dpdask.errors.PlanError
            If the budget admits no Gaussian mechanism (pure DP, zero budget), or the
            rescaled mechanism would not fit in it.
        """
        if not isinstance(budget, zCDP | ApproxDP):
            raise PlanError(
                f"a Gaussian mechanism needs a zCDP or (epsilon, delta) budget, not {budget!r}"
            )
        allowed = budget.max_privacy_cost()
        if not allowed > 0:
            raise PlanError(f"the budget {budget!r} admits no Gaussian noise at all")
        factor = (self._charged_cost() / allowed) ** 2
        for _ in range(64):
            out = self.scaled(factor)
            if out._charged_cost() <= allowed:
                return out
            factor = math.nextafter(factor, math.inf) * (1.0 + 1e-15)
        raise PlanError(
            f"could not scale the mechanism into the budget {budget!r} "
            f"(privacy cost {self.privacy_cost!r} against {allowed!r})"
        )

    def summary(self) -> dict[str, Any]:
        """JSON-safe figures: privacy cost, ratios, variances and solver information."""
        ratios = self.variance_ratios()
        return {
            "privacy_cost": self.privacy_cost,
            "squared_privacy_cost": self.privacy_cost**2,
            "max_ratio": float(ratios.max()),
            "min_ratio": float(ratios.min()),
            "total_variance": self.total_variance(),
            "lower_bound": self.lower_bound,
            **{k: v for k, v in self.info.items() if isinstance(v, int | float | str | bool)},
        }


def _cholesky_upper(S: np.ndarray) -> np.ndarray:
    R, info = sla.lapack.dpotrf(S, lower=0, clean=1)
    if info != 0:
        raise ArgumentError("the noise covariance is not positive definite")
    out: np.ndarray = R
    return out


class FitnessSolution(FitnessResult):
    """A dense linear query mechanism ``(W, B, Sigma)`` from :func:`dpdask.strategy.fitness.solve`.

    Parameters
    ----------
    workload : LinearQuery
        ``W`` (``m x d``).
    targets : numpy.ndarray
        Variance targets (length ``m``).
    basis : LinearQuery
        ``B`` (``r x d``), linearly independent rows spanning ``W``'s row space.
    sigma : numpy.ndarray
        ``Sigma`` (``r x r``), symmetric positive definite, noise on ``B x``.
    basis_pinv : numpy.ndarray or None
        A right inverse ``B^#`` of ``B`` (``d x r``, ``B B^# = I``, so ``L = W B^#``);
        ``None`` when ``B`` is the identity.
    rows : row term
        ``L_c``, the queries in the solver's canonical basis (see
        :mod:`dpdask.strategy.fitness._terms`).
    to_canonical : numpy.ndarray or None
        ``T^-1`` where ``B = T B_c``: the canonical covariance is ``T^-1 Sigma T^-T``
        (``None`` when ``B`` is the canonical basis).
    info : dict
        Solver information (iterations, certified lower bound, ...).
    """

    def __init__(
        self,
        workload: LinearQuery,
        targets: np.ndarray,
        basis: LinearQuery,
        sigma: np.ndarray,
        basis_pinv: np.ndarray | None,
        rows: RowTerm,
        to_canonical: np.ndarray | None = None,
        info: dict[str, Any] | None = None,
    ):
        self.workload = workload
        self.targets = np.asarray(targets, dtype=float)
        self._basis = basis
        self.sigma = np.asarray(sigma, dtype=float)
        self.basis_pinv = basis_pinv
        self._rows = rows
        self._to_canonical = to_canonical
        self.info = dict(info or {})

    @property
    def basis(self) -> LinearQuery:
        """``B``, as given."""
        return self._basis

    @property
    def Sigma(self) -> Dense:
        """The noise covariance on ``B x``, as an operator."""
        return Dense(self.sigma)

    @property
    def L(self) -> LinearQuery:
        """The representation ``L`` with ``W = L B``: ``W`` itself for ``B = I``, else ``W B^+``."""
        if self.basis_pinv is None:
            return self.workload
        return Product(self.workload, Dense(self.basis_pinv))

    def _basis_dense(self) -> np.ndarray:
        if isinstance(self.basis, Identity):
            return np.eye(self.basis.n)
        return self.basis.dense()

    def privacy_profile(self) -> np.ndarray:
        R = _cholesky_upper(self.sigma)
        if isinstance(self.basis, Identity):
            Rinv = sla.lapack.dtrtri(R, lower=0)[0]
            out: np.ndarray = np.sqrt(np.einsum("ij,ij->i", Rinv, Rinv))
            return out
        Z = sla.solve_triangular(R, self._basis_dense(), trans="T", check_finite=False)
        out = np.sqrt(np.einsum("ij,ij->j", Z, Z))
        return out

    def query_variances(self) -> np.ndarray:
        if self._to_canonical is None:
            return self._rows.quad(self.sigma)
        P = self._to_canonical
        return self._rows.quad(P @ self.sigma @ P.T)

    def scaled(self, factor: float) -> FitnessSolution:
        return FitnessSolution(
            self.workload,
            self.targets,
            self.basis,
            self.sigma * float(factor),
            self.basis_pinv,
            self._rows,
            self._to_canonical,
            self.info,
        )

    def noise_factor(self) -> Dense:
        """The lower Cholesky factor ``F`` of ``Sigma`` (``F F^T = Sigma``)."""
        return Dense(_cholesky_upper(self.sigma).T)

    def __repr__(self) -> str:
        return (
            f"FitnessSolution(shape={self.workload.shape}, rank={self.sigma.shape[0]}, "
            f"privacy_cost={self.privacy_cost:.6g}, max_ratio={self.max_ratio:.6g})"
        )


class KronFitnessSolution(FitnessResult):
    """A Kronecker product of per-factor mechanisms: ``B = (x) B_k``, ``Sigma = (x) Sigma_k``.

    For ``W = (x) W_k`` with targets ``c = (x) c_k`` the privacy profile, the query
    variances and the covariance all factor, and the product of the factors' optima
    is optimal for the product problem (see :mod:`dpdask.strategy.fitness._product`).
    """

    def __init__(self, factors: Sequence[FitnessSolution], names: Sequence[str] | None = None):
        self.factors = list(factors)
        if not self.factors:
            raise ArgumentError("a Kronecker mechanism needs at least one factor")
        self.names = tuple(names) if names is not None else None
        self.workload = Kron([f.workload for f in self.factors])
        self.targets = kron_vector([f.targets for f in self.factors])
        lbs = [f.lower_bound for f in self.factors]
        self.info = {
            "lower_bound": math.prod(lbs),
            "factors": len(self.factors),
            "seconds": sum(float(f.info.get("seconds", 0.0)) for f in self.factors),
        }

    @property
    def basis(self) -> Kron:
        return Kron([f.basis for f in self.factors])

    @property
    def Sigma(self) -> Kron:
        return Kron([f.Sigma for f in self.factors])

    @property
    def L(self) -> Kron:
        return Kron([f.L for f in self.factors])

    def privacy_profile(self) -> np.ndarray:
        return kron_vector([f.privacy_profile() for f in self.factors])

    def query_variances(self) -> np.ndarray:
        return kron_vector([f.query_variances() for f in self.factors])

    @property
    def privacy_cost(self) -> float:
        return math.prod(f.privacy_cost for f in self.factors)

    @property
    def max_ratio(self) -> float:
        return math.prod(f.max_ratio for f in self.factors)

    def scaled(self, factor: float) -> KronFitnessSolution:
        return KronFitnessSolution([self.factors[0].scaled(factor), *self.factors[1:]], self.names)

    def noise_factor(self) -> Kron:
        return Kron([f.noise_factor() for f in self.factors])

    def __repr__(self) -> str:
        return (
            f"KronFitnessSolution({len(self.factors)} factors, shape={self.workload.shape}, "
            f"privacy_cost={self.privacy_cost:.6g})"
        )


class BlockDiagonal(LinearQuery):
    """``diag(A_1, A_2, ...)``: the covariance (or its factor) of independently measured parts."""

    def __init__(self, blocks: Sequence[LinearQuery]):
        self.blocks = list(blocks)
        self.rows = np.cumsum([0] + [b.shape[0] for b in self.blocks])
        self.cols = np.cumsum([0] + [b.shape[1] for b in self.blocks])
        self.shape = (int(self.rows[-1]), int(self.cols[-1]))

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [
                b._matmat(X[a:z])
                for b, a, z in zip(self.blocks, self.cols[:-1], self.cols[1:], strict=True)
            ]
        )

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [
                b._rmatmat(Y[a:z])
                for b, a, z in zip(self.blocks, self.rows[:-1], self.rows[1:], strict=True)
            ]
        )

    def _rounding(self) -> tuple[float, float]:
        from dpdask.linalg import rounding_pair

        pairs = [rounding_pair(b) for b in self.blocks]
        return max(p[0] for p in pairs), max(p[1] for p in pairs)

    def _params(self) -> tuple[object, ...]:
        return tuple(self.blocks)

    def dense(self) -> np.ndarray:
        check_dense_size(self.size, f"a {self.shape} BlockDiagonal")
        out: np.ndarray = sla.block_diag(*[b.dense() for b in self.blocks])
        return out


class UnionFitnessSolution(FitnessResult):
    """A union ``W = [W_1; W_2; ...]`` whose parts are measured independently.

    Each part has its own mechanism (its own basis and covariance); the noise of the
    parts is independent, so the released vector is ``[B_1 x + N_1; B_2 x + N_2; ...]``
    with block-diagonal covariance. Its squared privacy profile is the sum of the
    parts' squared profiles (Theorem 3.2 of paper 000 applied to the stacked basis), so
    the privacy cost is at most the root of the sum of the parts' squared costs: the
    budget is split between the parts in proportion to their squared costs. This is
    an approximation: the parts' noise could be correlated to do better, and the
    certified :attr:`lower_bound` (the largest part's) says by at most how much.
    """

    def __init__(self, parts: Sequence[FitnessResult], workload: LinearQuery):
        self.parts = list(parts)
        self.workload = workload
        self.targets = np.concatenate([p.targets for p in self.parts])
        self.info = {
            "lower_bound": max(p.lower_bound for p in self.parts),
            "parts": len(self.parts),
            "seconds": sum(float(p.info.get("seconds", 0.0)) for p in self.parts),
        }

    @property
    def basis(self) -> VStack:
        return VStack([p.basis for p in self.parts])

    @property
    def Sigma(self) -> BlockDiagonal:
        return BlockDiagonal([p.Sigma for p in self.parts])

    @property
    def L(self) -> BlockDiagonal:
        """``diag(L_1, L_2, ...)``: ``W = L [B_1; B_2; ...]``."""
        return BlockDiagonal([p.L for p in self.parts])

    def privacy_profile(self) -> np.ndarray:
        return np.sqrt(sum(p.privacy_profile() ** 2 for p in self.parts))

    def query_variances(self) -> np.ndarray:
        return np.concatenate([p.query_variances() for p in self.parts])

    def part_budget_shares(self) -> np.ndarray:
        """Each part's share of the squared privacy cost (its share of a zCDP budget)."""
        sq = np.array([p.privacy_cost**2 for p in self.parts])
        out: np.ndarray = sq / sq.sum()
        return out

    def scaled(self, factor: float) -> UnionFitnessSolution:
        return UnionFitnessSolution([p.scaled(factor) for p in self.parts], self.workload)

    def noise_factor(self) -> BlockDiagonal:
        return BlockDiagonal([p.noise_factor() for p in self.parts])

    def __repr__(self) -> str:
        return (
            f"UnionFitnessSolution({len(self.parts)} parts, shape={self.workload.shape}, "
            f"privacy_cost={self.privacy_cost:.6g})"
        )
