"""Algebra laws of the implicit operators, checked against dense oracles on random cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpdask.linalg import Dense, Kron, VStack
from dpdask.testing.strategies import kron_operators, operators, union_operators

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _vec(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=n)


@SETTINGS
@given(operators(), st.integers(0, 2**32 - 1))
def test_matvec_and_rmatvec_match_dense(A, seed) -> None:
    M = A.dense()
    x, y = _vec(A.shape[1], seed), _vec(A.shape[0], seed + 1)
    np.testing.assert_allclose(A @ x, M @ x, atol=1e-9)
    np.testing.assert_allclose(A.T @ y, M.T @ y, atol=1e-9)
    X = np.random.default_rng(seed).normal(size=(A.shape[1], 2))
    np.testing.assert_allclose(A @ X, M @ X, atol=1e-9)
    np.testing.assert_allclose(A.apply(X.T), X.T @ M.T, atol=1e-9)


@SETTINGS
@given(operators())
def test_gram_and_transpose(A) -> None:
    M = A.dense()
    np.testing.assert_allclose(A.T.dense(), M.T, atol=1e-12)
    np.testing.assert_allclose(A.gram().dense(), M.T @ M, atol=1e-8)


@SETTINGS
@given(operators())
def test_sensitivity_is_max_column_norm(A) -> None:
    M = A.dense()
    assert A.sensitivity(1) == pytest.approx(np.abs(M).sum(axis=0).max(), rel=1e-9, abs=1e-12)
    assert A.sensitivity(2) == pytest.approx(np.linalg.norm(M, axis=0).max(), rel=1e-9, abs=1e-12)


@SETTINGS
@given(kron_operators())
def test_kron_pinv_is_factorwise_pinv(K) -> None:
    M = K.dense()
    P = K.pinv()
    assert isinstance(P, Kron)
    np.testing.assert_allclose(P.dense(), np.linalg.pinv(M), atol=1e-7 * max(1, np.abs(M).max()))


@SETTINGS
@given(kron_operators(sizes=(2, 3)), kron_operators(sizes=(2, 3)))
def test_kron_mixed_product(K1, K2) -> None:
    # (A (x) B)^T (C (x) D) = A^T C (x) B^T D, and the composition stays a Kron
    if K1.shape[0] != K2.shape[0] or [f.shape[0] for f in K1.factors] != [
        f.shape[0] for f in K2.factors
    ]:
        return
    P = K1.T @ K2
    assert isinstance(P, Kron)
    np.testing.assert_allclose(P.dense(), K1.dense().T @ K2.dense(), atol=1e-8)


@SETTINGS
@given(union_operators(), st.floats(0.1, 5))
def test_union_sensitivity_scales_and_composes(W, c) -> None:
    # scaling every weight by c scales both sensitivities by c
    scaled = VStack(W.parts, weights=c * W.weights)
    assert scaled.sensitivity(1) == pytest.approx(c * W.sensitivity(1), rel=1e-9, abs=1e-12)
    assert scaled.sensitivity(2) == pytest.approx(c * W.sensitivity(2), rel=1e-9, abs=1e-12)
    # stacking the union with itself doubles L1 and multiplies L2 by sqrt(2)
    twice = VStack([W, W])
    assert twice.sensitivity(1) == pytest.approx(2 * W.sensitivity(1), rel=1e-9, abs=1e-12)
    assert twice.sensitivity(2) == pytest.approx(np.sqrt(2) * W.sensitivity(2), rel=1e-9, abs=1e-12)


@SETTINGS
@given(operators())
def test_dense_pinv_identities(A) -> None:
    M = A.dense()
    P = Dense(M).pinv().dense()
    np.testing.assert_allclose(M @ P @ M, M, atol=1e-7 * max(1.0, np.abs(M).max()) ** 3)
