"""A release's report: one self-contained HTML page (``dpdask report OUT.zarr``).

The page shows

* a summary: the release, its run, dataset, dates and the dpdask versions;
* the plan: workload, strategy, levels, the budget split over them and their noise;
* the budget and ledger: spent and left as the release recorded them and, when the
  ledger file is reachable, as it says now, whether its hash chain verifies and
  whether it still holds the head the release recorded;
* the predicted error of every table (workload part, and P.L. 94-171 table P1-P4 for
  the PL94 workload) at every level, from the variances the release publishes, with
  whiskers from the table's smallest to largest query standard deviation;
* with a truth, the realised error: the published answers against the true answers
  of every table at every level, beside the predicted error;
* the chunks whose reconstruction did not converge.

Plots are drawn with matplotlib (Agg) and embedded as ``data:`` PNG URIs; styles are
inline; the numbers are embedded too, as JSON (``<script type="application/json"
id="dpdask-report-data">``). The page loads nothing from anywhere: it can be mailed
or opened offline.

The truth is a dpdask data store (:func:`dpdask.store.write_store`) of the true
counts of every finest geography unit, on the release's domain, whose geography has
the release's levels (same level names and unit ids): its counts are summed up to each
level (:func:`dpdask.store.aggregate`) and the workload's true answers computed
from them. The workload is recognised among the named workloads (``pl94``,
``ri2010``, ``sf1-persons``, ``identity``, ``marginals``, ...: a candidate must have
the published labels and reproduce the published answers from the published
estimates); name it with ``workload="NAME"`` (``dpdask report --workload NAME``) or
pass the workload itself otherwise (else only the histogram cells are compared). A
named workload that is not the release's is answered from the published estimates
and compared with the truth too (realised error only)::

    from dpdask.store import read_pl94, write_store
    counts, domain, geography = read_pl94("examples/data/pl94_providence")
    write_store("truth.zarr", counts, domain, geography)
    write_report("out/pl94-providence.zarr", truth="truth.zarr")
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:  # pragma: no cover
    from dpdask.linalg import LinearQuery
    from dpdask.store import DataStore

__all__ = [
    "ReportWorkload",
    "Truth",
    "default_output",
    "report_data",
    "workload_spec",
    "write_report",
]

#: the true counts a report compares with: a data store, or its path
Truth: TypeAlias = "str | os.PathLike[str] | DataStore"
#: a workload to compare: a name, ``{"name": NAME, **options}``, the workload itself, or
#: one workload per level
ReportWorkload: TypeAlias = "str | Mapping[str, Any] | LinearQuery"


def report_data(
    release: str | os.PathLike[str],
    *,
    truth: Truth | None = None,
    ledger: str | os.PathLike[str] | None = None,
    workload: ReportWorkload | None = None,
) -> dict[str, Any]:
    """The numbers a report shows, as plain data (what the page embeds as JSON).

    Parameters
    ----------
    release : str or path-like
        A published release.
    truth : str, path-like or dpdask.store.DataStore, optional
        A data store of the true counts (module notes).
    ledger : str or path-like, optional
        The ledger file, if it moved from where the release records it.
    workload : str, mapping, LinearQuery or mapping of level to LinearQuery, optional
        The workload to compare with the truth: a name from
        :data:`dpdask.workloads.named.WORKLOAD_NAMES`, ``{"name": NAME, **options}``, or
        the workload itself (default: the release's, recognised; module notes).

    Returns
    -------
    dict
        ``summary``, ``plan`` (levels with budget share, noise scale, predicted RMSE),
        ``ledger``, ``levels``, ``tables`` (one row per level and table: ``rmse``,
        ``sd_min``, ``sd_max``, ``moe90``), ``realised`` (None without a truth; else
        ``truth`` and per level ``tables`` with ``predicted_rmse``, ``realised_rmse``,
        ``max_abs_error``, ``within_moe90``, and ``cells_rmse``), ``not_converged``,
        ``notes`` and ``uncertainty`` (per level: what its variances are of,
        ``uncertainty_of``, ``describes_published`` and ``noise``; a top-down level's
        ``simulated_rmse`` by query group and its ``unbiased`` answers, labelled
        "unbiased (least squares, this level's measurements)").

    Raises
    ------
    FileNotFoundError
        If the release (or the truth) is not there.
    dpdask.errors.ArgumentError
        If ``release`` is not a dpdask release, or ``workload`` names no workload that
        can be built on its domain (a ``ValueError``).
    dpdask.errors.DataError
        If the truth does not match the release (its levels: a
        :class:`~dpdask.errors.DomainError`).
    """
    from dpdask.report._data import collect

    return collect(release, truth=truth, ledger=ledger, workload=workload)


def workload_spec(value: str) -> str | dict[str, Any]:
    """``dpdask report --workload``'s value as ``workload=`` takes it: a name
    (``marginals``) or, in YAML flow style, a mapping with options (``{name: marginals,
    k: 2}``).

    Raises
    ------
    dpdask.errors.ArgumentError
        If a mapping is not valid YAML or has no ``name`` (a ``ValueError``).
    """
    from dpdask.report._workload import workload_spec as parse

    return parse(value)


def default_output(release: str | os.PathLike[str]) -> pathlib.Path:
    """Where a report goes by default: beside the release, ``OUT.zarr`` -> ``OUT.report.html``.

    Parameters
    ----------
    release : str or path-like

    Returns
    -------
    pathlib.Path
    """
    path = pathlib.Path(release)
    stem = path.name.removesuffix("/").removesuffix(".zarr") or "release"
    return path.with_name(f"{stem}.report.html")


def write_report(
    release_path: str | os.PathLike[str],
    out_html: str | os.PathLike[str] | None = None,
    *,
    truth: Truth | None = None,
    ledger: str | os.PathLike[str] | None = None,
    workload: ReportWorkload | None = None,
) -> pathlib.Path:
    """Write a release's report: one self-contained HTML page (module notes).

    Parameters
    ----------
    release_path : str or path-like
        A published release.
    out_html : str or path-like, optional
        The page to write (default :func:`default_output`: ``OUT.report.html`` beside
        ``OUT.zarr``); written under a temporary name and renamed when complete.
    truth : str, path-like or dpdask.store.DataStore, optional
        A data store of the true counts: adds the realised errors.
    ledger : str or path-like, optional
        The ledger file, if it moved from where the release records it.
    workload : str, mapping, LinearQuery or mapping of level to LinearQuery, optional
        The workload to compare with the truth: a name from
        :data:`dpdask.workloads.named.WORKLOAD_NAMES`, ``{"name": NAME, **options}``, or
        the workload itself (default: the release's, recognised; module notes).

    Returns
    -------
    pathlib.Path
        The page written.

    Raises
    ------
    FileNotFoundError
        If the release (or the truth) is not there.
    dpdask.errors.ArgumentError
        If ``release_path`` is not a dpdask release, or ``workload`` names no workload
        that can be built on its domain (a ``ValueError``).
    dpdask.errors.DataError
        If the truth does not match the release (its levels: a
        :class:`~dpdask.errors.DomainError`).

    Examples
    --------
    >>> write_report("out/pl94-providence.zarr")  # doctest: +SKIP
    PosixPath('out/pl94-providence.report.html')
    """
    from dpdask.report._html import render

    data = report_data(release_path, truth=truth, ledger=ledger, workload=workload)
    target = pathlib.Path(out_html) if out_html is not None else default_output(release_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        tmp.write_text(render(data), encoding="utf-8")
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target
