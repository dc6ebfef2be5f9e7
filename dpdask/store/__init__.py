"""Input stores: the counts a release reads, in zarr, chunked along geography.

A data store is a zarr v3 group with the counts of every finest geography unit and
the domain and geography hierarchy beside them (see :class:`DataStore` for the
layout): dense (``(n_geographies, *domain.shape)``, chunked along geography only)
or sparse (the non-zero counts as (unit, cell, count) entries), whichever is smaller.
Stores come from person records (:func:`ingest_records`, counted into a public universe
of units, :func:`geography_universe`), from the Census P.L. 94-171
summary file, 2020 or 2010 format (:func:`read_pl94`; :func:`read_pl94_file` adds its
block attributes), from the Rhode Island 2010 block file (:func:`read_ri2010`), from
an existing array (:func:`adopt_array`), from triples (:func:`write_sparse_store`),
from the synthetic person model (:func:`synthetic_store`) or from synthetic P.L. 94
blocks with their attributes (:func:`synthetic_blocks_store`); :func:`aggregate`
gives the counts of any coarser level, lazily, and :func:`aggregate_sparse` does so on sparse blocks
(:meth:`DataStore.to_sparse`). A store may carry public per-unit attributes (housing
units, group-quarters population: :data:`UNIT_ATTRIBUTES`,
:meth:`DataStore.unit_attribute`). Records as attribute codes for marginal releases come
from :func:`read_codes` (the types of their inputs: :data:`RecordSource`,
:data:`Universe`); the input's fingerprint (what a run is bound to) from
:func:`fingerprint_path`.
"""

from dpdask.publish import StoreExistsError
from dpdask.store._aggregate import aggregate, aggregate_rows, level_key
from dpdask.store._attributes import UNIT_ATTRIBUTES
from dpdask.store._ingest import RecordSource, ingest_records
from dpdask.store._marginal_records import read_codes
from dpdask.store._pl94 import (
    P1_RACE_COLUMNS,
    P5_HHGQ_LINES,
    PL94_LEVELS,
    PL94File,
    pl94_geography,
    read_pl94,
    read_pl94_file,
)
from dpdask.store._ri2010 import RI2010_FILE, RI2010_LEVELS, read_ri2010, ri2010_csv
from dpdask.store._source import (
    SourcePrint,
    fingerprint_options,
    fingerprint_path,
    private_dir,
)
from dpdask.store._sparse import aggregate_sparse, densify, prefer_dense, sparsify
from dpdask.store._sparse_store import write_sparse_store
from dpdask.store._store import (
    DataStore,
    SparseCounts,
    adopt_array,
    default_geo_chunk,
    open_store,
    read_store,
    write_store,
)
from dpdask.store._synthetic_blocks import block_geography, synthetic_blocks_store
from dpdask.store._synthetic_store import synthetic_store
from dpdask.store._universe import UNKNOWN_GEOGRAPHY, Universe, geography_universe

__all__ = [
    "P1_RACE_COLUMNS",
    "P5_HHGQ_LINES",
    "PL94_LEVELS",
    "RI2010_FILE",
    "RI2010_LEVELS",
    "UNIT_ATTRIBUTES",
    "UNKNOWN_GEOGRAPHY",
    "DataStore",
    "PL94File",
    "RecordSource",
    "SourcePrint",
    "SparseCounts",
    "StoreExistsError",
    "Universe",
    "adopt_array",
    "aggregate",
    "aggregate_rows",
    "aggregate_sparse",
    "block_geography",
    "default_geo_chunk",
    "densify",
    "fingerprint_options",
    "fingerprint_path",
    "geography_universe",
    "ingest_records",
    "level_key",
    "open_store",
    "pl94_geography",
    "prefer_dense",
    "private_dir",
    "read_codes",
    "read_pl94",
    "read_pl94_file",
    "read_ri2010",
    "read_store",
    "ri2010_csv",
    "sparsify",
    "synthetic_blocks_store",
    "synthetic_store",
    "write_sparse_store",
    "write_store",
]
