"""Every implicit-matrix class keeps the LinearQuery contract (``dpdask.testing``).

One :class:`~dpdask.testing.LinearQueryTests` subclass per :class:`LinearQuery` class of
the package, on small shapes, each paired with its matrix written out by definition
wherever it has one; :func:`test_every_linear_query_class_has_a_contract` fails when a
class of the package has none, so a new class cannot skip the contract.
"""

from __future__ import annotations

import importlib
import itertools
import pkgutil
from collections.abc import Sequence

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import scipy.sparse as sp

import dpdask
from dpdask.linalg import (
    AllRange,
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
    Total,
    Transpose,
    VStack,
    interval_tree,
)
from dpdask.reconstruct.structured import KronPairInverse, structured_pinv
from dpdask.strategy import PIdentity, WeightedMarginals
from dpdask.strategy._tridiag import SpectralStrategy, ca_solve_tridiagonal, tridiagonal_inverse
from dpdask.strategy.fitness._solution import BlockDiagonal
from dpdask.testing import LinearQueryTests
from dpdask.testing.faults import SlowOperator
from dpdask.testing.linear_query import Case, split_case
from dpdask.testing.strategies import kron_operators, union_operators

# -- matrices written out by definition, entry by entry (no dpdask code) ---------------


def _ranges(n: int, lo: Sequence[int], hi: Sequence[int]) -> np.ndarray:
    M = np.zeros((len(lo), n))
    for r, (a, b) in enumerate(zip(lo, hi, strict=True)):
        for j in range(n):
            M[r, j] = 1.0 if a <= j <= b else 0.0
    return M


def _identity(n: int) -> np.ndarray:
    return np.array([[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)])


def _kron(*mats: np.ndarray) -> np.ndarray:
    """The Kronecker product by its definition: rows and columns in C order."""
    rows = list(itertools.product(*(range(M.shape[0]) for M in mats)))
    cols = list(itertools.product(*(range(M.shape[1]) for M in mats)))
    out = np.ones((len(rows), len(cols)))
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            for M, a, b in zip(mats, r, c, strict=True):
                out[i, j] *= M[a, b]
    return out


def _block_diag(*mats: np.ndarray) -> np.ndarray:
    out = np.zeros((sum(M.shape[0] for M in mats), sum(M.shape[1] for M in mats)))
    r = c = 0
    for M in mats:
        out[r : r + M.shape[0], c : c + M.shape[1]] = M
        r, c = r + M.shape[0], c + M.shape[1]
    return out


_M23 = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]])
_M33 = np.array([[2.0, 0.0, 1.0], [-1.0, 1.0, 0.0], [0.5, 0.0, 4.0]])
_SPARSE = np.array([[0.0, 2.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.5, 0.0]])

_ELEMENTS = st.one_of(st.just(0.0), st.floats(1e-3, 4), st.floats(-4, -1e-3))


@st.composite
def _matrices(draw: st.DrawFn) -> np.ndarray:
    m, n = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    return draw(hnp.arrays(np.float64, (m, n), elements=_ELEMENTS))


@st.composite
def _intervals(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    n = draw(st.integers(1, 7))
    k = draw(st.integers(1, 6))
    lo = draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k))
    hi = [draw(st.integers(a, n - 1)) for a in lo]
    return n, lo, hi


# -- linalg primitives -------------------------------------------------------------------


def _prefix(n: int) -> np.ndarray:
    return _ranges(n, [0] * n, list(range(n)))


def _all_ranges(n: int) -> np.ndarray:
    pairs = [(i, j) for i in range(n) for j in range(i, n)]
    return _ranges(n, [a for a, _ in pairs], [b for _, b in pairs])


class TestIdentity(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [(Identity(n), _identity(n)) for n in (1, 2, 5)]


class TestOnes(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (Total(1), np.ones((1, 1))),
            (Total(4), np.ones((1, 4))),
            (Ones(3, 2), np.ones((2, 3))),
            (Ones(1, 3), np.ones((3, 1))),
        ]


class TestPrefix(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [(Prefix(n), _prefix(n)) for n in (1, 2, 6)]


class TestRangeQueries(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        lo, hi = [0, 1, 4, 2, 0], [4, 1, 4, 3, 0]
        tree5 = [(0, 4), (0, 2), (3, 4), (0, 1), (2, 2), (3, 3), (4, 4), (0, 0), (1, 1)]
        tree7 = [(0, 2), (3, 4), (5, 6), (0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6)]
        return [
            (RangeQueries(5, lo, hi), _ranges(5, lo, hi)),
            (RangeQueries(1, [0], [0]), np.ones((1, 1))),
            (interval_tree(5), _ranges(5, *zip(*tree5, strict=True))),
            (interval_tree(7, 3, root=False), _ranges(7, *zip(*tree7, strict=True))),
        ]

    @classmethod
    def strategy(cls) -> st.SearchStrategy[Case]:
        return _intervals().map(lambda t: (RangeQueries(*t), _ranges(*t)))


class TestAllRange(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [(AllRange(n), _all_ranges(n)) for n in (1, 2, 5)]


class TestDiagonal(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        d = [1.0, -0.5, 0.0, 3.0]
        M = np.array([[d[i] if i == j else 0.0 for j in range(4)] for i in range(4)])
        return [(Diagonal([2.0]), np.array([[2.0]])), (Diagonal(d), M)]


# -- explicit matrices -------------------------------------------------------------------


class TestDense(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [(Dense(_M23), _M23), (Dense(_M33), _M33), (Dense([[0.0]]), np.zeros((1, 1)))]

    @classmethod
    def strategy(cls) -> st.SearchStrategy[Case]:
        return _matrices().map(lambda M: (Dense(M), M))


class TestSparse(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [(Sparse(sp.csr_array(_SPARSE)), _SPARSE), (Sparse(sp.coo_matrix(_M23)), _M23)]

    @classmethod
    def strategy(cls) -> st.SearchStrategy[Case]:
        return _matrices().map(lambda M: (Sparse(sp.csr_array(M)), M))


# -- compositions ------------------------------------------------------------------------


class TestKron(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (Kron([Identity(2), Total(3)]), _kron(_identity(2), np.ones((1, 3)))),
            (
                Kron([Prefix(2), Dense(_M23), Ones(2)]),
                _kron(_prefix(2), _M23, np.ones((1, 2))),
            ),
            (
                Kron([Total(2), Identity(1), AllRange(3)]),
                _kron(np.ones((1, 2)), _identity(1), _all_ranges(3)),
            ),
            (Kron([Dense(_M33)]), _M33),
        ]

    @classmethod
    def strategy(cls) -> st.SearchStrategy[Case]:
        return kron_operators()


class TestVStack(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        marginals = [Kron([Identity(2), Total(3)]), Kron([Total(2), Prefix(3)])]
        M = np.vstack(
            [
                0.5 * _kron(_identity(2), np.ones((1, 3))),
                -1.5 * _kron(np.ones((1, 2)), _prefix(3)),
            ]
        )
        return [
            (
                VStack([Identity(3), Total(3)], weights=[1.0, 2.0]),
                np.vstack([_identity(3), 2.0 * np.ones((1, 3))]),
            ),
            (VStack(marginals, [0.5, -1.5]), M),
            (VStack([Dense(_M23)], names=["only"]), _M23),
        ]

    @classmethod
    def strategy(cls) -> st.SearchStrategy[Case]:
        return union_operators()


class TestTranspose(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (Transpose(Prefix(4)), _prefix(4).T),
            (Transpose(Dense(_M23)), _M23.T),
            (RangeQueries(4, [0, 2], [3, 2]).T, _ranges(4, [0, 2], [3, 2]).T),
        ]


class TestProduct(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (Product(Dense(_M23), Prefix(3)), _M23 @ _prefix(3)),
            (Product(Prefix(3).T, Dense(_M33)), _prefix(3).T @ _M33),
        ]


class TestScaled(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (Scaled(Prefix(3), -2.5), -2.5 * _prefix(3)),
            (Scaled(Dense(_M23), 0.0), np.zeros((2, 3))),
            (3.0 * Identity(2), 3.0 * _identity(2)),
        ]


class TestSum(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (Sum([Prefix(3), Identity(3), Dense(_M33)]), _prefix(3) + _identity(3) + _M33),
            (Dense(_M23) + Dense(-_M23), np.zeros((2, 3))),
        ]


# -- classes outside linalg --------------------------------------------------------------


def _marginals(sizes: tuple[int, ...], theta: Sequence[float]) -> np.ndarray:
    """``[theta_a M_a]`` by definition: bit ``i`` of subset ``a`` (first attribute most
    significant) keeps attribute ``i``, else totals it out; zero weights dropped."""
    d = len(sizes)
    parts = []
    for a, w in enumerate(theta):
        if w == 0:
            continue
        bits = [(a >> (d - 1 - i)) & 1 for i in range(d)]
        mats = [_identity(n) if b else np.ones((1, n)) for n, b in zip(sizes, bits, strict=True)]
        parts.append(w * _kron(*mats))
    return np.vstack(parts)


class TestWeightedMarginals(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        one_way = [0.0, 0.5, 0.5, 0.0]
        mixed = [0.1, 0.0, 0.2, 0.3, 0.0, 0.0, 0.4, 1.0]
        return [
            (WeightedMarginals((2, 3), one_way), _marginals((2, 3), one_way)),
            (WeightedMarginals((2, 2, 3), mixed), _marginals((2, 2, 3), mixed)),
        ]


_THETA = np.array([[1.0, 0.5, 0.0, 2.0], [0.0, 1.0, 1.0, 0.25]])


def _pidentity(theta: np.ndarray, norm: int) -> np.ndarray:
    """``[I; Theta]`` with every column divided by its L``norm`` norm."""
    n = theta.shape[1]
    d = [(1.0 + sum(abs(t) ** norm for t in theta[:, j])) ** (1.0 / norm) for j in range(n)]
    return np.vstack([_identity(n), theta]) / np.array(d)


class TestPIdentity(LinearQueryTests):
    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (PIdentity(_THETA, 1), _pidentity(_THETA, 1)),
            (PIdentity(_THETA, 2), _pidentity(_THETA, 2)),
            (PIdentity([[0.5]], 1), _pidentity(np.array([[0.5]]), 1)),
        ]


class TestPIdentityInverseGram(LinearQueryTests):
    """The ``(A^T A)^-1`` a p-Identity's pseudo-inverse is built from (``_SymLowRank``)."""

    @classmethod
    def operators(cls) -> Sequence[Case]:
        out: list[Case] = []
        for norm in (1, 2):
            pinv = PIdentity(_THETA, norm).pinv()
            assert isinstance(pinv, Product)
            A = _pidentity(_THETA, norm)
            out.append((pinv.A, np.linalg.inv(A.T @ A)))
        return out


class TestKronPairInverse(LinearQueryTests):
    """HDMM OPT_+'s least squares over a union of two Kronecker products: for a union
    of full column rank, ``(A^T A)^-1 A^T``."""

    @classmethod
    def operators(cls) -> Sequence[Case]:
        first = [Kron([Identity(2), Total(3)]), Kron([Prefix(2), Identity(3)])]
        second = [Kron([Identity(2), Prefix(2)]), Kron([Total(2), Identity(2)])]
        A1 = np.vstack(
            [_kron(_identity(2), np.ones((1, 3))), 0.5 * _kron(_prefix(2), _identity(3))]
        )
        A2 = np.vstack([_kron(_identity(2), _prefix(2)), _kron(np.ones((1, 2)), _identity(2))])
        out: list[Case] = []
        for A, M in ((VStack(first, [1.0, 0.5]), A1), (VStack(second), A2)):
            pinv = structured_pinv(A)
            assert isinstance(pinv, KronPairInverse)
            out.append((pinv, np.linalg.solve(M.T @ M, M.T)))
        return out


class TestSpectralStrategy(LinearQueryTests):
    """The convex optimum's strategy for prefix workloads: a dense matrix that knows its
    inverse Gram (the optimiser's own have no reference: the oracle only)."""

    @classmethod
    def operators(cls) -> Sequence[Case]:
        from dpdask.strategy._gram import Gram

        out: list[Case] = []
        for n in (1, 4):
            tri = tridiagonal_inverse(Gram.of(Prefix(n)))
            assert tri is not None
            out.append(ca_solve_tridiagonal(*tri)[0])
        out.append((SpectralStrategy(_M33, np.ones(3), np.ones(3), 1.0), _M33))
        return out


class TestBlockDiagonal(LinearQueryTests):
    """The covariance of independently measured parts (fitness for use)."""

    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (BlockDiagonal([Prefix(2), Dense(_M23)]), _block_diag(_prefix(2), _M23)),
            (BlockDiagonal([Identity(3)]), _identity(3)),
        ]


class TestSlowOperator(LinearQueryTests):
    """The fault-injection wrapper (here without its sleep)."""

    @classmethod
    def operators(cls) -> Sequence[Case]:
        return [
            (SlowOperator(Prefix(4), delay=0.0), _prefix(4)),
            (SlowOperator(Dense(_M23), delay=0.0), _M23),
        ]


# -- no class without its contract -------------------------------------------------------


def _subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_every_linear_query_class_has_a_contract() -> None:
    """Every LinearQuery subclass in the package is an operator of a contract class here."""
    for info in pkgutil.walk_packages(dpdask.__path__, "dpdask."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    in_package = {c for c in _subclasses(LinearQuery) if c.__module__.startswith("dpdask.")}
    contracts = [c for c in _subclasses(LinearQueryTests) if c.__module__ == __name__]
    tested = {type(split_case(case)[0]) for c in contracts for case in c.operators()}
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in in_package - tested)
    assert not missing, (
        f"LinearQuery classes without a LinearQueryTests subclass here: {missing}; "
        "add one (operators(): small instances, each with its matrix written out where it has one)"
    )
    assert len(in_package) >= 14  # the walk found the package's classes
