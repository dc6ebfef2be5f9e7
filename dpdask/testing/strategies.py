"""Hypothesis strategies for domains and implicit linear-query operators.

Every strategy draws small operators (a few hundred entries at most) so that
tests can compare them against their dense counterparts.

Examples
--------
>>> from hypothesis import given
>>> from dpdask.testing.strategies import operators
>>> @given(operators())
... def test_transpose(A):
...     assert (A.T.dense() == A.dense().T).all()
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np

from dpdask.domain import Domain
from dpdask.linalg import (
    AllRange,
    Dense,
    Diagonal,
    Identity,
    Kron,
    LinearQuery,
    Ones,
    Prefix,
    RangeQueries,
    Sparse,
    VStack,
)

__all__ = ["domains", "kron_operators", "operators", "primitive_operators", "union_operators"]

# entries are 0 or of magnitude 1e-3..4: well-conditioned enough that dense
# pseudo-inverses (the oracles) are themselves accurate
_ELEMENTS = st.one_of(st.just(0.0), st.floats(1e-3, 4), st.floats(-4, -1e-3))


def domains(max_attrs: int = 4, max_size: int = 5) -> st.SearchStrategy[Domain]:
    """Domains of 1..``max_attrs`` attributes with sizes 1..``max_size``."""
    return st.lists(st.integers(1, max_size), min_size=1, max_size=max_attrs).map(
        lambda sizes: Domain({f"a{i}": s for i, s in enumerate(sizes)})
    )


@st.composite
def _range_queries(draw: st.DrawFn, n: int) -> RangeQueries:
    k = draw(st.integers(1, 6))
    lo = draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
    hi = [draw(st.integers(a, n - 1)) for a in lo]
    return RangeQueries(n, lo, hi)


@st.composite
def _dense(draw: st.DrawFn, n: int) -> Dense:
    m = draw(st.integers(1, 5))
    return Dense(draw(hnp.arrays(np.float64, (m, n), elements=_ELEMENTS)))


@st.composite
def _sparse(draw: st.DrawFn, n: int) -> Sparse:
    m = draw(st.integers(1, 5))
    M = draw(hnp.arrays(np.float64, (m, n), elements=_ELEMENTS))
    mask = draw(hnp.arrays(np.bool_, (m, n)))
    return Sparse(np.where(mask, M, 0.0))


def primitive_operators(n: int) -> st.SearchStrategy[LinearQuery]:
    """Any primitive operator with ``n`` columns."""
    return st.one_of(
        st.just(Identity(n)),
        st.integers(1, 3).map(lambda m: Ones(n, m)),
        st.just(Prefix(n)),
        st.just(AllRange(n)),
        _range_queries(n),
        _dense(n),
        _sparse(n),
        hnp.arrays(np.float64, (n,), elements=_ELEMENTS).map(Diagonal),
    )


@st.composite
def kron_operators(draw: st.DrawFn, sizes: tuple[int, ...] | None = None) -> Kron:
    """A Kronecker product of primitives over ``sizes`` (drawn if not given)."""
    if sizes is None:
        sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    return Kron([draw(primitive_operators(s)) for s in sizes])


@st.composite
def union_operators(draw: st.DrawFn, sizes: tuple[int, ...] | None = None) -> VStack:
    """A weighted union of Kronecker products over one domain."""
    if sizes is None:
        sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    k = draw(st.integers(1, 3))
    parts = [draw(kron_operators(sizes)) for _ in range(k)]
    # bounded away from zero: a subnormal weight (say 5e-309) makes a matrix whose
    # pseudo-inverse overflows, which no dense oracle can check
    weight = st.one_of(st.floats(1e-3, 3), st.floats(-3, -1e-3))
    weights = draw(st.lists(weight, min_size=k, max_size=k))
    return VStack(parts, weights=weights)


@st.composite
def operators(draw: st.DrawFn) -> LinearQuery:
    """A primitive, a Kronecker product or a union, with a dense size under ~500."""
    sizes = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    n = int(np.prod(sizes))
    return draw(st.one_of(primitive_operators(n), kron_operators(sizes), union_operators(sizes)))
