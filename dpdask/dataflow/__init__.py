"""The release dataflow: zarr data stores chunked along geography, ingestion, aggregation.

A data store is a zarr v3 group with the counts of every finest geography unit
(``(n_geographies, *domain.shape)``, chunked along geography only) and the domain and
geography hierarchy beside them (see :mod:`dpdask.dataflow.store` for the layout).
Stores come from person records (:func:`ingest_records`), from the Census P.L. 94-171
summary file (:func:`read_pl94`), from the Rhode Island 2010 block file
(:func:`read_ri2010`) or from an existing array (:func:`adopt_array`);
:func:`aggregate` gives the counts of any coarser level, lazily.
"""

from dpdask.dataflow._aggregate import aggregate, level_key
from dpdask.dataflow._ingest import ingest_records
from dpdask.dataflow._output import table_variances
from dpdask.dataflow._pl94 import P1_RACE_COLUMNS, PL94_LEVELS, read_pl94
from dpdask.dataflow._ri2010 import RI2010_FILE, RI2010_LEVELS, read_ri2010, ri2010_csv
from dpdask.dataflow._source import (
    SourcePrint,
    fingerprint_options,
    fingerprint_path,
    private_dir,
)
from dpdask.dataflow.store import (
    DataStore,
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
    "DataStore",
    "SourcePrint",
    "StoreExistsError",
    "adopt_array",
    "aggregate",
    "default_geo_chunk",
    "fingerprint_options",
    "fingerprint_path",
    "ingest_records",
    "level_key",
    "open_store",
    "private_dir",
    "read_pl94",
    "read_ri2010",
    "read_store",
    "ri2010_csv",
    "table_variances",
    "write_store",
]
