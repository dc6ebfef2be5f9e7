"""HDMM's optimisers: gradients, convergence, and the published error ratios."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from dpdask.linalg import AllRange, Dense, Identity, Kron, Ones, Prefix, VStack
from dpdask.strategy import (
    PIdentity,
    WeightedMarginals,
    budget_split,
    opt_0,
    opt_kron,
    opt_marginals,
    squared_error,
    svd_bound,
)
from dpdask.strategy._gram import Gram
from dpdask.strategy._lbfgs import lbfgs
from dpdask.strategy._marginals import complement_sizes, marginals_loss
from dpdask.strategy._terms import kron_terms
from dpdask.strategy.baselines import hierarchical
from dpdask.strategy.hdmm._opt_kron import _random_factors
from dpdask.strategy.hdmm._opt_marginals import marginals_spectrum
from dpdask.strategy.hdmm._pidentity import pidentity_loss


def finite_difference(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.empty_like(x)
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = h
        g[k] = (f(x + e) - f(x - e)) / (2 * h)
    return g


@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize(
    "W", [Prefix(9), AllRange(9), VStack([Identity(9), Ones(9)], weights=[1.0, 3.0])]
)
def test_pidentity_gradient(W, norm: int, rng: np.random.Generator) -> None:
    p, n = 3, 9
    G = Gram.of(W)
    T = rng.random((p, n)) if norm == 1 else rng.normal(size=(p, n))
    f, g = pidentity_loss(T.ravel(), p, G, G.diag(), norm)
    A = PIdentity(T, norm).dense()
    Wd = W.dense()
    assert f == pytest.approx(np.linalg.norm(Wd @ np.linalg.pinv(A), "fro") ** 2, rel=1e-10)
    fd = finite_difference(lambda x: pidentity_loss(x, p, G, G.diag(), norm)[0], T.ravel())
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-5 * np.abs(fd).max())


@pytest.mark.parametrize("norm", [1, 2])
def test_marginals_gradient(norm: int, rng: np.random.Generator) -> None:
    sizes = (3, 2, 4)
    W = VStack([Kron([Identity(3), Ones(2), Prefix(4)]), Kron([Ones(3), Identity(2), Ones(4)])])
    terms = kron_terms(W)
    h = marginals_spectrum(terms)
    wc = complement_sizes(sizes)
    theta = rng.random(8) + 0.1
    f, g = marginals_loss(theta, h, wc, 3, norm)
    A = WeightedMarginals(sizes, theta)
    assert f == pytest.approx(A.sensitivity(norm) ** 2 * squared_error(W, A), rel=1e-10)
    fd = finite_difference(lambda x: marginals_loss(x, h, wc, 3, norm)[0], theta)
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6 * np.abs(fd).max())


def test_gram_closed_forms_match_dense(rng: np.random.Generator) -> None:
    X = rng.normal(size=(11, 3))
    for W in (Prefix(11), AllRange(11), Ones(11, 3), Identity(11)):
        G = Gram.of(W)
        Gd = W.dense().T @ W.dense()
        np.testing.assert_allclose(G.matmat(X), Gd @ X, atol=1e-9)
        np.testing.assert_allclose(G.diag(), np.diag(Gd))
        assert G.total() == pytest.approx(Gd.sum())


def test_projected_lbfgs_on_a_bounded_quadratic(rng: np.random.Generator) -> None:
    Q = rng.normal(size=(30, 30))
    Q = Q @ Q.T + np.eye(30)
    b = rng.normal(size=30)

    def fun(x):
        return 0.5 * x @ Q @ x - b @ x, Q @ x - b

    res = lbfgs(fun, np.ones(30), ftol=1e-14, gtol=1e-10, maxiter=5000, nonneg=True)
    from scipy.optimize import minimize

    ref = minimize(
        fun,
        np.ones(30),
        jac=True,
        method="L-BFGS-B",
        bounds=[(0, None)] * 30,
        options={"ftol": 1e-14, "gtol": 1e-12},
    )
    assert res.fun == pytest.approx(ref.fun, rel=1e-7)
    assert (res.x >= 0).all()


@pytest.mark.parametrize("norm", [1, 2])
def test_both_optimisers_agree(norm: int) -> None:
    G = Gram.of(Prefix(64))
    _, f_scipy, _ = opt_0(G, 4, norm=norm, seed=1, ftol=1e-11, method="scipy")
    _, f_own, _ = opt_0(G, 4, norm=norm, seed=1, ftol=1e-11, method="lbfgs")
    assert f_own == pytest.approx(f_scipy, rel=2e-3)
    with pytest.raises(ValueError, match="method"):
        opt_0(G, 4, method="newton")


def _rmse_ratio(W, A, B, norm: int = 1) -> float:
    """RMSE of strategy A over that of strategy B (each at its own sensitivity)."""
    ea = A.sensitivity(norm) ** 2 * squared_error(W, A)
    eb = B.sensitivity(norm) ** 2 * squared_error(W, B)
    return float(np.sqrt(ea / eb))


@pytest.mark.parametrize(
    ("n", "identity", "h2"),
    [(256, 2.18, 1.79), pytest.param(1024, 3.34, 1.80, marks=pytest.mark.slow)],
)
def test_prefix_ratios(n: int, identity: float, h2: float) -> None:
    """HDMM slides, 'Error on Prefix workload': RMSE of Identity and H2 over HDMM's."""
    W = Prefix(n)
    theta, _, _ = opt_0(Gram.of(W), seed=0)
    A = PIdentity(theta)
    assert _rmse_ratio(W, Identity(n), A) == pytest.approx(identity, rel=0.05)
    assert _rmse_ratio(W, hierarchical(n, 2), A) == pytest.approx(h2, rel=0.05)


@pytest.mark.parametrize("W", [Prefix(256), AllRange(256)], ids=["prefix", "allrange"])
def test_gaussian_opt0_near_svd_bound(W) -> None:
    theta, loss, _ = opt_0(Gram.of(W), norm=2, seed=0)
    A = PIdentity(theta, norm=2)
    err = A.sensitivity(2) ** 2 * squared_error(W, A)
    assert err == pytest.approx(loss, rel=1e-9)
    assert 1.0 <= err / svd_bound(W) <= 1.05


def test_opt_marginals_three_way() -> None:
    """All 3-way marginals on the Adult-like (75, 16, 5, 2, 20) domain: OPT_M <= 0.65 Identity."""
    sizes = (75, 16, 5, 2, 20)
    parts = [
        Kron([Identity(n) if i in c else Ones(n) for i, n in enumerate(sizes)])
        for c in itertools.combinations(range(5), 3)
    ]
    W = VStack(parts)
    terms = kron_terms(W)
    res = min((opt_marginals(terms, seed=s) for s in range(3)), key=lambda r: r.loss)
    A = WeightedMarginals(sizes, res.theta)
    err = A.sensitivity(1) ** 2 * squared_error(W, A)
    assert err == pytest.approx(res.loss, rel=1e-8)
    assert err <= 0.65 * squared_error(W, Kron([Identity(n) for n in sizes]))


def _factor_optimum(W, norm: int, seeds: range) -> float:
    """Best error at unit sensitivity of a p-Identity for ``W`` alone (SciPy's L-BFGS-B).

    Each loss is evaluated densely, ``||W A^+||_F^2``, not taken from the optimiser.
    """
    best = np.inf
    for s in seeds:
        theta, _, _ = opt_0(Gram.of(W), norm=norm, seed=s, ftol=1e-12, method="scipy")
        A = PIdentity(theta, norm).dense()
        best = min(best, np.linalg.norm(W.dense() @ np.linalg.pinv(A), "fro") ** 2)
    return float(best)


@pytest.mark.parametrize("norm", [1, 2])
def test_opt_kron_on_one_term_is_per_factor(norm: int) -> None:
    """On one term OPT_x reaches the product of the factors' own optima, found separately."""
    factors = [Prefix(12), AllRange(6)]
    W = Kron(factors)
    res = opt_kron(kron_terms(W), norm=norm, seed=0, ftol=1e-9, restarts=4)
    A = res.strategy()
    assert A.sensitivity(norm) == pytest.approx(1.0)
    assert squared_error(W, A) == pytest.approx(res.loss, rel=1e-6)
    oracle = math.prod(_factor_optimum(Wf, norm, range(10, 16)) for Wf in factors)
    assert svd_bound(W) <= res.loss <= oracle * (1 + 1e-4)
    # more starts per factor can only help: the starts of restarts=1 are among them
    one = opt_kron(kron_terms(W), norm=norm, seed=0, ftol=1e-9)
    assert res.loss <= one.loss * (1 + 1e-4)
    assert one.loss <= oracle * (1 + 1e-3)


def test_opt_0_reports_the_loss_of_its_answer() -> None:
    """Where the objective's fast form loses digits, the reported loss is still the true one."""
    W = Prefix(12)
    for seed in range(3):
        theta, loss, _ = opt_0(Gram.of(W), seed=seed, ftol=1e-9)
        A = PIdentity(theta).dense()
        direct = np.linalg.norm(W.dense() @ np.linalg.pinv(A), "fro") ** 2
        assert loss == pytest.approx(direct, rel=1e-5)


def test_opt_kron_union_improves_every_sweep(rng: np.random.Generator) -> None:
    W = VStack(
        [
            Kron([Prefix(8), Identity(5), Ones(3)]),
            Kron([Identity(8), Ones(5), Dense(rng.random((2, 3)))]),
            Kron([Ones(8), AllRange(5), Identity(3)]),
        ]
    )
    terms = kron_terms(W)
    res = opt_kron(terms, seed=3)
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(res.history))
    A = res.strategy()
    assert A.sensitivity(1) == pytest.approx(1.0)
    assert squared_error(W, A) == pytest.approx(res.loss, rel=1e-6)
    assert res.loss < squared_error(W, Kron([Identity(8), Identity(5), Identity(3)]))
    # the random start alone (the descent before per-factor starts) does no better
    random_start = _random_factors(terms, 1, np.random.SeedSequence(3).generate_state(3), None)
    assert res.loss <= opt_kron(terms, start=random_start).loss * (1 + 1e-12)


@pytest.mark.parametrize("norm", [1, 2])
def test_budget_split_is_optimal(norm: int) -> None:
    E = np.array([5.0, 1.0, 20.0])
    w, loss = budget_split(E, norm)

    def total(c: np.ndarray) -> float:
        sens = c.sum() if norm == 1 else np.sqrt((c * c).sum())
        return float(sens**2 * (E / c**2).sum())

    assert total(w) == pytest.approx(loss, rel=1e-12)
    for k in range(3):  # no single-coordinate change improves it

        def f(t: float, k: int = k) -> float:
            c = w.copy()
            c[k] = t
            return total(c)

        best = minimize_scalar(f, bounds=(1e-3, 5.0), method="bounded")
        assert best.fun >= loss * (1 - 1e-8)
