"""The release dataflow: zarr data stores chunked along geography, ingestion, aggregation.

A data store is a zarr v3 group with the counts of every finest geography unit and
the domain and geography hierarchy beside them (see :mod:`dpdask.dataflow.store` for
the layout): dense (``(n_geographies, *domain.shape)``, chunked along geography only)
or sparse (the non-zero counts as (unit, cell, count) entries), whichever is smaller.
Stores come from person records (:func:`ingest_records`, counted into a public universe
of units, :func:`geography_universe`), from the Census P.L. 94-171
summary file (:func:`read_pl94`), from the Rhode Island 2010 block file
(:func:`read_ri2010`), from an existing array (:func:`adopt_array`), from triples
(:func:`write_sparse_store`) or from the synthetic person model
(:func:`synthetic_store`); :func:`aggregate` gives the counts of any coarser level,
lazily, and :func:`aggregate_sparse` does so on sparse blocks
(:meth:`DataStore.to_sparse`).
"""

from dpdask.dataflow._aggregate import aggregate, level_key
from dpdask.dataflow._ingest import ingest_records
from dpdask.dataflow._marginal_records import read_codes
from dpdask.dataflow._marginal_release import (
    MarginalLevel,
    charge_marginals,
    levels_of,
    marginal_name,
    write_marginals,
)
from dpdask.dataflow._output import table_variances
from dpdask.dataflow._pl94 import P1_RACE_COLUMNS, PL94_LEVELS, read_pl94
from dpdask.dataflow._progress import Progress
from dpdask.dataflow._ri2010 import RI2010_FILE, RI2010_LEVELS, read_ri2010, ri2010_csv
from dpdask.dataflow._source import (
    SourcePrint,
    fingerprint_options,
    fingerprint_path,
    private_dir,
)
from dpdask.dataflow._sparse import aggregate_sparse, densify, prefer_dense, sparsify
from dpdask.dataflow._sparse_store import write_sparse_store
from dpdask.dataflow._synthetic_store import synthetic_store
from dpdask.dataflow._universe import UNKNOWN_GEOGRAPHY, geography_universe
from dpdask.dataflow.store import (
    DataStore,
    SparseCounts,
    adopt_array,
    default_geo_chunk,
    open_store,
    read_store,
    write_store,
)
from dpdask.publish import StoreExistsError

__all__ = [
    "P1_RACE_COLUMNS",
    "PL94_LEVELS",
    "RI2010_FILE",
    "RI2010_LEVELS",
    "UNKNOWN_GEOGRAPHY",
    "DataStore",
    "MarginalLevel",
    "Progress",
    "SourcePrint",
    "SparseCounts",
    "StoreExistsError",
    "adopt_array",
    "aggregate",
    "aggregate_sparse",
    "charge_marginals",
    "default_geo_chunk",
    "densify",
    "fingerprint_options",
    "fingerprint_path",
    "geography_universe",
    "ingest_records",
    "level_key",
    "levels_of",
    "marginal_name",
    "open_store",
    "prefer_dense",
    "private_dir",
    "read_codes",
    "read_pl94",
    "read_ri2010",
    "read_store",
    "ri2010_csv",
    "sparsify",
    "synthetic_store",
    "table_variances",
    "write_marginals",
    "write_sparse_store",
    "write_store",
]
