"""Where a pipeline runs: the embedded default (a local cluster) or a scheduler address."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dpdask import config

__all__ = ["connect"]

DEFAULT_LOCAL = {"n_workers": 2, "threads_per_worker": 1, "processes": True}


@contextmanager
def connect(cluster: str | Mapping[str, Any] | None = None) -> Iterator[Any]:
    """A ``distributed.Client`` for the duration of a run.

    Parameters
    ----------
    cluster : str, mapping or None
        A scheduler address (``"tcp://host:8786"``), a mapping of
        :class:`distributed.LocalCluster` options, or ``None`` for the embedded
        default: a local cluster of two single-threaded worker processes. A local
        cluster's workers sample their tasks for the dashboard's Profile page every
        ``dpdask.cluster.profile-interval`` (100 ms; Dask's default is 10 ms).

    Yields
    ------
    distributed.Client
        Its ``dashboard_link`` shows the release's tasks (``measure-county-...``).
    """
    import dask.config
    from distributed import Client, LocalCluster

    if isinstance(cluster, str):
        with Client(cluster) as client:
            yield client
        return
    options = {**DEFAULT_LOCAL, **dict(cluster or {})}
    options.setdefault("dashboard_address", ":0")
    # the workers (processes) take the configuration in force when they start
    interval = config.get("cluster.profile-interval")
    with (
        dask.config.set({"distributed.worker.profile.interval": interval}),
        LocalCluster(**options) as lc,
        Client(lc) as client,
    ):
        yield client
