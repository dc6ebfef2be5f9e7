"""Checkpointing a chunk of estimates into the run's work folder (:mod:`dpdask.publish`)."""

from __future__ import annotations

import pathlib

import numpy as np
import zarr

from dpdask.dataflow._levels import LevelChunks, partial_sum_block

__all__ = ["write_region"]


def write_region(
    block: np.ndarray,
    arr: zarr.Array,
    start: int,
    done: pathlib.Path,
    sums: tuple[zarr.Array, int, LevelChunks, int, int] | None = None,
) -> int:
    """Write one chunk of estimates (and, for the finest level, its sums by parent),
    then its marker (so a marker means the data is there)."""
    arr[start : start + block.shape[0]] = block
    if sums is not None:
        target, row, lc, i, k = sums
        part = partial_sum_block(block, lc, i, k)
        target[row : row + part.shape[0]] = part
    done.touch()
    return block.shape[0]
