"""Synthetic Census-like test data.

:func:`synthetic_persons` writes per-geography person histograms with realistic
shapes (an age pyramid, a sex ratio, Hispanic origin and race from Rhode Island
2010, household relationship, US-county-like geography sizes) to a zarr array, in
bounded memory and deterministically from a seed. The numbers behind the model
and their sources are in :mod:`dpdask.datasets._constants`; the model itself, and
how attributes are matched by name, in :mod:`dpdask.datasets._model`.
:func:`synthetic_pl94_blocks` draws blocks on the 2,016-cell P.L. 94 histogram
(households and group quarters) with housing units and facilities consistent with
the persons (:class:`SyntheticBlocksGenerator`: a chunk of blocks at a time).
"""

from dpdask.datasets._constants import CONCENTRATION, POPULATION_MEDIAN
from dpdask.datasets._generator import SyntheticGenerator
from dpdask.datasets._model import GROUPS, KNOWN_ATTRIBUTES, PersonModel
from dpdask.datasets._pl94_full import (
    BLOCKS_PER_STREAM,
    GQ_SHARES,
    SyntheticBlocks,
    SyntheticBlocksGenerator,
    synthetic_pl94_blocks,
)
from dpdask.datasets._synthetic import (
    SyntheticPersons,
    draw_populations,
    synthetic_block,
    synthetic_persons,
)
from dpdask.datasets._wide import (
    geography_ids,
    wide_records,
    with_geography,
    write_geography_universe,
)

__all__ = [
    "BLOCKS_PER_STREAM",
    "CONCENTRATION",
    "GQ_SHARES",
    "GROUPS",
    "KNOWN_ATTRIBUTES",
    "POPULATION_MEDIAN",
    "PersonModel",
    "SyntheticBlocks",
    "SyntheticBlocksGenerator",
    "SyntheticGenerator",
    "SyntheticPersons",
    "draw_populations",
    "geography_ids",
    "synthetic_block",
    "synthetic_persons",
    "synthetic_pl94_blocks",
    "wide_records",
    "with_geography",
    "write_geography_universe",
]
