"""The report's page: one HTML file, its styles, plots (``data:`` URIs) and data inline."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from dpdask.report import _plots

__all__ = ["render"]

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 0; color: #1f2328; background: #f6f8fa; font-size: 14px; }
header { background: #1f2937; color: #fff; padding: 12px 22px; }
header h1 { font-size: 20px; margin: 0 0 4px 0; }
header .sub { color: #d1d5db; font-size: 13px; }
nav { padding: 6px 22px; background: #e5e7eb; font-size: 13px; }
nav a { margin-right: 14px; color: #1d4ed8; text-decoration: none; }
main { padding: 10px 22px 30px 22px; max-width: 1200px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 6px;
          padding: 10px 16px 14px 16px; margin: 14px 0; overflow-x: auto; }
h2 { font-size: 17px; margin: 2px 0 8px 0; }
h3 { font-size: 14px; margin: 12px 0 4px 0; }
table { border-collapse: collapse; margin: 6px 0 10px 0; }
th, td { border-bottom: 1px solid #e5e7eb; padding: 3px 10px; text-align: left;
         vertical-align: top; }
th { background: #f3f4f6; font-weight: 600; }
table.kv th { background: none; font-weight: 600; color: #57606a; width: 12em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.mono, span.mono { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; }
img.plot { max-width: 100%; height: auto; display: block; margin: 8px 0; }
.note { color: #57606a; font-size: 13px; }
.ok { color: #15803d; font-weight: 600; }
.bad { color: #b91c1c; font-weight: 600; }
.warn { color: #b45309; }
"""


def _num(x: Any, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    try:
        return f"{float(x):.{digits}g}"
    except (TypeError, ValueError):
        return escape(str(x))


def _pct(x: Any) -> str:
    return "–" if x is None else f"{100 * float(x):.1f}%"


def _text(x: Any) -> str:
    return "–" if x is None or x == "" else escape(str(x))


def _table(
    head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "", num: Sequence[int] = ()
) -> str:
    """An HTML table; cells are HTML already (escape text before); columns ``num`` right."""
    out = [f'<table class="{cls}">' if cls else "<table>", "<tr>"]
    out += [f"<th>{escape(h)}</th>" for h in head]
    out.append("</tr>")
    for row in rows:
        cells = [
            f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>" for i, c in enumerate(row)
        ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _kv(pairs: Iterable[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in pairs)
    return f'<table class="kv">{rows}</table>'


def _img(uri: str | None, alt: str) -> str:
    return "" if uri is None else f'<img class="plot" alt="{escape(alt)}" src="{uri}">'


def _yes(value: bool | None, yes: str, no: str) -> str:
    if value is None:
        return '<span class="note">not checked</span>'
    return (
        f'<span class="ok">{escape(yes)}</span>'
        if value
        else f'<span class="bad">{escape(no)}</span>'
    )


def _summary(data: dict[str, Any]) -> str:
    s = data["summary"]
    domain = " × ".join(f"{k} {v}" for k, v in s["domain"].items())
    flags = []
    if s.get("test_mode"):
        flags.append('<span class="bad">test mode</span>')
    if s.get("noise") is False:
        flags.append('<span class="bad">published without noise</span>')
    return _kv(
        [
            ("release", _text(s["release"])),
            ("run", f'<span class="mono">{_text(s["run_id"])}</span>'),
            ("dataset", _text(s["dataset"])),
            ("source", _text(s["source"])),
            ("published", _text(s["created"])),
            ("output", f'<span class="mono">{_text(s["path"])}</span>'),
            ("format", _text(s["format"])),
            ("written by", f"dpdask {_text(s['release_dpdask_version'])}"),
            ("domain", f"{escape(domain)} ({_num(_cells(s['domain']))} cells)"),
            ("reconstruction", _text(s["reconstruct"])),
            ("report", f"dpdask {_text(s['report_dpdask_version'])}, {_text(s['report_created'])}"),
            *([("flags", " ".join(flags))] if flags else []),
        ]
    )


def _cells(domain: dict[str, int]) -> int:
    n = 1
    for v in domain.values():
        n *= int(v)
    return n


def _record(rec: Any, keys: Sequence[str]) -> str:
    if not isinstance(rec, dict):
        return _text(rec)
    if "levels" in rec and isinstance(rec["levels"], dict):
        return "<br>".join(
            f"<b>{escape(str(lv))}</b>: {_record(r, keys)}" for lv, r in rec["levels"].items()
        )
    parts = [f"{escape(k)} <b>{_text(rec.get(k))}</b>" for k in keys if rec.get(k) is not None]
    return ", ".join(parts)


def _plan(data: dict[str, Any]) -> str:
    p = data["plan"]
    workload = p.get("workload") or {}
    parts = ""
    if isinstance(workload, dict) and workload.get("parts"):
        parts = "; parts " + ", ".join(
            f"{escape(str(q['name']))} ({q['rows']})" for q in workload["parts"]
        )
    head = _kv(
        [
            ("budget", escape(p["budget_text"])),
            ("workload", _record(workload, ("name", "queries", "cells")) + parts),
            ("strategy", _record(p.get("strategy"), ("template", "mechanism", "rows",
                                                    "measured_rows", "operator"))),
            ("reconstruction", _text(p.get("reconstruct"))),
        ]
    )  # fmt: skip
    levels = _table(
        ["level", "units", "chunks", "budget", "share", "mechanism", "noise scale", "queries",
         "RMSE / query", "max std. dev."],
        ([escape(str(lv["level"])), _num(lv["units"]), _num(lv["chunks"]),
          escape(lv["budget_text"]), _pct(lv["budget_share"]), _text(lv["mechanism"]),
          _num(lv["noise_scale"]), _num(lv["queries"]), _num(lv["rmse"]),
          _num(lv["max_stddev"])] for lv in p["levels"]),
        cls="levels", num=(1, 2, 4, 6, 7, 8, 9),
    )  # fmt: skip
    charges = _table(
        ["level", "measurement", "mechanism", "sensitivity", "noise scale", "charged"],
        ([_text(c.get("level")), _text(c.get("measurement")), _text(c.get("mechanism")),
          _num(c.get("sensitivity")), _num(c.get("noise_scale")), escape(c["privacy_text"])]
         for c in p["charges"]),
        cls="charges", num=(3, 4),
    )  # fmt: skip
    return (
        head
        + "<h3>Levels</h3>"
        + '<p class="note">RMSE / query and max std. dev.: the plan\'s predicted error of '
        "the workload's queries at each level (persons).</p>"
        + levels
        + _img(_plots.budget_plot(p), "budget split and noise per level")
        + "<h3>Charges</h3>"
        + charges
    )


def _ledger(data: dict[str, Any]) -> str:
    led = data["ledger"]
    rec = led["recorded"]
    out = ["<h3>As recorded in the release</h3>"]
    out.append(
        _kv(
            [
                ("ledger", f'<span class="mono">{_text(rec.get("path"))}</span>'),
                ("ledger id", f'<span class="mono">{_text(rec.get("id"))}</span>'),
                ("head at publication", f'<span class="mono">{_text(rec.get("head"))}</span>'),
                ("dataset", _text(rec.get("dataset"))),
                ("spent (release)", escape(led["recorded_spent_text"])),
                ("left (release)", escape(led["recorded_remaining_text"])),
            ]
        )
    )
    out.append("<h3>The ledger now</h3>")
    if not led["reachable"]:
        out.append(f'<p class="warn">{_text(led["error"])}</p>')
        return "\n".join(out)
    pairs = [
        ("ledger", f'<span class="mono">{_text(led["path"])}</span>'),
        ("hash chain", _yes(led["verifies"], "verifies", "does not verify")),
    ]
    if led["verifies"]:
        pairs += [
            ("same ledger", _yes(led["same_ledger"], "yes", "no: another ledger id")),
            ("release's head", _yes(led["head_in_chain"], "in the chain",
                                    "not in the chain (rewritten or rolled back)")),
            ("current head", f'<span class="mono">{_text(led["head"])}</span>'),
        ]  # fmt: skip
    out.append(_kv(pairs))
    if led["error"]:
        out.append(f'<p class="bad">{escape(led["error"])}</p>')
    rows = []
    if led.get("dataset"):
        d = led["dataset"]
        rows.append(["dataset", _text(data["summary"]["dataset"]), escape(d["total_text"]),
                     escape(d["spent_text"]), escape(d["remaining_text"])])  # fmt: skip
    if led.get("release"):
        r = led["release"]
        rows.append(["release", _text(data["summary"]["release"]), escape(r["budget_text"]),
                     escape(r["spent_text"]), escape(r["remaining_text"])])  # fmt: skip
    if rows:
        out.append(_table(["", "name", "budget", "spent", "left"], rows, cls="budget"))
    runs = (led.get("release") or {}).get("runs") or []
    if runs:
        out.append("<h3>Runs of the release</h3>")
        this = data["summary"]["run_id"]
        out.append(
            _table(
                ["run", "state", "charges", "output"],
                ([f'<span class="mono">{_text(r.get("run_id"))}</span>'
                  + (" (this release)" if r.get("run_id") == this else ""),
                  _text(r.get("state")), _num(r.get("charges")), _text(r.get("output"))]
                 for r in runs),
                cls="runs", num=(2,),
            )
        )  # fmt: skip
    return "\n".join(out)


def _predicted(data: dict[str, Any]) -> str:
    tables, levels = data["tables"], data["levels"]
    if not tables:
        return '<p class="note">The release has no per-query variances.</p>'
    names = list(dict.fromkeys((r["table"], r["kind"]) for r in tables))
    cell = {(r["level"], r["table"]): r for r in tables}

    def show(r: dict[str, Any] | None) -> str:
        if r is None:
            return "–"
        return (f"{_num(r['rmse'], 3)} <span class=\"note\">({_num(r['sd_min'], 3)}–"
                f"{_num(r['sd_max'], 3)})</span>")  # fmt: skip

    queries = {(r["table"], r["kind"]): r["queries"] for r in tables}
    body = _table(
        ["table", "queries", *levels],
        ([escape(t) + (" <span class=\"note\">(workload part)</span>" if k == "part" else ""),
          _num(queries[t, k]), *(show(cell.get((lv, t))) for lv in levels)] for t, k in names),
        cls="tables", num=tuple(range(1, len(levels) + 2)),
    )  # fmt: skip
    return (
        '<p class="note">Predicted root mean squared error (persons) of each table\'s '
        "queries, from the variances the release publishes; in brackets and as whiskers, "
        "the smallest and largest standard deviation of a query of the table. The 90% "
        "margin of error of a query is 1.645 standard deviations.</p>"
        + _img(_plots.predicted_plot(tables, levels), "predicted RMSE per table and level")
        + body
    )


def _realised(data: dict[str, Any]) -> str:
    real = data["realised"]
    if real is None:
        return (
            '<p class="note">No truth given: run <span class="mono">dpdask report OUT.zarr '
            "--truth STORE</span> with a data store of the true counts to compare.</p>"
        )
    out = [
        f'<p class="note">Truth: <span class="mono">{escape(real["truth"])}</span>. Realised '
        "RMSE: root mean squared difference between the published answers and the true "
        "answers of each table at each level; within MOE: the share of published answers "
        "within their 90% margin of error of the truth (about 90% if the errors are as "
        "predicted).</p>",
        _img(_plots.realised_plot(real, data["tables"]), "realised versus predicted error"),
    ]
    compared = {(w.get("release"), w.get("other")) for w in (real.get("workloads") or {}).values()}
    for own, other in sorted(compared, key=str):
        text = (
            f'the release\'s workload, rebuilt as <span class="mono">{escape(own)}</span>'
            if own
            else "the release's workload was not rebuilt (histogram cells only)"
            if own is None
            else "the release's workload, as given"
        )
        if other:
            text += (f'; <span class="mono">{escape(other)}</span> answered from the '
                     "published estimates")  # fmt: skip
        out.append(f'<p class="note">Compared: {text}.</p>')
    for lv in real["levels"]:
        units = _num(lv["units"]) + (" units" if lv["units"] != 1 else " unit")
        out.append(f"<h3>{escape(lv['level'])} ({units})</h3>")
        if lv["tables"]:
            out.append(
                _table(
                    ["table", "queries", "predicted RMSE", "realised RMSE", "realised / predicted",
                     "max |error|", "within 90% MOE"],
                    ([escape(r["table"]) + (' <span class="note">(from the estimates)</span>'
                                            if r["kind"] == "derived" else ""),
                      _num(r["queries"]), _num(r["predicted_rmse"]),
                      _num(r["realised_rmse"]),
                      _num(None if not r["predicted_rmse"] or r["realised_rmse"] is None
                           else r["realised_rmse"] / r["predicted_rmse"], 3),
                      _num(r["max_abs_error"]), _pct(r["within_moe90"])] for r in lv["tables"]),
                    cls="realised", num=(1, 2, 3, 4, 5, 6),
                )
            )  # fmt: skip
        out.append(
            f'<p class="note">Histogram cells: realised RMSE {_num(lv["cells_rmse"])}, '
            f"max |error| {_num(lv['cells_max_abs_error'])}.</p>"
        )
    return "\n".join(out)


def _uncertainty(data: dict[str, Any]) -> str:
    """What each level's variances are of; a top-down level's simulated RMSE by query
    group and its unbiased least-squares answers, labelled as published."""
    levels = data.get("uncertainty") or {}
    if not levels:
        return '<p class="note">The release says nothing about its variances.</p>'
    rows = []
    for lv, u in levels.items():
        sim = u.get("simulated_rmse") or {}
        unb = u.get("unbiased")
        groups = ", ".join(
            f"{escape(g)} {_num(v, 3)}" for g, v in (sim.get("groups") or {}).items()
        )
        rows.append([
            escape(lv), _text(u.get("uncertainty_of")),
            _yes(u.get("describes_published"), "yes", "no: see the next columns"),
            (f"{_text(sim.get('label'))}: {groups}" if groups else _text(sim.get("label"))),
            "–" if unb is None else (
                f"{escape(unb['label'])}: {_num(unb['queries'])} queries"
                + (f"; skipped {escape(', '.join(unb['skipped_groups']))}"
                   if unb["skipped_groups"] else "")
            ),
        ])  # fmt: skip
    return (
        '<p class="note">What the published variances and margins of error are the '
        "variances of (the release's labels). Where they do not describe the published "
        "estimate (top-down, NNLS, ADMM, integer rounding), the predicted error above is "
        "that of least squares; the simulated RMSE is the published answers' own.</p>"
        + _table(
            [
                "level",
                "variances are of",
                "the published estimate's?",
                "simulated RMSE",
                "unbiased answers",
            ],
            rows,
            cls="uncertainty",
        )
    )


def _not_converged(data: dict[str, Any]) -> str:
    bad = data["not_converged"]
    if not bad:
        return '<p class="ok">Every chunk converged.</p>'
    keys = list(dict.fromkeys(k for r in bad for k in r))
    return f'<p class="warn">{len(bad)} chunk(s) did not converge.</p>' + _table(
        keys, ([_text(r.get(k)) for k in keys] for r in bad), cls="not-converged"
    )


def _json(data: dict[str, Any]) -> str:
    from dpdask.dashboard import json_safe

    text = json.dumps(json_safe(data), default=str, ensure_ascii=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def render(data: dict[str, Any]) -> str:
    """The report page of :func:`dpdask.report._data.collect`'s data.

    Parameters
    ----------
    data : dict
        The report's data.

    Returns
    -------
    str
        A complete HTML document that needs nothing else: styles inline, plots as
        ``data:`` PNG URIs, the data as JSON in ``<script type="application/json"
        id="dpdask-report-data">``.
    """
    s = data["summary"]
    sections = [
        ("summary", "Summary", _summary(data)),
        ("plan", "Plan", _plan(data)),
        ("budget", "Budget and ledger", _ledger(data)),
        ("predicted", "Predicted error per table and level", _predicted(data)),
        ("uncertainty", "What the margins of error are of", _uncertainty(data)),
        ("realised", "Realised versus predicted error", _realised(data)),
        ("convergence", "Chunks not converged", _not_converged(data)),
    ]
    if data["notes"]:
        items = "".join(f"<li>{escape(n)}</li>" for n in data["notes"])
        sections.append(("notes", "Notes", f"<ul>{items}</ul>"))
    nav = "".join(f'<a href="#{k}">{escape(t)}</a>' for k, t, _ in sections)
    body = "\n".join(
        f'<section id="{k}">\n<h2>{escape(t)}</h2>\n{html}\n</section>' for k, t, html in sections
    )
    title = f"dpdask release report: {s['release']}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="dpdask {escape(str(s["report_dpdask_version"]))}">
<title>{escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<header>
<h1>{escape(title)}</h1>
<div class="sub">run {_text(s["run_id"])} · dataset {_text(s["dataset"])} · published \
{_text(s["created"])}</div>
</header>
<nav>{nav}</nav>
<main>
{body}
</main>
<script type="application/json" id="dpdask-report-data">{_json(data)}</script>
</body>
</html>
"""
