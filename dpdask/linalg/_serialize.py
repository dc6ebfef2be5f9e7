"""A small, safe serialisation of implicit operators: nested dictionaries plus arrays.

``to_dict(op)`` describes an operator by its class name and constructor data;
structured operators keep their structure (a ``Kron`` of ``Prefix`` factors stays
two words and a number), and only explicit data (dense matrices, sparse arrays,
weights, range bounds, strategy parameters) becomes arrays. ``from_dict`` rebuilds
the operator. Nothing is pickled and no code is imported except registered
``dpdask`` modules, so a saved plan can be loaded from an untrusted file.

Arrays either stay inline (``{"__array__": [...], "dtype": ..., "shape": ...}``,
JSON-safe) or, when an ``arrays`` dictionary is passed, are stored there and
referenced by key (``{"__ref__": "a0"}``), for ``.npz`` files.

Classes outside :mod:`dpdask.linalg` join through :func:`register` (the strategy
module registers its p-Identity and weighted-marginals operators).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpdask.errors import ArgumentError, ArgumentTypeError
from dpdask.linalg._base import LinearQuery, Product, Scaled, Sum, Transpose
from dpdask.linalg._explicit import Dense, Sparse
from dpdask.linalg._kron import Kron
from dpdask.linalg._primitives import AllRange, Diagonal, Identity, Ones, Prefix, RangeQueries
from dpdask.linalg._union import VStack

__all__ = ["from_dict", "register", "to_dict"]

Encoder = Callable[[Any, "_Writer"], dict[str, Any]]
Decoder = Callable[[dict[str, Any], "_Reader"], LinearQuery]

_REGISTRY: dict[str, tuple[type, Encoder, Decoder, str]] = {}


def register(cls: type, encode: Encoder, decode: Decoder, name: str | None = None) -> None:
    """Make ``cls`` serialisable.

    Parameters
    ----------
    cls : type
        A :class:`LinearQuery` subclass.
    encode : callable
        ``encode(op, writer) -> dict`` of constructor data; call ``writer.op(x)`` for
        nested operators and ``writer.array(a)`` for arrays.
    decode : callable
        ``decode(data, reader) -> op``, using ``reader.op`` and ``reader.array``.
    name : str, optional
        Type name in the file (default the class name); must be unique.
    """
    key = name or cls.__name__
    module = cls.__module__
    if not module.startswith("dpdask."):
        raise ArgumentError("only dpdask operator classes can be registered")
    _REGISTRY[key] = (cls, encode, decode, module)


class _Writer:
    def __init__(self, arrays: dict[str, np.ndarray] | None):
        self.arrays = arrays

    def array(self, a: Any) -> dict[str, Any]:
        a = np.asarray(a)
        if a.dtype == object:
            raise ArgumentTypeError("cannot serialise an object array")
        if self.arrays is None:
            return {"__array__": a.ravel().tolist(), "dtype": a.dtype.str, "shape": list(a.shape)}
        key = f"a{len(self.arrays)}"
        self.arrays[key] = a
        return {"__ref__": key}

    def op(self, op: LinearQuery) -> dict[str, Any]:
        for key, (cls, encode, _, module) in _REGISTRY.items():
            if type(op) is cls:
                out = {"type": key, **encode(op, self)}
                if not module.startswith("dpdask.linalg"):
                    out["module"] = module
                return out
        raise ArgumentTypeError(
            f"no serialisation for operator type {type(op).__qualname__}; "
            "register one with dpdask.linalg._serialize.register"
        )


class _Reader:
    def __init__(self, arrays: Any):
        self.arrays = arrays

    def array(self, d: dict[str, Any]) -> np.ndarray:
        if "__ref__" in d:
            if self.arrays is None:
                raise ArgumentError("operator refers to stored arrays but none were given")
            return np.asarray(self.arrays[d["__ref__"]])
        return np.asarray(d["__array__"], dtype=np.dtype(d["dtype"])).reshape(d["shape"])

    def op(self, d: dict[str, Any]) -> LinearQuery:
        kind = d.get("type")
        if kind not in _REGISTRY and isinstance(d.get("module"), str):
            module = d["module"]
            if not module.startswith("dpdask."):
                raise ArgumentError(f"refusing to import {module!r} while loading an operator")
            importlib.import_module(module)
        if kind not in _REGISTRY:
            raise ArgumentError(f"unknown operator type {kind!r} in serialised data")
        return _REGISTRY[kind][2](d, self)


def to_dict(op: LinearQuery, arrays: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """A dictionary describing ``op``; JSON-safe unless ``arrays`` collects the arrays.

    Examples
    --------
    >>> from dpdask.linalg import Kron, Prefix, Identity
    >>> to_dict(Kron([Prefix(3), Identity(2)]))
    {'type': 'Kron', 'factors': [{'type': 'Prefix', 'n': 3}, {'type': 'Identity', 'n': 2}]}
    """
    return _Writer(arrays).op(op)


def from_dict(d: dict[str, Any], arrays: Any = None) -> LinearQuery:
    """Rebuild an operator from :func:`to_dict`'s output (and its arrays, if stored apart)."""
    return _Reader(arrays).op(d)


# ---------------------------------------------------------------------------
# the operators of dpdask.linalg
# ---------------------------------------------------------------------------
def _names(op: VStack) -> list[str] | None:
    return list(op.names) if op.names is not None else None


register(Identity, lambda o, w: {"n": o.n}, lambda d, r: Identity(d["n"]))
register(Ones, lambda o, w: {"n": o.n, "m": o.m}, lambda d, r: Ones(d["n"], d["m"]))
register(Prefix, lambda o, w: {"n": o.n}, lambda d, r: Prefix(d["n"]))
register(AllRange, lambda o, w: {"n": o.n}, lambda d, r: AllRange(d["n"]))
register(
    RangeQueries,
    lambda o, w: {"n": o.n, "lo": w.array(o.lo), "hi": w.array(o.hi)},
    lambda d, r: RangeQueries(d["n"], r.array(d["lo"]), r.array(d["hi"])),
)
register(Diagonal, lambda o, w: {"d": w.array(o.d)}, lambda d, r: Diagonal(r.array(d["d"])))
register(
    Dense, lambda o, w: {"matrix": w.array(o.matrix)}, lambda d, r: Dense(r.array(d["matrix"]))
)


def _encode_sparse(o: Sparse, w: _Writer) -> dict[str, Any]:
    M = o.matrix.tocsr()
    return {
        "shape": list(M.shape),
        "data": w.array(M.data),
        "indices": w.array(M.indices),
        "indptr": w.array(M.indptr),
    }


def _decode_sparse(d: dict[str, Any], r: _Reader) -> Sparse:
    M = sp.csr_array(
        (r.array(d["data"]), r.array(d["indices"]), r.array(d["indptr"])), shape=tuple(d["shape"])
    )
    return Sparse(M)


register(Sparse, _encode_sparse, _decode_sparse)
register(
    Kron,
    lambda o, w: {"factors": [w.op(f) for f in o.factors]},
    lambda d, r: Kron([r.op(f) for f in d["factors"]]),
)
register(
    VStack,
    lambda o, w: {
        "parts": [w.op(p) for p in o.parts],
        "weights": w.array(o.weights),
        "names": _names(o),
    },
    lambda d, r: VStack([r.op(p) for p in d["parts"]], r.array(d["weights"]), d.get("names")),
)
register(
    Product,
    lambda o, w: {"A": w.op(o.A), "B": w.op(o.B)},
    lambda d, r: Product(r.op(d["A"]), r.op(d["B"])),
)
register(
    Scaled,
    lambda o, w: {"A": w.op(o.A), "c": o.c},
    lambda d, r: Scaled(r.op(d["A"]), d["c"]),
)
register(
    Sum,
    lambda o, w: {"terms": [w.op(t) for t in o.terms]},
    lambda d, r: Sum([r.op(t) for t in d["terms"]]),
)
register(Transpose, lambda o, w: {"base": w.op(o.base)}, lambda d, r: Transpose(r.op(d["base"])))
