"""The numbers of a release report, read from the release (and a truth store, if given).

Everything here is plain data (dicts, lists, floats, strings) so that the page can
embed it as JSON beside the tables and plots drawn from it.
"""

from __future__ import annotations

import datetime
import math
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, DataError, DomainError
from dpdask.publish.reader import MOE90_Z

__all__ = ["collect", "estimate_rows", "read_rows"]

_CELLS_PER_BATCH = 2_000_000  # answers (units x queries) read from the release at once


def _float(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _strings(g: Any, name: str) -> list[str]:
    return [str(s) for s in np.asarray(g[name][:]).tolist()] if name in g else []


def table_of(label: str) -> str:
    """The table (or workload part) a query label belongs to.

    Workload rows are labelled ``{part}_{row:03d}`` (``race-single_003``; a label made
    unique by ``#i`` drops it) and Census table cells ``{table}_{line:03d}``
    (``P1_001``): the table is the label up to its last underscore.

    Parameters
    ----------
    label : str
        A query label of the release.

    Returns
    -------
    str
    """
    head, sep, _ = label.split("#", 1)[0].rpartition("_")
    return head if sep else label


# -- the release's record --------------------------------------------------------------
def _summary(path: pathlib.Path, meta: Mapping[str, Any]) -> dict[str, Any]:
    from dpdask import __version__

    return {
        "release": meta.get("release"),
        "run_id": meta.get("run_id"),
        "path": str(path.resolve()),
        "dataset": meta.get("dataset"),
        "source": meta.get("source"),
        "created": meta.get("created"),
        "release_dpdask_version": meta.get("dpdask_version"),
        "format": f"{meta.get('format')} v{meta.get('format_version')}",
        "report_dpdask_version": __version__,
        "report_created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "domain": dict(meta.get("domain") or {}),
        "reconstruct": meta.get("reconstruct"),
        "noise": meta.get("noise"),
        "test_mode": meta.get("test_mode"),
    }


def _plan(meta: Mapping[str, Any]) -> dict[str, Any]:
    from dpdask.dashboard import budget_text, budget_values

    total = budget_values(meta.get("budget"))
    first = next(iter(total), None)
    levels = []
    for lv in meta.get("levels") or []:
        values = budget_values(lv.get("budget"))
        share = None
        if first is not None and total[first] > 0 and first in values:
            share = values[first] / total[first]
        mean_var, max_var = (
            _float(lv.get("mean_query_variance")),
            _float(lv.get("max_query_variance")),
        )
        levels.append(
            {
                "level": lv.get("level"),
                "units": lv.get("units"),
                "chunks": lv.get("chunks"),
                "budget": lv.get("budget"),
                "budget_text": budget_text(lv.get("budget")),
                "budget_share": share,
                "mechanism": lv.get("mechanism"),
                "noise_scale": _float(lv.get("noise_scale")),
                "queries": lv.get("queries"),
                "rmse": None if mean_var is None else math.sqrt(max(mean_var, 0.0)),
                "max_stddev": None if max_var is None else math.sqrt(max(max_var, 0.0)),
            }
        )
    return {
        "budget": meta.get("budget"),
        "budget_text": budget_text(meta.get("budget")),
        "workload": meta.get("workload"),
        "strategy": meta.get("strategy"),
        "reconstruct": meta.get("reconstruct"),
        "levels": levels,
        "charges": [
            {**c, "privacy_text": budget_text(c.get("privacy"))} for c in meta.get("charges") or []
        ],
    }


def _ledger(meta: Mapping[str, Any], override: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The ledger as the release records it, and as the ledger file says now (if reachable)."""
    from dpdask.dashboard import budget_text
    from dpdask.privacy import Head, Ledger, LedgerMissingError, LedgerTamperedError

    rec = dict(meta.get("ledger") or {})
    path = override if override is not None else rec.get("path")
    out: dict[str, Any] = {
        "recorded": rec,
        "recorded_spent_text": budget_text(rec.get("spent")),
        "recorded_remaining_text": budget_text(rec.get("remaining")),
        "path": None if path is None else str(path),
        "reachable": False,
        "verifies": None,
        "same_ledger": None,
        "head_in_chain": None,
        "head": None,
        "release": None,
        "dataset": None,
        "error": None,
    }
    if path is None:
        out["error"] = "the release records no ledger"
        return out
    try:
        ledger = Ledger(path)  # opening verifies the hash chain and the head file
    except LedgerMissingError:
        out["error"] = f"no ledger at {path} (from here); showing what the release records"
        return out
    except LedgerTamperedError as exc:
        out.update(reachable=True, verifies=False, error=str(exc))
        return out
    except Exception as exc:  # unreadable file, another format: the report goes on
        out["error"] = f"cannot read the ledger {path}: {type(exc).__name__}: {exc}"
        return out
    report = ledger.report()
    out.update(reachable=True, verifies=True, head=str(ledger.head()))
    out["same_ledger"] = rec.get("id") is None or rec.get("id") == ledger.ledger_id
    if rec.get("head") and out["same_ledger"]:
        try:
            out["head_in_chain"] = ledger.contains(Head.parse(rec["head"]))
        except ValueError:
            out["head_in_chain"] = False
    rel = report["releases"].get(meta.get("release"))
    if rel is not None:
        out["release"] = {
            **rel,
            "budget_text": budget_text(rel.get("budget")),
            "spent_text": budget_text(rel.get("spent")),
            "remaining_text": budget_text(rel.get("remaining")),
        }
    ds = report["datasets"].get(meta.get("dataset"))
    if ds is not None:
        out["dataset"] = {
            **ds,
            "total_text": budget_text(ds.get("total")),
            "spent_text": budget_text(ds.get("spent")),
            "remaining_text": budget_text(ds.get("remaining")),
        }
    return out


# -- the truth -------------------------------------------------------------------------
def _open_truth(truth: Any, domain: Any) -> Any:
    from dpdask.store import DataStore, open_store

    store = truth if isinstance(truth, DataStore) else open_store(truth)
    if store.domain.shape != domain.shape:
        raise DataError(
            f"the truth store's domain {store.domain} does not match the release's {domain}"
        )
    return store


def _truth_batches(
    store: Any, level: str, ids: list[str], n_queries: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(release unit indices, true counts of those units) of one level, in batches."""
    from dpdask.store import aggregate

    geo = store.geography
    if level not in geo.levels:
        raise DomainError(
            f"the truth store has no level {level!r}; its levels are {list(geo.levels)}"
        )
    truth_ids = list(geo.ids[geo.level_index(level)])
    if truth_ids == ids:
        where = None
    else:
        rank = {u: i for i, u in enumerate(ids)}
        if len(truth_ids) != len(ids) or set(truth_ids) != rank.keys():
            raise DataError(f"level {level!r}: the truth store's units differ from the release's")
        where = np.array([rank[u] for u in truth_ids], dtype=np.int64)
    x = aggregate(store.to_dask(), geo, level)
    step = max(1, _CELLS_PER_BATCH // max(1, n_queries))
    start = 0
    for size in x.chunks[0]:
        block = np.asarray(x[start : start + size].compute(scheduler="threads"))
        for a in range(0, size, step):
            rows = np.arange(start + a, start + min(size, a + step), dtype=np.int64)
            yield (rows if where is None else where[rows]), block[a : a + step]
        start += size


def _plain_batches(n_units: int, n_queries: int) -> Iterator[tuple[np.ndarray, None]]:
    step = max(1, _CELLS_PER_BATCH // max(1, n_queries))
    for a in range(0, n_units, step):
        yield np.arange(a, min(n_units, a + step), dtype=np.int64), None


def read_rows(array: Any, rows: np.ndarray) -> np.ndarray:
    """Rows of a zarr array (a slice when they are contiguous and increasing)."""
    if rows.size and rows[-1] - rows[0] + 1 == rows.size and np.all(np.diff(rows) == 1):
        return np.asarray(array[int(rows[0]) : int(rows[-1]) + 1])
    order = np.argsort(rows, kind="stable")
    picked = np.asarray(array.get_orthogonal_selection((rows[order],)))
    out = np.empty_like(picked)
    out[order] = picked
    return out


def estimate_rows(g: Any, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The published estimates of units ``rows`` (dense, ``shape``), from a dense
    ``estimate`` or from a level's entries."""
    if "entry_offsets" not in g:
        return read_rows(g["estimate"], rows)
    from dpdask.publish.reader import entry_rows

    out = np.zeros((rows.size, int(np.prod(shape[1:]))))
    if rows.size and rows[-1] - rows[0] + 1 == rows.size and np.all(np.diff(rows) == 1):
        local, cells, values = entry_rows(g, int(rows[0]), int(rows[-1]) + 1)
        out[local, cells] = values
    else:
        for i, r in enumerate(rows.tolist()):
            _, cells, values = entry_rows(g, r, r + 1)
            out[i, cells] = values
    return out.reshape(shape)


# -- one level -------------------------------------------------------------------------
def _spaces(
    g: Any, level: str, store: Any, rebuilt: Any, domain: Any, notes: list[str]
) -> list[tuple[Any, ...]]:
    """(labels, answers, variances, kind, Q) of every table space of one level: the
    published ones (``Q``: their queries, when rebuilt for a truth) and, for a named
    workload that is not the release's, its queries answered from the estimates
    (answers and variances None)."""
    from dpdask.publish import published_tables, query_labels
    from dpdask.publish.reader import query_spaces

    own = None if rebuilt is None else rebuilt.own
    other = None if rebuilt is None else rebuilt.other
    spaces = []
    for label, _, ans, var, kind in query_spaces(g):
        if var not in g:
            continue
        labels = _strings(g, label)
        Q = None
        if store is not None and own is not None:
            if kind == "part":
                ok = own.shape[0] == len(labels) and query_labels(own, domain) == labels
                Q = own if ok else None
            else:
                tables = published_tables(own, domain)
                Q = tables[2] if tables is not None and tables[0] == labels else None
            if Q is None:
                notes.append(f"{level}: the rebuilt workload does not match the {label} labels")
        spaces.append((labels, g[ans], g[var], kind, Q))
    if store is not None and other is not None and "estimate" in g:
        spaces.append((query_labels(other, domain), None, None, "derived", other))
    return spaces


def _level(
    g: Any, level: str, store: Any, rebuilt: Any, domain: Any, notes: list[str]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Per-table predicted (and realised) errors of one level, streamed over its units."""
    from dpdask.dashboard import rmse_groups

    ids = _strings(g, "ids")
    spaces = _spaces(g, level, store, rebuilt, domain, notes)
    n_q = sum(len(s[0]) for s in spaces)
    acc = [{k: np.zeros(len(s[0])) for k in ("var", "sse", "inside", "maxabs")} for s in spaces]
    cells = {"sse": 0.0, "maxabs": 0.0, "n": 0}
    batches = (
        _plain_batches(len(ids), n_q) if store is None else _truth_batches(store, level, ids, n_q)
    )
    for rows, truth in batches:
        est = None
        if truth is not None and "estimate" in g:
            est = estimate_rows(g, rows, truth.shape)
        for (_, ans, var, _, Q), a in zip(spaces, acc, strict=True):
            v = None
            if var is not None and var.ndim == 1:  # one variance per query for every unit
                v = np.broadcast_to(np.asarray(var[:]), (rows.size, var.shape[0]))
            elif var is not None:
                v = read_rows(var, rows)
            if v is not None:
                a["var"] += v.sum(axis=0)
            if truth is None or Q is None or (ans is None and est is None):
                continue
            got = read_rows(ans, rows) if ans is not None else Q.apply(est)
            err = np.asarray(got, dtype=np.float64) - np.asarray(Q.apply(truth), dtype=np.float64)
            a["sse"] += (err**2).sum(axis=0)
            a["maxabs"] = np.maximum(a["maxabs"], np.abs(err).max(axis=0, initial=0.0))
            if v is not None:
                a["inside"] += (np.abs(err) <= MOE90_Z * np.sqrt(v)).sum(axis=0)
        if est is not None:
            err = est - truth
            cells["sse"] += float((err**2).sum())
            cells["maxabs"] = max(cells["maxabs"], float(np.abs(err).max(initial=0.0)))
            cells["n"] += int(err.size)
    n = max(1, len(ids))
    tables: list[dict[str, Any]] = []
    realised: list[dict[str, Any]] = []
    for (labels, _, var, kind, Q), a in zip(spaces, acc, strict=True):
        names = [table_of(lab) for lab in labels]
        mean_var = a["var"] / n
        sd = np.sqrt(np.maximum(mean_var, 0.0))
        for grp in rmse_groups(names, mean_var, kind):
            idx = [i for i, nm in enumerate(names) if nm == grp["name"]]
            row = {
                "level": level,
                "table": grp["name"],
                "kind": kind,
                "queries": grp["queries"],
                "rmse": grp["rmse"] if var is not None else None,
                "sd_min": _float(sd[idx].min()) if var is not None else None,
                "sd_max": _float(sd[idx].max()) if var is not None else None,
                "moe90": None if grp["rmse"] is None or var is None else MOE90_Z * grp["rmse"],
            }
            if var is not None:  # a derived table has no predicted error
                tables.append(row)
            if store is not None and Q is not None:
                realised.append(
                    {
                        **{k: row[k] for k in ("level", "table", "kind", "queries")},
                        "predicted_rmse": row["rmse"],
                        "realised_rmse": _float(math.sqrt(a["sse"][idx].sum() / (n * len(idx)))),
                        "max_abs_error": _float(a["maxabs"][idx].max()),
                        "within_moe90": (
                            _float(a["inside"][idx].sum() / (n * len(idx)))
                            if var is not None
                            else None
                        ),
                    }
                )
    if store is None:
        return tables, None
    cell_rmse = math.sqrt(cells["sse"] / cells["n"]) if cells["n"] else None
    return tables, {
        "level": level,
        "units": len(ids),
        "tables": realised,
        "cells_rmse": _float(cell_rmse),
        "cells_max_abs_error": _float(cells["maxabs"]) if cells["n"] else None,
    }


def collect(
    release: str | os.PathLike[str],
    *,
    truth: Any = None,
    ledger: str | os.PathLike[str] | None = None,
    workload: Any = None,
) -> dict[str, Any]:
    """Everything a report shows, as plain data.

    Parameters
    ----------
    release : str or path-like
        A published release.
    truth : str, path-like or dpdask.store.DataStore, optional
        A data store with the true counts of every finest geography unit, on the
        release's domain and with its levels (as :func:`dpdask.store.write_store`
        writes them): the realised errors are measured against it.
    ledger : str or path-like, optional
        The ledger file, if it is no longer where the release says it was.
    workload : str, LinearQuery or mapping of level to LinearQuery, optional
        The workload to compare with the truth: a name (``dpdask report --workload``)
        or the workload itself. The release's own workload is compared through its
        published answers; another one on the same domain is answered from the
        published estimates. Default: the release's workload, recognised among the
        named workloads (:mod:`dpdask.report._workload`).

    Returns
    -------
    dict
        ``summary``, ``plan``, ``ledger``, ``tables`` (predicted RMSE per level and
        table), ``realised`` (None without ``truth``), ``not_converged`` and ``notes``.
    """
    import zarr

    from dpdask.domain import Domain
    from dpdask.publish import release_attributes

    path = pathlib.Path(release)
    if not path.exists():
        raise FileNotFoundError(f"no release at {path}")
    meta = release_attributes(path)
    if meta is None:
        raise ArgumentError(f"{path} is not a dpdask release (no dpdask release attributes)")
    root = zarr.open_group(str(path), mode="r")
    groups = dict(root.groups())
    levels = [lv["level"] for lv in meta.get("levels") or [] if lv.get("level") in groups]
    domain = Domain(list((meta.get("domain") or {}).items()))
    notes: list[str] = []
    store = None if truth is None else _open_truth(truth, domain)
    workloads: dict[str, Any] = {lv: None for lv in levels}
    if store is not None or workload is not None:
        from dpdask.report._workload import level_workloads

        workloads = level_workloads(meta, levels, groups, domain, workload, notes)
        if store is None:
            notes.append("a workload is compared with a truth: give one (--truth STORE)")
    tables: list[dict[str, Any]] = []
    realised: list[dict[str, Any]] = []
    for lv in levels:
        t, r = _level(groups[lv], lv, store, workloads[lv], domain, notes)
        tables += t
        if r is not None:
            realised.append(r)
    return {
        "summary": _summary(path, meta),
        "plan": _plan(meta),
        "ledger": _ledger(meta, ledger),
        "levels": levels,
        "tables": tables,
        "realised": None
        if store is None
        else {
            "truth": str(pathlib.Path(store.path).resolve()),
            "levels": realised,
            "workloads": {lv: r.record() for lv, r in workloads.items()},
        },
        "not_converged": list(meta.get("not_converged") or []),
        "notes": list(dict.fromkeys(notes)),
        "uncertainty": {lv: _uncertainty(groups[lv]) for lv in levels},
    }


def _uncertainty(g: Any) -> dict[str, Any]:
    """What a level's published variances are of, its simulated RMSE by query group and
    its unbiased least-squares answers (top-down releases), as published."""
    var = dict(g["variance"].attrs) if "variance" in g else {}
    out: dict[str, Any] = {
        "uncertainty_of": var.get("uncertainty_of"),
        "describes_published": var.get("describes_published"),
        "noise": var.get("noise"),
        "simulated_rmse": None,
        "unbiased": None,
    }
    if "simulated_rmse" in g:
        rmse = g["simulated_rmse"]
        out["simulated_rmse"] = {
            "label": rmse.attrs.get("long_name"),
            "groups": dict(zip(_strings(g, "query_group"), map(float, rmse[:]), strict=True)),
        }
    elif "simulated_rmse" in g.attrs:
        out["simulated_rmse"] = {"label": str(g.attrs["simulated_rmse"]), "groups": {}}
    if "unbiased" in g and "estimate" in g["unbiased"]:
        u = g["unbiased"]
        out["unbiased"] = {
            "label": "unbiased (least squares, this level's measurements)",
            "queries": int(u["unbiased_query"].shape[0]),
            "skipped_groups": list(u.attrs.get("skipped_groups") or []),
        }
    return out
