"""The scheduler's HTTP routes: ``/dpdask`` (a page) and ``/dpdask/json`` (its data).

The page is self-contained (no external scripts, styles or fonts: the scheduler may
have no internet) and fetches ``dpdask/json`` every second. The Dask dashboard's
page bar gets a ``Dpdask`` link to it.
"""

from __future__ import annotations

import json
import logging
import math
import weakref
from typing import Any

from distributed.http.utils import RequestHandler

from dpdask.dashboard._plugin import PLUGIN_NAME

log = logging.getLogger("dpdask.dashboard")

__all__ = ["PAGE", "JSONHandler", "PageHandler", "add_dashboard_link", "install_routes"]

_INSTALLED: weakref.WeakSet[Any] = weakref.WeakSet()


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as ``None`` (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class _Handler(RequestHandler):
    def _plugin(self) -> Any:
        plugins = getattr(self.server, "plugins", None) or {}
        return plugins.get(PLUGIN_NAME)


class JSONHandler(_Handler):
    """``GET /dpdask/json``: every release the plugin recorded, newest first."""

    def get(self) -> None:
        plugin = self._plugin()
        data = (
            plugin.snapshot()
            if plugin is not None
            else {"version": 1, "releases": [], "error": "the dpdask plugin is not registered"}
        )
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(json_safe(data)))


class PageHandler(_Handler):
    """``GET /dpdask``: the page (:data:`PAGE`), saying from the start whether a release
    is running (the script then shows every run)."""

    def get(self) -> None:
        plugin = self._plugin()
        runs = [] if plugin is None else [r for r in plugin.releases.values() if not r.finished]
        first = (
            f"{len(runs)} release run(s) in progress; loading…" if runs else "No release running."
        )
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(PAGE.replace(_FIRST, first))


_FIRST = "<!--first-->"


def _prefixes(scheduler: Any) -> list[str]:
    """``/`` and the dashboard's prefix, if it has one (``--dashboard-prefix``)."""
    out = ["/"]
    for app in getattr(scheduler.http_application, "applications", ()):
        prefix = getattr(app, "prefix", None)
        if isinstance(prefix, str) and prefix.strip("/"):
            out.append("/" + prefix.strip("/") + "/")
    return list(dict.fromkeys(out))


def install_routes(scheduler: Any) -> bool:
    """Add ``/dpdask`` and ``/dpdask/json`` to the scheduler's HTTP server, once.

    Parameters
    ----------
    scheduler : distributed.Scheduler
        A scheduler with its HTTP server started (as it is when plugins start).

    Returns
    -------
    bool
        Whether the routes are there (False: the scheduler serves no HTTP).
    """
    app = getattr(scheduler, "http_application", None)
    if app is None:
        log.info("dpdask dashboard: the scheduler has no HTTP server; no /dpdask page")
        return False
    if scheduler in _INSTALLED:
        return True
    kwargs = {"dask_server": scheduler}
    routes = []
    for prefix in _prefixes(scheduler):
        routes += [
            (rf"{prefix}dpdask", PageHandler, kwargs),
            (rf"{prefix}dpdask/json", JSONHandler, kwargs),
        ]
    app.add_handlers(r".*", routes)
    _INSTALLED.add(scheduler)
    return True


def add_dashboard_link(scheduler: Any) -> None:
    """Add ``dpdask`` to the Dask dashboard's page bar (beside Status, Workers, ...).

    The bar is rendered from the page list that ``distributed.dashboard.scheduler``
    memoizes per scheduler; without bokeh there is no dashboard and nothing to do.
    """
    try:
        from distributed.dashboard.scheduler import template_variables

        pages = template_variables(scheduler)["pages"]
    except Exception:  # no bokeh, or another dashboard layout: the page is still served
        log.debug("dpdask dashboard: no Dask dashboard page bar to link from", exc_info=True)
        return
    if isinstance(pages, list) and "dpdask" not in pages:
        pages.append("dpdask")


PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dpdask releases</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
         margin: 0; color: #1f2328; background: #f6f8fa; font-size: 14px; }
  header { background: #1f2937; color: #fff; padding: 10px 18px; display: flex;
           align-items: baseline; gap: 18px; }
  header h1 { font-size: 18px; margin: 0; }
  header a { color: #93c5fd; }
  #status { margin-left: auto; font-size: 12px; color: #d1d5db; }
  main { padding: 12px 18px; }
  section.release { background: #fff; border: 1px solid #d0d7de; border-radius: 6px;
                    padding: 12px 16px; margin-bottom: 16px; overflow-x: auto; }
  section.release h2 { font-size: 16px; margin: 0 0 6px 0; }
  .meta { color: #57606a; margin-bottom: 8px; }
  .meta span { margin-right: 14px; white-space: nowrap; display: inline-block; }
  .state { font-weight: 600; padding: 1px 8px; border-radius: 10px; color: #fff; }
  .state-selecting { background: #9333ea; }
  .state-planned { background: #6b7280; } .state-running { background: #2563eb; }
  .step { color: #57606a; margin-left: 8px; font-size: 13px; font-weight: 400; }
  .resume { background: #f3f4f6; padding: 6px 10px; border-radius: 4px; margin: 4px 0;
            font-family: ui-monospace, monospace; display: inline-block; }
  .state-published { background: #16a34a; } .state-failed { background: #dc2626; }
  table { border-collapse: collapse; margin: 6px 0 10px 0; }
  th, td { border-bottom: 1px solid #e5e7eb; padding: 4px 10px; text-align: left;
           vertical-align: middle; }
  th { background: #f3f4f6; font-weight: 600; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  td.nowrap, td.progress { white-space: nowrap; }
  .bar { position: relative; width: 90px; height: 16px; background: #e5e7eb;
         border-radius: 3px; overflow: hidden; display: inline-block; vertical-align: middle; }
  .bar > div { height: 100%; }
  .bar.measured > div { background: #60a5fa; }
  .bar.reconstructed > div { background: #a78bfa; }
  .bar.published > div { background: #34d399; }
  .bar.budget { width: 260px; } .bar.budget > div { background: #f59e0b; }
  .figure { font-size: 12px; margin-left: 6px; font-variant-numeric: tabular-nums; }
  h3 { font-size: 14px; margin: 10px 0 2px 0; }
  .none { color: #57606a; }
  .warn { color: #b45309; }
</style>
</head>
<body>
<header>
  <h1>dpdask releases</h1>
  <a href="status">Dask dashboard</a>
  <a href="dpdask/json">JSON</a>
  <a href="metrics">metrics</a>
  <span id="status">loading…</span>
</header>
<main id="releases"><p class="none"><!--first--></p></main>
<script>
"use strict";
const STAGES = ["measured", "reconstructed", "published"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.appendChild(typeof c === "string" || typeof c === "number"
      ? document.createTextNode(String(c)) : c);
  }
  return node;
}

function num(x, digits) {
  if (x === null || x === undefined) return "–";
  if (Math.abs(x) >= 1e5) return x.toExponential(2);
  return x.toFixed(digits === undefined ? 3 : digits);
}

function bar(kind, fraction, label) {
  const f = Math.max(0, Math.min(1, fraction || 0));
  const inner = el("div", {style: "width:" + (100 * f).toFixed(1) + "%"});
  return el("span", {},
    el("span", {class: "bar " + kind, title: label}, inner),
    el("span", {class: "figure"}, label));
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  return s < 120 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min";
}

function eta(e, state) {
  if (e && e.seconds === 0) return "done";
  if (state === "failed") return "stopped";
  if (!e || e.started === null || e.started === undefined) return "not started";
  if (e.seconds === null || e.seconds === undefined) return "estimating…";
  return seconds(e.seconds) + " (" + num(e.chunks_per_second, 2) + " chunks/s)";
}

function releaseEta(r) {
  if (r.state === "published") return "done";
  if (r.state !== "running") return "–";
  if (r.eta_seconds === null) return "estimating…";
  return r.eta_seconds === 0 ? "done; writing the outputs" : seconds(r.eta_seconds);
}

function failure(r) {
  const box = el("div", {class: "failure"},
    el("div", {class: "warn error"}, "error: " + r.error));
  if (r.resume) {
    box.appendChild(el("div", {}, r.charged ? "The run is charged. Resume it (same noise, " +
      "no new charge) with:" : "Whether the run was charged is unknown; resume it with:"));
    box.appendChild(el("code", {class: "resume"}, r.resume));
  } else if (r.charged === false) {
    box.appendChild(el("div", {}, "The run was not charged; nothing was spent."));
  }
  return box;
}

function budgetRow(what, name, entry) {
  if (!entry) return null;
  const f = entry.fraction_spent;
  return el("tr", {class: "budget-row"},
    el("td", {}, what), el("td", {}, name),
    el("td", {}, entry.total_text), el("td", {}, entry.spent_text),
    el("td", {}, entry.remaining_text),
    el("td", {}, bar("budget", f, f === null || f === undefined ? ""
      : (100 * f).toFixed(0) + "% spent")));
}

function release(r) {
  const sec = el("section", {class: "release", "data-release": r.release});
  sec.appendChild(el("h2", {}, "Release " + r.release + " ",
    el("span", {class: "state state-" + r.state}, r.state),
    r.step ? el("span", {class: "step"}, r.step + "…") : null));
  sec.appendChild(el("div", {class: "meta"},
    el("span", {}, "run " + r.run_id),
    el("span", {}, "dataset " + (r.dataset || "–")),
    el("span", {}, "workload " + (r.workload || "–") +
      (r.queries ? " (" + r.queries + " queries)" : "")),
    el("span", {}, "strategy " + (r.strategy || "–")),
    el("span", {}, "reconstruct " + (r.reconstruct || "–")),
    el("span", {}, "elapsed " + seconds(r.elapsed)),
    el("span", {class: "eta"}, "reconstruction ETA " + releaseEta(r)),
    el("span", {class: "rate"}, "cells/s " + num(r.cells_per_second, 0))));
  if (r.state === "failed" || r.error) sec.appendChild(failure(r));
  if (r.erred_tasks) sec.appendChild(el("div", {class: "warn"}, r.erred_tasks + " task(s) erred"));

  sec.appendChild(el("h3", {}, "Budget (" + r.budget_text + "; ledger " + r.ledger.as_of + ")"));
  const bt = el("table", {class: "budget"},
    el("tr", {}, el("th", {}, ""), el("th", {}, "name"), el("th", {}, "total"),
      el("th", {}, "spent"), el("th", {}, "left"), el("th", {}, "")));
  const dsRow = r.ledger.dataset ? budgetRow("dataset", r.dataset, r.ledger.dataset)
    : r.dataset ? el("tr", {class: "budget-row"}, el("td", {}, "dataset"),
        el("td", {}, r.dataset), el("td", {colspan: 4, class: "none"},
          "no lifetime total in the ledger")) : null;
  const relRow = budgetRow("release", r.release, r.ledger.release);
  if (dsRow) bt.appendChild(dsRow);
  if (relRow) bt.appendChild(relRow);
  if (!dsRow && !relRow) bt.appendChild(el("tr", {}, el("td", {colspan: 6, class: "none"},
    "no ledger balances reported")));
  sec.appendChild(bt);

  if (r.state === "selecting") {
    sec.appendChild(el("p", {class: "none selecting"}, "Levels are shown once the " +
      "strategy is selected and the data read (now: " + (r.step || "starting") + ")."));
    return sec;
  }
  sec.appendChild(el("h3", {}, "Levels (predicted errors; chunks done per stage; ETA " +
    "from chunks reconstructed per second)"));
  const lt = el("table", {class: "levels"});
  lt.appendChild(el("tr", {}, ...["level", "units", "chunks", "budget", "noise scale",
    "RMSE / query", "max stddev", ...STAGES, "ETA"].map(h => el("th", {}, h))));
  for (const lv of r.levels) {
    const row = el("tr", {class: "level", "data-level": lv.level},
      el("td", {}, lv.level), el("td", {class: "num"}, lv.units),
      el("td", {class: "num"}, lv.chunks), el("td", {class: "nowrap"}, lv.budget_text),
      el("td", {class: "num"}, num(lv.noise_scale)), el("td", {class: "num"}, num(lv.rmse)),
      el("td", {class: "num"}, num(lv.max_stddev)));
    for (const s of STAGES) {
      const p = lv.progress[s];
      row.appendChild(el("td", {class: "progress " + s},
        bar(s, p.fraction, p.chunks + "/" + p.of + " chunks")));
    }
    row.appendChild(el("td", {class: "eta nowrap"}, eta(lv.eta, r.state)));
    lt.appendChild(row);
  }
  sec.appendChild(lt);

  if (r.tables && r.tables.length) {
    sec.appendChild(el("h3", {}, "Predicted RMSE per table and level"));
    const levels = r.levels.map(lv => lv.level);
    const tt = el("table", {class: "tables"},
      el("tr", {}, el("th", {}, "table"), el("th", {}, "queries"),
        ...levels.map(l => el("th", {}, l))));
    for (const t of r.tables) {
      tt.appendChild(el("tr", {},
        el("td", {}, t.name + (t.kind === "table" ? "" : " (workload part)")),
        el("td", {class: "num"}, t.queries),
        ...levels.map(l => el("td", {class: "num"}, num(t.rmse[l])))));
    }
    sec.appendChild(tt);
  }

  sec.appendChild(el("h3", {}, "Chunks not converged"));
  if (!r.not_converged || !r.not_converged.length) {
    sec.appendChild(el("div", {class: "none not-converged"},
      r.state === "published" ? "none" : "none reported (known when the run ends)"));
  } else {
    const nt = el("table", {class: "not-converged"},
      el("tr", {}, ...["level", "chunk", "method", "iterations", "residual", "tolerance"]
        .map(h => el("th", {}, h))));
    for (const n of r.not_converged) {
      nt.appendChild(el("tr", {}, el("td", {}, n.level), el("td", {class: "num"}, n.chunk),
        el("td", {}, n.method || "–"), el("td", {class: "num"}, n.iterations),
        el("td", {class: "num"}, num(n.residual, 6)),
        el("td", {class: "num"}, num(n.tolerance, 6))));
    }
    sec.appendChild(nt);
  }
  return sec;
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const response = await fetch("dpdask/json", {cache: "no-store"});
    const data = await response.json();
    const main = document.getElementById("releases");
    main.replaceChildren();
    const running = data.releases.filter(r => r.finished === null).length;
    if (!running) {
      main.appendChild(el("p", {class: "none"}, data.error || ("No release running." +
        (data.releases.length ? " The last runs:" : ""))));
    }
    for (const r of data.releases) main.appendChild(release(r));
    status.textContent = (data.scheduler || "") + " · " + running + " running · updated " +
      new Date(1000 * data.time).toLocaleTimeString();
  } catch (err) {
    status.textContent = "cannot reach the scheduler: " + err;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
"""
