"""Reconstruction in marginal space against dense least squares, and residuals from records.

Oracles: the generalised least-squares estimate on explicit matrices (the plan's
strategy with i.i.d. noise, and the paper's residuals ``R_A`` with correlated noise),
its covariance ``sigma^2 M_S (A^T A)^+ M_T^T``, and group-by counts written out by hand.
"""

from __future__ import annotations

import itertools
import math
from functools import reduce

import numpy as np
import pytest
import sparse
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import block_diag

from dpdask.measure.residual import marginal_counts, reduce_table, residual_answer, residual_rows
from dpdask.privacy import zCDP
from dpdask.reconstruct.residual import ResidualEstimates
from dpdask.strategy.residual import MarginalWorkload, plan_residual

SIZES = (2, 3, 4)
SETS = [(0, 1), (1, 2), (2,)]


def _kron(fs: list[np.ndarray]) -> np.ndarray:
    return reduce(np.kron, fs, np.ones((1, 1)))


def _marginal(sizes: tuple[int, ...], S: tuple[int, ...]) -> np.ndarray:
    return _kron([np.eye(n) if i in S else np.ones((1, n)) for i, n in enumerate(sizes)])


def _measured_sets() -> list[tuple[int, ...]]:
    """Every marginal the workload's residuals determine: subsets of a workload marginal."""
    return sorted(
        {c for S in SETS for r in range(len(S) + 1) for c in itertools.combinations(S, r)}
    )


@pytest.fixture
def plan():
    return plan_residual(
        MarginalWorkload(SIZES, SETS, [1.0, 2.0, 1.0]), zCDP("0.3"), objective="max"
    )


def test_estimates_equal_dense_least_squares_on_the_plans_strategy(plan, rng):
    A = plan.strategy.dense()
    x = rng.integers(0, 20, math.prod(SIZES)).astype(float)
    y = A @ x + plan.noise_scale * rng.standard_normal(A.shape[0])  # test noise, not keyed
    xhat = np.linalg.pinv(A) @ y
    est = ResidualEstimates.from_plan(plan, y)
    cov = plan.noise_variance * np.linalg.pinv(A.T @ A)
    for S in _measured_sets():
        MS = _marginal(SIZES, S)
        np.testing.assert_allclose(est.marginal(S).ravel(), MS @ xhat, atol=1e-9)
        for T in _measured_sets():
            MT = _marginal(SIZES, T)
            np.testing.assert_allclose(est.covariance(S, T), MS @ cov @ MT.T, atol=1e-9)
        assert est.variance(S) == pytest.approx(float(np.diag(MS @ cov @ MS.T)[0]), rel=1e-9)
    np.testing.assert_allclose(
        [est.variance(S) for S in SETS], plan.marginal_variances(), rtol=1e-9
    )


def test_noisy_marginals_equal_gls_on_correlated_residuals(rng):
    """The paper's form: ``R_A x`` plus noise of covariance ``sigma_A^2 R_A R_A^T``."""
    W = MarginalWorkload(SIZES, SETS)
    s2 = {A: float(v) for A, v in zip(W.residual_sets(), rng.uniform(0.5, 3, 99), strict=False)}
    x = rng.integers(0, 20, math.prod(SIZES)).astype(float)
    noisy, Rs, covs, zs = {}, [], [], []
    for A in W.residual_sets():
        mA = _marginal(SIZES, A) @ x
        yA = mA + math.sqrt(s2[A]) * rng.standard_normal(mA.size)
        noisy[A] = yA
        DA = _kron([np.eye(SIZES[i])[:-1] - np.eye(SIZES[i])[1:] for i in A])
        Rs.append(DA @ _marginal(SIZES, A))
        covs.append(s2[A] * DA @ DA.T)
        zs.append(DA @ yA)  # what is released: the differences of the noisy marginal
    R, Sigma, z = np.vstack(Rs), block_diag(*covs), np.concatenate(zs)
    Si = np.linalg.inv(Sigma)
    F = np.linalg.pinv(R.T @ Si @ R)
    xhat = F @ R.T @ Si @ z
    est = ResidualEstimates.from_noisy_marginals(SIZES, noisy, s2)
    for S in _measured_sets():
        MS = _marginal(SIZES, S)
        np.testing.assert_allclose(est.marginal(S).ravel(), MS @ xhat, atol=1e-8)
        np.testing.assert_allclose(est.covariance(S), MS @ F @ MS.T, atol=1e-9)


@st.composite
def _case(draw: st.DrawFn):
    d = draw(st.integers(2, 4))
    sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=d, max_size=d)))
    sets = [s for r in range(1, d + 1) for s in itertools.combinations(range(d), r)]
    chosen = draw(st.lists(st.sampled_from(sets), min_size=1, max_size=4, unique=True))
    return sizes, chosen, draw(st.integers(0, 2**16))


@settings(max_examples=30, deadline=None)
@given(case=_case())
def test_marginals_agree_exactly_on_shared_sub_marginals(case):
    sizes, sets, seed = case
    rng = np.random.default_rng(seed)
    W = MarginalWorkload(sizes, sets)
    noisy = {A: rng.normal(10, 5, [sizes[i] for i in A]) for A in W.residual_sets()}
    est = ResidualEstimates.from_noisy_marginals(sizes, noisy, dict.fromkeys(noisy, 1.0))
    for S in W.sets():
        MS = est.marginal(S)
        for r in range(len(S)):
            for T in itertools.combinations(S, r):
                drop = tuple(k for k, i in enumerate(S) if i not in T)
                np.testing.assert_allclose(MS.sum(axis=drop), est.marginal(T), atol=1e-9)


def test_without_noise_every_marginal_is_exact(plan, rng):
    x = rng.integers(0, 9, SIZES)
    y = plan.strategy @ x.reshape(-1).astype(float)
    est = ResidualEstimates.from_plan(plan, y)
    for S in _measured_sets():
        drop = tuple(i for i in range(3) if i not in S)
        np.testing.assert_allclose(est.marginal(S), x.sum(axis=drop), atol=1e-9)


def test_records_give_the_plans_rows_without_a_data_vector(plan, rng):
    records = np.column_stack([rng.integers(0, n, 500) for n in SIZES])
    x = np.zeros(SIZES, dtype=np.int64)
    np.add.at(x, tuple(records.T), 1)  # the data vector, for the oracle only
    rows = [
        math.sqrt(u) * residual_rows(marginal_counts(records, SIZES, A))
        for A, u in zip(plan.marginals.residual_sets(), plan.precision, strict=True)
    ]
    np.testing.assert_allclose(
        np.concatenate(rows), plan.strategy @ x.reshape(-1).astype(float), atol=1e-9
    )
    # a DataFrame with named columns, and a sparse marginal table, give the same counts
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(records, columns=["a", "b", "c"])
    m12 = marginal_counts(df, SIZES, (1, 2), columns=["a", "b", "c"])
    np.testing.assert_array_equal(m12, x.sum(axis=0))
    table = sparse.COO.from_numpy(x.sum(axis=1))  # attributes (0, 2)
    np.testing.assert_array_equal(reduce_table(table, (0, 2), (2,)), x.sum(axis=(0, 1)))
    np.testing.assert_array_equal(reduce_table(x, (0, 1, 2), (2, 0)), x.sum(axis=1))
    P = residual_answer(m12)
    np.testing.assert_allclose(P.sum(axis=0), 0, atol=1e-9)
    np.testing.assert_allclose(P.sum(axis=1), 0, atol=1e-9)


def test_bad_inputs_are_refused(plan):
    with pytest.raises(ValueError, match="outside"):
        marginal_counts(np.array([[0, 3, 0]]), SIZES, (1,))
    with pytest.raises(ValueError, match="integers"):
        marginal_counts(np.array([[0.5, 1, 0]]), SIZES, (1,))
    with pytest.raises(ValueError, match="rows"):
        ResidualEstimates.from_plan(plan, np.zeros(3))
    with pytest.raises(ValueError, match="not centred"):
        ResidualEstimates(SIZES, {(1,): np.ones(3)}, {(1,): 1.0})
    est = ResidualEstimates.from_noisy_marginals(
        SIZES, {(): [5.0], (0,): [1.0, 2.0]}, {(): 1, (0,): 1}
    )
    with pytest.raises(ValueError, match="not measured"):
        est.marginal((0, 1))


def _nonneg_case(seed: int, mean: float):
    rng = np.random.default_rng(seed)
    sizes = (3, 4, 2)
    W = MarginalWorkload(sizes, [(0, 1), (1, 2), (0, 2)])
    x = rng.poisson(mean, sizes)
    noisy, s2 = {}, {}
    for A in W.residual_sets():
        drop = tuple(i for i in range(3) if i not in A)
        s2[A] = float(rng.uniform(1.0, 4.0))
        noisy[A] = x.sum(axis=drop) + rng.normal(0, math.sqrt(s2[A]), [sizes[i] for i in A])
    return W, ResidualEstimates.from_noisy_marginals(sizes, noisy, s2)


def test_local_nonnegativity_matches_a_convex_solver():
    cp = pytest.importorskip("cvxpy")
    W, est = _nonneg_case(1, 0.4)
    assert min(est.marginal(S).min() for S in W.sets()) < -0.5  # the constraint binds
    nn = est.nonnegative()
    sizes = W.sizes
    # the oracle: the same program on explicit matrices, residuals free but centred
    var = {A: cp.Variable(math.prod(sizes[i] for i in A)) for A in W.residual_sets()}
    cons, obj = [], 0
    for A, v in var.items():
        C = _kron([np.eye(sizes[i]) - 1.0 / sizes[i] for i in A])
        cons.append(C @ v == v)
        obj += cp.sum_squares(v - est.q[A].ravel()) / est.s2[A]
    for S in W.sets():
        table = 0
        for A in var:
            if set(A) <= set(S):
                L = _kron(
                    [np.eye(sizes[i]) if i in A else np.ones((sizes[i], 1)) / sizes[i] for i in S]
                )
                table = table + L @ var[A]
        cons.append(table >= 0)
    cp.Problem(cp.Minimize(obj), cons).solve(solver="CLARABEL")
    for A, v in var.items():
        np.testing.assert_allclose(nn.q[A].ravel(), v.value, atol=1e-5)
    for S in W.sets():
        assert nn.marginal(S).min() >= -1e-6
        for T in itertools.combinations(S, 1):
            drop = tuple(k for k, i in enumerate(S) if i not in T)
            np.testing.assert_allclose(nn.marginal(S).sum(axis=drop), nn.marginal(T), atol=1e-9)


def test_local_nonnegativity_leaves_non_negative_estimates_alone():
    W, est = _nonneg_case(2, 50.0)
    assert min(est.marginal(S).min() for S in W.sets()) > 0
    nn = est.nonnegative()
    for S in W.sets():
        np.testing.assert_allclose(nn.marginal(S), est.marginal(S), atol=1e-6)


def test_geographies_at_once_equal_one_at_a_time(plan, rng):
    A = plan.strategy.dense()
    X = rng.integers(0, 3, (4, math.prod(SIZES))).astype(float)
    Y = X @ A.T + plan.noise_scale * rng.standard_normal((4, A.shape[0]))
    batch = ResidualEstimates.from_plan(plan, Y)
    nn = batch.nonnegative()
    for g in range(4):
        one = ResidualEstimates.from_plan(plan, Y[g])
        for S in _measured_sets():
            np.testing.assert_allclose(batch.marginal(S)[g], one.marginal(S), atol=1e-12)
        nn_one = one.nonnegative()
        for S in SETS:
            np.testing.assert_allclose(nn.marginal(S)[g], nn_one.marginal(S), atol=1e-5)
            assert nn.marginal(S)[g].min() >= -1e-6
    # consistent marginals as measurements give themselves back, geography by geography
    res = plan.marginals.residual_sets()
    noisy = {R: batch.marginal(R).reshape(4, -1) for R in res}
    back = ResidualEstimates.from_noisy_marginals(SIZES, noisy, dict.fromkeys(res, 1.0), 4)
    for S in _measured_sets():
        np.testing.assert_allclose(back.marginal(S), batch.marginal(S), atol=1e-9)


def test_a_given_noise_variance_scales_every_residual_by_its_precision(plan, rng):
    A = plan.strategy.dense()
    y = rng.standard_normal(A.shape[0])
    base = ResidualEstimates.from_plan(plan, y)
    v = 3.7 * plan.noise_scale**2
    est = ResidualEstimates.from_plan(plan, y, v)
    for j, R in enumerate(plan.marginals.residual_sets()):
        assert est.s2[R] == pytest.approx(v / plan.precision[j], rel=1e-12)
        np.testing.assert_array_equal(est.q[R], base.q[R])
    for S in _measured_sets():
        assert est.variance(S) == pytest.approx(3.7 * base.variance(S), rel=1e-12)
