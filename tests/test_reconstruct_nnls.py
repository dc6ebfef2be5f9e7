"""NNLS and workload NNLS on implicit operators against scipy.optimize.nnls on dense matrices."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from scipy.optimize import nnls as scipy_nnls

from dpdask.linalg import AllRange, Dense, Identity, Kron, Prefix, Total, VStack
from dpdask.reconstruct import least_squares, nnls, wnnls


def _strategies(rng: np.random.Generator):
    yield Kron([Prefix(3), Identity(4)])
    yield Kron([Dense(rng.uniform(size=(5, 3))), AllRange(4)])
    yield VStack([Kron([Identity(3), Total(4)]), Kron([Total(3), Identity(4)]), Identity(12)])
    yield VStack([Kron([Identity(3), Prefix(4)]), Kron([Total(3), Identity(4)])], weights=[2, 0.5])


def _relerr(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-12))


def test_matches_scipy_nnls(rng: np.random.Generator) -> None:
    for A in _strategies(rng):
        M = A.dense()
        x_true = rng.poisson(1.0, size=M.shape[1]).astype(float)
        Y = M @ x_true + rng.laplace(scale=2.0, size=(4, M.shape[0]))
        est = nnls(A, Y, tol=1e-12)
        assert est.report.converged
        assert est.x.shape == (4, M.shape[1]) and (est.x >= 0).all()
        for x, y in zip(est.x, Y, strict=True):
            assert _relerr(x, scipy_nnls(M, y)[0]) < 1e-6
        # a single right-hand side gives the same answer as its row of the batch
        np.testing.assert_allclose(nnls(A, Y[1], tol=1e-12).x, est.x[1], atol=1e-8)


def test_weighted_matches_scipy(rng: np.random.Generator) -> None:
    A = VStack([Identity(6), Prefix(6), Total(6)])
    M = A.dense()
    w = np.concatenate([np.full(6, 4.0), rng.uniform(0.2, 1.0, size=6), [1.0]])
    y = M @ rng.poisson(1.0, size=6) + rng.laplace(scale=2.0, size=M.shape[0])
    ref = scipy_nnls(np.sqrt(w)[:, None] * M, np.sqrt(w) * y)[0]
    for weights in (w, 2.0 * w):  # a common factor does not move the solution
        assert _relerr(nnls(A, y, weights=weights, tol=1e-12).x, ref) < 1e-6
    ref_scalar = scipy_nnls(M, y)[0]
    assert _relerr(nnls(A, y, weights=3.0, tol=1e-12).x, ref_scalar) < 1e-6


@pytest.mark.parametrize("x0", ["auto", "ls", "zero"])
def test_exact_measurements_return_the_truth(x0: str, rng: np.random.Generator) -> None:
    A = VStack([Kron([Identity(3), Total(4)]), Identity(12)])
    x = rng.integers(0, 20, size=12).astype(float)
    x[[2, 7]] = 0.0
    est = nnls(A, A @ x, x0=x0, tol=1e-12)
    np.testing.assert_allclose(est.x, x, atol=1e-8)
    assert est.report.converged
    # projected Newton (the default) starts from zero under "auto"
    assert est.report.details["start"] == ("zero" if x0 == "auto" else x0)


def test_given_start_and_iteration_limit_reported(rng: np.random.Generator) -> None:
    A = Kron([Dense(rng.uniform(size=(6, 5))), Prefix(4)])
    y = A @ rng.poisson(1.0, size=20) + rng.laplace(scale=3.0, size=A.shape[0])
    short = nnls(A, y, x0="zero", tol=1e-14, maxiter=2)
    assert not short.report.converged and short.report.iterations == 2
    assert short.report.residual > short.report.tolerance
    # restarting from where it stopped finishes the job
    full = nnls(A, y, x0=short.x, tol=1e-12)
    assert full.report.converged and full.report.details["start"] == "given"
    assert _relerr(full.x, scipy_nnls(A.dense(), y)[0]) < 1e-6


def test_wnnls_matches_nnls_on_the_workload(rng: np.random.Generator) -> None:
    """WNNLS is NNLS of the workload against the workload answers of the LS estimate."""
    A = VStack([Identity(8), Kron([Total(2), Identity(4)])])
    for W in (AllRange(8), Prefix(8), Kron([Identity(2), Total(4)])):  # the last is rank 2
        Wd = W.dense()
        Y = A @ rng.poisson(0.5, size=8) + rng.laplace(scale=3.0, size=(3, A.shape[0]))
        est = wnnls(W, A, Y, tol=1e-12)
        assert est.report.converged and (est.x >= 0).all()
        x_ls = least_squares(A, Y).x
        for x, xl in zip(est.x, x_ls, strict=True):
            ref = scipy_nnls(Wd, Wd @ xl)[0]
            # W x is what the problem determines (x itself is not unique for a rank-deficient W)
            assert _relerr(Wd @ x, Wd @ ref) < 1e-6


def test_wnnls_with_nonnegative_ls_keeps_it(rng: np.random.Generator) -> None:
    A = Identity(5)
    y = rng.uniform(1.0, 5.0, size=5)
    np.testing.assert_allclose(wnnls(Prefix(5), A, y).x, y, atol=1e-9)


def test_bad_input_raises() -> None:
    A = Identity(3)
    with pytest.raises(ValueError, match="shape"):
        nnls(A, np.ones(4))
    with pytest.raises(ValueError, match="NaN"):
        nnls(A, np.array([1.0, np.nan, 2.0]))
    with pytest.raises(ValueError, match="start"):
        nnls(A, np.ones(3), x0="middle")
    with pytest.raises(ValueError, match="columns"):
        wnnls(Identity(4), A, np.ones(3))
    with pytest.raises(ValueError, match="weights"):
        nnls(A, np.ones(3), weights=np.array([1.0, -1.0, 1.0]))


def test_stopping_rule_is_in_noise_units(rng: np.random.Generator) -> None:
    """With inverse-variance weights the scaled gradient at the truth has unit variance."""
    A = VStack([Identity(6), Prefix(6), Total(6)])
    sd = np.concatenate([np.full(6, 0.5), np.full(6, 3.0), [10.0]])
    w = 1.0 / sd**2
    Aw = np.sqrt(w)[:, None] * A.dense()
    scale = np.sqrt((Aw**2).sum(axis=0))
    x = rng.uniform(5.0, 10.0, size=6)  # interior: the projected gradient is the gradient
    noise = rng.normal(size=(4000, A.shape[0])) * sd
    grads = (Aw.T @ (np.sqrt(w) * (-noise)).T).T / scale
    np.testing.assert_allclose((grads**2).mean(axis=0), 1.0, rtol=0.1)
    # so a loose tolerance stops within a small fraction of the noise of the optimum
    y = A @ x + noise[0]
    loose, tight = nnls(A, y, weights=w, tol=1e-2), nnls(A, y, weights=w, tol=1e-12)
    gap = np.sqrt(((Aw @ (loose.x - tight.x)) ** 2).mean())
    assert loose.report.converged and gap < 0.05


def test_compact_gram_is_the_gram(rng: np.random.Generator) -> None:
    nnls_module = importlib.import_module("dpdask.reconstruct.nnls")
    for A in _strategies(rng):
        for op in (A, 3.0 * A):
            G = nnls_module._compact_gram(op)
            np.testing.assert_allclose(G.dense(), op.dense().T @ op.dense(), atol=1e-10)
