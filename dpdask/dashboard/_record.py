"""One release run as the dashboard records it: its state, plan, progress and ETA.

A run is announced when it starts (``run``: state ``selecting``, while its strategy is
selected and its data read), then described (``plan``: its levels, chunks, budgets and
predicted errors; state ``planned``), then counted from the task stream (``running``)
until it ends (``published`` or ``failed``, with the error and, for a charged run, the
command that resumes it).

A level's progress in a stage is counted in chunk equivalents: ``chunks * done /
planned`` over the stage's tasks for the level (Dask may fuse several chunks, or a
level's whole stage, into one task). Its ETA is its chunks left to reconstruct over
its throughput: chunks reconstructed per second since its first task started.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

__all__ = ["STAGES", "STATES", "ReleaseRecord", "budget_text", "budget_values", "is_ours"]

STAGES = ("measured", "reconstructed", "published")
"""The stages a level's chunks go through, in order."""

STATES = ("selecting", "planned", "running", "published", "failed")
"""A run's states, in order (``failed`` may follow any other)."""

_STAGE_OF = {
    "measure-reconstruct": ("measured", "reconstructed"),
    "measure": ("measured",),
    "reconstruct": ("reconstructed",),
    "answer": ("published",),
}
# the families of task keys dpdask's release graphs name (``<family>-<level>-<token>``,
# data stores ``store-counts-<token>``...), also inside a name Dask fused
_OURS = re.compile(
    r"(?:^|-)(?:measure|reconstruct|answer|aggregate|checkpoint|streamkey|nonnegative"
    r"|estimate|entries|ingest|synthesize|synthetic|adopt|store-(?:counts|spill|entries"
    r"|sparsify))-"
)


def is_ours(key: Any) -> bool:
    """Whether a task key is one of dpdask's (``measure-county-<token>``, ...)."""
    name = _key_name(key)
    return name is not None and _OURS.search(name) is not None


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


def _words_pattern(levels: list[dict[str, Any]]) -> tuple[dict[str, str], re.Pattern[str]]:
    by_word = {str(lv.get("word") or lv["level"]): lv["level"] for lv in levels}
    words = sorted(by_word, key=len, reverse=True)
    stages = "|".join(sorted(_STAGE_OF, key=len, reverse=True))
    alt = "|".join(re.escape(w) for w in words) or r"(?!x)x"
    return by_word, re.compile(rf"(?:^|-)({stages})-({alt})(?=-|$)")


class ReleaseRecord:
    """One run of a release: its plan and progress (kept by the plugin, plain data)."""

    def __init__(self, msg: Mapping[str, Any], now: float):
        self.release = str(msg.get("release"))
        self.run_id = str(msg.get("run_id"))
        self.client = msg.get("client")
        self.state = "selecting"
        self.step: str | None = msg.get("step") or "selecting strategy"
        self.announced = now
        self.updated = now
        self.started: float | None = None
        self.last_done: float | None = None
        self.finished: float | None = None
        self.error: str | None = None
        self.charged: bool | None = None
        self.resume: str | None = msg.get("resume")
        self.failed_keys: set[Any] = set()
        # (level, stage) -> planned / done task keys; level -> its first task's start
        self.planned: dict[tuple[str, str], set[Any]] = {}
        self.done: dict[tuple[str, str], set[Any]] = {}
        self.level_started: dict[str, float] = {}
        self.level_finished: dict[str, float] = {}
        self.plan: dict[str, Any] = dict(msg)
        self.levels: list[dict[str, Any]] = []
        self.by_word, self.pattern = _words_pattern(self.levels)
        self.not_converged: list[Any] = []
        self.ledger: Any = None
        self.ledger_as_of = "before this run's charge"
        if msg.get("event") == "plan":
            self.describe(msg, now)

    def describe(self, plan: Mapping[str, Any], now: float) -> None:
        """Take the run's plan (levels, chunks, budgets, errors, the ledger before)."""
        self.plan = {**self.plan, **plan}
        if plan.get("client") is not None:
            self.client = plan["client"]
        self.levels = [dict(lv) for lv in plan.get("levels", ())]
        self.by_word, self.pattern = _words_pattern(self.levels)
        self.not_converged = list(plan.get("not_converged") or [])
        self.ledger = plan.get("ledger_before")
        if self.state == "selecting":
            self.state, self.step = "planned", "charging the ledger"
        self.updated = now

    @property
    def ident(self) -> tuple[str, str]:
        return (self.release, self.run_id)

    def match(self, key: Any) -> set[tuple[str, str]]:
        """The (level, stage) pairs a task key belongs to (empty: not this release's)."""
        name = _key_name(key)
        if name is None:
            return set()
        out: set[tuple[str, str]] = set()
        for m in self.pattern.finditer(name):
            level = self.by_word[m.group(2)]
            out.update((level, stage) for stage in _STAGE_OF[m.group(1)])
        return out

    def task_started(self, pairs: set[tuple[str, str]], now: float) -> None:
        if self.started is None:
            self.started = now
        for level, _stage in pairs:
            self.level_started.setdefault(level, now)
        self.updated = now

    def task_done(self, key: Any, pairs: set[tuple[str, str]], now: float) -> None:
        self.task_started(pairs, now)
        for pair in pairs:
            self.done.setdefault(pair, set()).add(key)
            level, stage = pair
            if stage == "reconstructed" and self.done[pair] >= self.planned.get(pair, set()):
                self.level_finished.setdefault(level, now)
        self.last_done = now

    def task_failed(self, key: Any, now: float) -> None:
        self.failed_keys.add(key)
        self.updated = now

    def end(self, msg: Mapping[str, Any], now: float) -> None:
        """Take the run's end: ``published`` or ``failed`` (error, charged, resume)."""
        self.state = str(msg.get("state", "published"))
        self.step = None
        self.finished = self.finished or now
        self.updated = now
        for field in ("error", "charged", "resume"):
            if msg.get(field) is not None:
                setattr(self, field, msg[field])
        if msg.get("ledger") is not None:
            self.ledger = msg["ledger"]
            self.ledger_as_of = str(msg.get("ledger_as_of", "after the run"))
        if msg.get("not_converged") is not None:
            self.not_converged = list(msg["not_converged"])

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

    def eta(self, level: Mapping[str, Any], now: float) -> dict[str, Any]:
        """The level's throughput and time left (module notes); None where unknown."""
        name, chunks = level["level"], int(level.get("chunks", 0))
        started = self.level_started.get(name)
        done = self.chunks_done(level, "reconstructed")
        left = max(0.0, chunks - done)
        out: dict[str, Any] = {"started": started, "chunks_left": left,
                               "chunks_per_second": None, "seconds": None}  # fmt: skip
        if started is None:
            return out
        end = self.level_finished.get(name) or self.finished or now
        if done > 0 and end > started:
            out["chunks_per_second"] = done / (end - started)
        if left <= 1e-9:
            out["seconds"] = 0.0
        elif out["chunks_per_second"] and self.state not in ("failed", "published"):
            out["seconds"] = left / out["chunks_per_second"]
        return out

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
                    "eta": self.eta(lv, now),
                }
            )
        etas = [lv["eta"]["seconds"] for lv in levels]
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
            "step": self.step,
            "error": self.error,
            "charged": self.charged,
            "resume": self.resume,
            "erred_tasks": len(self.failed_keys),
            "workload": plan.get("workload"),
            "strategy": plan.get("strategy"),
            "reconstruct": plan.get("reconstruct"),
            "queries": plan.get("queries"),
            "announced": self.announced,
            "updated": self.updated,
            "started": self.started,
            "finished": self.finished,
            "elapsed": end - self.announced,
            "eta_seconds": max(etas) if etas and None not in etas else None,
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
