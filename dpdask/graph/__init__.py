"""The release graph: aggregate, measure, reconstruct, make consistent, answer, publish.

:func:`release` builds a lazy :class:`Release` from a data store (:mod:`dpdask.store`)
and a plan (each level's from :func:`level_plans`, as ``dpdask plan`` shows them);
:meth:`Release.to_zarr` runs it as one Dask graph, chunk by chunk
(``_blocks``), level by level (``_levels``), top-down (``_topdown``) or by least
squares with consistency (``_graph``, ``_finish``), and publishes it
(``_output``, ``_output_sparse``). Marginal releases over records run per chunk
of units (:func:`write_marginals`). :class:`Progress` reports steps on standard error.
"""

from dpdask.graph._chunked import ChunkedConstraints
from dpdask.graph._marginal_release import (
    MarginalLevel,
    charge_marginals,
    levels_of,
    marginal_name,
    write_marginals,
)
from dpdask.graph._output import table_variances
from dpdask.graph._pass_options import resolve_passes
from dpdask.graph._plans import fused, level_plans, structured_inverse
from dpdask.graph._progress import Progress
from dpdask.graph._release import Release, release
from dpdask.graph._simulate import group_rows
from dpdask.graph._spine import Spine, annotate_spine, spine_levels

__all__ = [
    "ChunkedConstraints",
    "MarginalLevel",
    "Progress",
    "Release",
    "Spine",
    "annotate_spine",
    "charge_marginals",
    "fused",
    "group_rows",
    "level_plans",
    "levels_of",
    "marginal_name",
    "release",
    "resolve_passes",
    "spine_levels",
    "structured_inverse",
    "table_variances",
    "write_marginals",
]
