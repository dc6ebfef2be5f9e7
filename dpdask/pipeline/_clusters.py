"""The clusters dpdask starts for a run (a local one, a SLURM allocation), and how a
run's client and cluster close without touching the run's outcome."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from dpdask.errors import ArgumentError

__all__ = ["DEFAULT_DASHBOARD", "local_client", "outcome_kept", "slurm_client"]

log = logging.getLogger("dpdask")

#: where the dashboard of a cluster dpdask starts listens, unless told otherwise
DEFAULT_DASHBOARD = "127.0.0.1:0"


@contextmanager
def local_client(options: Mapping[str, Any], settings: Mapping[str, Any]) -> Iterator[Any]:
    """A client of a ``LocalCluster(**options)`` started under Dask's ``settings``."""
    import dask.config
    from distributed import Client, LocalCluster

    with (
        dask.config.set(settings),
        LocalCluster(**options) as lc,  # type: ignore[no-untyped-call]
        Client(lc) as client,  # type: ignore[no-untyped-call]
    ):
        yield client


@contextmanager
def outcome_kept(resource: AbstractContextManager[Any], what: str) -> Iterator[Any]:
    """``resource`` entered for a run; its close cannot replace the run's outcome.

    By the time a cluster closes, the run has published or been refused. A close that
    times out or finds its connection gone (an ``OSError``: ``TimeoutError``,
    ``CommClosedError``; seen on a loaded machine) is logged as a warning: the run's
    own error is raised as it was, and a published run stays a success.
    """
    own: BaseException | None = None
    try:
        with resource as entered:
            try:
                yield entered
            except BaseException as exc:
                own = exc
                raise
    except OSError as exc:
        if exc is own:
            raise
        log.warning("%s did not close cleanly (%s: %s); the run's outcome stands",
                    what, type(exc).__name__, exc)  # fmt: skip
        if own is not None:
            raise own from None


@contextmanager
def slurm_client(
    options: Mapping[str, Any], insecure: bool, dashboard_address: str | None = None
) -> Iterator[Any]:
    """A client of a ``dask_jobqueue.SLURMCluster``: the scheduler runs in this process,
    its workers in SLURM jobs that connect back to it over the cluster's network.

    Unless ``insecure``, that network carries TLS: a temporary self-signed certificate
    (``Security.temporary()``) that dask-jobqueue hands to its jobs through
    ``shared_temp_directory`` (a folder the compute nodes see; the working directory
    by default). Its dashboard listens on ``127.0.0.1`` unless ``dashboard_address``
    or ``scheduler_options.dashboard_address`` says otherwise.
    """
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise ArgumentError(
            "cluster.slurm needs dask-jobqueue, which is not installed "
            "(pip install dask-jobqueue); or start `dask scheduler` and `dask worker` "
            "with srun and give the address (deploy/slurm-dpdask.sh)"
        ) from None
    from distributed import Client, Security

    opts = dict(options)
    for k in ("security", "protocol"):
        if k in opts:
            raise ArgumentError(
                f"cluster.slurm.{k}: dpdask sets it (TLS unless cluster.insecure: true)"
            )
    import dask.config

    # dask-jobqueue reads its configuration's scheduler options only when none are given
    given = opts.get("scheduler_options")
    if given is None:
        given = dask.config.get("jobqueue.slurm.scheduler-options", None) or {}
    scheduler_options = dict(given)
    if dashboard_address is not None:
        scheduler_options["dashboard_address"] = dashboard_address
    scheduler_options.setdefault("dashboard_address", DEFAULT_DASHBOARD)
    opts["scheduler_options"] = scheduler_options
    jobs = opts.pop("jobs", None)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ArgumentError(f"cluster.slurm.jobs: expected a positive integer, got {jobs!r}")
    if jobs is None and not opts.get("n_workers"):
        jobs = 1
    if not insecure:
        try:
            security = Security.temporary()  # type: ignore[no-untyped-call]
        except ImportError:
            raise ArgumentError(
                "cluster.slurm: the TLS between the scheduler and its SLURM jobs uses a "
                "temporary certificate, which needs the cryptography package (pip install "
                "cryptography); on a network you trust, set cluster.insecure: true"
            ) from None
        opts["protocol"] = "tls://"
        opts["security"] = security
    with SLURMCluster(**opts) as cluster:
        if jobs is not None:
            cluster.scale(jobs=jobs)
        with Client(cluster) as client:  # type: ignore[no-untyped-call]
            yield client
