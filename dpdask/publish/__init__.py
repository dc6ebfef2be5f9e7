"""Publishing a release: output safety, the run's work folder, atomic publication,
labels of the published arrays, and reading a published release.

* :mod:`~dpdask.publish._safety`: an output may replace only a dpdask release, never
  the input, the ledger or a work folder; a release appears at its path in one atomic
  move (:func:`publishing`).
* :mod:`~dpdask.publish._workdir`: the private work folder of a run (checkpoints,
  chunk markers, reports, the run's key), removed once the release is published.
* :mod:`~dpdask.publish._labels`: row labels and descriptions of the published
  queries, category labels, the P.L. 94-171 tables, the workload and strategy records.
* :mod:`dpdask.publish.reader`: :func:`~dpdask.publish.reader.open_release` (xarray),
  tables and CSV / Parquet export with margins of error (imported on first use: it
  needs xarray).

The layout of a published release is written by :mod:`dpdask.dataflow` (the release
graph); this package owns everything around it.
"""

from dpdask.errors import StoreExistsError, UnsafeOutputError
from dpdask.publish._labels import (
    CODE_SUFFIX,
    PL94_PARTS,
    QUERY_DIM,
    category_labels,
    pl94_tables,
    published_tables,
    query_descriptions,
    query_labels,
    strategy_record,
    workload_record,
)
from dpdask.publish._safety import (
    RELEASE_FORMAT,
    check_output,
    check_target,
    move_into_place,
    publishing,
    release_attributes,
)
from dpdask.publish._workdir import (
    FLAT_KEYS,
    marker,
    new_run_id,
    remove_work,
    work_dir,
)

__all__ = [
    "CODE_SUFFIX",
    "FLAT_KEYS",
    "PL94_PARTS",
    "QUERY_DIM",
    "RELEASE_FORMAT",
    "StoreExistsError",
    "UnsafeOutputError",
    "category_labels",
    "check_output",
    "check_target",
    "marker",
    "move_into_place",
    "new_run_id",
    "pl94_tables",
    "published_tables",
    "publishing",
    "query_descriptions",
    "query_labels",
    "release_attributes",
    "remove_work",
    "strategy_record",
    "work_dir",
    "workload_record",
]
