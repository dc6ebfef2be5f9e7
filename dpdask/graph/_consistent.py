"""A least-squares release's estimator after measuring: consistency, then non-negativity.

:func:`consistent_estimates` turns every level's estimates (from its own measurements)
into the published ones: consistent across levels (``<name>-up-<level>``,
``<name>-<level>``: children add up to parents, by inverse-variance weighting) and, for
NNLS and WNNLS, fitted non-negative at the finest level and summed up, for ADMM
projected top-down onto non-negative children. The release (:mod:`._finish`) and the
simulation of its error (:mod:`._simulate`) run this same function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import dask.array as da
import numpy as np

from dpdask.graph._blocks import FIT_AFTER_CONSISTENCY, NONNEGATIVE
from dpdask.graph._levels import bottom_up, nonneg_down, nonneg_fit_up, top_down

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = ["consistent_estimates"]


def consistent_estimates(
    rel: Release,
    estimates: Sequence[da.Array],
    variances: Sequence[np.ndarray],
    reports: str | None,
    name: str = "consistent",
    sums: da.Array | None = None,
) -> tuple[list[da.Array], list[np.ndarray]]:
    """Every level's published estimates (module notes) and their per-unit variance
    scalars (of the consistent least-squares estimates); ``sums``: the finest level's
    sums by parent, when already computed."""
    if len(rel.released) > 1:
        z, vz, cz, cv = bottom_up(estimates, variances, rel.lc, f"{name}-up", sums)
        final, fvar = top_down(z, vz, cz, cv, rel.lc, name)
    else:
        final, fvar = list(estimates), list(variances)
    if rel.reconstruct in FIT_AFTER_CONSISTENCY:
        L = rel.released[-1]
        M, weights = (
            (L.plan.strategy, 1.0 / L.plan.row_variance)
            if rel.reconstruct == "nnls"
            else (L.plan.workload, None)
        )
        final = nonneg_fit_up(final, rel.lc, M, weights, reports)
    elif rel.reconstruct in NONNEGATIVE:
        prefix = "nonnegative" if name == "consistent" else f"{name}-nonnegative"
        final = nonneg_down(final, rel.lc, prefix)
    return final, fvar
