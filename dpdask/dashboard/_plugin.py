"""The scheduler plugin: what each release planned, and its progress from the task stream.

A release announces itself with an event on the scheduler's ``dpdask`` topic
(:func:`dpdask.dashboard.track`, sent by ``dpdask run``): its levels, chunks, budgets,
predicted errors and the ledger's balances. Its progress comes from the scheduler's
own task transitions, matched to the release by the client that submitted the tasks
and to a level and stage by the task's key (``measure-<level>-...``,
``measure-reconstruct-<level>-...``, ``reconstruct-<level>-...``, ``answer-<level>-...``,
also when Dask fused them with neighbouring layers, e.g.
``blocks-measure-county-reconstruct-county-...``).

A level's progress in a stage is counted in chunk equivalents: ``chunks * done /
planned`` over the stage's tasks for the level (Dask may fuse several chunks, or a
level's whole stage, into one task).
"""

from __future__ import annotations

import logging
import math
import re
import time
import weakref
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

log = logging.getLogger("dpdask.dashboard")

__all__ = ["PLUGIN_NAME", "STAGES", "TOPIC", "DashboardPlugin"]

PLUGIN_NAME = "dpdask-dashboard"
"""The plugin's name on the scheduler (``scheduler.plugins[PLUGIN_NAME]``)."""

TOPIC = "dpdask"
"""The scheduler event topic releases announce themselves on."""

STAGES = ("measured", "reconstructed", "published")
"""The stages a level's chunks go through, in order."""

_STAGE_OF = {
    "measure-reconstruct": ("measured", "reconstructed"),
    "measure": ("measured",),
    "reconstruct": ("reconstructed",),
    "answer": ("published",),
}
_KEEP = 50  # releases kept; the oldest finished ones are dropped first

# every live plugin in this process, for the Prometheus collector
LIVE: weakref.WeakSet[DashboardPlugin] = weakref.WeakSet()


def _key_name(key: Any) -> str | None:
    """The name part of a task key (``("measure-county-ab12", 3, 0)`` -> its string)."""
    if isinstance(key, tuple):
        key = key[0] if key else None
    if isinstance(key, bytes):
        key = key.decode(errors="replace")
    return key if isinstance(key, str) else None


def budget_text(budget: Mapping[str, Any] | None, approx: bool = True) -> str:
    """A budget's dict (:meth:`~dpdask.privacy.Budget.to_dict`) as text: ``zCDP ρ=1/6``.

    Parameters
    ----------
    budget : mapping or None
        ``{"type": ..., <field>: "<exact number>", ...}``.
    approx : bool
        Add a decimal value to each field that is a fraction: ``ρ=1/6 (≈0.1667)``.

    Returns
    -------
    str
        The type and each field, exact.
    """
    if not budget:
        return "-"
    names = {"rho": "ρ", "epsilon": "ε", "delta": "δ"}
    parts = []
    for field, value in budget.items():
        if field == "type":
            continue
        text = str(value)
        number = _number(value)
        if approx and number is not None and "/" in text:
            text = f"{text} (≈{number:.4g})"
        parts.append(f"{names.get(field, field)}={text}")
    return " ".join([str(budget.get("type", "")), *parts]).strip()


def _number(value: Any) -> float | None:
    try:
        return float(Fraction(str(value)))
    except (ValueError, ZeroDivisionError):
        return None


def budget_values(budget: Mapping[str, Any] | None) -> dict[str, float]:
    """A budget's fields as floats (``{"rho": 0.1667}``), for metrics and bars."""
    out: dict[str, float] = {}
    for field, value in (budget or {}).items():
        number = None if field == "type" else _number(value)
        if number is not None:
            out[field] = number
    return out


def _balance(entry: Mapping[str, Any] | None, total_key: str) -> dict[str, Any] | None:
    """A ledger entry (dataset or release) with texts and the fraction spent."""
    if not entry:
        return None
    total, spent = entry.get(total_key), entry.get("spent")
    t, s = budget_values(total), budget_values(spent)
    first = next(iter(t), None)
    fraction = None
    if first is not None and t[first] > 0 and first in s:
        fraction = min(1.0, max(0.0, s[first] / t[first]))
    return {
        **{k: v for k, v in entry.items() if k != "runs"},
        "total": total,
        "total_text": budget_text(total),
        "spent_text": budget_text(spent),
        "remaining_text": budget_text(entry.get("remaining")),
        "fraction_spent": fraction,
    }


class _Release:
    """One release's plan and progress (kept by the plugin, plain data only)."""

    def __init__(self, plan: Mapping[str, Any], now: float):
        self.plan = dict(plan)
        self.release = str(plan.get("release"))
        self.run_id = str(plan.get("run_id"))
        self.client = plan.get("client")
        self.state = "planned"
        self.announced = now
        self.started: float | None = None
        self.last_done: float | None = None
        self.finished: float | None = None
        self.error: str | None = None
        self.erred_tasks = 0
        self.not_converged: list[Any] = list(plan.get("not_converged") or [])
        self.ledger = plan.get("ledger_before")
        self.ledger_as_of = "before this run's charge"
        self.levels: list[dict[str, Any]] = [dict(lv) for lv in plan.get("levels", ())]
        self.by_word = {str(lv.get("word") or lv["level"]): lv["level"] for lv in self.levels}
        words = sorted(self.by_word, key=len, reverse=True)
        stages = "|".join(sorted(_STAGE_OF, key=len, reverse=True))
        alt = "|".join(re.escape(w) for w in words) or r"(?!x)x"
        self.pattern = re.compile(rf"(?:^|-)({stages})-({alt})(?=-|$)")
        # (level, stage) -> planned / done task keys
        self.planned: dict[tuple[str, str], set[Any]] = {}
        self.done: dict[tuple[str, str], set[Any]] = {}

    @property
    def ident(self) -> tuple[str, str]:
        return (self.release, self.run_id)

    def match(self, key: Any) -> set[tuple[str, str]]:
        """The (level, stage) pairs a task key belongs to (empty: not this release's)."""
        name = _key_name(key)
        if name is None:
            return set()
        out = set()
        for m in self.pattern.finditer(name):
            level = self.by_word[m.group(2)]
            out.update((level, stage) for stage in _STAGE_OF[m.group(1)])
        return out

    def chunks_done(self, level: Mapping[str, Any], stage: str) -> float:
        """Chunk equivalents of ``level`` done in ``stage`` (module notes)."""
        pair = (level["level"], stage)
        planned = len(self.planned.get(pair, ()))
        if not planned:
            return 0.0
        done = len(self.done.get(pair, ()))
        return int(level.get("chunks", 0)) * done / planned

    def cells_done(self) -> float:
        out = 0.0
        for lv in self.levels:
            chunks = int(lv.get("chunks", 0)) or 1
            out += float(lv.get("cells", 0)) * self.chunks_done(lv, "reconstructed") / chunks
        return out

    def cells_per_second(self) -> float:
        if self.started is None or self.last_done is None or self.last_done <= self.started:
            return 0.0
        return self.cells_done() / (self.last_done - self.started)

    def snapshot(self, now: float) -> dict[str, Any]:
        """The release as JSON-safe data, for the page, the JSON route and the metrics."""
        plan = self.plan
        levels = []
        for lv in self.levels:
            chunks = int(lv.get("chunks", 0))
            progress = {}
            for stage in STAGES:
                pair = (lv["level"], stage)
                done = self.chunks_done(lv, stage)
                progress[stage] = {
                    "chunks": math.floor(done + 1e-9),
                    "of": chunks,
                    "fraction": done / chunks if chunks else 0.0,
                    "tasks_done": len(self.done.get(pair, ())),
                    "tasks_planned": len(self.planned.get(pair, ())),
                }
            levels.append(
                {
                    **{k: v for k, v in lv.items() if k not in ("tables", "word")},
                    "budget_text": budget_text(lv.get("budget"), approx=False),
                    "progress": progress,
                }
            )
        tables: dict[str, dict[str, Any]] = {}
        for lv in self.levels:
            for t in lv.get("tables", ()):
                row = tables.setdefault(
                    t["name"],
                    {"name": t["name"], "kind": t.get("kind"), "queries": t.get("queries")},
                )
                row.setdefault("rmse", {})[lv["level"]] = t.get("rmse")
        ledger = self.ledger or {}
        end = self.finished or now
        return {
            "release": self.release,
            "run_id": self.run_id,
            "dataset": plan.get("dataset"),
            "state": self.state,
            "error": self.error,
            "erred_tasks": self.erred_tasks,
            "workload": plan.get("workload"),
            "strategy": plan.get("strategy"),
            "reconstruct": plan.get("reconstruct"),
            "queries": plan.get("queries"),
            "announced": self.announced,
            "started": self.started,
            "finished": self.finished,
            "elapsed": end - (self.started or self.announced),
            "cells_total": sum(float(lv.get("cells", 0)) for lv in self.levels),
            "cells_done": self.cells_done(),
            "cells_per_second": self.cells_per_second(),
            "budget": plan.get("budget"),
            "budget_text": budget_text(plan.get("budget")),
            "ledger": {
                "as_of": self.ledger_as_of,
                "path": ledger.get("ledger"),
                "dataset": _balance(ledger.get("dataset"), "total"),
                "release": _balance(ledger.get("release"), "budget"),
            },
            "levels": levels,
            "tables": list(tables.values()),
            "not_converged": self.not_converged,
        }


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
        self.releases: dict[tuple[str, str], _Release] = {}
        self.by_client: dict[str, tuple[str, str]] = {}
        self.keys: dict[Any, list[tuple[tuple[str, str], set[tuple[str, str]]]]] = {}
        self.scheduler: Any = None

    def __reduce__(self) -> tuple[Any, ...]:  # sent to the scheduler empty
        return (type(self), ())

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self, scheduler: Any) -> None:
        """Install the routes, the dashboard link and the metrics; replay past events."""
        from dpdask.dashboard._metrics import register_collector
        from dpdask.dashboard._page import add_dashboard_link, install_routes

        self.scheduler = scheduler
        LIVE.add(self)
        install_routes(scheduler)
        add_dashboard_link(scheduler)
        register_collector()
        try:
            past = scheduler.get_events(TOPIC)
        except Exception:  # pragma: no cover - an older scheduler without the broker
            past = ()
        for _t, msg in past:
            if isinstance(msg, Mapping) and msg.get("event") == "plan":
                key = (str(msg.get("release")), str(msg.get("run_id")))
                if key not in self.releases:
                    self.log_event(TOPIC, msg)
            elif isinstance(msg, Mapping):
                self.log_event(TOPIC, msg)

    async def close(self) -> None:
        LIVE.discard(self)

    # -- events from the client ---------------------------------------------------------
    def log_event(self, topic: str, msg: Any) -> None:
        """Take a release's announcement (``plan``) or its end (``finished``)."""
        if topic != TOPIC or not isinstance(msg, Mapping):
            return
        event = msg.get("event")
        now = time.time()
        if event == "plan":
            rel = _Release(msg, now)
            self.releases[rel.ident] = rel
            if rel.client is not None:
                self.by_client[str(rel.client)] = rel.ident
            self._trim()
        elif event == "finished":
            rel = self.releases.get((str(msg.get("release")), str(msg.get("run_id"))))
            if rel is None:
                return
            rel.state = str(msg.get("state", "published"))
            rel.finished = now
            rel.error = msg.get("error")
            if msg.get("ledger") is not None:
                rel.ledger = msg["ledger"]
                rel.ledger_as_of = str(msg.get("ledger_as_of", "after the run"))
            if msg.get("not_converged") is not None:
                rel.not_converged = list(msg["not_converged"])

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
    def _release_of(self, client: Any) -> _Release | None:
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
            if not pairs:
                continue
            entries = self.keys.setdefault(key, [])
            if any(ident == rel.ident for ident, _ in entries):
                continue  # submitted again
            entries.append((rel.ident, pairs))
            for pair in pairs:
                rel.planned.setdefault(pair, set()).add(key)
        if rel.state == "planned" and any(rel.planned.values()):
            rel.state = "running"
            plan_after = rel.plan.get("ledger_after_charge")
            if plan_after is not None:  # the release charges before it submits a task
                rel.ledger = plan_after
                rel.ledger_as_of = "after this run's charge"

    def transition(
        self, key: Any, start: str, finish: str, *args: Any, stimulus_id: str = "", **kwargs: Any
    ) -> None:
        """Count a task of a release done when its result is in memory."""
        entries = self.keys.get(key)
        if not entries:
            return
        now = time.time()
        for ident, pairs in entries:
            rel = self.releases.get(ident)
            if rel is None:
                continue
            if finish == "processing" and rel.started is None:
                rel.started = now
            elif finish == "memory":
                if rel.started is None:
                    rel.started = now
                for pair in pairs:
                    rel.done.setdefault(pair, set()).add(key)
                rel.last_done = now
            elif finish == "erred":
                rel.erred_tasks += 1

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
