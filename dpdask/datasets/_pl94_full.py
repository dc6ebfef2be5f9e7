"""Synthetic blocks on the 2,016-cell P.L. 94 histogram, with housing units and facilities.

:func:`synthetic_pl94_blocks` spreads a number of persons over a number of blocks
(lognormal block sizes, many blocks empty), draws each block's voting age, Hispanic
origin and race with the person model of :func:`~dpdask.datasets.synthetic_persons`
(:class:`~dpdask.datasets.SyntheticGenerator` on the ``pl94`` domain, the same
per-block streams), then puts some blocks' persons in group quarters and gives every
block housing units and facilities consistent with its persons:

* household persons (hhgq 0) only in blocks with at least one housing unit;
* persons of a group-quarters type ``t`` (1..7) only in blocks with at least one
  facility of that type, and at most as many facilities as persons of the type;
* nobody under 18 in nursing facilities (hhgq 3).

Housing units and facilities by type are block attributes (arrays beside the counts)
for the invariants of a later release. Test data: the seed is explicit and public.

:class:`SyntheticBlocksGenerator` draws any range of whole chunks of
:data:`BLOCKS_PER_STREAM` blocks on demand (each chunk from its own stream, the persons
from the person model's per-block streams), so a state of 700,000 blocks is drawn a
chunk at a time, in any order and in any process, with the same result as drawing it
at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dpdask import census
from dpdask.datasets._generator import SyntheticGenerator
from dpdask.datasets._synthetic import _check_seed
from dpdask.domain import Domain
from dpdask.errors import ArgumentError

__all__ = [
    "BLOCKS_PER_STREAM",
    "GQ_SHARES",
    "SyntheticBlocks",
    "SyntheticBlocksGenerator",
    "synthetic_pl94_blocks",
]

GQ_SHARES: np.ndarray = np.array([0.26, 0.02, 0.19, 0.03, 0.31, 0.04, 0.15])
"""ASSUMED shares of the group-quarters types 1..7 among blocks with a facility
(roughly the 2010 GQ population mix: college, correctional and nursing first)."""

_GQ_BLOCK_SHARE = 0.04  # ASSUMED: share of populated blocks with a facility
_PERSONS_PER_UNIT = (1.8, 3.2)  # ASSUMED: uniform range of household size per block
_VACANT_UNITS = 0.3  # ASSUMED: Poisson mean of (vacant) units in an empty block
_LOG_SD = 1.2  # ASSUMED: log-sd of block sizes
_STREAM = 7  # PCG64([seed, _STREAM]): this module's draws, apart from the person model's
BLOCKS_PER_STREAM = 4096
"""Blocks per chunk drawn from one stream (group quarters, housing units):
``PCG64([seed, 7, 1 + chunk])``."""


@dataclass(frozen=True, eq=False)
class SyntheticBlocks:
    """The result of :func:`synthetic_pl94_blocks`.

    Attributes
    ----------
    counts : ndarray
        ``(n_blocks, 8, 2, 2, 63)`` int32 persons by hhgq, voting age, Hispanic origin
        and race (:func:`dpdask.census.pl94_full_domain`).
    housing_units : ndarray
        ``(n_blocks,)`` int64 housing units (occupied or vacant).
    facilities : ndarray
        ``(n_blocks, 8)`` int64 group-quarters facilities by hhgq type (column 0,
        households, is always 0).
    """

    counts: np.ndarray
    housing_units: np.ndarray
    facilities: np.ndarray

    @property
    def domain(self) -> Domain:
        """The 2,016-cell histogram's domain."""
        return census.pl94_full_domain()

    @property
    def population(self) -> np.ndarray:
        """``(n_blocks,)`` int64 persons per block."""
        per_block: np.ndarray = self.counts.reshape(self.counts.shape[0], -1).sum(
            axis=1, dtype=np.int64
        )
        return per_block


def _block_sizes(n_blocks: int, persons: int, rng: np.random.Generator) -> np.ndarray:
    w = rng.lognormal(0.0, _LOG_SD, n_blocks)
    w[rng.random(n_blocks) < 0.3] = 0.0  # ASSUMED: about 30% of blocks are empty
    if not w.any():
        w[0] = 1.0
    return rng.multinomial(persons, w / w.sum()).astype(np.int64)


class SyntheticBlocksGenerator:
    """The blocks of :func:`synthetic_pl94_blocks`, drawn chunk by chunk.

    Block sizes are drawn for all blocks at once (8 bytes per block); persons, group
    quarters and housing units of chunk ``c`` (blocks ``c * BLOCKS_PER_STREAM`` ..)
    come from their own streams, so ``draw(a, b)`` equals
    ``synthetic_pl94_blocks(n_blocks, persons, seed=seed)`` rows ``a:b``.

    Parameters
    ----------
    n_blocks, persons, seed
        As in :func:`synthetic_pl94_blocks`.

    Raises
    ------
    ArgumentError
        For a non-positive number of blocks, negative persons or a bad seed.
    """

    def __init__(self, n_blocks: int, persons: int, *, seed: int = 0) -> None:
        self.seed = _check_seed(seed)
        if int(n_blocks) < 1 or int(persons) < 0:
            raise ArgumentError(f"need n_blocks >= 1 and persons >= 0, got {n_blocks}, {persons}")
        self.n_blocks, self.persons = int(n_blocks), int(persons)
        rng = np.random.default_rng(np.random.PCG64([self.seed, _STREAM]))
        self.population = _block_sizes(self.n_blocks, self.persons, rng)
        self._people = SyntheticGenerator(
            census.pl94_domain(), self.n_blocks, population=self.population, seed=self.seed
        )

    def __dask_tokenize__(self) -> tuple[Any, ...]:
        return ("SyntheticBlocksGenerator", self.n_blocks, self.persons, self.seed)

    def draw(self, start: int, stop: int) -> SyntheticBlocks:
        """Blocks ``start .. stop-1``; both on chunk bounds (multiples of
        :data:`BLOCKS_PER_STREAM`, or ``n_blocks``)."""
        start, stop = int(start), int(stop)
        bounds_ok = all(x % BLOCKS_PER_STREAM == 0 or x == self.n_blocks for x in (start, stop))
        if not (0 <= start <= stop <= self.n_blocks and bounds_ok):
            raise ArgumentError(
                f"blocks {start}:{stop} are not whole chunks of {BLOCKS_PER_STREAM} "
                f"within 0:{self.n_blocks}"
            )
        parts = [
            self._chunk(c) for c in range(start // BLOCKS_PER_STREAM, -(-stop // BLOCKS_PER_STREAM))
        ]
        if not parts:
            empty = np.zeros((0, len(census.HHGQ), 2, 2, 63), np.int32)
            return SyntheticBlocks(empty, np.zeros(0, np.int64), np.zeros((0, 8), np.int64))
        if len(parts) == 1:
            return parts[0]
        return SyntheticBlocks(
            counts=np.concatenate([p.counts for p in parts]),
            housing_units=np.concatenate([p.housing_units for p in parts]),
            facilities=np.concatenate([p.facilities for p in parts]),
        )

    def _chunk(self, c: int) -> SyntheticBlocks:
        lo, hi = c * BLOCKS_PER_STREAM, min((c + 1) * BLOCKS_PER_STREAM, self.n_blocks)
        rng = np.random.default_rng(np.random.PCG64([self.seed, _STREAM, 1 + c]))
        n = hi - lo
        base = self._people.block(lo, hi).astype(np.int32)  # (n, votingage, hisp, race)
        counts = np.zeros((n, len(census.HHGQ), *base.shape[1:]), dtype=np.int32)
        counts[:, 0] = base
        facilities = np.zeros((n, len(census.HHGQ)), dtype=np.int64)
        populated = np.flatnonzero(self.population[lo:hi] > 0)
        gq_blocks = populated[rng.random(populated.size) < _GQ_BLOCK_SHARE]
        for b in gq_blocks:
            t = 1 + int(rng.choice(GQ_SHARES.size, p=GQ_SHARES / GQ_SHARES.sum()))
            flat = counts[b, 0].reshape(-1)
            eligible = flat.copy()
            if t == census.HHGQ.index("nursing"):
                eligible.reshape(base.shape[1:])[0] = 0  # nobody under 18
            n_eligible = int(eligible.sum())
            if n_eligible == 0:
                continue
            k = 1 + int(rng.binomial(n_eligible - 1, 0.6))  # ASSUMED: most of the block
            chosen = rng.multivariate_hypergeometric(eligible, k)
            flat -= chosen.astype(np.int32)
            counts[b, t] = chosen.reshape(base.shape[1:])
            facilities[b, t] = 1 + int(rng.binomial(k - 1, 0.01)) if k > 1 else 1
        household = counts[:, 0].reshape(n, -1).sum(axis=1)
        per_unit = rng.uniform(*_PERSONS_PER_UNIT, n)
        units = np.where(
            household > 0,
            np.maximum(1, np.rint(household / per_unit)),
            rng.poisson(_VACANT_UNITS, n),
        ).astype(np.int64)
        return SyntheticBlocks(counts=counts, housing_units=units, facilities=facilities)


def synthetic_pl94_blocks(n_blocks: int, persons: int, *, seed: int = 0) -> SyntheticBlocks:
    """``persons`` synthetic persons in ``n_blocks`` blocks, on the 2,016-cell histogram.

    All blocks in memory (2,016 int32 cells each); :class:`SyntheticBlocksGenerator`
    draws the same blocks a chunk at a time.

    Parameters
    ----------
    n_blocks : int
        Number of blocks (positive).
    persons : int
        Total persons (non-negative).
    seed : int
        Non-negative seed (test data, public).

    Returns
    -------
    SyntheticBlocks

    Raises
    ------
    ArgumentError
        For a non-positive number of blocks, negative persons or a bad seed.

    Examples
    --------
    >>> b = synthetic_pl94_blocks(20, 500, seed=1)
    >>> b.counts.shape, int(b.population.sum())
    ((20, 8, 2, 2, 63), 500)
    """
    gen = SyntheticBlocksGenerator(n_blocks, persons, seed=seed)
    return gen.draw(0, gen.n_blocks)
