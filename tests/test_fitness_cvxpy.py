"""SM-II against an independent convex solver: Problem 1 as a semidefinite program in cvxpy.

Problem 1 with basis ``B`` (``r x d``) and ``L = W B^+`` is the SDP

    minimise t  subject to  [[Sigma, B], [B^T, Z]] >= 0,  diag(Z) <= t,
                            diag(L Sigma L^T) <= c,

(the Schur complement makes ``Z >= B^T Sigma^-1 B``), solved by Clarabel, an
interior-point method: a different algorithm on a different formulation. Every
workload here is small enough for it.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpdask import Domain
from dpdask import workloads as wl
from dpdask.linalg import AllRange, Dense, Identity, Kron, Ones, Prefix, RangeQueries, VStack
from dpdask.strategy.fitness import solve
from tests import requires_cvxpy


def sdp_optimum(W: np.ndarray, c: np.ndarray) -> float:
    """Least squared privacy cost of Problem 1, by cvxpy (orthonormal row-space basis)."""
    import cvxpy as cp

    _, s, Vt = np.linalg.svd(W, full_matrices=False)
    B = Vt[s > 1e-9 * s[0]]
    r, d = B.shape
    L = W @ B.T
    S = cp.Variable((r, r), symmetric=True)
    Z = cp.Variable((d, d), symmetric=True)
    t = cp.Variable()
    constraints = [
        cp.bmat([[S, B], [B.T, Z]]) >> 0,
        cp.diag(Z) <= t,
        cp.sum(cp.multiply(L @ S, L), axis=1) <= c,
    ]
    problem = cp.Problem(cp.Minimize(t), constraints)
    problem.solve(solver="CLARABEL")
    assert problem.status == "optimal"
    return float(problem.value)


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
    opt = sdp_optimum(W.dense(), c)
    sol = solve(W, c)
    cost2 = sol.privacy_cost**2
    assert sol.max_ratio <= 1 + 1e-9
    # SM-II is feasible, so it cannot beat the optimum (up to the SDP solver's accuracy) ...
    assert cost2 >= opt * (1 - 1e-5)
    # ... and it is within its certified gap of it
    assert cost2 <= opt * (1 + 2e-4)
    assert sol.lower_bound <= opt * (1 + 1e-5)


@requires_cvxpy
def test_kron_factor_solution_is_the_joint_optimum() -> None:
    """Solved by factors, a product with factored targets reaches the SDP optimum."""
    rng = np.random.default_rng(11)
    W = Kron([Prefix(4), Identity(2), AllRange(2)])
    targets = [rng.uniform(1, 3, 4), rng.uniform(1, 3, 2), rng.uniform(1, 3, 3)]
    sol = solve(W, targets)
    assert type(sol).__name__ == "KronFitnessSolution"
    opt = sdp_optimum(W.dense(), np.kron(np.kron(targets[0], targets[1]), targets[2]))
    assert sol.privacy_cost**2 == pytest.approx(opt, rel=2e-4)
    assert sol.lower_bound <= opt * (1 + 1e-5)
