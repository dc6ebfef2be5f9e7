"""``mean_cell_variance``: ``trace((A^T A)^+) / n`` against the dense pseudo-inverse."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdask.graph._plans import mean_cell_variance
from dpdask.linalg import Dense, Identity, Kron, Prefix, Total, VStack


def _oracle(A: np.ndarray) -> float:
    return float(np.trace(np.linalg.pinv(A.T @ A, hermitian=True)) / A.shape[1])


@settings(max_examples=40, deadline=None)
@given(extra=st.integers(0, 6), cols=st.integers(1, 8), seed=st.integers(0, 2**16))
def test_dense_strategies_of_full_column_rank(extra, cols, seed) -> None:
    """Random strategies (full column rank with probability one, well conditioned: a
    rank-deficient one is in the structured cases, whose null space is exact)."""
    A = np.random.default_rng(seed).standard_normal((cols + extra, cols))
    assert mean_cell_variance(Dense(A)) == pytest.approx(_oracle(A), rel=1e-7)


@pytest.mark.parametrize(
    "A",
    [
        VStack([Total(5), Identity(5)]),
        Kron([Prefix(3), VStack([Total(4), Identity(4) * 0.5])]),
        Total(6),  # rank one: only the total's direction counts
        Kron([Total(3), Identity(4)]),  # rank 4 of 12
    ],
    ids=["vstack", "kron", "total", "kron-rank-deficient"],
)
def test_structured_strategies(A) -> None:
    assert mean_cell_variance(A) == pytest.approx(_oracle(A.dense()), rel=1e-9)
