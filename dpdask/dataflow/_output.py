"""The published release: per level, estimates, workload answers and their variances.

The layout is in :mod:`dpdask.dataflow.release`. Every array has a row per
zarr chunk, so that any Dask chunk of a level writes whole zarr chunks with no
rechunking (the level chunks are uneven, aligned to parents).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize

from dpdask.dataflow._aggregate import level_key
from dpdask.dataflow._blocks import answer_block
from dpdask.dataflow._workdir import FLAT_KEYS

__all__ = ["level_outputs"]


def level_outputs(
    root: zarr.Group,
    levels: Sequence[tuple[str, Any, float]],
    estimates: Sequence[da.Array],
    variances: Sequence[np.ndarray],
    ids: Sequence[np.ndarray],
    parents: Sequence[np.ndarray],
    blas: int | None,
) -> tuple[list[da.Array], list[zarr.Array]]:
    """Create every level's group in ``root`` and pair its lazy arrays with their targets.

    Parameters
    ----------
    root : zarr.Group
        The output group (empty).
    levels : sequence of (name, plan, unit variance)
        Coarsest first; the plan gives the workload and its query variances for a unit
        of variance ``unit variance``.
    estimates : sequence of dask.array.Array
        Each level's final estimates ``(n_units, *domain.shape)``.
    variances : sequence of ndarray
        Each level's per-unit variance scalars ``(n_units,)``.
    ids, parents : sequence of ndarray
        Each level's unit ids, and each level's parent index below the top.
    blas : int or None
        BLAS threads of the answer tasks (``answer-<level>``).

    Returns
    -------
    list of dask.array.Array, list of zarr.Array
        Sources and targets for :func:`dask.array.store`; ``ids`` and ``parent`` are
        written at once.
    """
    sources: list[da.Array] = []
    targets: list[zarr.Array] = []
    for i, ((name, plan, unit_variance), est) in enumerate(zip(levels, estimates, strict=True)):
        g = root.create_group(name)
        g.create_array(
            "ids", shape=ids[i].shape, dtype=ids[i].dtype.str if ids[i].dtype.kind != "U" else str
        )[:] = ids[i]
        if i > 0:
            p = parents[i - 1]
            g.create_array("parent", shape=p.shape, dtype="int64")[:] = p
        W = plan.workload
        answers = est.map_blocks(
            answer_block, W, blas, chunks=(est.chunks[0], (W.shape[0],)),
            drop_axis=list(range(2, est.ndim)), dtype=np.float64,
            name=f"answer-{level_key(name)}-{tokenize(est, W)}", meta=np.empty((0, 0)),
        )  # fmt: skip
        qv = plan.query_variances()
        scale = variances[i] / unit_variance
        variance = da.from_array(scale[:, None], chunks=(est.chunks[0], 1)) * qv[None, :]
        for array, arr in (("estimate", est), ("answers", answers), ("variance", variance)):
            z = g.create_array(
                array, shape=arr.shape, dtype="float64", chunks=(1, *arr.shape[1:]),
                # noisy float estimates do not compress; skip the codec's time
                compressors=None if array == "estimate" else "auto",
                chunk_key_encoding=FLAT_KEYS,
            )  # fmt: skip
            sources.append(arr)
            targets.append(z)
    return sources, targets
