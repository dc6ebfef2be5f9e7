"""The release dashboard: a scheduler plugin, its page, its JSON and its metrics.

The plugin (:class:`DashboardPlugin`) records, per run of a release, from its start:
its state (``selecting``, ``planned``, ``running``, ``published``, ``failed``) and
step; the levels and their chunks planned, measured, reconstructed and published,
with an ETA per level from its chunk throughput; the budget spent and left per
dataset and release; the predicted error per level and per table; the chunks that did
not converge; its failed tasks; on failure, its error and the command that resumes
it. The scheduler's HTTP server (the Dask dashboard's) then serves

``/dpdask``
    A page showing them, refreshed every second (linked from the Dask dashboard's
    page bar as "Dpdask"); "No release running" when none is.
``/dpdask/json``
    The same data as JSON (``{"version": 1, "releases": [...]}``, newest first); the
    ledger's path relative to the spec's folder, never absolute.
``/metrics``
    Prometheus metrics ``dpdask_*`` beside Dask's own (:mod:`dpdask.dashboard._prometheus`).

``dpdask run`` registers the plugin on its scheduler before its checks and reports
the run from then on (:class:`RunTracker`; :func:`track` shows a release built by
hand); a standing scheduler can load it at start::

    dask scheduler --preload dpdask.dashboard
"""

from __future__ import annotations

from typing import Any

from dpdask.dashboard._client import (
    RunTracker,
    dashboard_url,
    plan_event,
    register,
    rmse_groups,
    shown_path,
    track,
)
from dpdask.dashboard._page import json_safe
from dpdask.dashboard._plugin import PLUGIN_NAME, STAGES, STATES, TOPIC, DashboardPlugin
from dpdask.dashboard._record import budget_text, budget_values

__all__ = [
    "PLUGIN_NAME",
    "STAGES",
    "STATES",
    "TOPIC",
    "DashboardPlugin",
    "RunTracker",
    "budget_text",
    "budget_values",
    "dashboard_url",
    "dask_setup",
    "json_safe",
    "plan_event",
    "register",
    "rmse_groups",
    "shown_path",
    "track",
]


def dask_setup(scheduler: Any) -> None:
    """Preload hook (``dask scheduler --preload dpdask.dashboard``): add the plugin.

    The scheduler starts its plugins right after its preloads, which installs the
    routes and metrics (:meth:`DashboardPlugin.start`).

    Parameters
    ----------
    scheduler : distributed.Scheduler
    """
    scheduler.add_plugin(DashboardPlugin(), idempotent=True)
