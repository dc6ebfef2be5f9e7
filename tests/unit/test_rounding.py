"""The floating-point evaluation bound behind the lattice (``dpdask.linalg._rounding``).

Oracle: the exact product ``A x`` of the operator's stored doubles with the data,
computed in rational arithmetic (:class:`fractions.Fraction`) from the dense
matrix, against ``A.apply(x)`` in floating point. The bound must hold for every
operator and input, including adversarial ones built to round badly (entries
``1 + 2**-52``, large counts, cancellation), where the observed error is not zero,
so the comparison has something to compare.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdask.linalg import (
    Dense,
    Diagonal,
    Identity,
    Kron,
    LinearQuery,
    Ones,
    Prefix,
    Product,
    RangeQueries,
    Scaled,
    Sparse,
    Sum,
    VStack,
    evaluation_error,
    gamma,
)
from dpdask.strategy import PIdentity


def _exact_products(A: LinearQuery, X: np.ndarray) -> list[list[Fraction]]:
    """``A x`` for every row ``x`` of ``X``, in exact rational arithmetic."""
    D = [[Fraction(float(v)) for v in row] for row in A.dense()]
    out = []
    for x in X:
        fx = [Fraction(float(v)) for v in x]
        out.append([sum((a * b for a, b in zip(row, fx, strict=True)), Fraction(0)) for row in D])
    return out


def _worst_ratio(A: LinearQuery, X: np.ndarray) -> tuple[float, float]:
    """Largest observed ``|fl(A x) - A x| / ||x||_1`` and the bound ``e``."""
    got = A.apply(X)
    exact = _exact_products(A, X)
    worst = 0.0
    for g, x in enumerate(X):
        l1 = float(np.abs(x).sum())
        if l1 == 0:
            continue
        err = max(abs(Fraction(float(v)) - e) for v, e in zip(got[g], exact[g], strict=True))
        worst = max(worst, float(err) / l1)
    return worst, evaluation_error(A)


def _rough(shape, rng) -> np.ndarray:
    """Entries that round on every product: ``(1 + 2**-52) * 3**j`` and thirds."""
    base = 1.0 + 2.0**-52
    return base * rng.choice([1 / 3, 2 / 3, 0.1, 1.0, 7 / 9], size=shape) * (1 + 1e-15)


OPERATORS = {
    "dense": lambda rng: Dense(_rough((5, 7), rng)),
    "kron-dense": lambda rng: Kron([Dense(_rough((3, 4), rng)), Dense(_rough((4, 3), rng))]),
    "kron-prefix-dense": lambda rng: Kron([Prefix(4), Dense(_rough((2, 3), rng))]),
    "ranges": lambda rng: Kron(
        [RangeQueries(6, [0, 1, 2, 3], [5, 4, 2, 5]), Scaled(Identity(2), 0.1)]
    ),
    "vstack-weighted": lambda rng: VStack(
        [Kron([Ones(3), Dense(_rough((2, 4), rng))]), Kron([Identity(3), Ones(4)])],
        weights=[1 / 3, 0.7],
    ),
    "sum": lambda rng: Sum([Dense(_rough((6, 6), rng)), Scaled(Prefix(6), 1 / 7)]),
    "product": lambda rng: Product(Dense(_rough((3, 5), rng)), Prefix(5)),
    "sparse-diag": lambda rng: Product(
        Sparse(_rough((4, 5), rng) * (rng.random((4, 5)) < 0.6)), Diagonal(_rough(5, rng))
    ),
    "transpose": lambda rng: Kron([Prefix(3).T, Dense(_rough((3, 2), rng)).T]),
    "pidentity": lambda rng: PIdentity(np.abs(_rough((2, 6), rng)), norm=2),
}


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_bound_covers_adversarial_inputs(name):
    rng = np.random.default_rng(sorted(OPERATORS).index(name))
    A = OPERATORS[name](rng)
    # large, mixed counts (near national totals) and float data with long mantissas
    X = np.concatenate(
        [
            rng.integers(0, 2**31, size=(3, A.shape[1])).astype(np.float64),
            rng.random((2, A.shape[1])) * 1e9 + 1 / 3,
            np.full((1, A.shape[1]), 2.0**40 + 1),
        ]
    )
    worst, bound = _worst_ratio(A, X)
    assert worst <= bound
    assert bound < 1e-12  # and not vacuous: a few hundred roundings at most


def test_adversarial_case_rounds_for_real():
    """The oracle sees rounding error here (so the bound test is not vacuous)."""
    rng = np.random.default_rng(0)
    A = OPERATORS["kron-dense"](rng)
    X = rng.integers(2**40, 2**41, size=(4, A.shape[1])).astype(np.float64)
    worst, bound = _worst_ratio(A, X)
    assert 0 < worst <= bound


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    seed=st.integers(0, 2**32 - 1),
    total=st.integers(1, 2**45),
)
def test_bound_holds_for_random_kronecker_products(sizes, seed, total):
    rng = np.random.default_rng(seed)
    A = Kron([Dense(_rough((rng.integers(1, 4), n), rng) - 0.4) for n in sizes])
    x = rng.multinomial(total, np.ones(A.shape[1]) / A.shape[1]).astype(np.float64)
    worst, bound = _worst_ratio(A, x[None, :])
    assert worst <= bound


def test_gamma_is_the_classical_factor():
    u = 2.0**-53
    for n in (1, 10, 10**6):
        assert gamma(n) == pytest.approx(n * u / (1 - n * u), rel=1e-15)
    with pytest.raises(ValueError):
        gamma(2**52)


def test_composition_is_the_product_of_factors():
    """Kron of dense factors: ``prod(1 + gamma(n_f)) - 1`` times the product of maxima."""
    f1, f2 = Dense(np.full((2, 3), 0.5)), Dense(np.full((4, 5), 0.25))
    expected = ((1 + gamma(3)) * (1 + gamma(5)) - 1) * 0.5 * 0.25
    assert evaluation_error(Kron([f1, f2])) == pytest.approx(expected, rel=1e-5)
    assert evaluation_error(Identity(9)) == 0.0


def test_unknown_operator_fails_closed():
    class Opaque(LinearQuery):
        def __init__(self):
            self.shape = (2, 2)

        def _matmat(self, X):
            return X

    with pytest.raises(TypeError, match="no floating-point error bound"):
        evaluation_error(Kron([Opaque(), Identity(2)]))


def test_cph_sized_bound_is_small():
    """Five dense factors of the CPH sizes: the bound stays near ``199 u`` per unit."""
    sizes = (2, 2, 63, 17, 115)
    A = Kron([Dense(np.full((n, n), 1.0 / n)) for n in sizes])
    e = evaluation_error(A)
    assert e == pytest.approx(
        (math.prod(1 + gamma(n) for n in sizes) - 1) / math.prod(sizes), rel=1e-5
    )
