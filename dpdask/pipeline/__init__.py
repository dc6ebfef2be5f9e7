"""The release pipeline: read a YAML spec, then validate, plan or run it on a cluster.

=============================  ========================================================
name                           what
=============================  ========================================================
:func:`load_spec`              read and check a YAML release spec (:mod:`.spec`)
:func:`parse_spec`             check a spec given as a mapping
:func:`parse_domain`           the domain a spec names (``pl94``, ``cph``, sizes)
:class:`ReleaseSpec`           a checked spec; :class:`DataSpec` its data source
:class:`SpecError`             a spec is invalid (the message names the field)
:func:`validate_spec`          check a spec and its data, spending nothing (:mod:`.run`)
:func:`plan_spec`              select the strategy, report the expected error
:func:`run_spec`               select, charge, measure, reconstruct, publish
:func:`load_data`              the spec's data as a store (converted if need be)
:func:`connect`                the cluster a run uses (:mod:`.cluster`)
:func:`choose_cluster`         which cluster that is, and why; :class:`ClusterChoice`
:func:`security_from`          a :class:`distributed.Security` from TLS file names
=============================  ========================================================

The names are imported on first use, so that reading a spec
(``dpdask.pipeline.spec``) does not load the dataflow, ``distributed`` and the
cluster code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from dpdask.pipeline.cluster import (
        ClusterChoice,
        ClusterUnreachableError,
        choose_cluster,
        connect,
        security_from,
    )
    from dpdask.pipeline.run import load_data, plan_spec, run_spec, validate_spec
    from dpdask.pipeline.spec import (
        DataSpec,
        ReleaseSpec,
        SpecError,
        load_spec,
        parse_domain,
        parse_spec,
    )

_HOMES = {
    "DataSpec": "spec",
    "ReleaseSpec": "spec",
    "SpecError": "spec",
    "load_spec": "spec",
    "parse_domain": "spec",
    "parse_spec": "spec",
    "load_data": "run",
    "plan_spec": "run",
    "run_spec": "run",
    "validate_spec": "run",
    "ClusterChoice": "cluster",
    "ClusterUnreachableError": "cluster",
    "choose_cluster": "cluster",
    "connect": "cluster",
    "security_from": "cluster",
}

__all__ = [
    "ClusterChoice",
    "ClusterUnreachableError",
    "DataSpec",
    "ReleaseSpec",
    "SpecError",
    "choose_cluster",
    "connect",
    "load_data",
    "load_spec",
    "parse_domain",
    "parse_spec",
    "plan_spec",
    "run_spec",
    "security_from",
    "validate_spec",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dpdask.pipeline' has no attribute {name!r}")
    return getattr(importlib.import_module(f"dpdask.pipeline.{home}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
