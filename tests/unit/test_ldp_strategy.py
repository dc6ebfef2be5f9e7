"""Local strategies: exact privacy check, V*, variances (closed forms and Monte Carlo), bound."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dpdask.errors import ArgumentTypeError, PlanError
from dpdask.ldp import LocalStrategy, lower_bound
from dpdask.ldp.baselines import hadamard, randomized_response
from dpdask.ldp.bounds import objective_lower_bound
from dpdask.ldp.optimize import random_start
from dpdask.ldp.simulate import simulate_counts
from dpdask.ldp.strategy import DENOMINATOR, check_ldp, exp_lower_bound, quantize
from dpdask.linalg import AllRange, Dense, Identity, Prefix
from dpdask.privacy import PureDP

EPSILONS = [0.5, 1.0, 2.0, 4.0]


def rr_closed_form(n: int, eps: float) -> float:
    e = math.exp(eps)
    return (n - 1) * (n - 2 + 2 * e) / (e - 1) ** 2


@pytest.fixture
def small_case(rng):
    """A random 3-query workload on 5 types and a random 1-LDP strategy with 9 outputs."""
    W = rng.normal(size=(3, 5))
    Q = random_start(9, 5, 1.0, rng)
    return W, LocalStrategy.from_probabilities(Q, 1.0)


# -- exact privacy check ---------------------------------------------------------
@pytest.mark.parametrize("eps", [0, 0.25, 1, 4, Fraction(1, 3)])
def test_exp_lower_bound_is_a_tight_lower_bound(eps):
    L = exp_lower_bound(eps)
    e = math.exp(float(eps))
    assert float(L) <= e * (1 + 1e-15)
    assert float(L) >= e * (1 - 1e-15)


def test_exp_lower_bound_is_below_the_true_value_at_high_precision():
    from decimal import Decimal, getcontext

    getcontext().prec = 60
    for eps in ["0.5", "1", "2", "4"]:
        assert (
            Decimal(exp_lower_bound(Fraction(eps)).numerator)
            / Decimal(exp_lower_bound(Fraction(eps)).denominator)
            <= Decimal(eps).exp()
        )


def test_check_ldp_accepts_rr_and_fails_closed_at_the_boundary():
    # 2 types, e^eps = 3 exactly representable as a ratio of integers: 3/4, 1/4
    K = np.array([[3, 1], [1, 3]], dtype=np.int64)
    check_ldp(K, math.log(3) + 1e-12, denominator=4)
    with pytest.raises(PlanError, match="LDP"):
        check_ldp(K, math.log(3) - 1e-12, denominator=4)


@pytest.mark.parametrize(
    "K, match",
    [
        (np.array([[3, 1], [1, 2]]), "sums"),
        (np.array([[5, -1], [-1, 5]]), "negative"),
        (np.array([[4, 0], [0, 4]]), "LDP"),
    ],
)
def test_check_ldp_rejects(K, match):
    with pytest.raises(PlanError, match=match):
        check_ldp(K, 1.0, denominator=4)


def test_check_ldp_rejects_floats():
    with pytest.raises(ArgumentTypeError):
        check_ldp(np.array([[0.5, 0.5], [0.5, 0.5]]), 1.0, denominator=1)


def test_strategy_is_exact_and_read_only(small_case):
    _, S = small_case
    assert (S.counts.sum(axis=0) == DENOMINATOR).all()
    with pytest.raises(ValueError):
        S.counts[0, 0] = 1
    assert S.epsilon == 1


def test_quantize_rejects_a_non_private_matrix():
    with pytest.raises(PlanError):
        quantize(np.eye(3), 1.0)


def test_epsilon_from_puredp():
    S = randomized_response(4, PureDP(1))
    assert S.epsilon == 1


def test_json_roundtrip(small_case):
    _, S = small_case
    T = LocalStrategy.from_json(S.to_json())
    assert np.array_equal(T.counts, S.counts)
    assert T.epsilon == S.epsilon


# -- V* -----------------------------------------------------------------------------
def test_reconstruction_is_weighted_least_squares(small_case, rng):
    W, S = small_case
    Q = np.array(S.Q)
    V = S.reconstruction(W)
    np.testing.assert_allclose(V @ Q, W, atol=1e-10)  # unbiased: V Q = W
    y = rng.uniform(0, 50, size=Q.shape[0])
    w = 1 / np.sqrt(Q.sum(axis=1))  # weights 1 / row sum
    x_hat = np.linalg.lstsq(Q * w[:, None], y * w, rcond=None)[0]
    np.testing.assert_allclose(V @ y, W @ x_hat, rtol=1e-9)


def test_reconstruction_minimises_the_objective(small_case, rng):
    """Any other unbiased V = V* + Z (Z Q = 0) has larger tr(V D V^T) (Theorem 3.3)."""
    W, S = small_case
    Q = np.array(S.Q)
    D = np.diag(Q.sum(axis=1))
    V = S.reconstruction(W)
    base = np.trace(V @ D @ V.T)
    assert base == pytest.approx(S.objective(W), rel=1e-9)
    null = np.linalg.svd(Q.T)[2][Q.shape[1] :]  # rows z with z Q = 0
    for _ in range(5):
        Z = rng.normal(size=(W.shape[0], null.shape[0])) @ null
        np.testing.assert_allclose(Z @ Q, 0, atol=1e-12)
        assert np.trace((V + Z) @ D @ (V + Z).T) > base


def test_reconstruction_is_not_w_q_pinv(small_case):
    W, S = small_case
    naive = W @ np.linalg.pinv(np.array(S.Q))
    Q = np.array(S.Q)
    D = np.diag(Q.sum(axis=1))
    assert np.trace(naive @ D @ naive.T) > S.objective(W) * (1 + 1e-6)


def test_unsupported_workload_is_refused():
    S = LocalStrategy.from_probabilities(np.full((2, 3), 0.5), 1.0)
    W = np.eye(3)
    assert not S.supports(W)
    assert S.objective(W) == math.inf
    with pytest.raises(ValueError, match="row space"):
        S.reconstruction(W)


# -- variances ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 8, 64])
@pytest.mark.parametrize("eps", EPSILONS)
def test_randomized_response_closed_form(n, eps):
    S = randomized_response(n, eps)
    W = Identity(n)
    assert S.worst_variance(W) == pytest.approx(rr_closed_form(n, eps), rel=1e-8)
    assert S.average_variance(W) == pytest.approx(rr_closed_form(n, eps), rel=1e-8)
    alpha = 0.01
    expected = rr_closed_form(n, eps) / (n * alpha)
    assert S.sample_complexity(W, alpha) == pytest.approx(expected, rel=1e-8)


def test_average_variance_is_the_objective(small_case):
    W, S = small_case
    G = W.T @ W
    assert S.average_variance(W) == pytest.approx((S.objective(W) - np.trace(G)) / 5, rel=1e-9)


def test_worst_variance_bounded_by_average(small_case):
    """Theorem 5.1: average <= worst <= e^eps (average + tr G / n)."""
    W, S = small_case
    avg, worst = S.average_variance(W), S.worst_variance(W)
    assert avg <= worst + 1e-9
    assert worst <= math.e * (avg + np.trace(W.T @ W) / 5) + 1e-9


def test_person_variance_by_definition(small_case):
    """sum_o ||v_o||^2 Q[o, u] - ||w_u||^2 computed from V* directly."""
    W, S = small_case
    V = S.reconstruction(W)
    Q = np.array(S.Q)
    direct = (V**2).sum(axis=0) @ Q - (W**2).sum(axis=0)
    np.testing.assert_allclose(S.person_variances(W), direct, rtol=1e-9)


def test_implicit_and_dense_workloads_agree():
    S = hadamard(16, 1.0)
    assert S.worst_variance(Prefix(16)) == pytest.approx(
        S.worst_variance(Prefix(16).dense()), rel=1e-12
    )
    assert S.worst_variance(Dense(Prefix(16).dense())) == pytest.approx(
        S.worst_variance(Prefix(16)), rel=1e-12
    )


@pytest.mark.parametrize("which", ["worst", "uniform"])
def test_variance_matches_monte_carlo(which, small_case, rng):
    """Total variance of V* y over many simulated response vectors vs N * per-person formula."""
    W, S = small_case
    pv = S.person_variances(W)
    N = 400
    if which == "worst":
        x = np.zeros(5, dtype=np.int64)
        x[np.argmax(pv)] = N
    else:
        x = np.full(5, N // 5, dtype=np.int64)
    reps = 3000
    X = np.tile(x, (reps, 1))
    Y = simulate_counts(S, X, rng)
    V = S.reconstruction(W)
    est = Y @ V.T
    np.testing.assert_allclose(est.mean(axis=0), W @ x, atol=6 * np.sqrt(N * pv.max()) / 20)
    total = est.var(axis=0, ddof=1).sum()
    expected = float(pv @ x)
    # the variance of a sample variance: a few percent at 3000 replications
    assert total == pytest.approx(expected, rel=0.08)


# -- lower bound ------------------------------------------------------------------------
@pytest.mark.parametrize("eps", EPSILONS)
def test_lower_bound_is_tight_for_two_types(eps):
    """n = 2: randomized response is optimal and the bound equals it."""
    assert lower_bound(np.eye(2), eps) == pytest.approx(rr_closed_form(2, eps), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 6),
    extra=st.integers(0, 6),
    eps=st.sampled_from(EPSILONS),
    seed=st.integers(0, 2**16),
)
def test_lower_bound_holds_for_random_strategies(n, extra, eps, seed):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(n + 1, n))
    Q = random_start(n + extra, n, eps, rng)
    S = LocalStrategy.from_probabilities(Q, eps)
    assume(S.supports(W))  # a square random Q can be singular
    assert S.objective(W) >= objective_lower_bound(W, eps) * (1 - 1e-9)
    assert S.worst_variance(W) >= lower_bound(W, eps) * (1 - 1e-9) - 1e-9


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("W", [Identity(16), Prefix(16)], ids=["identity", "prefix"])
def test_lower_bound_below_baselines(W, eps):
    for S in (randomized_response(16, eps), hadamard(16, eps)):
        assert S.worst_variance(W) >= lower_bound(W, eps) * (1 - 1e-9)


def test_lower_bound_sample_complexity():
    W = Identity(8)
    assert lower_bound(W, 1.0, alpha=0.01) == pytest.approx(lower_bound(W, 1.0) / (8 * 0.01))


@pytest.mark.parametrize("eps", [0.5, 2.0, 6.0])
@pytest.mark.parametrize(
    "W",
    [Identity(3), Prefix(4), AllRange(4), Dense(np.arange(12.0).reshape(4, 3) % 5 - 2)],
    ids=["hist3", "prefix4", "allrange4", "dense"],
)
def test_lower_bound_never_above_an_optimized_strategy(W, eps):
    """Section 5.3: the bound holds for the optimiser's own result (small cases, several
    starts), on the objective and on the average (hence the worst) variance."""
    from dpdask.ldp import optimize

    S = optimize(W, eps, starts=2, iters=200, polish=200, seed=4, matrix_mechanism=False)
    assert objective_lower_bound(W, eps) <= S.objective(W) * (1 + 1e-9)
    assert lower_bound(W, eps) <= S.average_variance(W) * (1 + 1e-9) + 1e-12
    assert S.average_variance(W) <= S.worst_variance(W) + 1e-12
