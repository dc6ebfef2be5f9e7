"""A workload as a union of weighted Kronecker terms over the domain's attributes.

HDMM's templates and the error analytics see every workload as
``W = [w_1 (x)_i W_1i; ...; w_k (x)_i W_ki]``: one term per Kronecker part, one
factor per attribute, rows in the workload's own order. :func:`kron_terms`
reads that structure from the operators of :mod:`dpdask.linalg` without
materialising anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask.base import tokenize

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import Identity, Kron, LinearQuery, Ones, Scaled, VStack
from dpdask.strategy._gram import Gram

__all__ = ["KronTerms", "kron_terms"]

STACK_MAX_N = 512


@dataclass
class KronTerms:
    """``W = [w_j (x)_i factors[j][i]]_j`` over attributes of ``sizes``.

    Attributes
    ----------
    sizes : tuple of int
        Attribute sizes.
    weights : ndarray, shape (k,)
        Term weights ``w_j``.
    factors : list of list of LinearQuery
        ``factors[j][i]`` acts on attribute ``i``.
    names : list of str
        A label per term (the workload part's name where it has one).
    """

    sizes: tuple[int, ...]
    weights: np.ndarray
    factors: list[list[LinearQuery]]
    names: list[str]

    def __post_init__(self) -> None:
        self._grams: dict[tuple[int, int], Gram] = {}
        self._stacks: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
        self.kinds: dict[int, str] = {}
        """Factor templates per attribute (:func:`._opt_kron.factor_kind`), cached."""
        self._token: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the Gram caches (megabytes on the Census domains; rebuilt on use)."""
        state = dict(self.__dict__)
        state["_grams"], state["_stacks"] = {}, {}
        return state

    def __dask_tokenize__(self) -> str:
        if self._token is None:
            self._token = tokenize(
                "dpdask.KronTerms", self.sizes, self.weights, self.factors, self.names
            )
        return self._token

    @property
    def k(self) -> int:
        return len(self.factors)

    @property
    def d(self) -> int:
        return len(self.sizes)

    def gram(self, j: int, i: int) -> Gram:
        """``G_ji = W_ji^T W_ji`` (cached)."""
        key = (j, i)
        if key not in self._grams:
            self._grams[key] = Gram.of(self.factors[j][i])
        return self._grams[key]

    def stacked_grams(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The distinct Gram matrices of attribute ``i`` and each term's index into them.

        Returns ``(stack, index)`` with ``stack`` of shape ``(u, n_i, n_i)`` and
        ``stack[index[j]] == G_ji``, or ``None`` when ``n_i`` exceeds
        :data:`STACK_MAX_N` (then use :meth:`gram` term by term).
        """
        if i not in self._stacks:
            n = self.sizes[i]
            if n > STACK_MAX_N:
                self._stacks[i] = None
            else:
                seen: dict[bytes, int] = {}
                mats: list[np.ndarray] = []
                index = np.empty(self.k, dtype=np.int64)
                for j in range(self.k):
                    M = self.gram(j, i).dense()
                    key = M.tobytes()
                    if key not in seen:
                        seen[key] = len(mats)
                        mats.append(M)
                    index[j] = seen[key]
                self._stacks[i] = (np.stack(mats), index)
        return self._stacks[i]

    def traces_totals(self) -> tuple[np.ndarray, np.ndarray]:
        """``tr(G_ji)`` and ``1^T G_ji 1`` of every term ``j`` and attribute ``i`` (``(k, d)``)."""
        tr = np.empty((self.k, self.d))
        to = np.empty((self.k, self.d))
        for j in range(self.k):
            for i in range(self.d):
                G = self.gram(j, i)
                tr[j, i] = G.trace()
                to[j, i] = G.total()
        return tr, to

    def rows(self, j: int) -> int:
        return math.prod(f.shape[0] for f in self.factors[j])

    def subset(self, index: Sequence[int]) -> KronTerms:
        """The terms ``index`` (Gram matrices shared with this object)."""
        index = list(index)
        out = KronTerms(
            self.sizes,
            self.weights[index],
            [self.factors[j] for j in index],
            [self.names[j] for j in index],
        )
        # the token of a subset, from its parent's (hashing every factor again costs
        # milliseconds per subset on the Census workloads)
        out._token = tokenize("dpdask.KronTerms.subset", self.__dask_tokenize__(), index)
        for new, old in enumerate(index):
            for i in range(self.d):
                if (old, i) in self._grams:
                    out._grams[(new, i)] = self._grams[(old, i)]
        for i, st in self._stacks.items():
            if st is not None:
                used, inv = np.unique(st[1][index], return_inverse=True)
                out._stacks[i] = (st[0][used], inv.astype(np.int64))
        return out


def kron_terms(W: LinearQuery, sizes: Sequence[int] | None = None) -> KronTerms:
    """Decompose ``W`` into weighted Kronecker terms over ``sizes``.

    Parameters
    ----------
    W : LinearQuery
        A :class:`~dpdask.linalg.Kron`, a :class:`~dpdask.linalg.VStack` of them
        (nested and weighted), a scaled one, the identity or total of the flat
        domain, or any operator when the domain has one attribute.
    sizes : sequence of int, optional
        Attribute sizes (default: those of the first Kronecker term found, or
        ``(n,)``).

    Raises
    ------
    dpdask.errors.ShapeError, dpdask.errors.ArgumentError
        If ``W`` has no Kronecker structure over ``sizes``.
    """
    if sizes is None:
        sizes = _guess_sizes(W)
    sizes = tuple(int(s) for s in sizes)
    if math.prod(sizes) != W.shape[1]:
        raise ShapeError(
            f"the workload has {W.shape[1]} columns but the domain {sizes} has "
            f"{math.prod(sizes)} cells"
        )
    weights: list[float] = []
    factors: list[list[LinearQuery]] = []
    names: list[str] = []
    _collect(W, 1.0, sizes, weights, factors, names, "W")
    return KronTerms(sizes, np.asarray(weights, dtype=float), factors, names)


def _guess_sizes(W: LinearQuery) -> tuple[int, ...]:
    if isinstance(W, Kron):
        return W.in_shape
    if isinstance(W, Scaled):
        return _guess_sizes(W.A)
    if isinstance(W, VStack):
        for part in W.parts:
            s = _guess_sizes(part)
            if len(s) > 1:
                return s
    return (W.shape[1],)


def _collect(
    W: LinearQuery,
    c: float,
    sizes: tuple[int, ...],
    weights: list[float],
    factors: list[list[LinearQuery]],
    names: list[str],
    name: str,
) -> None:
    if isinstance(W, Scaled):
        _collect(W.A, c * W.c, sizes, weights, factors, names, name)
        return
    if isinstance(W, VStack):
        for k, (part, w) in enumerate(zip(W.parts, W.weights, strict=True)):
            label = W.names[k] if W.names is not None else f"{name}[{k}]"
            _collect(part, c * w, sizes, weights, factors, names, label)
        return
    if isinstance(W, Kron) and W.in_shape == sizes:
        fs = list(W.factors)
    elif len(sizes) == 1:
        fs = [W]
    elif isinstance(W, Kron) and len(W.factors) == 1:
        _collect(W.factors[0], c, sizes, weights, factors, names, name)
        return
    elif isinstance(W, Identity):
        fs = [Identity(n) for n in sizes]
    elif isinstance(W, Ones) and W.m == 1:
        fs = [Ones(n) for n in sizes]
    else:
        raise ArgumentError(
            f"cannot read a {type(W).__name__} of shape {W.shape} as a union of Kronecker "
            f"products over a domain of sizes {sizes}; build the workload from Kron factors"
        )
    weights.append(c)
    factors.append(fs)
    names.append(name)
