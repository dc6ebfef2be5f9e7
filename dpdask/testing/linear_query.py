"""The contract of an implicit matrix, as a reusable pytest suite: :class:`LinearQueryTests`.

Every :class:`~dpdask.linalg.LinearQuery` stands for an ``m x n`` matrix that never has
to exist. The suite builds that matrix independently of the class's own ``dense()``,
``gram()``, transpose and norms: column ``j`` of the *oracle* is the operator applied to
the unit vector ``e_j`` (:func:`dense_oracle`). Every other promise of the interface is
then checked against the oracle: ``dense()``, the transpose (``.T @ y`` and ``y @ A``),
``gram()`` (``A^T A``), products with blocks of vectors and batches of geographies,
integer counts, shape and dtype, the L1 and L2 column norms and sensitivities, the
Moore-Penrose pseudo-inverse (the four Penrose conditions), sums, scalings, products,
Kronecker products and unions built from the operator, Dask arrays, and a pickling round
trip (Dask ships operators to workers).

Requires ``pytest`` and ``hypothesis`` (development dependencies).

Examples
--------
A test class per operator class subclasses the suite and says which operators to try;
pytest then runs every contract test on each of them::

    from dpdask.linalg import Prefix
    from dpdask.testing import LinearQueryTests

    class TestPrefix(LinearQueryTests):
        @classmethod
        def operators(cls):
            # an operator, or (operator, its matrix written out by definition)
            return [Prefix(1), (Prefix(3), np.tril(np.ones((3, 3))))]

A class may also draw operators (or pairs) with :mod:`hypothesis`
(:meth:`LinearQueryTests.strategy`); each drawn one goes through
:func:`check_linear_query`, every check at once.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpdask.errors import ShapeError
from dpdask.linalg import Dense, Kron, LinearQuery, VStack

__all__ = [
    "LinearQueryTests",
    "check_compositions",
    "check_dask",
    "check_dense",
    "check_gram",
    "check_linear_query",
    "check_matmat",
    "check_pickle",
    "check_pinv",
    "check_sensitivity",
    "check_shape_dtype",
    "check_transpose",
    "dense_oracle",
    "split_case",
]

Matrix = npt.NDArray[np.float64]

#: a test case: an operator, or an operator and its matrix written out independently
Case = LinearQuery | tuple[LinearQuery, npt.ArrayLike]

#: default relative tolerance of every comparison (entries scaled by the oracle's largest)
RTOL = 1e-9


def dense_oracle(op: LinearQuery) -> Matrix:
    """The matrix of ``op``, column ``j`` being ``op @ e_j`` (one matrix-vector product per
    column, so that nothing of ``dense()``, ``gram()`` or the transpose is used).

    Raises
    ------
    ShapeError
        If a product is not a vector of ``op.shape[0]`` entries.
    """
    m, n = op.shape
    out = np.empty((m, n), dtype=np.float64)
    for j in range(n):
        e = np.zeros(n)
        e[j] = 1.0
        col = np.asarray(op @ e)
        if col.shape != (m,):
            raise ShapeError(f"{op!r} @ e_{j} has shape {col.shape}, not ({m},)")
        out[:, j] = col
    return out


def split_case(case: Case) -> tuple[LinearQuery, npt.ArrayLike | None]:
    """``(operator, reference matrix or None)`` of a test case."""
    if isinstance(case, LinearQuery):
        return case, None
    return case


def _close(got: Any, want: npt.ArrayLike, what: str, rtol: float = RTOL) -> None:
    want_a = np.asarray(want, dtype=np.float64)
    got_a = np.asarray(got)
    assert got_a.shape == want_a.shape, f"{what}: shape {got_a.shape}, expected {want_a.shape}"
    scale = max(1.0, float(np.abs(want_a).max(initial=0.0)))
    np.testing.assert_allclose(got_a, want_a, rtol=rtol, atol=rtol * scale, err_msg=what)


def _rng(op: LinearQuery) -> np.random.Generator:
    """Test data (never noise), seeded by the shape so that a failure repeats."""
    return np.random.default_rng([20261128, *op.shape])


def _vector(rng: np.random.Generator, *shape: int) -> Matrix:
    return rng.uniform(-1.0, 1.0, size=shape)


def check_shape_dtype(op: LinearQuery) -> None:
    """``shape`` is two positive ints, ``size`` their product, ``dtype`` float64, and
    products have the shapes and dtype they promise (float64 for integer counts too)."""
    shape = op.shape
    assert isinstance(shape, tuple) and len(shape) == 2, f"shape {shape!r}"
    assert all(isinstance(s, int) and s >= 1 for s in shape), f"shape {shape!r}"
    m, n = shape
    assert op.size == m * n
    assert op.dtype == np.dtype(np.float64)
    assert op.T.shape == (n, m)
    rng = _rng(op)
    y = np.asarray(op @ _vector(rng, n))
    assert y.shape == (m,) and y.dtype == np.float64, (y.shape, y.dtype)
    counts = rng.integers(0, 9, size=n)
    yi = np.asarray(op @ counts)
    assert yi.shape == (m,) and yi.dtype == np.float64, (yi.shape, yi.dtype)
    _close(yi, np.asarray(op @ counts.astype(np.float64)), "integer counts")
    Y = np.asarray(op @ _vector(rng, n, 3))
    assert Y.shape == (m, 3) and Y.dtype == np.float64, (Y.shape, Y.dtype)


def check_dense(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """``dense()`` is the oracle."""
    M = np.asarray(op.dense())
    assert M.dtype == np.float64, M.dtype
    _close(M, D, "dense()", rtol)


def check_transpose(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """``.T`` (on vectors, blocks, as a matrix, its Gram and column norms), ``y @ A`` and
    ``.T.T`` match ``D^T``."""
    m, n = op.shape
    rng = _rng(op)
    y, Y, x = _vector(rng, m), _vector(rng, m, 3), _vector(rng, n)
    _close(op.T @ y, D.T @ y, ".T @ y", rtol)
    _close(op.T @ Y, D.T @ Y, ".T @ Y", rtol)
    _close(y @ op, y @ D, "y @ A", rtol)
    _close(Y.T @ op, Y.T @ D, "Y^T @ A", rtol)
    _close(op.T.dense(), D.T, ".T.dense()", rtol)
    _close(op.T.T @ x, D @ x, ".T.T @ x", rtol)
    _close(op.T.gram().dense(), D @ D.T, ".T.gram()", rtol)
    for p in (1, 2):
        _close(op.T.column_norms(p), np.linalg.norm(D, ord=p, axis=1), f".T L{p} norms", rtol)


def check_gram(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """``gram()`` is ``D^T D``, as a matrix and on a vector."""
    G = op.gram()
    n = op.shape[1]
    assert G.shape == (n, n), G.shape
    _close(G.dense(), D.T @ D, "gram().dense()", rtol)
    x = _vector(_rng(op), n)
    _close(G @ x, D.T @ (D @ x), "gram() @ x", rtol)


def check_matmat(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """A block of vectors goes column by column; a batch of geographies row by row."""
    n = op.shape[1]
    rng = _rng(op)
    X = _vector(rng, n, 4)
    got = np.asarray(op @ X)
    by_column = np.column_stack([np.asarray(op @ X[:, j]) for j in range(4)])
    _close(got, by_column, "A @ X by columns", rtol)
    _close(got, D @ X, "A @ X", rtol)
    B = _vector(rng, 3, n)
    _close(op.apply(B), B @ D.T, "apply(batch)", rtol)


def check_sensitivity(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """L1 and L2 column norms and sensitivities (the largest) are those of ``D``."""
    for p in (1, 2):
        norms = np.linalg.norm(D, ord=p, axis=0)
        _close(op.column_norms(p), norms, f"column_norms({p})", rtol)
        _close(op.sensitivity(p), norms.max(), f"sensitivity({p})", rtol)


def check_pinv(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """``pinv()`` satisfies the four Penrose conditions against ``D`` (which define the
    Moore-Penrose pseudo-inverse uniquely, whatever its algorithm or cut-off)."""
    m, n = op.shape
    P = np.asarray(op.pinv().dense())
    assert P.shape == (n, m), P.shape
    a, q, k = float(np.linalg.norm(D, 2)), float(np.linalg.norm(P, 2)), max(m, n)
    for got, want, scale, what in (
        (D @ P @ D, D, a * q * a, "A P A = A"),
        (P @ D @ P, P, q * a * q, "P A P = P"),
        ((D @ P).T, D @ P, a * q, "A P symmetric"),
        ((P @ D).T, P @ D, a * q, "P A symmetric"),
    ):
        np.testing.assert_allclose(got, want, rtol=0, atol=rtol * k * scale, err_msg=what)


def check_compositions(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """Sums, scalings, products, Kronecker products (``op`` on the first, middle and last
    axis) and weighted unions built from ``op`` act, transpose and have the norms of the
    same compositions of ``D``."""
    m, n = op.shape
    rng = _rng(op)
    x, y = _vector(rng, n), _vector(rng, m)
    _close((op + op) @ x, 2.0 * (D @ x), "A + A", rtol)
    _close((2.5 * op) @ x, 2.5 * (D @ x), "2.5 * A", rtol)
    _close((op / 4) @ x, (D @ x) / 4, "A / 4", rtol)
    _close((op.T @ op) @ x, D.T @ (D @ x), "A^T @ A (composed)", rtol)
    S = np.array([[1.0, -2.0], [0.5, 3.0], [0.0, 1.0]])
    R = np.array([[2.0, 0.0, -1.0]])
    for factors, dense in (
        ([op, Dense(S)], [D, S]),
        ([Dense(S), op], [S, D]),
        ([Dense(R), op, Dense(S)], [R, D, S]),
    ):
        K = Kron(factors)
        KD = dense[0]
        for f in dense[1:]:
            KD = np.kron(KD, f)
        xk, yk = _vector(rng, KD.shape[1]), _vector(rng, KD.shape[0])
        _close(K @ xk, KD @ xk, "Kron @ x", rtol)
        _close(K.T @ yk, KD.T @ yk, "Kron.T @ y", rtol)
        B = _vector(rng, 2, KD.shape[1])
        _close(K.apply(B), B @ KD.T, "Kron.apply(batch)", rtol)
        T = B.reshape(2, *K.in_shape)
        _close(K.apply(T), B @ KD.T, "Kron.apply(batch of tensors)", rtol)
        for p in (1, 2):
            _close(K.sensitivity(p), np.linalg.norm(KD, ord=p, axis=0).max(), f"Kron L{p}", rtol)
    V = VStack([op, op], weights=[1.0, -2.0])
    VD = np.vstack([D, -2.0 * D])
    _close(V @ x, VD @ x, "VStack @ x", rtol)
    _close(V.T @ np.concatenate([y, y]), VD.T @ np.concatenate([y, y]), "VStack.T @ y", rtol)
    for p in (1, 2):
        _close(V.sensitivity(p), np.linalg.norm(VD, ord=p, axis=0).max(), f"VStack L{p}", rtol)


def check_dask(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """``op @ dask_array`` applies ``op`` to every geography (row) of a chunked array, flat
    ``(g, n)`` or, for a Kronecker product with ``op`` as a factor, ``(g, *domain)``."""
    import dask.array as da

    rng = _rng(op)
    B = _vector(rng, 5, op.shape[1])
    x: Any = da.from_array(B, chunks=(2, -1))  # type: ignore[no-untyped-call]
    _close((op @ x).compute(scheduler="sync"), B @ D.T, "A @ dask array", rtol)
    S = np.array([[1.0, 0.5], [-1.0, 2.0]])
    K, KD = Kron([Dense(S), op]), np.kron(S, D)
    T = _vector(rng, 5, 2, op.shape[1])
    t: Any = da.from_array(T, chunks=(3, 1, -1))  # type: ignore[no-untyped-call]
    got = (K @ t).compute(scheduler="sync")
    _close(got, T.reshape(5, -1) @ KD.T, "Kron @ dask array of tensors", rtol)


def check_pickle(op: LinearQuery, D: Matrix, rtol: float = RTOL) -> None:
    """A pickled and unpickled copy is the same class and the same matrix."""
    copy = pickle.loads(pickle.dumps(op))
    assert type(copy) is type(op), type(copy)
    assert copy.shape == op.shape
    _close(dense_oracle(copy), D, "unpickled copy", rtol)


def check_linear_query(
    op: LinearQuery,
    reference: npt.ArrayLike | None = None,
    rtol: float = RTOL,
    pinv_rtol: float = RTOL,
) -> None:
    """Every check of the contract on ``op`` (and its oracle against ``reference``, the
    matrix written out independently, when given)."""
    check_shape_dtype(op)
    D = dense_oracle(op)
    if reference is not None:
        _close(D, reference, "A @ e_j against the reference matrix", rtol)
    for check in (
        check_dense,
        check_transpose,
        check_gram,
        check_matmat,
        check_sensitivity,
        check_compositions,
        check_dask,
        check_pickle,
    ):
        check(op, D, rtol)
    check_pinv(op, D, pinv_rtol)


class LinearQueryTests:
    """The :class:`~dpdask.linalg.LinearQuery` contract as pytest tests; subclass it.

    A subclass provides :meth:`operators` (small instances: the oracle costs one product
    per column), each alone or paired with its matrix written out by definition (which
    makes the suite check the products themselves, not only their consistency), and may
    provide :meth:`strategy` (cases drawn by hypothesis). ``rtol`` (every comparison) and
    ``pinv_rtol`` (the Penrose conditions) may be loosened by a class whose operators
    are computed through a factorisation; ``known_failures`` names the tests a class is
    known to fail (each runs as a strict ``xfail``, so that fixing the bug is noticed).
    """

    rtol: ClassVar[float] = RTOL
    #: test name -> why this class breaks it (a known bug: strict xfail, so a fix shows)
    known_failures: ClassVar[dict[str, str]] = {}
    pinv_rtol: ClassVar[float] = 1e-9
    max_examples: ClassVar[int] = 15
    test_drawn_operators: ClassVar[Callable[[LinearQueryTests], None]]

    @classmethod
    def operators(cls) -> Sequence[Case]:
        """The cases every test runs on: operators, or ``(operator, matrix)`` pairs whose
        matrix is written out independently of dpdask."""
        raise NotImplementedError(f"{cls.__name__} must say which operators to test")

    @classmethod
    def strategy(cls) -> st.SearchStrategy[Case] | None:
        """Cases for hypothesis to draw (None: only :meth:`operators`)."""
        return None

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "operator" not in metafunc.fixturenames:
            return
        cases = [split_case(c) for c in self.operators()]
        reason = self.known_failures.get(metafunc.function.__name__)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        with_ref = "reference" in metafunc.fixturenames
        params = [
            pytest.param(
                *((op, ref) if with_ref else (op,)),
                id=f"{i}-{type(op).__name__}-{op.shape[0]}x{op.shape[1]}",
                marks=marks,
            )
            for i, (op, ref) in enumerate(cases)
        ]
        metafunc.parametrize(("operator", "reference") if with_ref else "operator", params)

    # -- the contract ----------------------------------------------------
    def test_shape_and_dtype(self, operator: LinearQuery) -> None:
        check_shape_dtype(operator)

    def test_dense_is_the_matvec_oracle(
        self, operator: LinearQuery, reference: npt.ArrayLike | None
    ) -> None:
        D = dense_oracle(operator)
        if reference is not None:
            _close(D, reference, "A @ e_j against the reference matrix", self.rtol)
        check_dense(operator, D, self.rtol)

    def test_transpose(self, operator: LinearQuery) -> None:
        check_transpose(operator, dense_oracle(operator), self.rtol)

    def test_gram(self, operator: LinearQuery) -> None:
        check_gram(operator, dense_oracle(operator), self.rtol)

    def test_matmat_by_columns(self, operator: LinearQuery) -> None:
        check_matmat(operator, dense_oracle(operator), self.rtol)

    def test_sensitivity(self, operator: LinearQuery) -> None:
        check_sensitivity(operator, dense_oracle(operator), self.rtol)

    def test_pinv(self, operator: LinearQuery) -> None:
        check_pinv(operator, dense_oracle(operator), self.pinv_rtol)

    def test_compositions(self, operator: LinearQuery) -> None:
        check_compositions(operator, dense_oracle(operator), self.rtol)

    def test_dask(self, operator: LinearQuery) -> None:
        check_dask(operator, dense_oracle(operator), self.rtol)

    def test_pickle(self, operator: LinearQuery) -> None:
        check_pickle(operator, dense_oracle(operator), self.rtol)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # the drawn test exists only where a class draws (no test that cannot fail)
        if any("strategy" in vars(k) for k in cls.__mro__ if k is not LinearQueryTests):
            cls.test_drawn_operators = _test_drawn_operators


def _test_drawn_operators(self: LinearQueryTests) -> None:
    """Every check on operators drawn from the class's :meth:`~LinearQueryTests.strategy`."""
    drawn = self.strategy()
    assert drawn is not None

    @settings(
        max_examples=self.max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(drawn)
    def check(case: Case) -> None:
        op, reference = split_case(case)
        check_linear_query(op, reference, self.rtol, self.pinv_rtol)

    check()
