"""OPT_M: HDMM's weighted-marginals template, the weights of all ``2^d`` marginals.

The loss and its gradient depend on the workload only through its spectrum ``h``
(:func:`marginals_spectrum`; the algebra is in :mod:`dpdask.strategy._marginals`). The weights are
found by :func:`._optimize.minimize`, bounded at zero, then scaled to unit
sensitivity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dpdask.strategy._marginals import complement_sizes, marginals_loss, workload_spectrum
from dpdask.strategy._terms import KronTerms
from dpdask.strategy.hdmm._optimize import minimize

__all__ = ["MarginalsResult", "fit_marginals", "marginals_spectrum", "opt_marginals"]


@dataclass
class MarginalsResult:
    theta: np.ndarray
    loss: float
    nit: int


def marginals_spectrum(terms: KronTerms) -> np.ndarray:
    """``h(s)`` of the workload (see :mod:`dpdask.strategy._marginals`)."""
    tr, to = terms.traces_totals()
    return workload_spectrum(tr, to, terms.weights**2, terms.sizes)


def fit_marginals(
    h: np.ndarray,
    sizes: Sequence[int],
    *,
    norm: int = 1,
    seed: int = 0,
    theta0: np.ndarray | None = None,
    ftol: float = 1e-9,
    maxiter: int = 5000,
) -> MarginalsResult:
    """OPT_M on a precomputed workload spectrum ``h`` (see :func:`marginals_spectrum`)."""
    d = len(sizes)
    wc = complement_sizes(sizes)
    x0 = np.random.default_rng(seed).random(2**d) if theta0 is None else np.array(theta0)

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        return marginals_loss(x, h, wc, d, norm)

    x, f, nit = minimize(fun, x0, True, ftol, maxiter)
    scale = x.sum() if norm == 1 else math.sqrt(float(x @ x))
    return MarginalsResult(x / scale, f, nit)


def opt_marginals(
    terms: KronTerms,
    *,
    norm: int = 1,
    seed: int = 0,
    ftol: float = 1e-9,
    maxiter: int = 5000,
) -> MarginalsResult:
    """OPT_M: the weights of all ``2^d`` marginals, normalised to unit sensitivity."""
    h = marginals_spectrum(terms)
    return fit_marginals(h, terms.sizes, norm=norm, seed=seed, ftol=ftol, maxiter=maxiter)
