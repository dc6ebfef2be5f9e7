"""The residual strategy against dense oracles: the matrix mechanism on explicit matrices.

The oracle is written here from the definitions, in the paper's form: residual
``R_A = (x)_i (D_i if i in A else 1^T)`` with the difference matrix ``D_i``
(rows ``e_j - e_{j+1}``), measured with Gaussian noise of covariance
``sigma_A^2 R_A R_A^T``; privacy is the largest whitened column norm, variances
come from the generalised least-squares covariance ``W (R^T Sigma^-1 R)^+ W^T``.
"""

from __future__ import annotations

import itertools
import math
from functools import reduce

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import block_diag

import dpdask
from dpdask import Domain
from dpdask.errors import ArgumentError, DomainError, PlanError
from dpdask.privacy import PureDP, zCDP
from dpdask.strategy.residual import (
    MarginalWorkload,
    ResidualPlan,
    all_subsets,
    as_marginals,
    plan_residual,
    solve_max,
    solve_sum,
    solve_targets,
)
from dpdask.workloads import marginals


def _kron(fs: list[np.ndarray]) -> np.ndarray:
    return reduce(np.kron, fs, np.ones((1, 1)))


def _diff(n: int) -> np.ndarray:
    return np.eye(n)[:-1] - np.eye(n)[1:]


def _marginal(sizes: tuple[int, ...], S: tuple[int, ...]) -> np.ndarray:
    return _kron([np.eye(n) if i in S else np.ones((1, n)) for i, n in enumerate(sizes)])


def _dense_mechanism(W: MarginalWorkload, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(R, Sigma)``: the stacked residuals and their block-diagonal noise covariance."""
    Rs, covs = [], []
    for A, uA in zip(W.residual_sets(), u, strict=True):
        R = _kron([_diff(n) if i in A else np.ones((1, n)) for i, n in enumerate(W.sizes)])
        not_a = math.prod(n for i, n in enumerate(W.sizes) if i not in A)
        Rs.append(R)
        covs.append(R @ R.T / (uA * not_a))  # sigma_A^2 = s_A^2 / N_{not A}
    return np.vstack(Rs), block_diag(*covs)


def _workloads() -> st.SearchStrategy:
    @st.composite
    def build(draw: st.DrawFn) -> MarginalWorkload:
        d = draw(st.integers(1, 4))
        sizes = tuple(draw(st.lists(st.integers(2, 4), min_size=d, max_size=d)))
        all_sets = [s for r in range(d + 1) for s in itertools.combinations(range(d), r)]
        sets = draw(st.lists(st.sampled_from(all_sets), min_size=1, max_size=5, unique=True))
        weights = draw(st.lists(st.floats(0.25, 4.0), min_size=len(sets), max_size=len(sets)))
        return MarginalWorkload(sizes, sets, weights)

    return build()


# -- the algebra ---------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(W=_workloads(), seed=st.integers(0, 2**16))
def test_variances_and_privacy_equal_the_dense_matrix_mechanism(W, seed):
    u = np.random.default_rng(seed).uniform(0.2, 5.0, len(W.residuals))
    R, Sigma = _dense_mechanism(W, u)
    F = R.T @ np.linalg.solve(Sigma, R)
    # every column has the same whitened norm, the residual formula's sensitivity
    np.testing.assert_allclose(np.diag(F), W.sensitivity2(u), rtol=1e-9)
    Fp = np.linalg.pinv(F)
    for S, V in zip(W.sets(), W.cell_variances(u), strict=True):
        M = _marginal(W.sizes, S)
        np.testing.assert_allclose(np.diag(M @ Fp @ M.T), V, rtol=1e-8)


@settings(max_examples=15, deadline=None)
@given(W=_workloads(), seed=st.integers(0, 2**16))
def test_the_plans_strategy_is_the_same_mechanism(W, seed):
    u = np.random.default_rng(seed).uniform(0.2, 5.0, len(W.residuals))
    sol = solve_sum(W)
    sol.precision = u
    plan = ResidualPlan(W, sol, zCDP("0.5"))
    A = plan.strategy.dense()
    assert plan.sensitivity == pytest.approx(float(np.linalg.norm(A, axis=0).max()), rel=1e-9)
    assert plan.noise_scale == pytest.approx(plan.sensitivity, rel=1e-12)  # rho = 1/2
    Wd = plan.workload.dense()
    cov = plan.noise_variance * Wd @ np.linalg.pinv(A.T @ A) @ Wd.T
    np.testing.assert_allclose(plan.query_variances(), np.diag(cov), rtol=1e-7)
    assert plan.expected_error() == pytest.approx(float(np.trace(cov)), rel=1e-7)


def test_residual_closure_and_empty_residuals():
    W = MarginalWorkload((2, 1, 3), [(0, 1), (1, 2), (0, 1)], [1.0, 1.0, 2.0])
    assert W.m == 2 and W.weights.tolist() == pytest.approx([math.sqrt(5), 1.0])
    # attribute 1 has one value: residuals containing it are empty and dropped
    assert W.residual_sets() == [(), (0,), (2,)]
    with pytest.raises(DomainError, match="outside"):
        MarginalWorkload((2, 2), [(0, 2)])
    with pytest.raises(ArgumentError, match="positive"):
        MarginalWorkload((2, 2), [(0,)], [0.0])


def test_all_subsets_counts_the_marginals_up_to_three_way():
    rows = all_subsets(100, 3)
    assert rows.shape == (1 + 100 + 4950 + 161700, 3)
    assert all_subsets(5, 2, up_to=False).shape == (10, 2)


# -- the optimum -------------------------------------------------------------------------
@pytest.mark.parametrize("d", [3, 4, 6])
def test_sum_optimum_is_the_svd_bound_and_not_above_opt_m(d):
    dom = Domain({f"a{i}": 2 + i % 3 for i in range(d)})
    W = marginals(dom, 2)
    plan = dpdask.select(W, zCDP("0.5"), "residual", domain=dom)
    bound = plan.svd_bound()  # dpdask.strategy.analysis.svd_bound: no strategy does better
    assert plan.expected_error() == pytest.approx(bound, rel=1e-9)
    opt_m = dpdask.select(W, zCDP("0.5"), domain=dom, templates=["marginals"], restarts=2)
    assert plan.expected_error() <= opt_m.expected_error() * (1 + 1e-9)


def test_hdmm_keeps_its_path_for_pure_dp_and_other_workloads():
    dom = Domain(a=2, b=3, c=4)
    W = marginals(dom, 2)
    assert not dpdask.select(W, PureDP(1), domain=dom, restarts=1).template.endswith("residual")
    from dpdask.linalg import Kron, Prefix

    P = Kron([Prefix(2), Prefix(3), Prefix(4)])
    assert as_marginals(P) is None
    assert "residual" not in dpdask.select(P, zCDP(1), restarts=1).template
    with pytest.raises(PlanError, match="Gaussian"):
        dpdask.select(W, PureDP(1), "residual", domain=dom)
    with pytest.raises(PlanError, match="marginal workload"):
        dpdask.select(P, zCDP(1), "residual")
    with pytest.raises(PlanError, match="objective"):
        dpdask.select(W, zCDP(1), "residual", domain=dom, objective="median")
    with pytest.raises(PlanError, match="targets"):
        dpdask.select(W, zCDP(1), "residual", domain=dom, objective="targets", targets=[1.0])


def _cvx_workload(seed: int) -> MarginalWorkload:
    rng = np.random.default_rng(seed)
    sizes = (2, 3, 4, 2, 5)
    sets = [tuple(sorted(rng.choice(5, size=k, replace=False))) for k in (1, 2, 2, 3, 3, 2)]
    return MarginalWorkload(sizes, sets, rng.uniform(0.5, 3.0, len(sets)))


def _cvx_solve(W: MarginalWorkload, objective: str, tau: np.ndarray | None = None):
    cp = pytest.importorskip("cvxpy")
    p = W.pairs()
    c = W.residual_cost()
    u = cp.Variable(c.size, pos=True)
    inv = cp.inv_pos(u)
    V = [
        cp.sum(cp.multiply(p.v[p.marginal == s], inv[p.residual[p.marginal == s]]))
        for s in range(W.m)
    ]
    if objective == "sum":
        prob = cp.Problem(
            cp.Minimize(
                sum(w * w * n * v for w, n, v in zip(W.weights, W.cells(), V, strict=True))
            ),
            [c @ u <= 1],
        )
    elif objective == "max":
        t = cp.Variable()
        cons = [c @ u <= 1] + [w * w * v <= t for w, v in zip(W.weights, V, strict=True)]
        prob = cp.Problem(cp.Minimize(t), cons)
    else:
        prob = cp.Problem(cp.Minimize(c @ u), [v <= t for v, t in zip(V, tau, strict=True)])
    prob.solve(solver="CLARABEL", tol_gap_rel=1e-10, tol_gap_abs=1e-10, tol_feas=1e-10)
    return np.asarray(u.value)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_optimum_matches_cvxpy(seed):
    W = _cvx_workload(seed)
    # the cvxpy point, made exactly feasible and evaluated with the residual formulas
    s = solve_sum(W)
    u = _cvx_solve(W, "sum")
    assert s.value == pytest.approx(W.total_variance(u / W.sensitivity2(u)), rel=1e-6)
    m = solve_max(W)
    assert m.gap < 1e-8 and m.lower_bound <= m.value * (1 + 1e-12)
    u = _cvx_solve(W, "max")
    cvx = float(np.max(W.weights**2 * W.cell_variances(u / W.sensitivity2(u))))
    assert m.value == pytest.approx(cvx, rel=1e-6)
    assert m.value <= cvx * (1 + 1e-9)  # cvxpy's point is feasible: never better
    tau = np.random.default_rng(seed).uniform(0.5, 4.0, W.m)
    t = solve_targets(W, tau)
    assert np.all(W.cell_variances(t.precision) <= tau * (1 + 1e-12))
    u = _cvx_solve(W, "targets", tau)
    cvx = W.sensitivity2(u) * float(np.max(W.cell_variances(u) / tau))
    assert t.value == pytest.approx(cvx, rel=1e-6)
    assert t.lower_bound <= cvx * (1 + 1e-9)


def test_targets_plan_has_the_least_budget_meeting_them():
    dom = Domain(a=2, b=3, c=4)
    W = marginals(dom, 2)
    tau = np.array([4.0, 9.0, 16.0])
    plan = dpdask.select(W, None, "residual", domain=dom, objective="targets", targets=tau)
    assert np.all(plan.marginal_variances() <= tau)
    assert np.max(plan.marginal_variances() / tau) > 1 - 1e-6  # the least: some target is tight
    assert plan.privacy.rho == pytest.approx(plan.solution.value / 2, rel=1e-8)


def test_max_objective_certified_on_binary_three_way_marginals():
    for d in (8, 10):
        W = MarginalWorkload((2,) * d, all_subsets(d, 3, up_to=False))
        m = solve_max(W)
        assert -1e-12 <= m.gap < 1e-8  # rounding may put the bound a hair above
        # symmetric workload: the sum optimum spreads the variance evenly, so it is also
        # optimal for the largest variance
        s = solve_sum(W)
        assert m.value == pytest.approx(float(W.cell_variances(s.precision).max()), rel=1e-8)


def test_plan_saves_and_loads(tmp_path):
    dom = Domain(a=2, b=3, c=4)
    plan = dpdask.select(marginals(dom, 2), zCDP("1/3"), "residual", domain=dom, objective="max")
    plan.save(tmp_path / "p.npz")
    back = dpdask.Plan.load(tmp_path / "p.npz")
    assert isinstance(back, ResidualPlan)
    assert back.noise_scale == plan.noise_scale
    np.testing.assert_array_equal(back.query_variances(), plan.query_variances())
    assert "hdmm-residual" not in plan.summary() and "residual" in plan.summary()


def test_plan_residual_takes_a_marginal_workload_object():
    W = MarginalWorkload((3, 3, 3), [(0, 1), (1, 2), (0, 2)])
    plan = plan_residual(W, zCDP(1), objective="max")
    assert plan.workload.shape == (27, 27)
    assert plan.info["gap"] < 1e-8


def test_hdmm_picks_residual_when_lower_unless_templates_are_named():
    from dpdask.privacy import ApproxDP

    dom = Domain({f"a{i}": 2 for i in range(5)})
    W = marginals(dom, 2)  # HDMM's best is about 1.1x the optimum here
    plan = dpdask.select(W, ApproxDP(1, "1e-6"), domain=dom, restarts=1)
    assert isinstance(plan, ResidualPlan) and plan.template == "hdmm-residual"
    assert plan.expected_error() < plan.info["hdmm_expected_error"] * (1 - 1e-6)
    named = dpdask.select(W, ApproxDP(1, "1e-6"), domain=dom, templates=["kron"], restarts=1)
    assert named.template == "hdmm-kron"
    assert plan.expected_error() <= named.expected_error()


def test_hdmm_keeps_its_plan_where_it_reaches_the_optimum():
    # total, two one-way marginals and the full table: the marginals template is optimal
    from dpdask.linalg import VStack

    dom = Domain(a=2, b=8)
    W = VStack([marginals(dom, k) for k in range(3)])
    plan = dpdask.select(W, zCDP(1), domain=dom, restarts=2)
    best = dpdask.select(W, zCDP(1), "residual", domain=dom)
    assert plan.expected_error() <= best.expected_error() * (1 + 1e-6)
    assert plan.expected_error() == pytest.approx(best.expected_error(), rel=1e-6)


def test_repeated_marginals_keep_the_workloads_rows():
    from dpdask.linalg import VStack

    dom = Domain(a=2, b=3, c=4)
    W = VStack([marginals(dom, 1), marginals(dom, 2), marginals(dom, 1)], weights=[1, 1, 2])
    plan = dpdask.select(W, zCDP(1), "residual", domain=dom)
    assert plan.marginals.m == 6
    A, Wd = plan.strategy.dense(), W.dense()
    cov = plan.noise_variance * Wd @ np.linalg.pinv(A.T @ A) @ Wd.T
    np.testing.assert_allclose(plan.query_variances(), np.diag(cov), rtol=1e-8)
    assert plan.error_by_term().shape == (9,)
    assert plan.expected_error() == pytest.approx(plan.svd_bound(), rel=1e-9)
    # one marginal: measured as it is, HDMM's path
    assert dpdask.select(marginals(dom, 3), zCDP(1), domain=dom, restarts=1).template != (
        "hdmm-residual"
    )


def test_plan_covariance_equals_the_dense_least_squares_covariance():
    dom = Domain(a=2, b=3, c=4)
    W = marginals(dom, 2)
    plan = dpdask.select(W, zCDP("0.7"), "residual", domain=dom, objective="max")
    A = plan.strategy.dense()
    cov = plan.noise_variance * np.linalg.pinv(A.T @ A)
    sizes = dom.shape
    for S, T in [((0, 1), (0, 1)), ((0, 1), (1, 2)), ((2,), (0, 2)), ((), (1,))]:
        want = _marginal(sizes, S) @ cov @ _marginal(sizes, T).T
        np.testing.assert_allclose(plan.covariance(S, T), want, atol=1e-10)
    with pytest.raises(PlanError, match="not measured"):
        plan.covariance((0, 1, 2))


def test_an_unfinished_program_warns_and_stays_feasible(monkeypatch):
    from dpdask.errors import ConvergenceWarning
    from dpdask.strategy.residual import _solve

    monkeypatch.setattr(_solve, "NEWTON_STEPS", 0)
    W = _cvx_workload(3)
    tau = np.linspace(0.5, 3.0, W.m)
    with pytest.warns(ConvergenceWarning, match="certified gap"):
        sol = solve_targets(W, tau, gap=1e-12, maxiter=2)
    assert np.all(W.cell_variances(sol.precision) <= tau * (1 + 1e-12))
    assert sol.lower_bound <= sol.value
