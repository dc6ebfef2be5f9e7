"""Prometheus metrics of the releases, served by the scheduler's ``/metrics``.

Distributed's ``/metrics`` handler writes ``prometheus_client.REGISTRY``; the
collector here is registered there once per process and reports the releases of
every live :class:`~dpdask.dashboard.DashboardPlugin` in it (one per scheduler).

Metrics (labels in braces):

``dpdask_release_state{release,run_id,state}``
    1 for the run's state now, 0 for the others (``selecting``, ``planned``,
    ``running``, ``published``, ``failed``): alert on ``state="failed"`` being 1.
``dpdask_release_started_timestamp_seconds{release,run_id}``
    When the run started (was announced), in seconds since the epoch.
``dpdask_release_updated_timestamp_seconds{release,run_id}``
    When the run last changed (an event, a task submitted, started, done or failed):
    a running release whose value stops moving is stuck.
``dpdask_failed_tasks_total{release,run_id}``
    The run's tasks (keys dpdask names, ``measure-county-...``) that erred where they
    ran (retried tasks count once; tasks erred only because a dependency did, not).
``dpdask_level_eta_seconds{release,run_id,level}``
    Seconds left to reconstruct the level's chunks at its throughput so far (absent
    until a chunk is done).
``dpdask_chunks_planned{release,run_id,level}``
    The level's chunks.
``dpdask_chunks_done_total{release,run_id,level,stage}``
    Chunks done in each stage (``measured``, ``reconstructed``, ``published``).
``dpdask_cells_done_total{release,run_id}``
    Cells (units x data cells) reconstructed.
``dpdask_cells_per_second{release,run_id}``
    Cells reconstructed per second since the release's first task started.
``dpdask_predicted_rmse{release,run_id,level}``
    The predicted root mean squared error of the level's workload answers.
``dpdask_chunks_not_converged{release,run_id}``
    Chunks whose iterative reconstruction did not converge (known at the end).
``dpdask_budget_total``, ``dpdask_budget_spent``, ``dpdask_budget_remaining``
    ``{scope,name,parameter}``: per dataset (``scope="dataset"``) and release
    (``scope="release"``), each budget parameter (``rho``, ``epsilon``, ``delta``) as the
    ledger last reported it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("dpdask.dashboard")

__all__ = ["DpdaskCollector", "register_collector"]

_REGISTERED: list[Any] = []


class DpdaskCollector:
    """A ``prometheus_client`` collector over the live plugins' releases."""

    def collect(self) -> Iterator[Any]:
        """Yield every metric family (module notes), empty when nothing has run."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from dpdask.dashboard._plugin import LIVE
        from dpdask.dashboard._record import STATES, budget_values

        rel_labels = ["release", "run_id"]
        state = GaugeMetricFamily(
            "dpdask_release_state", "1 for the run's state now, 0 for the others",
            labels=[*rel_labels, "state"],
        )  # fmt: skip
        started = GaugeMetricFamily(
            "dpdask_release_started_timestamp_seconds", "When the run started (Unix time)",
            labels=rel_labels,
        )  # fmt: skip
        updated = GaugeMetricFamily(
            "dpdask_release_updated_timestamp_seconds", "When the run last changed (Unix time)",
            labels=rel_labels,
        )  # fmt: skip
        erred = CounterMetricFamily(
            "dpdask_failed_tasks", "The run's dpdask tasks that erred", labels=rel_labels
        )
        eta = GaugeMetricFamily(
            "dpdask_level_eta_seconds", "Seconds left to reconstruct a level's chunks",
            labels=[*rel_labels, "level"],
        )  # fmt: skip
        planned = GaugeMetricFamily(
            "dpdask_chunks_planned", "Chunks of each level of a release",
            labels=[*rel_labels, "level"],
        )  # fmt: skip
        done = CounterMetricFamily(
            "dpdask_chunks_done", "Chunks of each level done, per stage",
            labels=[*rel_labels, "level", "stage"],
        )  # fmt: skip
        cells = CounterMetricFamily(
            "dpdask_cells_done", "Cells (units x data cells) reconstructed", labels=rel_labels
        )
        rate = GaugeMetricFamily(
            "dpdask_cells_per_second", "Cells reconstructed per second", labels=rel_labels
        )
        rmse = GaugeMetricFamily(
            "dpdask_predicted_rmse", "Predicted RMSE of a level's workload answers",
            labels=[*rel_labels, "level"],
        )  # fmt: skip
        failed = GaugeMetricFamily(
            "dpdask_chunks_not_converged", "Chunks whose reconstruction did not converge",
            labels=rel_labels,
        )  # fmt: skip
        budget_labels = ["scope", "name", "parameter"]
        total = GaugeMetricFamily(
            "dpdask_budget_total", "Privacy budget of a dataset or release", labels=budget_labels
        )
        spent = GaugeMetricFamily(
            "dpdask_budget_spent", "Privacy budget spent", labels=budget_labels
        )
        left = GaugeMetricFamily(
            "dpdask_budget_remaining", "Privacy budget left", labels=budget_labels
        )
        seen: set[tuple[str, str]] = set()
        balances: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        for plugin in list(LIVE):
            for r in plugin.snapshot()["releases"]:
                ident = (r["release"], r["run_id"])
                if ident in seen:
                    continue
                seen.add(ident)
                labels = [r["release"], r["run_id"]]
                for s in STATES:
                    state.add_metric([*labels, s], float(r["state"] == s))
                started.add_metric(labels, float(r["announced"]))
                updated.add_metric(labels, float(r["updated"]))
                erred.add_metric(labels, float(r["erred_tasks"]))
                for lv in r["levels"]:
                    planned.add_metric([*labels, lv["level"]], float(lv.get("chunks", 0)))
                    for stage, p in lv["progress"].items():
                        done.add_metric(
                            [*labels, lv["level"], stage], float(p["fraction"] * p["of"])
                        )
                    if lv["eta"]["seconds"] is not None:
                        eta.add_metric([*labels, lv["level"]], float(lv["eta"]["seconds"]))
                    if lv.get("rmse") is not None:
                        rmse.add_metric([*labels, lv["level"]], float(lv["rmse"]))
                cells.add_metric(labels, float(r["cells_done"]))
                rate.add_metric(labels, float(r["cells_per_second"]))
                failed.add_metric(labels, float(len(r["not_converged"])))
                # the newest report of each dataset's and release's balance
                when = r["finished"] or r["started"] or r["announced"]
                for scope, name in (("dataset", r["dataset"]), ("release", r["release"])):
                    entry = r["ledger"].get(scope)
                    if entry is None or name is None:
                        continue
                    old = balances.get((scope, name))
                    if old is None or old[0] <= when:
                        balances[(scope, name)] = (when, entry)
        for (scope, name), (_when, entry) in sorted(balances.items()):
            for family, field in ((total, "total"), (spent, "spent"), (left, "remaining")):
                for parameter, value in budget_values(entry.get(field)).items():
                    family.add_metric([scope, name, parameter], value)
        yield from (state, started, updated, erred, eta, planned, done, cells, rate, rmse)
        yield from (failed, total, spent, left)


def register_collector() -> bool:
    """Register :class:`DpdaskCollector` in ``prometheus_client.REGISTRY``, once.

    Returns
    -------
    bool
        False if ``prometheus_client`` is not installed (``/metrics`` then says so).
    """
    if _REGISTERED:
        return True
    try:
        import prometheus_client
    except ImportError:
        log.info("dpdask dashboard: prometheus_client is not installed; no dpdask metrics")
        return False
    collector = DpdaskCollector()
    prometheus_client.REGISTRY.register(collector)
    _REGISTERED.append(collector)
    return True
