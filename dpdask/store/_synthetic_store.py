"""Synthetic person counts written straight into a data store, sparse or dense.

The counts are those of :func:`dpdask.datasets.synthetic_persons` (geography ``g``
drawn from its own stream, whatever the chunking), one row per finest unit of any
geography. Sparse, each task draws a range of units and keeps only their non-zero
counts (:class:`~dpdask.datasets.SyntheticGenerator`), so memory and disk grow with
the persons: the P.L. 94 domain at 8.1 million blocks or the CPH domain at 9,000
tracts fit a small machine.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import zarr
from dask.base import compute, tokenize
from dask.delayed import delayed

from dpdask.datasets import CONCENTRATION, POPULATION_MEDIAN, SyntheticGenerator
from dpdask.domain import Domain, Geography
from dpdask.errors import ArgumentError, ArgumentTypeError
from dpdask.publish import check_target
from dpdask.store._entries import write_parts
from dpdask.store._store import DataStore, open_store
from dpdask.store._store_write import _publish_store

__all__ = ["synthetic_store"]

_PERSONS_PER_TASK = 2**22  # about 4 million persons (at most as many entries) per task


def _default_chunk(population: npt.NDArray[np.integer[Any]]) -> int:
    """Units per task: about :data:`_PERSONS_PER_TASK` persons on average."""
    total = int(population.sum())
    if total == 0:
        return max(1, population.size)
    return int(np.clip(population.size * _PERSONS_PER_TASK // total, 1, population.size))


def _draw_entries(
    gen: SyntheticGenerator, lo: int, hi: int
) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]:
    return gen.entries(lo, hi)


def _draw_dense(gen: SyntheticGenerator, target: zarr.Array[Any], lo: int, hi: int) -> int:
    target[lo:hi] = gen.block(lo, hi)
    return hi - lo


def synthetic_store(
    path: str | os.PathLike[str],
    domain: Domain,
    geography: Geography,
    *,
    population: float | Sequence[int] | npt.NDArray[np.integer[Any]] = POPULATION_MEDIAN,
    seed: int = 0,
    concentration: float | None = CONCENTRATION,
    layout: str = "sparse",
    chunk: int | None = None,
    overwrite: bool = False,
    scheduler: Any = None,
) -> DataStore:
    """Write synthetic Census-like counts of every finest unit of ``geography`` as a store.

    Row ``g`` holds the counts of geography ``g`` of
    :func:`dpdask.datasets.synthetic_persons` with the same ``seed``,
    ``population`` and ``concentration``: the sparse and the dense store of one
    seed hold exactly the same counts.

    Parameters
    ----------
    path : str or path-like
        Directory of the new store.
    domain : Domain
        The histogram domain (e.g. P.L. 94's 252 cells or CPH's 492,660).
    geography : Geography
        Any number of levels; rows are its finest units, in order.
    population : float or sequence of int
        The median of the lognormal unit populations (as
        :func:`dpdask.datasets.draw_populations`), or every unit's population.
    seed : int
        Non-negative seed of the data (public: this is test data, never noise).
    concentration : float or None
        As in :func:`dpdask.datasets.synthetic_persons`.
    layout : {"sparse", "dense"}
        The store's layout.
    chunk : int, optional
        Units per task (and per chunk of a dense store). By default about four
        million persons per task for a sparse store, 64 MiB per chunk for a dense
        one.
    overwrite : bool
        Replace an existing store at ``path`` (only once the new one is complete).
    scheduler
        Passed to :func:`dask.compute` (default: Dask's current scheduler).

    Returns
    -------
    DataStore

    Raises
    ------
    dpdask.errors.ArgumentError
        On a bad argument (the message names it; an
        :class:`~dpdask.errors.ArgumentTypeError` for one of the wrong type); nothing
        is written.
    StoreExistsError
        If ``path`` exists and ``overwrite`` is false.

    Notes
    -----
    A sparse task holds its units' entries (at most one per person, 20 bytes
    each) and 16 MiB of dense rows; the client holds the populations and the
    number of entries of each unit (16 bytes per unit) besides the geography.

    Examples
    --------
    >>> import tempfile
    >>> from dpdask import Domain, Geography
    >>> g = Geography.flat(["a", "b", "c"])
    >>> s = synthetic_store(tempfile.mkdtemp() + "/s", Domain(sex=2, age=115), g,
    ...                     population=[10, 0, 250], seed=7)
    >>> s.layout, s.to_dask().sum(axis=(1, 2)).compute().tolist()
    ('sparse', [10, 0, 250])
    """
    check_target(path, overwrite)
    if layout not in ("sparse", "dense"):
        raise ArgumentError(f"layout must be 'sparse' or 'dense', got {layout!r}")
    if not isinstance(geography, Geography):
        raise ArgumentTypeError(
            f"geography must be a dpdask.Geography, got {type(geography).__name__}"
        )
    n = geography.n_units()
    gen = SyntheticGenerator(
        domain, n, seed=seed, population=population, concentration=concentration
    )
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int | np.integer)):
        raise ArgumentTypeError(f"chunk must be a positive integer, got {chunk!r}")
    if chunk is not None and chunk < 1:
        raise ArgumentError(f"chunk must be a positive integer, got {chunk!r}")
    dtype = np.dtype(np.int32)
    source = (
        f"synthetic persons (dpdask.datasets, seed {seed}, concentration {concentration}, "
        f"{int(gen.population.sum()):,} persons)"
    )
    token = tokenize(gen, str(pathlib.Path(path).absolute()), chunk, layout)
    node = delayed(gen, name=f"synthetic-generator-{token}")
    if layout == "dense":

        def fill(target: zarr.Array[Any]) -> None:
            step = target.chunks[0]
            draw = delayed(_draw_dense, pure=True)
            name = f"synthesize-counts-{token}"
            tasks = [
                draw(node, target, lo, min(lo + step, n), dask_key_name=(name, i))
                for i, lo in enumerate(range(0, n, step))
            ]
            compute(*tasks, scheduler=scheduler)  # type: ignore[no-untyped-call]

        _publish_store(path, domain, geography, dtype, chunk, overwrite, source, fill)
        return open_store(path)

    step = int(chunk) if chunk is not None else _default_chunk(gen.population)
    draw = delayed(_draw_entries, pure=True)
    name = f"synthesize-entries-{token}"
    parts = [
        (lo, min(lo + step, n), draw(node, lo, min(lo + step, n), dask_key_name=(name, i)))
        for i, lo in enumerate(range(0, n, step))
    ]

    def fill_entries(root: pathlib.Path, group: zarr.Group) -> int:
        def never(row: int, problem: int) -> None:  # pragma: no cover - drawn counts are valid
            raise RuntimeError(f"synthetic counts of unit {row} are invalid ({problem})")

        return write_parts(root, group, parts, n, dtype, never, scheduler)

    _publish_store(path, domain, geography, dtype, None, overwrite, source, fill_entries, "sparse")
    return open_store(path)
