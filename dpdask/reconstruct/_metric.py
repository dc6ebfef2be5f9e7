"""The metric of a non-negative fit: ``G = A^T W A`` and what every fit in it shares.

A fit minimises ``1/2 x^T G x - c^T x`` over ``x >= 0``; :class:`Metric` holds the
row-weighted operator and, each computed once when first needed, the Jacobi scaling,
the Gram with small Kronecker factors held dense, the float32 structured Gram
(:mod:`._kron_gram`, :mod:`._union_gram`) and the ADMM start (:mod:`._admm_start`).
:func:`shared_metric` keeps the last few metrics of the process, so that fits of many
geographies, one task at a time, build them once.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import cast

import numpy as np
from dask.base import tokenize

from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Scaled, Sum, VStack
from dpdask.reconstruct._admm_start import AdmmStart
from dpdask.reconstruct._inputs import row_weighted
from dpdask.reconstruct._kron_gram import ScaledKronGram, jacobi_scale, scaled_kron_gram
from dpdask.reconstruct._union_gram import ScaledUnionGram, scaled_union_gram

__all__ = ["Metric", "compact_gram", "shared_metric", "structured_gram"]

_DENSE_FACTOR = 512  # Kronecker factors up to this size get a dense Gram matrix
_SHARED_METRICS = 4  # metrics kept per process for the fitters (see shared_metric)


def compact_gram(A: LinearQuery) -> LinearQuery:
    """``A^T A`` with every small Kronecker factor's Gram matrix held dense.

    A factor's ``gram()`` may be an implicit product (apply the factor, then its
    transpose, with the copies that entails); a dense ``n_i x n_i`` matrix is one
    contraction per axis, with no intermediate copies.
    """
    if isinstance(A, Scaled):
        return Scaled(compact_gram(A.A), A.c * A.c)
    if isinstance(A, VStack):
        pairs = zip(A.parts, A.weights, strict=True)
        terms = [compact_gram(p) if w == 1 else Scaled(compact_gram(p), w * w) for p, w in pairs]
        return terms[0] if len(terms) == 1 else Sum(terms)
    if isinstance(A, Kron):
        return Kron([_small_dense(f.gram()) for f in A.factors])
    return A.gram()


def _small_dense(G: LinearQuery) -> LinearQuery:
    if isinstance(G, Dense | Identity) or G.shape[1] > _DENSE_FACTOR:
        return G
    return Dense(G.dense())


class Metric:
    """The row-weighted operator ``A`` of a fit, and what every fit in the metric
    ``G = A^T A`` shares, each computed once, when first needed: the Jacobi scaling
    ``s = diag(G)^-1/2``, the Gram with small factors dense, the float32 structured Gram
    and, for a Kronecker one, the ADMM start (shared across fits by
    :func:`shared_metric`).
    """

    def __init__(self, A: LinearQuery, weights: np.ndarray | float | None = None):
        self.A = row_weighted(A, weights)

    @functools.cached_property
    def scale(self) -> np.ndarray:
        """``s`` as a column ``(n, 1)``."""
        return jacobi_scale(self.A.column_norms(2) ** 2)[:, None]

    @functools.cached_property
    def compact(self) -> LinearQuery:
        return compact_gram(self.A)

    @functools.cached_property
    def fast(self) -> ScaledKronGram | ScaledUnionGram | None:
        return structured_gram(self.A)

    @functools.cached_property
    def exact(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """The float64 product of :attr:`fast`."""
        return None if self.fast is None else self.fast.with_dtype(np.float64).rows

    @functools.cached_property
    def admm(self) -> AdmmStart:
        """The ADMM start of :attr:`fast`, a Kronecker Gram (the callers check it is)."""
        return AdmmStart(cast(ScaledKronGram, self.fast))


_metrics: OrderedDict[str, Metric] = OrderedDict()
_metrics_lock = threading.Lock()


def shared_metric(A: LinearQuery, weights: np.ndarray | float | None) -> Metric:
    """The :class:`Metric` of ``A`` and ``weights``, shared within the process.

    The last :data:`_SHARED_METRICS` are kept, keyed by the dask token of ``A`` and
    ``weights``, so that a worker fitting thousands of geographies one task at a time
    builds what the fits share once instead of once per task. A metric holds only what
    is computed from ``A`` and ``weights``, and fits do not modify it.
    """
    key = tokenize(A, weights)
    with _metrics_lock:
        metric = _metrics.pop(key, None) or Metric(A, weights)
        _metrics[key] = metric
        while len(_metrics) > _SHARED_METRICS:
            _metrics.popitem(last=False)
    return metric


def structured_gram(A: LinearQuery) -> ScaledKronGram | ScaledUnionGram | None:
    """The float32 scaled Gram of a Kronecker product or a union of them, else None."""
    return scaled_kron_gram(A) or scaled_union_gram(A)
