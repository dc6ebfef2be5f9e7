"""SM-II against an independent convex solver: Problem 1 as a semidefinite program in cvxpy.

Problem 1 with basis ``B`` (``r x d``) and ``L = W B^+`` is the SDP

    minimise t  subject to  [[Sigma, B], [B^T, Z]] >= 0,  diag(Z) <= t,
                            diag(L Sigma L^T) <= c,

(the Schur complement makes ``Z >= B^T Sigma^-1 B``), solved by Clarabel, an
interior-point method: a different algorithm on a different formulation. Every
workload here is small enough for it. Its status string is not trusted: each answer
(``optimal`` or ``optimal_inaccurate``) is bracketed by a feasible point and a dual
bound computed here, and used only when that certified gap is small.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pytest

from dpdask import Domain
from dpdask import workloads as wl
from dpdask.linalg import AllRange, Dense, Identity, Kron, Ones, Prefix, RangeQueries, VStack
from dpdask.strategy.fitness import solve
from tests import requires_cvxpy

ACCEPTED = ("optimal", "optimal_inaccurate")
"""Solver statuses whose answer is used, each only through the certificate below."""

MAX_GAP = 1e-5
"""Largest certified relative gap ``(upper - lower) / upper`` an oracle may have."""


@dataclass(frozen=True)
class SDPBracket:
    """The optimum of Problem 1, bracketed by a feasible point and a dual bound.

    Attributes
    ----------
    lower : float
        Dual objective at a dual-feasible point built from the solver's multipliers
        (weak duality: no feasible point is below it).
    upper : float
        Objective at a primal point made feasible here from the solver's ``Sigma``.
    status : str
        The solver's status string (informative only).
    """

    lower: float
    upper: float
    status: str

    @property
    def gap(self) -> float:
        """Certified relative gap ``(upper - lower) / upper``."""
        return (self.upper - self.lower) / self.upper


def _feasible_value(S: np.ndarray, B: np.ndarray, L: np.ndarray, c: np.ndarray) -> float:
    """An upper bound on the optimum: ``max diag(B^T S^-1 B)`` at a feasible rescaling of ``S``.

    ``S`` is symmetrised and floored to positive definite, then scaled so that
    ``diag(L S L^T) <= c`` holds exactly; with ``Z = B^T S^-1 B`` the block matrix is
    positive semidefinite (Schur complement), so this ``t`` is attained.
    """
    S = (S + S.T) / 2
    lam, V = np.linalg.eigh(S)
    lam = np.maximum(lam, 1e-12 * lam.max())
    S = (V * lam) @ V.T
    S = S / np.max(np.einsum("ij,jk,ik->i", L, S, L) / c)
    X = np.linalg.solve(S, B)
    return float(np.max(np.einsum("ij,ij->j", B, X)))


def _dual_value(
    B: np.ndarray, L: np.ndarray, c: np.ndarray, lam: np.ndarray, mu: np.ndarray
) -> float:
    """A lower bound on the optimum from multipliers ``lam >= 0`` and ``mu >= 0``.

    With ``Y = [[Y11, Y12], [Y12^T, Y22]] >= 0`` for the semidefinite constraint,
    ``mu`` for ``diag(Z) <= t`` and ``lam`` for the privacy constraints, the Lagrange
    dual needs ``sum(mu) = 1``, ``Y22 = diag(mu)``, ``Y11 = L^T diag(lam) L``, and its
    objective ``-2 <Y12, B> - lam^T c`` is largest, over the ``Y12`` keeping ``Y``
    semidefinite, at ``2 ||Y11^(1/2) B Y22^(1/2)||_* - lam^T c``. Any such
    ``(lam, mu)`` is dual feasible, so this is a bound however inaccurate they are.
    """
    lam = np.maximum(lam, 0.0)
    mu = np.maximum(mu, 0.0)
    mu = mu / mu.sum()
    w, V = np.linalg.eigh(L.T @ (lam[:, None] * L))
    root = (V * np.sqrt(np.maximum(w, 0.0))) @ V.T
    nuclear = np.linalg.svd(root @ B * np.sqrt(mu), compute_uv=False).sum()
    return float(2 * nuclear - lam @ c)


def sdp_bracket(W: np.ndarray, c: np.ndarray) -> SDPBracket:
    """Least squared privacy cost of Problem 1 by cvxpy, certified by a bracket.

    The solver's status is not trusted on its own: ``optimal`` and
    ``optimal_inaccurate`` are both accepted, and either way the answer is turned
    into a feasible primal value and a dual bound computed here (orthonormal
    row-space basis). A bracket wider than :data:`MAX_GAP` is re-solved with
    tighter tolerances before it fails the test.
    """
    import cvxpy as cp

    _, s, Vt = np.linalg.svd(W, full_matrices=False)
    B = Vt[s > 1e-9 * s[0]]
    r, d = B.shape
    L = W @ B.T
    S = cp.Variable((r, r), symmetric=True)
    Z = cp.Variable((d, d), symmetric=True)
    t = cp.Variable()
    diag_bound = cp.diag(Z) <= t
    privacy = cp.sum(cp.multiply(L @ S, L), axis=1) <= c
    constraints = [cp.bmat([[S, B], [B.T, Z]]) >> 0, diag_bound, privacy]
    problem = cp.Problem(cp.Minimize(t), constraints)
    tight = {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10, "max_iter": 500}
    bracket = None
    for options in ({}, tight):
        with warnings.catch_warnings():  # an inaccurate answer is certified below
            warnings.filterwarnings("ignore", "Solution may be inaccurate", UserWarning)
            problem.solve(solver="CLARABEL", **options)
        if problem.status not in ACCEPTED:
            continue
        upper = _feasible_value(S.value, B, L, c)
        lower = _dual_value(B, L, c, np.asarray(privacy.dual_value), diag_bound.dual_value)
        bracket = SDPBracket(lower, upper, problem.status)
        if bracket.gap <= MAX_GAP:
            break
    assert bracket is not None, f"CLARABEL: {problem.status}"
    assert bracket.gap <= MAX_GAP, f"uncertified SDP answer: {bracket}"
    return bracket


def _cases() -> list:
    rng = np.random.default_rng(3)
    dom = Domain(a=2, b=2, c=2)
    return [
        pytest.param(Prefix(8), np.ones(8), id="prefix-8"),
        pytest.param(Prefix(10), rng.uniform(1, 10, 10), id="prefix-10-random-targets"),
        pytest.param(AllRange(6), rng.uniform(1, 4, 21), id="allrange-6"),
        pytest.param(
            VStack([wl.marginals(dom, 1), wl.marginals(dom, 2)]), np.ones(18), id="marginals-k3-t2"
        ),
        pytest.param(
            Dense(rng.integers(0, 2, (7, 4)) @ rng.integers(0, 2, (4, 9)).astype(float)),
            rng.uniform(1, 2, 7),
            id="random-rank-deficient",
        ),
        pytest.param(
            Kron([Prefix(3), AllRange(3)]),
            np.kron(rng.uniform(1, 2, 3), rng.uniform(1, 2, 6)),
            id="kron-factored",
        ),
        pytest.param(VStack([Identity(6), Ones(6)]), np.ones(7), id="identity-sum"),
        pytest.param(
            RangeQueries(12, [0, 2, 2, 5, 9], [3, 4, 8, 6, 9]),
            rng.uniform(1, 3, 5),
            id="ranges-merged-rank-deficient",
        ),
    ]


@requires_cvxpy
@pytest.mark.parametrize(("W", "c"), _cases())
def test_smii_matches_sdp(W, c: np.ndarray) -> None:
    opt = sdp_bracket(W.dense(), c)
    sol = solve(W, c)
    cost2 = sol.privacy_cost**2
    assert sol.max_ratio <= 1 + 1e-9
    # SM-II is feasible, so it cannot beat the certified lower bound ...
    assert cost2 >= opt.lower * (1 - 1e-9)
    # ... it is within its certified gap of the optimum, which is at most the upper bound ...
    assert cost2 <= opt.upper * (1 + 2e-4)
    # ... and its own lower bound is no larger than the optimum
    assert sol.lower_bound <= opt.upper * (1 + 1e-9)


@requires_cvxpy
def test_kron_factor_solution_is_the_joint_optimum() -> None:
    """Solved by factors, a product with factored targets reaches the SDP optimum."""
    rng = np.random.default_rng(11)
    W = Kron([Prefix(4), Identity(2), AllRange(2)])
    targets = [rng.uniform(1, 3, 4), rng.uniform(1, 3, 2), rng.uniform(1, 3, 3)]
    sol = solve(W, targets)
    assert type(sol).__name__ == "KronFitnessSolution"
    opt = sdp_bracket(W.dense(), np.kron(np.kron(targets[0], targets[1]), targets[2]))
    assert opt.lower * (1 - 2e-4) <= sol.privacy_cost**2 <= opt.upper * (1 + 2e-4)
    assert sol.lower_bound <= opt.upper * (1 + 1e-9)
