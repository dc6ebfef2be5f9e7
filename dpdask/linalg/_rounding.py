"""Rigorous bounds on the floating-point error of applying an operator.

:func:`evaluation_error` returns a number ``e`` such that, for every input ``x``
held exactly in float64 (integer counts below ``2**53``, or float data), the
answers computed by ``op.apply(x)`` satisfy, row by row,

    ``|fl(op x)_i - (op x)_i| <= e * ||x||_1``

where ``op x`` is the exact product of the operator's stored (double) entries
with ``x``. The measurement on a lattice (:func:`dpdask.measure.lattice`) uses it
to choose a grid step no finer than twice the largest evaluation error.

The bound is the classical componentwise one (Higham, *Accuracy and Stability
of Numerical Algorithms*, 2002, ch. 3): a dot product of length ``n`` computed
in any order, with or without fused multiply-adds, has error at most
``gamma(n) |a|^T |x|`` with ``gamma(n) = n u / (1 - n u)`` and ``u = 2**-53``.
Each operator reports a pair ``(c, M)``: its computed answers err by at most
``c * (B |x|)`` for a non-negative matrix ``B >= |op|`` entrywise whose largest
entry is at most ``M``; then ``(B |x|)_i <= M ||x||_1`` and ``e = c M``. Pairs
compose:

* a product of stages (Kronecker factors applied mode by mode, ``A @ B``) has
  ``c = prod(1 + c_k) - 1`` and ``B = prod B_k``;
* a scaling multiplies ``M`` by ``|c|`` and adds one rounding; a sum of ``T``
  terms adds ``gamma(T - 1)`` for the final additions and sums the ``M``;
* a union takes the worst part;
* interval queries computed as differences of running sums are bounded with
  ``B`` the all-ones matrix (their error scales with the whole running sum).

Operator types outside this module define ``_rounding() -> (c, M)``; an
operator with neither fails closed (:class:`TypeError`): its answers cannot be
put on a lattice. Underflow adds at most ``2**-1074`` per operation, far below
any grid step used, and is ignored.
"""

from __future__ import annotations

import math

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError
from dpdask.linalg._base import LinearQuery, Product, Scaled, Sum, Transpose
from dpdask.linalg._explicit import Dense, Sparse
from dpdask.linalg._kron import Kron
from dpdask.linalg._primitives import Diagonal, Identity, Ones, Prefix, RangeQueries
from dpdask.linalg._union import VStack

__all__ = ["evaluation_error", "gamma", "rounding_pair"]

UNIT_ROUNDOFF = 2.0**-53
_SLACK = 1.0 + 2.0**-20  # covers the roundings made while computing the bound itself


def gamma(n: int) -> float:
    """``n u / (1 - n u)``: the error factor of ``n`` roundings (``u = 2**-53``).

    Examples
    --------
    >>> gamma(0)
    0.0
    >>> 1.1e-13 < gamma(1000) < 1.2e-13
    True
    """
    n = max(int(n), 0)
    nu = n * UNIT_ROUNDOFF
    if nu >= 0.5:
        raise ArgumentError(f"gamma({n}) is not a useful error bound in double precision")
    return nu / (1.0 - nu)


def _compose(cs: list[float]) -> float:
    out = 1.0
    for c in cs:
        out *= 1.0 + c
    return out - 1.0


def _maxabs(values: np.ndarray) -> float:
    values = np.abs(np.asarray(values, dtype=float))
    return float(values.max(initial=0.0))


def rounding_pair(op: LinearQuery) -> tuple[float, float]:
    """``(c, M)`` for ``op`` (module notes): error ``<= c B|x|``, ``max B <= M``.

    Raises
    ------
    TypeError
        If ``op``'s type has no known rounding behaviour.
    """
    own = getattr(op, "_rounding", None)
    if callable(own):
        c, M = own()
        return float(c), float(M)
    if isinstance(op, Identity):
        return 0.0, 1.0
    if isinstance(op, Ones):
        return gamma(op.shape[1] - 1), 1.0
    if isinstance(op, Prefix):
        return gamma(op.n - 1), 1.0
    if isinstance(op, RangeQueries):
        # running sums (gamma(n) each), one subtraction: bounded by the all-ones B
        return 3.0 * gamma(op.n + 1), 1.0
    if isinstance(op, Diagonal):
        return UNIT_ROUNDOFF, _maxabs(op.d)
    if isinstance(op, Dense):
        return gamma(op.shape[1]), _maxabs(op.matrix)
    if isinstance(op, Sparse):
        nnz = np.diff(op.matrix.indptr)
        return gamma(int(nnz.max(initial=0))), _maxabs(op.matrix.data)
    if isinstance(op, Scaled):
        c, M = rounding_pair(op.A)
        return _compose([c, UNIT_ROUNDOFF]), abs(op.c) * M
    if isinstance(op, Product):
        ca, Ma = rounding_pair(op.A)
        cb, Mb = rounding_pair(op.B)
        return _compose([ca, cb]), Ma * Mb * op.A.shape[1]
    if isinstance(op, Sum):
        pairs = [rounding_pair(t) for t in op.terms]
        c = _compose([gamma(len(pairs) - 1), max(p[0] for p in pairs)])
        return c, math.fsum(p[1] for p in pairs)
    if isinstance(op, Kron):
        pairs = [rounding_pair(f) for f in op.factors]
        return _compose([p[0] for p in pairs]), math.prod(p[1] for p in pairs)
    if isinstance(op, VStack):
        cs, Ms = [], []
        for part, w in zip(op.parts, op.weights, strict=True):
            c, M = rounding_pair(part)
            cs.append(c if w == 1 else _compose([c, UNIT_ROUNDOFF]))
            Ms.append(abs(float(w)) * M)
        return max(cs), max(Ms)
    if isinstance(op, Transpose):
        return _transpose_pair(op.base)
    raise ArgumentTypeError(
        f"no floating-point error bound for a {type(op).__name__} operator; define "
        "_rounding() on it (dpdask.linalg._rounding) to measure it on a lattice"
    )


def _transpose_pair(base: LinearQuery) -> tuple[float, float]:
    m = base.shape[0]
    if isinstance(base, Identity):
        return 0.0, 1.0
    if isinstance(base, Diagonal):
        return UNIT_ROUNDOFF, _maxabs(base.d)
    if isinstance(base, Dense):
        return gamma(m), _maxabs(base.matrix)
    if isinstance(base, Sparse):
        nnz = np.bincount(base.matrix.indices, minlength=base.shape[1])
        return gamma(int(nnz.max(initial=0))), _maxabs(base.matrix.data)
    if isinstance(base, Ones | Prefix):
        return gamma(m - 1), 1.0
    if isinstance(base, RangeQueries):
        # scatter-add of the rows (2 m terms), then a running sum over n cells
        return gamma(2 * m + base.n), 1.0
    flipped = base.T
    if isinstance(flipped, Transpose):
        raise ArgumentTypeError(
            f"no floating-point error bound for the transpose of a {type(base).__name__}"
        )
    return rounding_pair(flipped)


def evaluation_error(op: LinearQuery) -> float:
    """A bound ``e``: every computed answer of ``op.apply(x)`` is within ``e ||x||_1``.

    Parameters
    ----------
    op : LinearQuery
        The operator (a strategy).

    Returns
    -------
    float
        ``c * M`` (module notes), rounded up.

    Raises
    ------
    TypeError
        If some part of ``op`` has no known rounding behaviour.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Kron, Prefix
    >>> evaluation_error(Identity(5))
    0.0
    >>> 0 < evaluation_error(Kron([Prefix(10), Identity(3)])) < 1e-14
    True
    """
    c, M = rounding_pair(op)
    return c * M * _SLACK
