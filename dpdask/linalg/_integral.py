"""Whether an operator's entries are all integers, decided from its structure."""

from __future__ import annotations

import numpy as np

from dpdask.linalg._base import LinearQuery, Product, Scaled, Sum, Transpose
from dpdask.linalg._explicit import Dense, Sparse
from dpdask.linalg._kron import Kron
from dpdask.linalg._primitives import Diagonal, Identity, Ones, Prefix, RangeQueries
from dpdask.linalg._union import VStack

__all__ = ["has_integer_entries"]


def _integral(values: np.ndarray) -> bool:
    values = np.asarray(values, dtype=float)
    return bool(np.isfinite(values).all() and (values == np.floor(values)).all())


def has_integer_entries(op: LinearQuery) -> bool:
    """Whether every entry of ``op`` is an integer, decided from its structure.

    Primitive counting operators (identity, ones, prefix, ranges) are integral;
    diagonal, dense and sparse operators are checked entry by entry; products,
    sums, unions (with their weights), Kronecker products, scalings and
    transposes are integral when all their parts are. Operators of unknown type
    count as non-integral (so they get float noise), unless they define a
    ``has_integer_entries()`` method.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Kron, Ones, Prefix
    >>> has_integer_entries(Kron([Prefix(3), Ones(2)]))
    True
    >>> has_integer_entries(0.5 * Identity(3))
    False
    """
    own = getattr(op, "has_integer_entries", None)
    if callable(own):
        return bool(own())
    if isinstance(op, Identity | Ones | Prefix | RangeQueries):
        return True
    if isinstance(op, Diagonal):
        return _integral(op.d)
    if isinstance(op, Dense):
        return _integral(op.matrix)
    if isinstance(op, Sparse):
        return _integral(op.matrix.data)
    if isinstance(op, Scaled):
        return _integral(np.array([op.c])) and has_integer_entries(op.A)
    if isinstance(op, Transpose):
        return has_integer_entries(op.base)
    if isinstance(op, Product):
        return has_integer_entries(op.A) and has_integer_entries(op.B)
    if isinstance(op, Sum):
        return all(has_integer_entries(t) for t in op.terms)
    if isinstance(op, Kron):
        return all(has_integer_entries(f) for f in op.factors)
    if isinstance(op, VStack):
        return _integral(op.weights) and all(has_integer_entries(p) for p in op.parts)
    return False
