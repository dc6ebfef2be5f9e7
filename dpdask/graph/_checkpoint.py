"""Checkpointing chunks of estimates into the run's work folder (:mod:`dpdask.publish`).

Every Dask chunk of a level is one ``.npy`` file, ``raw/<level>/<k>.npy`` (and, for the
finest level, its sums by parent in ``raw/<level>-sums/<k>.npy``), written whole by the
chunk's task and followed by its marker: concurrent writes never share a file, a file
holds thousands of block-level rows, and a resumed run skips exactly the chunks whose
marker exists (a file without its marker is written again).

Sparse chunks (the top-down estimator's, :mod:`dpdask.graph._topdown`) are one
``.npz`` file each, ``raw/<level>/<k>.npz``, holding the chunk's shape and its entries
(``rows``, ``cells``, ``values``, sorted by row, then cell): :func:`write_sparse`,
:func:`read_sparse`.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
import sparse
from dask.highlevelgraph import HighLevelGraph

from dpdask.graph._levels import LevelChunks, partial_sum_block

__all__ = ["read_chunks", "read_sparse", "write_chunk", "write_sparse"]


def _path(folder: pathlib.Path | str, k: int) -> pathlib.Path:
    return pathlib.Path(folder) / f"{k}.npy"


def _save(path: pathlib.Path, block: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(block, dtype=np.float64))
    os.replace(tmp, path)


def write_chunk(
    block: np.ndarray,
    folder: pathlib.Path,
    k: int,
    done: pathlib.Path,
    sums: tuple[pathlib.Path, LevelChunks, int] | None = None,
) -> int:
    """Write chunk ``k`` of a level's estimates (and, for the finest level, its sums by
    parent into ``sums[0]``), then its marker (so a marker means the data is there)."""
    _save(_path(folder, k), block)
    if sums is not None:
        target, lc, i = sums
        _save(_path(target, k), partial_sum_block(block, lc, i, k))
    done.touch()
    return int(block.shape[0])


def _load(folder: str, k: int) -> np.ndarray:
    return np.asarray(np.load(_path(folder, k)))


def read_chunks(
    folder: pathlib.Path, chunks: Sequence[int], cell_shape: tuple[int, ...], name: str
) -> da.Array:
    """The checkpointed chunks of ``folder`` as one lazy array, a Dask chunk per file."""
    zeros = (0,) * len(cell_shape)
    dsk: dict[Any, Any] = {(name, k, *zeros): (_load, str(folder), k) for k in range(len(chunks))}
    return da.Array(  # type: ignore[no-untyped-call]
        HighLevelGraph.from_collections(name, dsk, dependencies=()),
        name,
        chunks=(tuple(int(c) for c in chunks), *((int(s),) for s in cell_shape)),
        dtype=np.float64,
    )


def _sparse_path(folder: pathlib.Path | str, k: int) -> pathlib.Path:
    return pathlib.Path(folder) / f"{k}.npz"


def write_sparse(block: sparse.COO, folder: pathlib.Path, k: int, done: pathlib.Path) -> int:
    """Write sparse chunk ``k`` (a 2-D :class:`sparse.COO`, ``(g, n)``) and then its marker;
    return its number of entries."""
    coo = block if isinstance(block, sparse.COO) else sparse.COO(block)
    rows, cells = coo.coords
    order = np.lexsort((cells, rows))
    path = _sparse_path(folder, k)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(tmp, "wb") as f:
        np.savez(
            f,
            shape=np.asarray(coo.shape, dtype=np.int64),
            rows=np.asarray(rows[order], dtype=np.int64),
            cells=np.asarray(cells[order], dtype=np.int64),
            values=np.asarray(coo.data[order], dtype=np.float64),
        )
    os.replace(tmp, path)
    done.touch()
    return int(coo.nnz)


def read_sparse(folder: pathlib.Path | str, k: int) -> sparse.COO:
    """Sparse chunk ``k`` of ``folder`` (:func:`write_sparse`) as a 2-D :class:`sparse.COO`."""
    with np.load(_sparse_path(folder, k)) as f:
        shape = tuple(int(s) for s in f["shape"])
        coords = np.stack([f["rows"], f["cells"]])
        return sparse.COO(coords, f["values"], shape=shape, sorted=True, has_duplicates=False)
