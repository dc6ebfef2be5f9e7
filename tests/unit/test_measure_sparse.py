"""The measure step on sparse chunks: the same measurement as the dense chunk.

Oracle: the dense chunk measured with the same key and identity (the answers
``A x`` of the dense rows, the noise from the same keyed stream); the checks refuse
on the stored entries what they refuse on dense counts.
"""

from __future__ import annotations

import numpy as np
import pytest
import sparse
from scipy import sparse as sp

import dpdask.linalg._geo as rows
from dpdask.errors import DataError, DataTypeError
from dpdask.measure import measure
from dpdask.noise import SecretKey
from tests.helpers import DOMAIN, make_plan

KEY = SecretKey.for_testing(7)
IDENT = ("r", "block", 0, "strategy")


def _counts(rng, g=9, density=0.3):
    x = rng.integers(0, 5, size=(g, DOMAIN.size)) * (rng.random((g, DOMAIN.size)) < density)
    x[2] = 0  # an empty geography
    return x.astype(np.int64)


@pytest.mark.parametrize("kind", ["coo", "csr"])
@pytest.mark.parametrize("batch", [1, 4, 2**20])
def test_sparse_chunk_is_measured_as_its_dense_form(rng, monkeypatch, kind, batch):
    monkeypatch.setattr(rows, "DENSE_BATCH_CELLS", batch * DOMAIN.size)
    x = _counts(rng)
    plan = make_plan()
    dense = measure(plan, x.reshape(-1, *DOMAIN.shape), KEY, IDENT, test_mode=True)
    chunk = sparse.COO.from_numpy(x) if kind == "coo" else sp.csr_array(x)
    got = measure(plan, chunk, KEY, IDENT, test_mode=True)
    np.testing.assert_array_equal(got, dense)


def test_sparse_chunk_of_domain_shape_is_accepted(rng):
    x = _counts(rng)
    plan = make_plan()
    coo = sparse.COO.from_numpy(x.reshape(-1, *DOMAIN.shape))
    got = measure(plan, coo, KEY, IDENT, test_mode=True)
    np.testing.assert_array_equal(
        got, measure(plan, x.reshape(coo.shape), KEY, IDENT, test_mode=True)
    )


@pytest.mark.parametrize(
    "data, error, match",
    [
        (np.array([1.0, -1.0]), DataError, "negative"),
        (np.array([1.0, np.nan]), DataError, "NaN"),
        (np.array([True, True]), DataTypeError, "dtype"),
    ],
)
def test_bad_entries_are_refused_before_anything(data, error, match):
    coo = sparse.COO(np.array([[0, 1], [0, 3]]), data, shape=(2, DOMAIN.size))
    with pytest.raises(error, match=match):
        measure(make_plan(), coo, KEY, IDENT, test_mode=True)


def test_wrong_shape_is_refused():
    coo = sparse.COO(np.array([[0], [0]]), np.array([1]), shape=(2, DOMAIN.size + 1))
    with pytest.raises(DataError, match="shape"):
        measure(make_plan(), coo, KEY, IDENT, test_mode=True)
