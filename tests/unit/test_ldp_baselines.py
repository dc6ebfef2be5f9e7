"""Baseline local mechanisms as strategy matrices."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpdask import Domain
from dpdask.ldp import LaplaceFactorization, baselines, lower_bound
from dpdask.ldp.baselines import (
    fourier,
    fourier_coefficients,
    hadamard,
    hadamard_matrix,
    hierarchical,
    hierarchical_matrix,
    randomized_response,
)
from dpdask.ldp.strategy import check_ldp
from dpdask.linalg import Identity, Prefix
from dpdask.workloads import marginals
from dpdask.workloads.parity import parities

EPS = [0.5, 1.0, 4.0]


@pytest.mark.parametrize("eps", EPS)
@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_every_baseline_is_exactly_ldp(n, eps):
    for S in (randomized_response(n, eps), hadamard(n, eps), hierarchical(n, eps, 2)):
        check_ldp(S.counts, eps)


@pytest.mark.parametrize("n", [3, 4, 7, 8])
def test_hadamard_structure(n):
    e = math.e
    Q = hadamard_matrix(n, 1.0)
    K = Q.shape[0]
    assert K == 1 << n.bit_length() and K > n
    np.testing.assert_allclose(Q.sum(axis=0), 1.0)
    hi = 2 * e / (K * (1 + e))
    assert ((np.isclose(Q, hi)).sum(axis=0) == K // 2).all()  # |C_u| = K / 2
    assert np.linalg.matrix_rank(Q) == n  # every histogram is estimable


def test_hadamard_histogram_variance_closed_form():
    """Worst-case variance of HR on the histogram, from the definition of the mechanism."""
    n, eps = 7, 1.0
    S = hadamard(n, eps)
    V = S.reconstruction(np.eye(n))
    Q = np.asarray(S.Q)
    direct = ((V**2).sum(axis=0) @ Q - 1).max()
    assert S.worst_variance(Identity(n)) == pytest.approx(direct, rel=1e-9)


def test_hierarchical_levels_and_support():
    Q = hierarchical_matrix(16, 1.0, 4)
    np.testing.assert_allclose(Q.sum(axis=0), 1.0)
    # two levels below the root: 4 nodes then 16 leaves, each with its HR oracle
    assert Q.shape[0] == hadamard_matrix(4, 1.0).shape[0] + hadamard_matrix(16, 1.0).shape[0]
    S = hierarchical(16, 1.0, W=Prefix(16))
    assert S.info["branching"] in (2, 4, 8, 16)
    assert S.supports(Prefix(16))


def test_fourier_uses_only_needed_coefficients():
    W = marginals(Domain(**{f"a{i}": 2 for i in range(4)}), 3)  # 4 binary attributes
    G = W.gram().dense()
    alphas = fourier_coefficients(G)
    weights = [bin(a).count("1") for a in alphas]
    assert set(weights) == {1, 2, 3}  # all coefficients of order 1..3, none of order 4
    S = fourier(W, 1.0)
    assert S.shape[0] == 2 * len(alphas)
    assert S.supports(W)
    check_ldp(S.counts, 1.0)


def test_parity_workload():
    P = parities(4, 3).dense()
    assert P.shape == (4, 16)
    assert set(np.unique(P)) == {0.0, 1.0}
    S = fourier(parities(4, 3), 1.0)
    assert S.shape[0] == 8  # four third-order coefficients, two outputs each


def test_local_matrix_mechanism_variance_by_simulation(rng):
    """Each person releases A e_u + Laplace(Delta / eps): total variance per person."""
    n, eps = 4, 1.0
    A = np.vstack([np.eye(n), np.ones((1, n))])
    M = LaplaceFactorization(A, eps)
    W = Prefix(n)
    assert M.sensitivity == 4.0  # 2 x max column L1 norm
    b = M.sensitivity / eps
    reps, N = 4000, 50
    noise = rng.laplace(scale=b, size=(reps, N, A.shape[0])).sum(axis=1)
    est = noise @ (W.dense() @ np.linalg.pinv(A)).T
    assert est.var(axis=0, ddof=1).sum() == pytest.approx(N * M.worst_variance(W), rel=0.08)


@pytest.mark.parametrize("eps", EPS)
def test_baselines_dictionary(eps):
    W = Prefix(16)
    b = baselines(W, eps)
    assert set(b) == {
        "randomized_response",
        "hadamard",
        "hierarchical",
        "fourier",
        "matrix_mechanism",
    }
    for S in b.values():
        assert S.worst_variance(W) >= lower_bound(W, eps) * (1 - 1e-9)
    assert "fourier" not in baselines(Prefix(12), eps)  # n not a power of two


def test_local_matrix_mechanism_error_is_kept_per_workload(monkeypatch):
    """supports / worst_variance / summary on one workload solve once; a new one re-solves."""
    import importlib

    B = importlib.import_module("dpdask.ldp.baselines")  # the package's `baselines` is the function
    calls = []
    real = B.sym_pinv

    def counting(X):
        calls.append(X.shape)
        return real(X)

    monkeypatch.setattr(B, "sym_pinv", counting)
    M = LaplaceFactorization(np.vstack([np.eye(4), np.ones((1, 4))]), 1.0)
    W = Prefix(4)
    expected = (
        2
        * (M.sensitivity / 1.0) ** 2
        * np.trace(np.linalg.pinv(M.A.T @ M.A) @ W.dense().T @ W.dense())
    )
    assert M.supports(W)
    assert M.worst_variance(W) == pytest.approx(expected, rel=1e-9)
    assert M.summary(W)["worst_variance"] == pytest.approx(expected, rel=1e-9)
    assert len(calls) == 1
    assert M.worst_variance(Identity(4)) == pytest.approx(
        2 * 16 * np.trace(np.linalg.pinv(M.A.T @ M.A)), rel=1e-9
    )
    assert len(calls) == 2
