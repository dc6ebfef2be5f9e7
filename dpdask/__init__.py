"""dpdask: differentially private release of linear counting queries on Dask.

The package follows the data path, select -> measure -> reconstruct -> publish:
:mod:`dpdask.domain` and :mod:`dpdask.linalg` describe data and queries,
:mod:`dpdask.workloads` builds real workloads, :mod:`dpdask.strategy` selects what
to measure (:func:`select`), :mod:`dpdask.measure` measures with keyed noise
(:mod:`dpdask.noise`) charged to the ledger (:mod:`dpdask.privacy`),
:mod:`dpdask.reconstruct` estimates, :mod:`dpdask.graph` runs a whole release
over zarr data on a Dask cluster (:func:`release`), :mod:`dpdask.publish` writes it
safely and reads it back (:func:`open_release`), :mod:`dpdask.pipeline` wires
them for release specs and the command line, and :class:`Session` (:mod:`dpdask.session`)
runs them from a notebook. Errors derive from :class:`DPDaskError` (:mod:`dpdask.errors`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from dpdask import config  # noqa: F401  (registers configuration defaults)
from dpdask.domain import Domain, Geography
from dpdask.errors import DPDaskError, DPDaskWarning
from dpdask.linalg import aslinearquery
from dpdask.strategy import Plan
from dpdask.strategy import select as _select_central

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dpdask.graph import release
    from dpdask.ldp.local_plan import LdpPlan
    from dpdask.linalg import LinearQuery
    from dpdask.privacy import Budget, PureDP
    from dpdask.publish.reader import open_release
    from dpdask.session import Session

try:
    __version__ = version("dpdask")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "DPDaskError",
    "DPDaskWarning",
    "Domain",
    "Geography",
    "Plan",
    "Session",
    "__version__",
    "open_release",
    "release",
    "select",
]


@overload
def select(
    workload: LinearQuery,
    privacy: Budget | None = None,
    strategy: str = "hdmm",
    *,
    model: Literal["central"] = "central",
    **options: Any,
) -> Plan: ...


@overload
def select(
    workload: LinearQuery | NDArray[np.float64],
    privacy: PureDP,
    strategy: str = "hdmm",
    *,
    model: Literal["local"],
    **options: Any,
) -> LdpPlan: ...


@overload
def select(
    workload: LinearQuery | NDArray[np.float64],
    privacy: Budget | None = None,
    strategy: str = "hdmm",
    *,
    model: str,
    **options: Any,
) -> Plan | LdpPlan: ...


def select(
    workload: LinearQuery | NDArray[np.float64],
    privacy: Budget | None = None,
    strategy: str = "hdmm",
    *,
    model: str = "central",
    **options: Any,
) -> Plan | LdpPlan:
    """Plan a release: :func:`dpdask.strategy.select` (central model, the default), or
    with ``model="local"`` a local-model collection, :func:`dpdask.ldp.local_plan.select_local`
    (every person randomizes their own record, paper 002; pure DP only; returns an
    :class:`~dpdask.ldp.local_plan.LdpPlan` with the per-person worst-case variance, the sample
    complexity and the comparison with every baseline; ``strategy`` is not used and
    ``options`` go to :func:`dpdask.ldp.optimize`, a ``client`` as its ``scheduler``).

    Examples
    --------
    >>> from dpdask.linalg import Prefix
    >>> from dpdask.privacy import PureDP
    >>> plan = select(Prefix(8), PureDP(1), model="local", iters=20, polish=10)
    >>> plan.model, plan.worst_variance <= min(
    ...     b["worst_variance"] for b in plan.baselines.values())
    ('local', True)
    """
    if model == "local":
        from dpdask.ldp.local_plan import select_local

        client = options.pop("client", None)
        if client is not None:
            options.setdefault("scheduler", client)
        return select_local(workload, privacy, **options)
    if isinstance(workload, np.ndarray):  # a dense matrix of queries
        workload = aslinearquery(workload)
    return _select_central(workload, privacy, strategy, model=model, **options)


def __getattr__(name: str) -> Any:
    # imported on first use, not with the package: open_release needs xarray, and the
    # release graph and the measure step import most of dpdask
    if name == "open_release":
        from dpdask.publish.reader import open_release

        return open_release
    if name == "release":
        from dpdask.graph import release

        return release
    if name == "Session":  # the notebook API: releases through the command line's door
        from dpdask.session import Session

        return Session
    if name in ("measure", "publish", "pipeline", "reconstruct", "errors"):
        import importlib

        return importlib.import_module(f"dpdask.{name}")
    raise AttributeError(f"module 'dpdask' has no attribute {name!r}")
