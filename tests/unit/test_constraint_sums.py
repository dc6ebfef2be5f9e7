"""The sums behind the constraints' checks: a parent's bounds are its children's summed
(``sum_rows``), a query's least and largest answers over a cell box (``_reach``), and the
units a chunk's rows select (``unit_positions``).

Oracles: ``np.add.at`` (an unbuffered scatter, the definition of the sum), the answers'
extremes written cell by cell (each cell at the end of its box that the query's sign
prefers), and NumPy's own indexing of ``np.arange(k)``, all independent of the code.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdask.reconstruct.topdown._constraints import _reach, sum_rows, unit_positions


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(0, 12), g=st.integers(1, 5))
def test_sum_rows_is_the_scatter_sum(seed, k, g):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, g, size=k)
    V = rng.normal(size=(k, 3))
    V[rng.random((k, 3)) < 0.2] = np.inf
    want = np.zeros((g, 3))
    np.add.at(want, idx, V)
    got = sum_rows(idx, V, g)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _extremes(Q, lower, upper):
    k, q = lower.shape[0], Q.shape[0]
    least, most = np.zeros((k, q)), np.zeros((k, q))
    for u in range(k):
        for r in range(q):
            lo = hi = 0.0
            for j, c in enumerate(Q[r]):
                if c > 0:
                    lo, hi = lo + c * lower[u, j], hi + c * upper[u, j]
                elif c < 0:
                    lo, hi = lo + c * upper[u, j], hi + c * lower[u, j]
            least[u, r], most[u, r] = lo, hi
    return least, most


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), signed=st.booleans())
def test_reach_is_the_box_extremes(seed, signed):
    rng = np.random.default_rng(seed)
    k, n, q = (int(x) for x in rng.integers(1, 6, size=3))
    Q = rng.integers(-1 if signed else 0, 3, size=(q, n)).astype(float)
    lower = rng.integers(0, 4, size=(k, n)).astype(float)
    upper = lower + rng.integers(0, 4, size=(k, n))
    upper[rng.random((k, n)) < 0.3] = np.inf
    for got, want in zip(_reach(Q, lower, upper), _extremes(Q, lower, upper), strict=True):
        np.testing.assert_array_equal(got, want)


@settings(max_examples=80, deadline=None)
@given(
    k=st.integers(0, 30),
    start=st.integers(-35, 35) | st.none(),
    stop=st.integers(-35, 35) | st.none(),
    step=st.sampled_from([None, 1, 2, 3, -1, -2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_unit_positions_index_as_numpy_does(k, start, stop, step, seed):
    every = np.arange(k)
    np.testing.assert_array_equal(unit_positions(None, k), every)
    rows = slice(start, stop, step)
    np.testing.assert_array_equal(unit_positions(rows, k), every[rows])
    rng = np.random.default_rng(seed)
    if k:
        idx = rng.integers(-k, k, size=int(rng.integers(0, 6)))
        np.testing.assert_array_equal(unit_positions(idx, k), every[idx])
        np.testing.assert_array_equal(unit_positions(list(idx), k), every[idx])
    mask = rng.random(k) < 0.5
    np.testing.assert_array_equal(unit_positions(mask, k), every[mask])
    with pytest.raises(IndexError):
        unit_positions(np.array([k]), k)
    with pytest.raises(IndexError):
        unit_positions(np.array([-k - 1]), k)
