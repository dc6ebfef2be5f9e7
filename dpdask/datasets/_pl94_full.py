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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpdask import census
from dpdask.datasets._generator import SyntheticGenerator
from dpdask.datasets._synthetic import _check_seed
from dpdask.domain import Domain
from dpdask.errors import ArgumentError

__all__ = ["GQ_SHARES", "SyntheticBlocks", "synthetic_pl94_blocks"]

GQ_SHARES: np.ndarray = np.array([0.26, 0.02, 0.19, 0.03, 0.31, 0.04, 0.15])
"""ASSUMED shares of the group-quarters types 1..7 among blocks with a facility
(roughly the 2010 GQ population mix: college, correctional and nursing first)."""

_GQ_BLOCK_SHARE = 0.04  # ASSUMED: share of populated blocks with a facility
_PERSONS_PER_UNIT = (1.8, 3.2)  # ASSUMED: uniform range of household size per block
_VACANT_UNITS = 0.3  # ASSUMED: Poisson mean of (vacant) units in an empty block
_LOG_SD = 1.2  # ASSUMED: log-sd of block sizes
_STREAM = 7  # PCG64([seed, _STREAM]): this module's draws, apart from the person model's


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


def synthetic_pl94_blocks(n_blocks: int, persons: int, *, seed: int = 0) -> SyntheticBlocks:
    """``persons`` synthetic persons in ``n_blocks`` blocks, on the 2,016-cell histogram.

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
    seed = _check_seed(seed)
    if int(n_blocks) < 1 or int(persons) < 0:
        raise ArgumentError(f"need n_blocks >= 1 and persons >= 0, got {n_blocks}, {persons}")
    n_blocks, persons = int(n_blocks), int(persons)
    rng = np.random.default_rng(np.random.PCG64([seed, _STREAM]))
    sizes = _block_sizes(n_blocks, persons, rng)
    people = SyntheticGenerator(census.pl94_domain(), n_blocks, population=sizes, seed=seed)
    base = people.block(0, n_blocks).astype(np.int32)  # (n, votingage, hisp, race)
    counts = np.zeros((n_blocks, len(census.HHGQ), *base.shape[1:]), dtype=np.int32)
    counts[:, 0] = base
    facilities = np.zeros((n_blocks, len(census.HHGQ)), dtype=np.int64)
    populated = np.flatnonzero(sizes > 0)
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
    household = counts[:, 0].reshape(n_blocks, -1).sum(axis=1)
    per_unit = rng.uniform(*_PERSONS_PER_UNIT, n_blocks)
    units = np.where(
        household > 0,
        np.maximum(1, np.rint(household / per_unit)),
        rng.poisson(_VACANT_UNITS, n_blocks),
    ).astype(np.int64)
    return SyntheticBlocks(counts=counts, housing_units=units, facilities=facilities)
