"""Consistency across geography levels for marginal releases: the joint least squares.

Every released level measures the same residuals (the same plan at the level's share of
the budget), so for one cell of one marginal the measurements of all units of all levels
are independent, with a variance that is the level's noise variance times a factor of
the marginal only. The generalised least-squares estimate of the finest units' cells
given every level's measurement, aggregated up, is then one linear map ``M`` over the
units (nodes) of all levels, the same for every cell of every marginal and every
residual: ``M = G (G^T V^-1 G)^-1 G^T V^-1`` with ``G`` the aggregation of the finest
released units into every level's and ``V`` the levels' variances. A parent's fitted
tables equal the sums of its children's, and each node's variance is
``diag(G (G^T V^-1 G)^-1 G^T)`` times the marginal's factor. ``M`` is computed densely,
data-free, once per release (units of all levels squared).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpdask.domain import Geography
from dpdask.errors import ArgumentError, PlanError

__all__ = ["MAX_FIT_UNITS", "level_fit", "level_maps"]

MAX_FIT_UNITS = 2_000
"""Finest released units up to which levels are fitted jointly (a dense solve)."""


def level_maps(geography: Geography, levels: Sequence[str]) -> list[np.ndarray]:
    """For each released level (coarsest first), the unit of each finest released unit."""
    finest = levels[-1]

    def anc(lv: str) -> np.ndarray:
        if lv == geography.levels[-1]:
            return np.arange(geography.n_units(lv))
        return np.asarray(geography.ancestor_index(lv), np.int64)

    leaf = anc(finest)
    out = []
    for lv in levels:
        m = np.full(geography.n_units(finest), -1, np.int64)
        m[leaf] = anc(lv)
        out.append(m)
    return out


def level_fit(
    maps: Sequence[np.ndarray], variances: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, list[slice]]:
    """The joint fit ``M`` over all nodes, each node's variance (in the units of
    ``variances``) and each level's slice of the nodes.

    Parameters
    ----------
    maps : sequence of ndarray
        :func:`level_maps`: per level, the unit of each finest released unit.
    variances : sequence of float
        The noise variance of a measurement at each level (positive).

    Raises
    ------
    ValueError
        For a non-positive variance or a finest level larger than :data:`MAX_FIT_UNITS`.
    """
    v = np.asarray(variances, dtype=float)
    if v.shape != (len(maps),) or not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise PlanError("every level needs a positive finite noise variance")
    leaves = maps[-1].size
    if leaves > MAX_FIT_UNITS:
        raise ArgumentError(f"{leaves} finest units: above {MAX_FIT_UNITS} for a joint fit")
    blocks, slices, at = [], [], 0
    for m in maps:
        n = int(m.max()) + 1
        G = np.zeros((n, leaves))
        G[m, np.arange(leaves)] = 1.0
        blocks.append(G)
        slices.append(slice(at, at + n))
        at += n
    G = np.vstack(blocks)
    w = np.concatenate([np.full(b.shape[0], 1.0 / vi) for b, vi in zip(blocks, v, strict=True)])
    info = G.T @ (w[:, None] * G)
    cov = np.linalg.inv(info)
    proj = G @ cov
    M = proj @ (G.T * w[None, :])
    d = np.einsum("ij,ij->i", proj, G)
    return M, d, slices
