"""The scheduler plugin: every run of a release, from its start, and its progress.

A run announces itself on the scheduler's ``dpdask`` topic as soon as its checks
pass (``run``, by :class:`dpdask.dashboard.RunTracker`; ``dpdask run`` sends it before
the strategy is selected), then its plan (``plan``, :func:`dpdask.dashboard.plan_event`:
levels, chunks, budgets, predicted errors and the ledger's balances), steps
(``step``) and its end (``finished``). Its progress comes from the scheduler's own
task transitions, matched to the run by the client that submitted the tasks and to a
level and stage by the task's key (``measure-<level>-...``,
``measure-reconstruct-<level>-...``, ``reconstruct-<level>-...``, ``answer-<level>-...``,
also when Dask fused them with neighbouring layers, e.g.
``blocks-measure-county-reconstruct-county-...``); its failed tasks are the erred
tasks of its client whose keys are dpdask's (:func:`~dpdask.dashboard._record.is_ours`).
What is recorded per run: :mod:`dpdask.dashboard._record`.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from dpdask.dashboard._record import STAGES, STATES, ReleaseRecord, is_ours

log = logging.getLogger("dpdask.dashboard")

__all__ = ["PLUGIN_NAME", "STAGES", "STATES", "TOPIC", "DashboardPlugin"]

PLUGIN_NAME = "dpdask-dashboard"
"""The plugin's name on the scheduler (``scheduler.plugins[PLUGIN_NAME]``)."""

TOPIC = "dpdask"
"""The scheduler event topic releases announce themselves on."""

_KEEP = 50  # releases kept; the oldest finished ones are dropped first

# every live plugin in this process, for the Prometheus collector
LIVE: weakref.WeakSet[DashboardPlugin] = weakref.WeakSet()


class DashboardPlugin(SchedulerPlugin):
    """Records every dpdask release the scheduler runs, and serves it (module notes).

    Registered by ``dpdask run`` (idempotently: one per scheduler) or preloaded with
    ``dask scheduler --preload dpdask.dashboard``. On start it adds the routes
    ``/dpdask`` (a page), ``/dpdask/json`` (the data) to the scheduler's HTTP server,
    a ``dpdask`` link to the Dask dashboard's pages, and its metrics to ``/metrics``.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.releases: dict[tuple[str, str], ReleaseRecord] = {}
        self.by_client: dict[str, tuple[str, str]] = {}
        self.keys: dict[Any, list[tuple[tuple[str, str], set[tuple[str, str]]]]] = {}
        self.scheduler: Any = None

    def __reduce__(self) -> tuple[Any, ...]:  # sent to the scheduler empty
        return (type(self), ())

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        """Install the routes, the dashboard link and the metrics; replay past events."""
        from dpdask.dashboard._page import add_dashboard_link, install_routes
        from dpdask.dashboard._prometheus import register_collector

        self.scheduler = scheduler
        LIVE.add(self)
        install_routes(scheduler)
        add_dashboard_link(scheduler)
        register_collector()
        try:
            past = scheduler.get_events(TOPIC)
        except Exception:  # pragma: no cover - an older scheduler without the broker
            past = ()
        for _t, msg in past:  # in order: a run's start, plan, steps and end
            self.log_event(TOPIC, msg)

    async def close(self) -> None:
        LIVE.discard(self)

    # -- events from the client ---------------------------------------------------------
    def log_event(self, topic: str, msg: Any) -> None:
        """Take a run's start (``run``), plan (``plan``), step (``step``) or end
        (``finished``)."""
        if topic != TOPIC or not isinstance(msg, Mapping):
            return
        event = msg.get("event")
        now = time.time()
        ident = (str(msg.get("release")), str(msg.get("run_id")))
        rel = self.releases.get(ident)
        if event in ("run", "plan") and rel is None:
            rel = ReleaseRecord(msg, now)
            self.releases[rel.ident] = rel
            self._trim()
        elif event == "plan" and rel is not None:
            rel.describe(msg, now)
        elif event == "step" and rel is not None and rel.finished is None:
            rel.step, rel.updated = msg.get("step"), now
        elif event == "finished" and rel is not None:
            rel.end(msg, now)
        if event in ("run", "plan") and rel is not None and rel.client is not None:
            self.by_client[str(rel.client)] = rel.ident

    def _trim(self) -> None:
        if len(self.releases) <= _KEEP:
            return
        order = sorted(self.releases.values(), key=lambda r: (r.finished is None, r.announced))
        for rel in order[: len(self.releases) - _KEEP]:
            del self.releases[rel.ident]
            if self.by_client.get(str(rel.client)) == rel.ident:
                del self.by_client[str(rel.client)]
        live = set(self.releases)
        self.keys = {
            k: kept for k, v in self.keys.items() if (kept := [e for e in v if e[0] in live])
        }

    # -- the task stream ---------------------------------------------------------------
    def _release_of(self, client: Any) -> ReleaseRecord | None:
        ident = self.by_client.get(str(client)) if client is not None else None
        if ident is not None and ident in self.releases:
            return self.releases[ident]
        running = [r for r in self.releases.values() if r.finished is None]
        return running[0] if len(running) == 1 else None  # an unannounced client

    def update_graph(
        self,
        scheduler: Any,
        *,
        client: str | None = None,
        keys: Iterable[Any] = (),
        tasks: Iterable[Any] = (),
        **kwargs: Any,
    ) -> None:
        """Count the release's tasks of each level and stage as they are submitted."""
        rel = self._release_of(client)
        if rel is None:
            return
        for key in tasks:
            pairs = rel.match(key)
            if not pairs and not is_ours(key):
                continue
            entries = self.keys.setdefault(key, [])
            if any(ident == rel.ident for ident, _ in entries):
                continue  # submitted again
            entries.append((rel.ident, pairs))
            for pair in pairs:
                rel.planned.setdefault(pair, set()).add(key)
        rel.updated = time.time()
        if rel.state == "planned" and any(rel.planned.values()):
            rel.state, rel.step = "running", "measuring and reconstructing"
            plan_after = rel.plan.get("ledger_after_charge")
            if plan_after is not None:  # the release charges before it submits a task
                rel.ledger = plan_after
                rel.ledger_as_of = "after this run's charge"

    def transition(
        self, key: Any, start: str, finish: str, *args: Any, stimulus_id: str = "", **kwargs: Any
    ) -> None:
        """Count a task of a run started, done (in memory) or failed (erred where it ran)."""
        entries = self.keys.get(key)
        if not entries:
            return
        now = time.time()
        for ident, pairs in entries:
            rel = self.releases.get(ident)
            if rel is None:
                continue
            if finish == "erred" and start == "processing":  # where it ran: not dependents
                rel.task_failed(key, now)
            elif not pairs:  # one of dpdask's tasks of no level's stage: failures only
                continue
            elif finish == "processing":
                rel.task_started(pairs, now)
            elif finish == "memory":
                rel.task_done(key, pairs, now)

    # -- what is served ----------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Every release, newest first, as JSON-safe data (the ``/dpdask/json`` route)."""
        now = time.time()
        releases = sorted(self.releases.values(), key=lambda r: r.announced, reverse=True)
        address = getattr(self.scheduler, "address", None)
        return {
            "version": 1,
            "time": now,
            "scheduler": address if isinstance(address, str) else None,
            "releases": [r.snapshot(now) for r in releases],
        }
