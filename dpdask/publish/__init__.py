"""Publishing a release: output safety, the run's work folder, atomic publication,
labels of the published arrays, and reading a published release.

* :mod:`~dpdask.publish._safety`: an output may replace only an earlier dpdask
  artefact (a release, or a file its sidecar vouches for), never the input, the ledger,
  a work folder or the spec, never through a link; a release appears at its path in one
  atomic move (:func:`publishing`, :func:`publish_file`).
* :mod:`~dpdask.publish._ledgers`: a ledger is created only where no release of
  another ledger is published, and a release is replaced only from its own ledger.
* :mod:`~dpdask.publish._claim`: a run claims its output before it charges (this
  Python can publish; an exclusive lock beside the output, so that a racing run is
  refused before it is charged).
* :mod:`~dpdask.publish._workdir`: the private work folder of a run (checkpoints,
  chunk markers, reports, the run's key), removed once the release is published.
* :mod:`~dpdask.publish._labels`: row labels and descriptions of the published
  queries, category labels, the P.L. 94-171 tables, the workload and strategy records.
* :mod:`dpdask.publish.reader`: :func:`~dpdask.publish.reader.open_release` (xarray),
  tables and CSV / Parquet export with margins of error (imported on first use: it
  needs xarray).

The layout of a published release is written by :mod:`dpdask.graph` (the release
graph); this package owns everything around it.
"""

from dpdask.errors import OutputLockedError, StoreExistsError, UnsafeOutputError
from dpdask.publish._claim import check_interpreter, check_unclaimed, claim_output, lock_path
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
from dpdask.publish._ledgers import check_replaced, open_ledger, period_outputs
from dpdask.publish._safety import (
    ARTEFACT_FORMAT,
    RELEASE_FORMAT,
    artefact_attributes,
    check_output,
    check_target,
    move_into_place,
    publish_file,
    publishing,
    release_attributes,
    sidecar,
)
from dpdask.publish._workdir import (
    FLAT_KEYS,
    marker,
    new_run_id,
    remove_work,
    work_dir,
)

__all__ = [
    "ARTEFACT_FORMAT",
    "CODE_SUFFIX",
    "FLAT_KEYS",
    "PL94_PARTS",
    "QUERY_DIM",
    "RELEASE_FORMAT",
    "OutputLockedError",
    "StoreExistsError",
    "UnsafeOutputError",
    "artefact_attributes",
    "category_labels",
    "check_interpreter",
    "check_output",
    "check_replaced",
    "check_target",
    "check_unclaimed",
    "claim_output",
    "lock_path",
    "marker",
    "move_into_place",
    "new_run_id",
    "open_ledger",
    "period_outputs",
    "pl94_tables",
    "publish_file",
    "published_tables",
    "publishing",
    "query_descriptions",
    "query_labels",
    "release_attributes",
    "remove_work",
    "sidecar",
    "strategy_record",
    "work_dir",
    "workload_record",
]
