"""Synthetic P.L. 94 blocks written into a sparse store, with their block attributes.

:func:`synthetic_blocks_store` writes the blocks of
:func:`dpdask.datasets.synthetic_pl94_blocks` (2,016-cell counts: hhgq x voting age x
Hispanic x race) under a generated state > county > tract > block_group > block
geography (:func:`block_geography`), with the unit attributes ``housing_units``,
``gq_facilities`` and ``gq_population`` (persons by hhgq type, from the counts). Each
task draws whole chunks of blocks (:class:`~dpdask.datasets.SyntheticBlocksGenerator`),
keeps their non-zero counts and writes their attributes into the store's attribute
arrays (whose zarr chunks are the generator's, so tasks never share one): memory
grows with the persons, never with blocks x cells.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
from dask.base import tokenize
from dask.delayed import delayed

from dpdask.census import HHGQ, pl94_full_domain
from dpdask.datasets import BLOCKS_PER_STREAM, SyntheticBlocksGenerator
from dpdask.domain import Geography
from dpdask.errors import ArgumentError
from dpdask.publish import check_target
from dpdask.store._attributes import create_unit_attribute
from dpdask.store._entries import write_parts
from dpdask.store._store import DataStore, open_store
from dpdask.store._store_write import _publish_store

__all__ = ["BLOCK_GEOGRAPHY", "block_geography", "synthetic_blocks_store"]

BLOCK_GEOGRAPHY: dict[str, int] = {"block_group": 30, "tract": 3, "county": 150}
"""ASSUMED sizes of the generated hierarchy: blocks per block group, block groups per
tract, tracts per county (about those of a large US state)."""

_PERSONS_PER_TASK = 2**22  # about 4 million persons (at most as many entries) per task


def _split(n: int, size: int) -> npt.NDArray[np.int64]:
    """The parent of each of ``n`` children in ``ceil(n / size)`` near-equal groups."""
    groups = max(1, -(-n // size))
    bounds = np.linspace(0, n, groups + 1).round().astype(np.int64)
    return np.repeat(np.arange(groups, dtype=np.int64), np.diff(bounds))


def block_geography(n_blocks: int, state: str = "99") -> Geography:
    """A state of ``n_blocks`` blocks in the Census hierarchy, GEOID-like ids.

    Blocks fill block groups of about 30, block groups tracts of about 3, tracts
    counties of about 150 (:data:`BLOCK_GEOGRAPHY`). Ids are state (2 digits), county
    (3), tract (6), block group (1) and block (block group digit and 3 more), so that
    every level's ids are sorted and children contiguous.

    Examples
    --------
    >>> g = block_geography(100)
    >>> [g.n_units(lv) for lv in g.levels], g.ids[-1][0]
    ([1, 1, 2, 4, 100], '990010001001000')
    """
    if int(n_blocks) < 1:
        raise ArgumentError(f"need at least one block, got {n_blocks}")
    bg_of_block = _split(int(n_blocks), BLOCK_GEOGRAPHY["block_group"])
    tract_of_bg = _split(int(bg_of_block[-1]) + 1, BLOCK_GEOGRAPHY["tract"])
    county_of_tract = _split(int(tract_of_bg[-1]) + 1, BLOCK_GEOGRAPHY["county"])
    if county_of_tract[-1] >= 999:
        raise ArgumentError(f"{n_blocks:,} blocks need more than 999 counties in one state")

    def rank(parent: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        first = np.searchsorted(parent, parent, side="left")
        return np.arange(parent.size, dtype=np.int64) - first

    counties = [f"{state}{c + 1:03d}" for c in range(int(county_of_tract[-1]) + 1)]
    tracts = [
        f"{counties[c]}{t + 1:04d}00"
        for c, t in zip(county_of_tract.tolist(), rank(county_of_tract).tolist(), strict=True)
    ]
    bgs = [
        f"{tracts[t]}{g + 1}"
        for t, g in zip(tract_of_bg.tolist(), rank(tract_of_bg).tolist(), strict=True)
    ]
    blocks = [
        f"{bgs[g]}{b:03d}"
        for g, b in zip(bg_of_block.tolist(), rank(bg_of_block).tolist(), strict=True)
    ]
    return Geography(
        levels=("state", "county", "tract", "block_group", "block"),
        ids=((state,), tuple(counties), tuple(tracts), tuple(bgs), tuple(blocks)),
        parents=(
            np.zeros(len(counties), np.int64),
            county_of_tract,
            tract_of_bg,
            bg_of_block,
        ),
    )


def _draw(
    gen: SyntheticBlocksGenerator, lo: int, hi: int, arrays: dict[str, zarr.Array[Any]]
) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]:
    """The entries of blocks ``lo .. hi-1``, drawn a chunk at a time; writes their
    attributes into ``arrays`` on the way."""
    units, cells, counts = [np.empty(0, np.int64)], [np.empty(0, np.int64)], [np.empty(0)]
    for a in range(lo, hi, BLOCKS_PER_STREAM):
        b = min(a + BLOCKS_PER_STREAM, hi)
        part = gen.draw(a, b)
        flat = part.counts.reshape(b - a, -1)
        rows, cols = np.nonzero(flat)
        units.append(rows.astype(np.int64) + a)
        cells.append(cols.astype(np.int64))
        counts.append(flat[rows, cols])
        arrays["housing_units"][a:b] = part.housing_units
        arrays["gq_facilities"][a:b] = part.facilities
        by_type = part.counts.reshape(b - a, len(HHGQ), -1).sum(axis=2, dtype=np.int64)
        arrays["gq_population"][a:b] = by_type
    dtype = np.int32
    return np.concatenate(units), np.concatenate(cells), np.concatenate(counts).astype(dtype)


def synthetic_blocks_store(
    path: str | os.PathLike[str],
    n_blocks: int,
    persons: int,
    *,
    seed: int = 0,
    chunk: int | None = None,
    overwrite: bool = False,
    scheduler: Any = None,
) -> DataStore:
    """Write synthetic blocks on the 2,016-cell P.L. 94 histogram as a sparse store.

    Parameters
    ----------
    path : str or path-like
        Directory of the new store.
    n_blocks : int
        Blocks of the state (positive).
    persons : int
        Persons in all (non-negative).
    seed : int
        Non-negative seed of the data (public: test data, never noise).
    chunk : int, optional
        Blocks per task, rounded up to whole chunks of
        :data:`~dpdask.datasets.BLOCKS_PER_STREAM` (default: about four million persons
        per task).
    overwrite : bool
        Replace an existing store at ``path`` (only once the new one is complete).
    scheduler
        Passed to :func:`dask.compute` (default: Dask's current scheduler).

    Returns
    -------
    DataStore
        Sparse, domain :func:`dpdask.census.pl94_full_domain`, geography
        :func:`block_geography`, unit attributes ``gq_facilities``, ``gq_population``
        and ``housing_units``; row ``b`` holds block ``b`` of
        ``synthetic_pl94_blocks(n_blocks, persons, seed=seed)``.

    Raises
    ------
    dpdask.errors.ArgumentError
        On a bad size, seed or chunk; nothing is written.
    StoreExistsError
        If ``path`` exists and ``overwrite`` is false.

    Examples
    --------
    >>> import tempfile
    >>> s = synthetic_blocks_store(tempfile.mkdtemp() + "/s", 50, 800, seed=1)
    >>> s.unit_attribute_names, int(s.unit_attribute("gq_population").sum())
    (('gq_facilities', 'gq_population', 'housing_units'), 800)
    """
    check_target(path, overwrite)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ArgumentError(f"chunk must be a positive integer, got {chunk!r}")
    gen = SyntheticBlocksGenerator(n_blocks, persons, seed=seed)
    geography = block_geography(gen.n_blocks)
    n, domain = gen.n_blocks, pl94_full_domain()
    if chunk is None:
        chunk = max(1, n * _PERSONS_PER_TASK // max(1, gen.persons))
    step = BLOCKS_PER_STREAM * max(1, -(-int(chunk) // BLOCKS_PER_STREAM))
    dtype = np.dtype(np.int32)
    source = f"synthetic P.L. 94 blocks (dpdask.datasets, seed {gen.seed}, {gen.persons:,} persons)"
    token = tokenize(gen, str(pathlib.Path(path).absolute()), step)

    def fill(root: pathlib.Path, group: zarr.Group) -> int:
        shapes = {"housing_units": (n,), "gq_facilities": (n, 8), "gq_population": (n, 8)}
        arrays = {
            k: create_unit_attribute(group, k, s, BLOCKS_PER_STREAM) for k, s in shapes.items()
        }
        node = delayed(gen, name=f"synthetic-blocks-generator-{token}")
        draw = delayed(_draw, pure=True)
        name = f"synthesize-blocks-{token}"
        parts = [
            (
                lo,
                min(lo + step, n),
                draw(node, lo, min(lo + step, n), arrays, dask_key_name=(name, i)),
            )
            for i, lo in enumerate(range(0, n, step))
        ]

        def never(row: int, problem: int) -> None:  # pragma: no cover - drawn counts are valid
            raise RuntimeError(f"synthetic counts of block {row} are invalid ({problem})")

        return write_parts(root, group, parts, n, dtype, never, scheduler)

    _publish_store(path, domain, geography, dtype, None, overwrite, source, fill, "sparse")
    return open_store(path)
