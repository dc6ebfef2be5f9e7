"""Drawing the geographies of :func:`~dpdask.datasets.synthetic_persons` on demand.

:class:`SyntheticGenerator` builds the person model once and draws any range of
geographies, as dense rows (:meth:`~SyntheticGenerator.block`) or as their non-zero
entries (:meth:`~SyntheticGenerator.entries`), from the same per-geography streams
as :func:`~dpdask.datasets.synthetic_persons`: the counts are identical. The entries
of a range are collected with only about 16 MiB of dense rows at a time, so a task
drawing many geographies of a large domain holds little more than its entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpdask.datasets import _constants as C
from dpdask.datasets._synthetic import (
    DTYPE,
    _block,
    _build_spec,
    _check_concentration,
    _check_seed,
    _Spec,
    draw_populations,
)
from dpdask.domain import Domain
from dpdask.errors import ArgumentError, ArgumentTypeError

__all__ = ["SyntheticGenerator"]

_ENTRY_BLOCK_BYTES = 16 * 2**20  # dense rows held at once while collecting entries


def _entries(spec: _Spec, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero counts of geographies ``lo..hi-1`` as ``(geography, flat cell, count)``,
    row-major, with dense rows only about :data:`_ENTRY_BLOCK_BYTES` at a time."""
    n_cells = spec.model.domain.size
    step = max(1, _ENTRY_BLOCK_BYTES // (n_cells * DTYPE.itemsize))
    geos, cells, counts = [np.empty(0, np.int64)], [np.empty(0, np.int64)], [np.empty(0, DTYPE)]
    for a in range(lo, hi, step):
        block = _block(spec, a, min(a + step, hi))
        rows, cols = np.nonzero(block)
        geos.append(rows.astype(np.int64) + a)
        cells.append(cols.astype(np.int64))
        counts.append(block[rows, cols])
    return np.concatenate(geos), np.concatenate(cells), np.concatenate(counts)


class SyntheticGenerator:
    """The geographies of :func:`synthetic_persons`, drawn on demand, densely or sparsely.

    Geography ``g`` is drawn from its own stream, so any range comes out the same
    whatever else is drawn, in any order, in any process: ``block(a, b)`` equals
    ``synthetic_persons(domain, n, ...).array[a:b]`` and ``entries(a, b)`` holds its
    non-zero counts. The model is built once, so one generator serves many tasks.

    Parameters
    ----------
    domain : Domain
        The histogram domain.
    n_geographies : int
        Number of geographies (populations are drawn for all of them).
    seed, population, concentration
        As in :func:`synthetic_persons`.

    Examples
    --------
    >>> from dpdask import Domain
    >>> gen = SyntheticGenerator(Domain(sex=2, age=115), 3, population=[4, 0, 2], seed=1)
    >>> geos, cells, counts = gen.entries(0, 3)
    >>> sorted(set(geos.tolist())), int(counts.sum())
    ([0, 2], 6)
    """

    def __init__(
        self,
        domain: Domain,
        n_geographies: int,
        *,
        seed: int = 0,
        population: float | Sequence[int] | np.ndarray = C.POPULATION_MEDIAN,
        concentration: float | None = C.CONCENTRATION,
    ) -> None:
        if not isinstance(domain, Domain):
            raise ArgumentTypeError(f"domain must be a dpdask.Domain, got {type(domain).__name__}")
        seed = _check_seed(seed)
        pops = draw_populations(int(n_geographies), seed, population)
        self._spec = _build_spec(domain, pops, seed, _check_concentration(concentration), 1)

    @property
    def domain(self) -> Domain:
        return self._spec.model.domain

    @property
    def population(self) -> np.ndarray:
        """``(n_geographies,)`` int64: the persons of each geography."""
        return self._spec.population

    def _check(self, start: int, stop: int) -> tuple[int, int]:
        if not 0 <= int(start) <= int(stop) <= self.population.size:
            raise ArgumentError(
                f"need 0 <= start <= stop <= {self.population.size}, got {start}, {stop}"
            )
        return int(start), int(stop)

    def block(self, start: int, stop: int) -> np.ndarray:
        """Geographies ``start..stop-1``: ``(stop - start, *domain.shape)`` int32 counts."""
        start, stop = self._check(start, stop)
        return _block(self._spec, start, stop).reshape((stop - start, *self.domain.shape))

    def entries(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The non-zero counts of geographies ``start..stop-1``, in bounded memory.

        Returns
        -------
        tuple of ndarray
            ``(geography, cell, count)``: int64 geography indices, int64 flat cells
            (C order over the domain) and int32 positive counts, sorted by
            (geography, cell).
        """
        start, stop = self._check(start, stop)
        return _entries(self._spec, start, stop)

    def __reduce__(self) -> tuple[Any, ...]:
        # The model's tables (8 x 2 x cells float64: 60 MiB on the CPH domain) are
        # rebuilt where the generator lands (a fraction of a second) instead of
        # being shipped in every graph that holds one.
        spec = self._spec
        return (
            _rebuild,
            (spec.model.domain, spec.population, spec.seed, spec.concentration),
        )

    def __dask_tokenize__(self) -> tuple[Any, ...]:
        spec = self._spec
        return (
            "SyntheticGenerator",
            spec.model.domain,
            spec.population,
            spec.seed,
            spec.concentration,
        )


def _rebuild(
    domain: Domain, population: np.ndarray, seed: int, concentration: float | None
) -> SyntheticGenerator:
    """Unpickle a :class:`SyntheticGenerator` from its arguments (populations drawn)."""
    gen = SyntheticGenerator.__new__(SyntheticGenerator)
    gen._spec = _build_spec(domain, population, seed, concentration, 1)
    return gen
