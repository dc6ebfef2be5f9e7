"""The report's plots: matplotlib figures (Agg, no pyplot) as ``data:`` PNG URIs."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["budget_plot", "predicted_plot", "realised_plot"]

_DPI = 110


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # a canvas of its own: no pyplot, no global backend
    return fig


def _uri(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _log_if_wide(ax: Any, values: Sequence[float | None]) -> None:
    v = [x for x in values if x is not None and x > 0]
    if v and max(v) / min(v) > 30:
        ax.set_yscale("log")


def budget_plot(plan: dict[str, Any]) -> str | None:
    """Each level's share of the release's budget and its noise scale."""
    levels = plan["levels"]
    if not levels:
        return None
    names = [lv["level"] for lv in levels]
    colors = _colors(len(levels))
    fig = _figure(10.0, max(2.2, 0.32 * len(levels) + 0.9))
    share_ax, noise_ax = fig.subplots(1, 2, width_ratios=(3, 2))
    left = 0.0
    for lv, c in zip(levels, colors, strict=True):
        share = lv["budget_share"] or 0.0
        share_ax.barh([0], [share], left=left, color=c, edgecolor="white", label=lv["level"])
        if share > 0.06:  # the level's name on its part (the noise bars name all)
            share_ax.text(left + share / 2, 0, f"{lv['level']}\n{100 * share:.0f}%",
                          ha="center", va="center", color="white", fontsize=8)  # fmt: skip
        left += share
    share_ax.set_xlim(0, max(1.0, left))
    share_ax.set_yticks([])
    share_ax.set_xlabel(f"share of the release's budget ({plan['budget_text']})")
    share_ax.set_title("Budget split over levels", fontsize=10)
    y = list(range(len(levels)))[::-1]
    noise_ax.barh(y, [lv["noise_scale"] or 0.0 for lv in levels], color=colors)
    noise_ax.set_yticks(y, names, fontsize=8)
    noise_ax.set_xlabel("noise scale (std. dev. per measured row)")
    noise_ax.set_title("Noise per level", fontsize=10)
    return _uri(fig)


def _table_axis(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["table"] for r in rows))


def predicted_plot(tables: list[dict[str, Any]], levels: list[str]) -> str | None:
    """Predicted RMSE per table and level, whiskers from the table's smallest to largest
    query standard deviation."""
    if not tables:
        return None
    names = _table_axis(tables)
    fig = _figure(max(7.0, 0.75 * len(names) + 2.5), 4.2)
    ax = fig.subplots()
    width = 0.8 / max(1, len(levels))
    for k, (lv, c) in enumerate(zip(levels, _colors(len(levels)), strict=True)):
        rows = {r["table"]: r for r in tables if r["level"] == lv and r["rmse"] is not None}
        xs = [i - 0.4 + width * (k + 0.5) for i, t in enumerate(names) if t in rows]
        ys = [rows[t]["rmse"] for t in names if t in rows]
        lo = [max(0.0, rows[t]["rmse"] - rows[t]["sd_min"]) for t in names if t in rows]
        hi = [max(0.0, rows[t]["sd_max"] - rows[t]["rmse"]) for t in names if t in rows]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=4, capsize=2, color=c, label=lv)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("persons")
    ax.set_title("Predicted RMSE per table (whiskers: smallest to largest query std. dev.)",
                 fontsize=10)  # fmt: skip
    _log_if_wide(ax, [r["sd_max"] for r in tables] + [r["sd_min"] for r in tables])
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, title="level", title_fontsize=8)
    return _uri(fig)


def realised_plot(realised: dict[str, Any] | None, tables: list[dict[str, Any]]) -> str | None:
    """Per level: predicted RMSE with whiskers and the realised RMSE; then all tables'
    realised against predicted RMSE."""
    # tables with a predicted error (not those answered from the estimates)
    levels = [
        {**lv, "tables": [r for r in lv["tables"] if r["predicted_rmse"] is not None]}
        for lv in (realised or {}).get("levels", [])
    ]
    levels = [lv for lv in levels if lv["tables"]]
    if not levels:
        return None
    spread = {(r["level"], r["table"]): r for r in tables}
    ncols = min(3, len(levels) + 1)
    nrows = math.ceil((len(levels) + 1) / ncols)
    fig = _figure(4.2 * ncols, 3.4 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    colors = _colors(len(levels))
    for ax, lv in zip(axes, levels, strict=False):
        rows = lv["tables"]
        xs = range(len(rows))
        pred = [r["predicted_rmse"] for r in rows]
        lo = [max(0.0, p - spread[lv["level"], r["table"]]["sd_min"]) for p, r in zip(pred, rows,
              strict=True)]  # fmt: skip
        hi = [max(0.0, spread[lv["level"], r["table"]]["sd_max"] - p) for p, r in zip(pred, rows,
              strict=True)]  # fmt: skip
        ax.errorbar(xs, pred, yerr=[lo, hi], fmt="o", ms=4, capsize=2, color="#6b7280",
                    label="predicted")  # fmt: skip
        ax.plot(xs, [r["realised_rmse"] for r in rows], "x", ms=7, mew=2, color="#dc2626",
                label="realised")  # fmt: skip
        ax.set_xticks(list(xs), [r["table"] for r in rows], rotation=35, ha="right", fontsize=7)
        units = f"{lv['units']} unit" + ("s" if lv["units"] != 1 else "")
        ax.set_title(f"{lv['level']} ({units})", fontsize=10)
        ax.set_ylabel("RMSE (persons)", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[len(levels)]
    top = 0.0
    for lv, c in zip(levels, colors, strict=True):
        p = [r["predicted_rmse"] for r in lv["tables"]]
        q = [r["realised_rmse"] for r in lv["tables"]]
        ax.scatter(p, q, s=18, color=c, label=lv["level"])
        top = max(top, *p, *q)
    ax.plot([0, top * 1.05], [0, top * 1.05], "--", color="#9ca3af", lw=1)
    ax.set_xlim(0, top * 1.05)
    ax.set_ylim(0, top * 1.05)
    ax.set_xlabel("predicted RMSE", fontsize=8)
    ax.set_ylabel("realised RMSE", fontsize=8)
    ax.set_title("Realised vs predicted (all tables)", fontsize=10)
    ax.legend(fontsize=7)
    for extra in axes[len(levels) + 1 :]:
        extra.set_visible(False)
    return _uri(fig)
