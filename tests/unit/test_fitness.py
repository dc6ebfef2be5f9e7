"""Fitness-for-use (paper 000): SM-II against the paper, closed forms and weak duality.

Oracles: the paper's Table 2, the closed forms of section 5.1 (derived here), dense
matrices for every mechanism quantity, finite differences for the derivatives, the
weak-duality bound recomputed here from a dense SVD, the CA baseline of
:mod:`dpdask.strategy.baselines` (an independent solver of the total-error problem),
and the exact Gaussian calibration of :mod:`dpdask.privacy`. The cvxpy SDP oracle
is in ``test_fitness_cvxpy.py``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from dpdask import Domain
from dpdask import workloads as wl
from dpdask.errors import ConvergenceWarning
from dpdask.linalg import AllRange, Dense, Identity, Ones, Prefix, RangeQueries, VStack
from dpdask.privacy import ApproxDP, PureDP, gaussian_delta, zCDP
from dpdask.strategy import baselines
from dpdask.strategy.fitness import FitnessSolution, SMIIOptions, solve
from dpdask.strategy.fitness import _newton as newton_module
from dpdask.strategy.fitness._smii import _Objective
from dpdask.strategy.fitness._terms import canonical_problem, merge_columns, row_term
from tests.helpers import dense_profile


def dual_bound(W: np.ndarray, c: np.ndarray, u: np.ndarray, v: np.ndarray) -> float:
    """``||diag(v/c)^{1/2} W diag(u)^{1/2}||_*^2`` from a dense SVD (weak duality)."""
    M = np.sqrt(v / c)[:, None] * W * np.sqrt(u)[None, :]
    return float(np.linalg.svd(M, compute_uv=False).sum() ** 2)


def check_mechanism(sol: FitnessSolution) -> None:
    """Every reported quantity of a dense solution against dense matrices."""
    W = sol.workload.dense()
    B, L, S = sol.basis.dense(), sol.L.dense(), sol.Sigma.dense()
    np.testing.assert_allclose(L @ B, W, atol=1e-9 * max(1.0, np.abs(W).max()))
    np.testing.assert_allclose(sol.query_variances(), np.diag(L @ S @ L.T), rtol=1e-9)
    np.testing.assert_allclose(sol.privacy_profile(), dense_profile(B, S), rtol=1e-9)
    F = sol.noise_factor().dense()
    np.testing.assert_allclose(F @ F.T, S, rtol=1e-9, atol=1e-12 * np.abs(S).max())


# -- Table 2 ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("d", "expected"), [(2, 1.333), (4, 1.759), (8, 2.282), (16, 2.905), (64, 4.458)]
)
def test_table2_prefix(d: int, expected: float) -> None:
    """Squared privacy cost of the prefix workload, targets 1, B = I (paper 000 Table 2)."""
    sol = solve(Prefix(d), 1.0)
    assert isinstance(sol.basis, Identity)
    assert round(sol.privacy_cost**2, 3) == expected
    assert sol.max_ratio == pytest.approx(1.0, abs=1e-12)
    assert sol.lower_bound <= sol.privacy_cost**2 <= sol.lower_bound * (1 + 2e-4)


def test_table2_basis_invariance() -> None:
    """The paper's upper-triangular basis gives the same mechanism (Theorems 3.1, 3.3)."""
    d = 8
    U = np.triu(np.ones((d, d)))
    a, b = solve(Prefix(d)), solve(Prefix(d), basis=U)
    check_mechanism(b)
    np.testing.assert_allclose(b.privacy_profile(), a.privacy_profile(), rtol=1e-9)
    np.testing.assert_allclose(b.query_variances(), a.query_variances(), rtol=1e-9)


# -- certified optimality on the paper's workloads ----------------------------
def _certify(sol: FitnessSolution, tol: float) -> None:
    u, v = sol.info["dual_weights"]
    lb = dual_bound(sol.workload.dense(), sol.targets, u, v)
    assert abs(u.sum() - 1) < 1e-9 and abs(v.sum() - 1) < 1e-9 and (u >= 0).all()
    assert lb == pytest.approx(sol.lower_bound, rel=1e-8)
    upper = sol.privacy_cost**2 * sol.max_ratio
    assert lb <= upper <= lb * (1 + tol)


@functools.cache
def _paper_solution(name: str) -> FitnessSolution:
    """SM-II on a workload of paper 000 section 7, targets 1 (shared by the tests below)."""
    if name.startswith("marginals"):
        t = int(name[-1])
        dom = Domain(a=t, b=t, c=t)
        W = VStack([wl.marginals(dom, 1), wl.marginals(dom, 2)])
    else:
        W = getattr(wl, name)()
    return solve(W, 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pl94", "age_pyramid", "marginals_t2", "marginals_t4"])
def test_paper_workloads_within_half_percent(name: str) -> None:
    """Within 0.5% of the optimum, certified by a dense-SVD duality bound (the issue asks 0.5%)."""
    sol = _paper_solution(name)
    _certify(sol, 5e-3)
    assert sol.info["gap"] <= 2e-4


def test_pl94_reference_figures() -> None:
    """PL94: 319 queries on 252 cells, all targets met; input perturbation's ratio.

    The paper's SM-II reports IP at 36.56 times the targets; IP's largest variance
    is that of the 126-cell marginal queries, so its ratio at our cost is
    ``126 / cost^2``, higher than the paper's by as much as the paper's SM-II
    stopped short of the optimum (about 14%).
    """
    sol = _paper_solution("pl94")
    assert sol.workload.shape == (319, 252)
    assert sol.max_ratio == pytest.approx(1.0, abs=1e-12)
    ip = 126 / sol.privacy_cost**2
    assert 1.10 < ip / 36.56 < 1.18
    check_mechanism(sol)


def _ip_over_hm(W) -> float:
    """IP's largest variance over HM's at the same privacy cost (dense pseudo-inverse)."""
    from dpdask.strategy.fitness import paper_hm

    Wd = W.dense()
    A = paper_hm(W.shape[1])
    P = Wd @ np.linalg.pinv(A.dense())
    hm = A.sensitivity(2) ** 2 * np.einsum("ij,ij->i", P, P).max()
    return float(np.einsum("ij,ij->i", Wd, Wd).max() / hm)


@pytest.mark.parametrize(
    ("name", "ip", "hm"),
    [("pl94", 36.56, 13.93), ("age_pyramid", 32.49, 6.2), ("marginals_t2", 1.82, 3.02),
     ("marginals_t4", 4.55, 10.28), ("marginals_t6", 8.6, 21.38)],
)  # fmt: skip
def test_hm_matches_paper_ratio(name: str, ip: float, hm: float) -> None:
    """IP / HM does not depend on the optimiser: the paper's Tables 4, 9, 10 within 1%."""
    if name.startswith("marginals"):
        t = int(name[-1])
        dom = Domain(a=t, b=t, c=t)
        W = VStack([wl.marginals(dom, 1), wl.marginals(dom, 2)])
    else:
        W = getattr(wl, name)()
    assert _ip_over_hm(W) == pytest.approx(ip / hm, rel=0.01)


def test_hm_structure() -> None:
    """Root, floor(sqrt(n)) blocks over the first k^2 cells, identity; sensitivity sqrt(3)."""
    from dpdask.strategy.fitness import paper_hm

    A = paper_hm(11).dense()  # k = 3: cells 9 and 10 are in no block
    assert A.shape == (1 + 3 + 11, 11)
    np.testing.assert_array_equal(A[0], 1)
    np.testing.assert_array_equal(A[1:4].sum(axis=0), [1] * 9 + [0, 0])
    np.testing.assert_array_equal(A[4:], np.eye(11))
    assert paper_hm(11).sensitivity(2) == pytest.approx(math.sqrt(3))
    assert paper_hm(2).shape == (3, 2)


# -- section 5.1: identity + sum ----------------------------------------------
def _identity_sum(n: int) -> VStack:
    return VStack([Identity(n), Ones(n)])


@pytest.mark.parametrize("n", [8, 64])
def test_identity_sum_closed_form(n: int) -> None:
    """With equal targets SM-II meets every target exactly; the cost is ``2n / (n + 1)``.

    Closed form: by symmetry ``Sigma = a I + b 11^T``; both constraint families are
    active at the optimum, ``a + b = 1`` and ``n a + n^2 b = 1``, so ``b = -1/n``,
    ``a = 1 + 1/n`` and ``diag(Sigma^-1) = (a + (n-1) b) / (a (a + n b)) = 2n / (n+1)``.
    """
    sol = solve(_identity_sum(n), 1.0)
    np.testing.assert_allclose(sol.variance_ratios(), 1.0, atol=2e-4)
    assert sol.privacy_cost**2 == pytest.approx(2 * n / (n + 1), rel=1e-4)


@pytest.mark.parametrize(("n", "paper"), [(64, 4.48)])
def test_identity_sum_total_error_optimum(n: int, paper: float) -> None:
    """The total-error optimum (CA) misses the sum query's target by the closed form.

    With ``X = Sigma^-1 = alpha I + beta 11^T`` and ``alpha + beta = p`` the total
    error ``(n-1)/alpha + (n+1)/(alpha + n beta)`` is least at
    ``alpha + n beta = sqrt(n+1) alpha``; at the fitness optimum's cost
    ``p = 2n/(n+1)`` the sum query's variance is ``(n-1+sqrt(n+1)) sqrt(n+1) / (2n)``.
    """
    closed = (n - 1 + math.sqrt(n + 1)) * math.sqrt(n + 1) / (2 * n)
    assert round(closed, 2) == paper
    W = _identity_sum(n)
    sol = solve(W, 1.0)
    A = baselines.convex_ca(W).dense()  # unit L2 sensitivity, independent solver
    var = np.diag(W.dense() @ np.linalg.pinv(A.T @ A) @ W.dense().T) / sol.privacy_cost**2
    assert var.max() == pytest.approx(closed, rel=2e-3)
    assert var[-1] == var.max()


def test_total_error_term_tends_to_ca() -> None:
    """Section 6.1: with a heavy total-error weight SM-II approaches CA's total error."""
    W = Prefix(8)
    ca = baselines.ca_solve(W).error  # total variance at privacy cost 1
    totals = []
    for lam in [0.0, 0.05, 50.0]:
        sol = solve(W, 1.0, total_weight=lam).for_budget(zCDP(0.5))  # privacy cost 1
        totals.append(sol.total_variance())
    assert totals[0] > totals[1] > totals[2] >= ca * (1 - 1e-6)
    assert totals[2] == pytest.approx(ca, rel=5e-3)
    assert totals[0] > 1.01 * ca


# -- the mechanism's quantities -----------------------------------------------
@pytest.mark.parametrize(
    "W",
    [
        Prefix(6),
        AllRange(5),
        VStack([Prefix(5), AllRange(5)], weights=[1.0, 0.5]),
        Dense(np.random.default_rng(7).integers(0, 2, (9, 6)).astype(float)),
        wl.marginals(Domain(a=2, b=3), 1),  # rank-deficient: orthonormal row-space basis
        RangeQueries(10, [2, 2, 5], [4, 6, 6]),  # merged cells, untouched cells
        Dense([[1.0, 1, 0, 2, 1], [0, 0, 0, 1, 0], [1, 1, 0, 0, 1]]),  # equal and zero columns
    ],
    ids=[
        "prefix",
        "allrange",
        "weighted-stack",
        "random-01",
        "marginals-rank-deficient",
        "ranges-merged",
        "explicit-merged",
    ],
)
def test_mechanism_against_dense(W, rng: np.random.Generator) -> None:
    c = rng.uniform(0.5, 2.0, W.shape[0])
    sol = solve(W, c)
    check_mechanism(sol)
    assert sol.query_variances().max() <= (c * (1 + 1e-9)).max()
    assert sol.max_ratio == pytest.approx(1.0, abs=1e-12)
    assert sol.lower_bound <= sol.privacy_cost**2 <= sol.lower_bound * (1 + 1e-3)
    untouched = ~W.dense().any(axis=0)
    assert (sol.privacy_profile()[untouched] == 0).all()
    _certify(sol, 1e-3)  # the certificate holds on the original cells, merged or not


@pytest.mark.parametrize(
    ("W", "classes"),
    [
        (RangeQueries(10, [2, 2, 5], [4, 6, 6]), [-1, -1, 0, 0, 0, 1, 1, -1, -1, -1]),
        (Dense([[1.0, 1, 0, 2, 1], [0, 0, 0, 1, 0], [1, 1, 0, 0, 1]]), [0, 0, -1, 1, 0]),
    ],
    ids=["ranges", "explicit"],
)
def test_merge_columns(W, classes: list[int]) -> None:
    """Cells with equal columns share a class; untouched cells are dropped (-1)."""
    merged, got = merge_columns(row_term(W))
    np.testing.assert_array_equal(got, classes)
    M = W.dense()
    kept = [int(np.flatnonzero(np.asarray(classes) == k)[0]) for k in range(merged.r)]
    rng = np.random.default_rng(5)
    A = rng.standard_normal((merged.r, merged.r))
    S = A + A.T
    np.testing.assert_allclose(merged.quad(S), np.diag(M[:, kept] @ S @ M[:, kept].T))


def test_rank_deficient_basis_and_user_basis(rng: np.random.Generator) -> None:
    """A linearly independent subset of W's rows is a valid basis with the same mechanism."""
    W = wl.marginals(Domain(a=2, b=3), 1)  # rows: a=0, a=1, b=0, b=1, b=2; rank 4
    Wd = W.dense()
    sol = solve(W, 1.0)
    assert sol.basis.shape == (4, 6)
    user = solve(W, 1.0, basis=Wd[[0, 1, 2, 3]])
    check_mechanism(user)
    np.testing.assert_allclose(user.privacy_profile(), sol.privacy_profile(), rtol=1e-8)
    with pytest.raises(ValueError, match="rank"):
        solve(W, 1.0, basis=np.eye(6))
    with pytest.raises(ValueError, match="row space"):
        solve(W, 1.0, basis=rng.standard_normal((4, 6)))
    with pytest.raises(ValueError, match="linearly independent"):
        solve(W, 1.0, basis=Wd[[0, 1, 0, 1]])


@pytest.mark.parametrize("targets", [0.0, -1.0, np.inf, np.ones(3)])
def test_bad_targets_fail_closed(targets) -> None:
    with pytest.raises(ValueError, match="targets"):
        solve(Prefix(4), targets)


def test_initial_strategy(rng: np.random.Generator) -> None:
    """Section 6.3: any strategy supporting W initialises SM-II to the same optimum."""
    W = Prefix(6)
    a = solve(W, 1.0)
    b = solve(W, 1.0, init=baselines.hierarchical(6))
    assert b.privacy_cost == pytest.approx(a.privacy_cost, rel=2e-4)
    with pytest.raises(ValueError, match="support"):
        solve(W, 1.0, init=np.eye(6)[:3])


# -- budgets (Problem 2) ------------------------------------------------------
def test_for_budget_zcdp_and_problem2(rng: np.random.Generator) -> None:
    W = AllRange(6)
    c = rng.uniform(1.0, 3.0, W.shape[0])
    sol = solve(W, c)
    rho = 0.3
    out = solve(W, c, budget=zCDP(rho))
    assert out.privacy_cost <= math.sqrt(2 * rho)
    assert out.privacy_cost == pytest.approx(math.sqrt(2 * rho), rel=1e-8)
    assert out.zcdp() <= zCDP(rho)
    # Theorem 3.1: the shape of the solution is kept; every ratio scales alike
    np.testing.assert_allclose(out.variance_ratios() / sol.variance_ratios(), out.max_ratio)
    assert out.max_ratio == pytest.approx(sol.privacy_cost**2 / (2 * rho), rel=1e-8)


def test_for_budget_approx_dp() -> None:
    sol = solve(Prefix(8), 1.0)
    budget = ApproxDP(1.0, 1e-6)
    out = sol.for_budget(budget)
    assert gaussian_delta(out.privacy_cost, 1.0) <= 1e-6
    assert gaussian_delta(out.privacy_cost * 1.001, 1.0) > 1e-6  # nothing left unused
    spent = out.approx_dp(1.0)
    assert spent.epsilon == 1 and spent.delta <= budget.delta
    assert float(spent.delta) == pytest.approx(gaussian_delta(out.privacy_cost, 1.0), rel=1e-6)


@pytest.mark.parametrize("budget", [PureDP(1), zCDP(0)])
def test_budget_without_gaussian_fails(budget) -> None:
    with pytest.raises(ValueError):
        solve(Prefix(3), 1.0).for_budget(budget)


# -- derivatives and the optimiser's internals ---------------------------------
@pytest.mark.parametrize("precondition", ["geometric", "scalar"])
@pytest.mark.parametrize("implicit_rows", [False, True], ids=["explicit-rows", "implicit-rows"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_and_hessian_finite_differences(
    seed: int, implicit_rows: bool, precondition: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Equations (15)-(20) as implemented, against central differences of Problem 4.

    ``implicit_rows`` forces the path for workloads with too many queries to hold
    their whitened rows (no Woodbury preconditioner, rows applied through the term).
    """
    if implicit_rows:
        monkeypatch.setattr(newton_module, "_MAX_ROW_ENTRIES", 0)
    rng = np.random.default_rng(seed)
    W = [Prefix(5), Dense(rng.random((8, 3)) @ rng.random((3, 6)))][seed % 2]
    can = canonical_problem(W)
    r = can.rank
    c = rng.uniform(0.5, 1.5, W.shape[0])
    obj = _Objective(can.rows, can.cols, c, lam=0.2 * seed)
    obj.gP, obj.gV = 3.0, 5.0
    A = rng.random((r, r))
    S = A @ A.T + r * np.eye(r)
    D = rng.standard_normal((r, r))
    D = D + D.T
    h = 1e-6
    pt = obj.point(S)
    g = obj.gradient(pt)
    fd = (obj.point(S + h * D).value - obj.point(S - h * D).value) / (2 * h)
    assert fd == pytest.approx(float(np.sum(g * D)), rel=1e-6)
    system = obj.newton_system(pt, precondition)
    G = system.map  # D = G E G^T: whitening by Sigma, then C = K^{-1/4} (geometric)
    np.testing.assert_allclose(G.T @ g @ G, system.gradient, atol=1e-10 * np.abs(g).max())
    E = np.linalg.solve(G, np.linalg.solve(G, D).T).T
    np.testing.assert_allclose(system.direction(E), D, atol=1e-9 * np.abs(D).max())
    HD = (obj.gradient(obj.point(S + h * D)) - obj.gradient(obj.point(S - h * D))) / (2 * h)
    np.testing.assert_allclose(system.hv(E), G.T @ HD @ G, atol=1e-6 * np.abs(G.T @ HD @ G).max())
    # Levenberg-Marquardt damping adds delta X D X, delta = damping * tr(K) / r
    damped = obj.newton_system(pt, precondition, damping=0.5)
    Gd = damped.map
    Ed = np.linalg.solve(Gd, np.linalg.solve(Gd, D).T).T
    X = np.linalg.inv(S)
    delta = 0.5 * float(pt.pi @ pt.p) / r
    expect = Gd.T @ (HD + delta * X @ D @ X) @ Gd
    np.testing.assert_allclose(damped.hv(Ed), expect, atol=1e-6 * np.abs(expect).max())
    # the preconditioned conjugate gradient solves the Newton system
    x, _ = system.solve(system.hv(E), 1e-10, 500)
    np.testing.assert_allclose(x, E, atol=1e-7 * np.abs(E).max())
    assert (system.chol is None) == implicit_rows
    if implicit_rows:
        sol = solve(W, c)
        assert sol.lower_bound <= sol.privacy_cost**2 <= sol.lower_bound * (1 + 1e-3)


@pytest.mark.parametrize(
    "W",
    [Prefix(7), AllRange(6), VStack([Prefix(6), AllRange(6)], weights=[2.0, 1.0])],
    ids=["prefix", "allrange", "stack"],
)
def test_range_rows_against_dense(W, rng: np.random.Generator) -> None:
    """The O(d^2) interval formulas for diag(L S L^T), L^T diag(w) L and L F."""
    rows = row_term(W)
    assert type(rows).__name__ == "RangeRows"
    M = W.dense()
    A = rng.standard_normal((W.shape[1], W.shape[1]))
    S = A + A.T
    w = rng.random(W.shape[0])
    np.testing.assert_allclose(rows.quad(S), np.diag(M @ S @ M.T), atol=1e-10)
    np.testing.assert_allclose(rows.gram(w), M.T @ (w[:, None] * M), atol=1e-10)
    np.testing.assert_allclose(rows.times(A), M @ A, atol=1e-10)


def test_solver_options_validated() -> None:
    with pytest.raises(ValueError):
        SMIIOptions(tau_growth=1.0)
    with pytest.raises(ValueError, match="preconditioner"):
        SMIIOptions(precondition="magic")
    sol = solve(Prefix(4), 1.0, options=SMIIOptions(precondition="none", hessian_dtype=np.float32))
    assert round(sol.privacy_cost**2, 3) == 1.759


def test_bench_fitness_smoke() -> None:
    """``dpdask bench fitness`` runs and reports the paper's figures beside its own."""
    import argparse

    from dpdask_benchmarks import fitness as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = ["--sections", "table2,ranges,sum", "--sizes", "16", "--sum-sizes", "8"]
    out = bench.run(parser.parse_args([*args, "--repeats", "1"]))
    assert [r["rounded"] for r in out["table2"]] == [1.333, 1.759, 2.282, 2.905, 4.458]
    assert {r["table"] for r in out["tables"]} == {"5", "6"}
    for r in out["tables"]:
        assert r["CA"] >= 1 - 1e-6 and r["IP"] >= 1 - 1e-6  # nobody beats the optimum
    (row,) = out["identity_sum"]
    assert row["ca_sum_ratio"] == pytest.approx(row["closed_form_sum_ratio"], rel=2e-3)
    with pytest.raises(ValueError, match="unknown sections"):
        bench.run(parser.parse_args(["--sections", "nope"]))


def test_stage_that_worsens_does_not_stop_the_continuation() -> None:
    """A sub-problem ending above the previous one is no sign of convergence.

    Found by hypothesis (``test_kron_by_factors_equals_joint``): on this 3 x 2 problem
    the second stage ends slightly above the first, and stopping there left a 2%
    certified gap; the joint dense solve of the product showed the factor was not optimal.
    """
    c = np.array([2.17136632, 2.88830883, 1.83261607])
    sol = solve(AllRange(2), c)
    _certify(sol, 1e-3)
    assert sol.gap <= 2e-4


def test_iteration_limit_still_feasible() -> None:
    """Stopped early, SM-II still returns a mechanism that meets the targets (not optimal)."""
    full = solve(Prefix(8), 1.0)
    with pytest.warns(ConvergenceWarning, match="SM-II stopped at its iteration limit"):
        early = solve(Prefix(8), 1.0, options=SMIIOptions(max_newton=3))
    assert full.info["converged"] and not early.info["converged"]
    assert early.max_ratio == pytest.approx(1.0, abs=1e-12)
    assert early.privacy_cost > full.privacy_cost * 1.001
    assert early.lower_bound <= full.privacy_cost**2
