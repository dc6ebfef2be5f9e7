"""The client's side: register the plugin, announce a release, report its end.

Everything is sent as plain data on the scheduler's ``dpdask`` event topic
(``Client.log_event``), so the scheduler runs no code of the client's. The dashboard
never fails a release: a scheduler that cannot take the plugin (no dpdask installed
there) or the events is logged and the release goes on.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dpdask.dashboard._plugin import TOPIC, DashboardPlugin

log = logging.getLogger("dpdask")

__all__ = ["RunTracker", "dashboard_url", "plan_event", "register", "shown_path", "track"]


def dashboard_url(client: Any) -> str | None:
    """The address of the ``/dpdask`` page of the client's scheduler.

    Parameters
    ----------
    client : distributed.Client

    Returns
    -------
    str or None
        The dashboard link with ``/dpdask`` in place of ``/status``; None without a
        dashboard.
    """
    try:
        link = client.dashboard_link
    except Exception:
        return None
    if not isinstance(link, str) or not link:
        return None
    base = link.removesuffix("/status") if link.endswith("/status") else link.rstrip("/")
    return f"{base}/dpdask"


def register(client: Any) -> bool:
    """Register :class:`DashboardPlugin` on the client's scheduler unless it has one.

    Returns
    -------
    bool
        Whether the scheduler has the plugin now (False: it could not take it).
    """
    try:
        client.register_plugin(DashboardPlugin())  # idempotent: one per scheduler
    except Exception as exc:
        log.warning(
            "the scheduler did not take the dpdask dashboard plugin (%s: %s); the release "
            "runs without its /dpdask page",
            type(exc).__name__,
            exc,
        )
        return False
    return True


def _float(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _rmse(variances: Any) -> float | None:
    import numpy as np

    v = np.asarray(variances, dtype=float)
    return _float(math.sqrt(max(float(v.mean()), 0.0))) if v.size else None


def rmse_groups(names: list[str], variances: Any, kind: str) -> list[dict[str, Any]]:
    """RMSE of each named group of rows (rows named by ``names``, in order of first use)."""
    import numpy as np

    v = np.asarray(variances, dtype=float)
    rows: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        rows.setdefault(n, []).append(i)
    return [
        {"name": n, "kind": kind, "queries": len(idx), "rmse": _rmse(v[idx])}
        for n, idx in rows.items()
    ]


def _row_names(Q: Any) -> list[str] | None:
    """The part name of each row of a stacked query (None: not stacked)."""
    from dpdask.linalg import VStack

    if not isinstance(Q, VStack):
        return None
    names = Q.names or tuple(f"part{k + 1}" for k in range(len(Q.parts)))
    return [n for n, p in zip(names, Q.parts, strict=True) for _ in range(p.shape[0])]


def _tables(plan: Any, domain: Any) -> list[dict[str, Any]]:
    """Predicted RMSE per workload part and, for PL94, per published table (P1-P4)."""
    qv = plan.query_variances()
    out: list[dict[str, Any]] = []
    names = _row_names(plan.workload)
    if names is not None and len(names) == len(qv):
        out += rmse_groups(names, qv, "part")
    try:
        from dpdask.graph import table_variances
        from dpdask.publish import published_tables

        tables = published_tables(plan.workload, domain)
        tv = None if tables is None else table_variances(plan, tables[2], domain)
        t_names = None if tables is None else _row_names(tables[2])
        if tv is not None and t_names is not None and len(t_names) == len(tv):
            out += rmse_groups(t_names, tv, "table")
    except Exception:  # the tables are extra information; the parts are always there
        log.debug("dpdask dashboard: no per-table errors", exc_info=True)
    return out


def shown_path(
    path: str | os.PathLike[str] | None, base: str | os.PathLike[str] | None = None
) -> str | None:
    """A path as the dashboard shows it: relative to ``base`` (the spec's folder), or
    its last part without one; never absolute (the page may be seen by others)."""
    if path is None:
        return None
    p = os.path.abspath(os.fspath(path))
    if base is None:
        return os.path.basename(p)
    return os.path.relpath(p, os.path.abspath(os.fspath(base)))


def _ledger_view(
    ledger: Any, release: str, dataset: str | None, base: Any = None
) -> dict[str, Any] | None:
    """The dataset's and the release's balances in the ledger, as plain data."""
    if ledger is None:
        return None
    report = ledger.report()
    rel = report["releases"].get(release)
    if rel is not None:
        rel = {k: v for k, v in rel.items() if k != "runs"}
    return {
        "ledger": shown_path(report.get("ledger"), base),
        "head": report.get("head"),
        "dataset": report["datasets"].get(dataset) if dataset is not None else None,
        "release": rel,
    }


def _after_charge(before: Mapping[str, Any] | None, total: Any) -> dict[str, Any] | None:
    """The balances once a new run of the release is charged ``total`` (its budget: the
    levels' charges compose to it), for the page until the ledger is read again."""
    from dpdask.privacy import Budget

    if before is None:
        return None

    def spend(entry: Mapping[str, Any] | None, limit_key: str) -> dict[str, Any] | None:
        if entry is None:
            if limit_key == "total":
                return None  # a dataset without a lifetime total
            entry = {"budget": total.to_dict(), "spent": total.zero().to_dict()}
        limit = Budget.from_dict(entry[limit_key])
        spent = Budget.from_dict(entry["spent"]) + total
        try:
            left = limit - spent
        except ValueError:  # spent past it (cannot happen once charged): nothing left
            left = limit.zero()
        return {**entry, "spent": spent.to_dict(), "remaining": left.to_dict()}

    try:
        return {
            **before,
            "dataset": spend(before.get("dataset"), "total"),
            "release": spend(before.get("release"), "budget"),
        }
    except (TypeError, ValueError, KeyError):
        return None


def plan_event(
    rel: Any,
    ledger: Any = None,
    plan: Mapping[str, Any] | None = None,
    client_id: Any = None,
    base: Any = None,
) -> dict[str, Any]:
    """The announcement of a release: what the plugin shows before any task runs.

    Parameters
    ----------
    rel : dpdask.graph.Release
        The release, built and not yet run.
    ledger : dpdask.privacy.Ledger, optional
        Its ledger; the dataset's and release's balances are read from it.
    plan : mapping, optional
        :func:`dpdask.pipeline.run.plan_spec`'s report (names the workload and
        strategy).
    client_id : str, optional
        The client that will submit the release's tasks.
    base : path-like, optional
        The spec's folder: paths are shown relative to it (:func:`shown_path`).

    Returns
    -------
    dict
        Plain data (msgpack-serialisable): ``event="plan"``, the release, its levels
        (units, chunks, cells, budget, noise, predicted RMSE per level and per table),
        and the ledger's balances before and after the run's charge.
    """
    from dpdask.store import level_key

    plan = plan or {}
    summary = rel.summary()
    domain_size = int(rel.domain.size)
    levels = []
    for lv in summary["levels"]:
        p = rel.plans[lv["level"]]
        levels.append(
            {
                "level": lv["level"],
                "word": level_key(lv["level"]),
                "units": int(lv["units"]),
                "chunks": int(lv["chunks"]),
                "cells": int(lv["units"]) * domain_size,
                "budget": lv["budget"],
                "mechanism": str(lv["mechanism"]),
                "noise_scale": _float(lv["noise_scale"]),
                "queries": int(lv["queries"]),
                "rmse": _float(math.sqrt(max(lv["mean_query_variance"], 0.0))),
                "max_stddev": _float(math.sqrt(max(lv["max_query_variance"], 0.0))),
                "tables": _tables(p, rel.domain),
            }
        )
    workload = plan.get("workload")
    if isinstance(workload, Mapping):
        workload = workload.get("name")
    before = _ledger_view(ledger, rel.release_id, rel.dataset, base)
    resuming = ledger is not None and ledger.run(rel.release_id, rel.run_id) is not None
    return {
        "event": "plan",
        "client": client_id,
        "release": rel.release_id,
        "run_id": rel.run_id,
        "dataset": rel.dataset,
        "workload": None if workload is None else str(workload),
        "strategy": None if plan.get("strategy") is None else str(plan["strategy"]),
        "queries": plan.get("queries"),
        "reconstruct": rel.reconstruct,
        "budget": summary["budget"],
        "levels": levels,
        "ledger_before": before,
        "ledger_after_charge": before if resuming else _after_charge(before, rel.total),
    }


def _send(client: Any, msg: Mapping[str, Any]) -> None:
    try:
        client.log_event(TOPIC, dict(msg))
    except Exception as exc:
        log.warning("dpdask dashboard: could not send the release's %s event (%s)",
                    msg.get("event"), exc)  # fmt: skip


class RunTracker:
    """A run's reports to its scheduler's ``/dpdask`` page, from its first second to its end.

    Made, it registers the plugin (the page is served from then on); :meth:`start`
    announces the run (``selecting strategy``); :meth:`step` names what it does now;
    :meth:`releasing` describes its levels (:func:`plan_event`) and reports its
    publication; :meth:`failed` its error and, for a charged run, the command that
    resumes it. Without a client (the local threaded scheduler) it does nothing; it
    never fails a run.

    Parameters
    ----------
    client : distributed.Client or None
    release, run_id : str
    """

    def __init__(self, client: Any, release: str, run_id: str) -> None:
        self.client = client
        self.ident = {"release": release, "run_id": run_id}
        self.resume: str | None = None
        self.ended = False
        if client is not None:
            register(client)

    def start(self, dataset: str | None = None, resume: str | None = None) -> None:
        """Announce the run (of ``dataset``) and log the page's address; ``resume`` is
        the command that resumes it, shown if it fails charged (no absolute paths)."""
        self.resume = resume
        if self.client is None:
            return
        _send(self.client, {"event": "run", **self.ident, "client": _client_id(self.client),
                            "dataset": dataset, "step": "selecting strategy"})  # fmt: skip
        self.show_link()

    def show_link(self) -> None:
        url = dashboard_url(self.client)
        if url is not None:
            log.warning("run %s: release page at %s", self.ident["release"], url)

    def step(self, step: str) -> None:
        """Show what the run does now (``reading data``, ...)."""
        if self.client is not None:
            _send(self.client, {"event": "step", **self.ident, "step": step})

    def describe(self, rel: Any, ledger: Any = None, plan: Mapping[str, Any] | None = None,
                 base: Any = None) -> None:  # fmt: skip
        """Send the run's levels, budgets and errors (:func:`plan_event`)."""
        if self.client is None:
            return
        try:
            msg = plan_event(rel, ledger, plan, client_id=_client_id(self.client), base=base)
        except Exception:  # never fail a release for its dashboard
            log.warning("dpdask dashboard: could not describe the release", exc_info=True)
            return
        _send(self.client, msg)

    def published(self, rel: Any, ledger: Any = None, base: Any = None) -> None:
        """Report the publication, with the ledger's balances after it."""
        if self.client is None or self.ended:
            return
        self.ended = True
        end: dict[str, Any] = {"event": "finished", **self.ident, "state": "published"}
        try:
            end["ledger"] = _ledger_view(ledger, rel.release_id, rel.dataset, base)
            end["ledger_as_of"] = "after publication"
            end["not_converged"] = [dict(r) for r in rel.summary()["not_converged"]]
        except Exception:
            log.warning("dpdask dashboard: could not read the release's end", exc_info=True)
        _send(self.client, end)

    def failed(self, exc: BaseException, state: str | None = "unknown") -> None:
        """Report the run failed with ``exc``. ``state`` is the run's in the ledger
        (``failure_reported`` in :mod:`dpdask.pipeline.run`): None if not charged; ``open`` or
        ``measuring`` (or ``unknown``) and the page offers the resume command."""
        if self.client is None or self.ended:
            return
        self.ended = True
        msg = {"event": "finished", **self.ident, "state": "failed",
               "error": f"{type(exc).__name__}: {exc}".removesuffix(": "),
               "charged": None if state == "unknown" else state is not None}  # fmt: skip
        if state in ("open", "measuring", "unknown") and self.resume is not None:
            msg["resume"] = self.resume
        _send(self.client, msg)

    @contextmanager
    def releasing(self, rel: Any, ledger: Any = None, plan: Mapping[str, Any] | None = None,
                  base: Any = None) -> Iterator[None]:  # fmt: skip
        """Describe the release on entering, report its publication on leaving."""
        self.describe(rel, ledger, plan, base)
        yield
        self.published(rel, ledger, base)


def _client_id(client: Any) -> Any:
    return getattr(client, "id", None)


@contextmanager
def track(
    client: Any,
    rel: Any,
    ledger: Any = None,
    plan: Mapping[str, Any] | None = None,
    base: Any = None,
) -> Iterator[None]:
    """Show a release on its scheduler's ``/dpdask`` page while it runs.

    Registers the plugin (unless the scheduler has it), announces the release
    (:func:`plan_event`) and logs the page's address; on leaving, reports the end
    (``published`` or ``failed``) with the ledger's balances and the chunks that did
    not converge. Without a client (the local threaded scheduler) it does nothing.
    ``dpdask run`` shows a run from its start instead (:class:`RunTracker`).

    Parameters
    ----------
    client : distributed.Client or None
    rel : dpdask.graph.Release
    ledger : dpdask.privacy.Ledger, optional
    plan : mapping, optional
        :func:`dpdask.pipeline.run.plan_spec`'s report.
    base : path-like, optional
        The spec's folder; the ledger's path is shown relative to it, never absolute.

    Examples
    --------
    >>> with track(client, rel, ledger, plan=report):  # doctest: +SKIP
    ...     rel.to_zarr(path, client=client)
    """
    if client is None:
        yield
        return
    tracker = RunTracker(client, rel.release_id, rel.run_id)
    tracker.describe(rel, ledger, plan, base)
    tracker.show_link()
    try:
        yield
    except BaseException as exc:
        tracker.failed(exc)
        raise
    tracker.published(rel, ledger, base)
