"""Sum-release specs: sums of a numeric attribute per geography, with a private threshold.

A sum spec is a YAML mapping with ``model: sums``, read by :func:`load_spec`. ``dpdask
validate SPEC`` makes every check a run makes, charging nothing
(:func:`dpdask.sums.sum_plan.validate_spec`); ``dpdask plan SPEC`` shows the mechanism's
variance at every threshold it may use, before any data is read
(:func:`dpdask.sums.sum_plan.plan_spec`); ``dpdask run SPEC`` runs it
(:func:`dpdask.sums.sum_release.run_spec`; also ``python -m dpdask.sums.sum_spec
{run,validate,plan} SPEC``). Example::

    model: sums
    release: wages-by-county
    data: {format: records, path: people.csv, geography_column: county, value_column: wage}
                                     # (optional id: the dataset; default a hash of the file)
    geographies: [c01, c02, c03]     # every geography published (or {path: f.csv, column: id})
    by: {sex: [F, M]}                # optional: sums by these columns' public categories
    bins: {low: 0, high: 20000, width: 20}
    workload: prefix                 # prefix sums over the bins, or {name: prefix, every: 10},
                                     # total, or {name: range, ranges: [[0, 500], [500, 2000]]}
    threshold: svt                   # svt | recursive | none, or {name: svt, r: 0.998, s: 20}
    mechanism: TaMM                  # SQM | Identity | Workload | TiMM | TaMM
    strategy: hdmm                   # how TiMM / TaMM choose A, or
                                     # {name: hdmm, restarts: 1, objective: relative}
    postprocess: none                # or isotonic (prefix workloads): non-decreasing answers
    privacy: {epsilon: 1, threshold_share: 0.1}   # optional dataset: {epsilon: 4} (lifetime)
    output: out/wages.zarr
    ledger: {path: out/ledger.sqlite, create: true}
                                     # or a shared ledger on a server: postgresql://...
                                     # or {url: postgresql://...}

Relative paths are relative to the spec file; unknown keys are errors. The list of
geographies is public and part of the spec: every listed geography is published (a
geography without records gets noisy zeros), and a record of an unlisted one is an error
(publishing only the geographies present would reveal who is in the data).

What a run does, in order (every step raises before the next one runs):

1. the spec is checked; the output path must be free (or an earlier dpdask release with
   ``--overwrite``) and must not overlap the data or the ledger; the ledger is opened
   (verified) or created when ``ledger.create``; on a shared server ledger the dataset
   is held against other jobs until this run's charge commits, and its budget and
   source are checked (:func:`~dpdask.privacy.check_source`);
2. the records are read (pandas) and validated: the two columns exist, no geography is
   missing or unlisted, no value is missing, non-numeric, NaN, negative or outside the
   bins. All problems are reported together, *before anything is charged*;
3. the release is opened with budget ``epsilon`` and both charges are checked to fit;
4. the threshold (on all records, one histogram over the bins) is charged as measurement
   ``"threshold"`` at level ``"all"`` (:func:`~dpdask.sums.threshold_charge`, budget
   ``threshold_share * epsilon``), then its noise is drawn from the run's key;
5. the mechanism, built for that threshold, is charged once as measurement ``"sums"`` at
   the geography level (:func:`~dpdask.measure.charge_level`, the rest of the budget) and
   measured per chunk of geographies (:func:`~dpdask.measure.measure`, one identity per
   chunk); the answers ``W T M^+ (M x + noise)`` are computed per geography;
6. the zarr group is written under a temporary name and moved into place, then the run is
   marked published in the ledger.

Both charges belong to one run id bound to a fresh :func:`~dpdask.noise.new_key`; all the
noise comes from that key. The key is never written down, so an interrupted run cannot be
resumed: abandon it (``dpdask ledger abandon``) and run again (charged again).
``threshold: none`` spends the whole budget on the sums (one charge, no truncation).

Workloads: ``prefix`` sums (every ``every``-th prefix), ``range`` sums over ``(low, high]``
in the attribute's units (snapped to the bins: a bin counts when its upper end lies in
the range) and the ``total``. ``by`` crosses the sums with public categories of other
columns (e.g. wages by county and sex): every category listed is published, a record
with an unlisted one is an error, as for geographies.

``postprocess: isotonic`` (prefix workloads only) replaces every row of answers (a
geography and ``by`` group) by its weighted isotonic fit, weights ``1 / variance``
(:func:`dpdask.sums.monotone`): post-processing, free of budget. The true (truncated)
prefix sums are non-decreasing, so the fit is the projection onto a convex set that holds
them and its weighted squared error is never larger than the raw answers'; ``variance``
stays that of the raw answers, published as ``answers_raw``.

SQM answers each of the ``m`` queries on the attribute with its own threshold: ``m``
threshold runs of ``threshold_share * epsilon / m`` each (one charge, ``m`` runs; shared
by the groups of ``by``), and the queries measured together with the Laplace mechanism
on their joint sensitivity (at most the paper's ``m``; :mod:`dpdask.sums.sqm`).

The published group holds ``answers`` (geography x the ``by`` columns x query),
``variance`` (the ``by`` columns x query; the variance of every answer, the same for
every geography), ``ids`` (geography), ``query_lower`` and ``query_upper`` (the values
``(lower, upper]`` every query covers), ``bias_per_record`` (as ``variance``), for every
``by`` column ``C`` an array ``by_C`` of its categories and, in
``attributes["dpdask"]``, the threshold (value, method, parameters, privacy), the
mechanism and its noise, the budget split, the bias bound, the charges, the ledger head
and the run id.

Bias bound. Truncation only lowers the sums: query ``i`` is biased by
``-b_i <= bias_i <= 0`` with ``b_i = n_trunc * bias_per_record_i``, ``n_trunc`` the number
of records above the threshold (:meth:`~dpdask.sums.SumMechanism.bias_bound`).
``n_trunc`` is private and not released. For SVT it is bounded with probability at least
``1 - beta`` (``beta = 0.05``) by ``(1 - r) N + alpha / q`` where ``N`` is the (unreleased)
number of records of all geographies, ``r = p / q`` and
``alpha = (8 Delta / eps_t) ln(4 K / beta)`` (``K`` candidates, ``Delta = max(p, q - p)``):
if the threshold noise and every query noise are below ``alpha / 2`` in absolute value
(the discrete Laplace tail ``P(|X| >= t) <= 2 exp(-t / s)`` and a union bound), the chosen
candidate's ``q F - p N`` is at least ``-alpha`` (Dwork and Roth, Theorem 3.24;
:func:`~dpdask.sums.svt_truncation_bound`). A geography's own truncated records are at
most that many. For SQM the bound holds for all ``m`` thresholds at once (``beta / m``
each). The attribute records this bound as a formula in ``N``; it does not invent a
number. For the recursive threshold the bound is a number computed from the published
threshold, ``floor((ln(theta / theta0) - mu) / beta + shift)``
(:func:`~dpdask.sums.recursive_truncation_bound`), with the probability it holds: that
is ``1 - beta`` only when ``mu`` is large enough, since a threshold noise below
``-mu / beta`` can truncate every record; the attribute states the probability reached
(for SQM's ``m`` thresholds, a union bound) or, when it is useless, that no bound is
available. With no threshold the bias is zero.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from fractions import Fraction
from typing import Any

import pandas as pd

from dpdask.errors import SpecError
from dpdask.privacy import PureDP, is_server_url
from dpdask.specs import check_id, parse_budget, read_spec
from dpdask.sums.mechanisms import OBJECTIVES

__all__ = ["SPEC_KEYS", "SpecError", "load_spec", "main", "run_spec"]  # noqa: F822


SPEC_KEYS = (
    "model",
    "release",
    "data",
    "geographies",
    "by",
    "bins",
    "workload",
    "threshold",
    "mechanism",
    "strategy",
    "postprocess",
    "privacy",
    "output",
    "ledger",
)
_REQUIRED = ("release", "data", "geographies", "bins", "privacy", "output", "ledger")
_DATA_KEYS = {"format", "path", "geography_column", "value_column", "id"}
_MECHANISMS = ("SQM", "Identity", "Workload", "TiMM", "TaMM")
_THRESHOLD_KEYS = {"svt": {"name", "r", "s", "c"}, "recursive": {"name", "theta0", "beta", "mu"}}


def _path(base: pathlib.Path, p: Any, what: str) -> pathlib.Path:
    if not isinstance(p, str) or not p:
        raise SpecError(f"{what}: a path is required, got {p!r}")
    q = pathlib.Path(p)
    return q if q.is_absolute() else base / q


def _mapping(value: Any, what: str, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{what}: expected a mapping, got {value!r}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise SpecError(f"{what}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    missing = sorted(required - set(value))
    if missing:
        raise SpecError(f"{what}: missing {missing}")
    return value


def _number(value: Any, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SpecError(f"{what}: expected a number, got {value!r}")
    try:
        f = Fraction(str(value))
    except (ValueError, ZeroDivisionError) as err:
        raise SpecError(f"{what}: expected a number, got {value!r}") from err
    return f


def _workload(w: Any, low: float, high: float, k: int) -> dict[str, Any]:
    """``{"name": "prefix", "every": e}``, ``{"name": "range", "low": [...], "high": [...]}``."""
    if w == "total":
        return {"name": "range", "low": [low], "high": [high], "total": True}
    opts: dict[str, Any] = {}
    if isinstance(w, dict):
        name = w.get("name")
        allowed = {"prefix": {"name", "every"}, "range": {"name", "ranges"}, "total": {"name"}}
        if name not in allowed:
            raise SpecError(f"workload.name: prefix, range or total, got {name!r}")
        required = {"name", "ranges"} if name == "range" else {"name"}
        opts = dict(_mapping(w, "workload", allowed[name], required))
        w = name
    if w == "total":
        return _workload("total", low, high, k)
    if w == "prefix":
        every = opts.get("every", 1)
        if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= k:
            raise SpecError(f"workload.every: an integer in [1, {k}], got {every!r}")
        return {"name": "prefix", "every": every}
    if w != "range":
        raise SpecError(f"workload: prefix, total or {{name: range, ranges: ...}}, got {w!r}")
    ranges = opts["ranges"]
    if not isinstance(ranges, list) or not ranges:
        raise SpecError("workload.ranges: a non-empty list of [low, high] pairs")
    lo, hi = [], []
    for i, pair in enumerate(ranges):
        if not isinstance(pair, list) or len(pair) != 2:
            raise SpecError(f"workload.ranges[{i}]: a pair [low, high], got {pair!r}")
        a, b = (float(_number(v, f"workload.ranges[{i}]")) for v in pair)
        if not (low <= a < b <= high):
            raise SpecError(f"workload.ranges[{i}]: need {low:g} <= low < high <= {high:g}")
        lo.append(a)
        hi.append(b)
    return {"name": "range", "low": lo, "high": hi}


def _by(by: Any, data: dict[str, Any]) -> dict[str, list[str]]:
    """``{column: [categories]}``: public categories of the columns the sums are split by."""
    if not isinstance(by, dict):
        raise SpecError(f"by: a mapping of column -> [categories], got {by!r}")
    out: dict[str, list[str]] = {}
    taken = {data["geography_column"], data["value_column"]}
    for col, cats in by.items():
        if not isinstance(col, str) or not col.isidentifier() or col in taken:
            raise SpecError(
                f"by: {col!r} must be a column name (an identifier) other than the geography "
                "and value columns"
            )
        if not isinstance(cats, list) or not cats:
            raise SpecError(f"by.{col}: a non-empty list of categories")
        labels = [str(c) for c in cats]
        if any(c in ("", "nan") for c in labels) or len(set(labels)) != len(labels):
            raise SpecError(f"by.{col}: categories must be distinct and non-empty")
        out[col] = labels
    return out


def _lifetime(raw: Any) -> Any:
    """``privacy.dataset``: the dataset's lifetime budget, ``{epsilon: e}`` or ``{zcdp: r}``."""
    return parse_budget(raw, "privacy.dataset", ("epsilon", "zcdp", "rho"))


def _ledger(raw: Any, base: pathlib.Path) -> tuple[pathlib.Path | str, bool]:
    """``ledger``: ``{path: FILE, create: ...}`` (SQLite), a server's ``postgresql://...``
    URL, or ``{url: URL, create: ...}``; the location (a path, or the URL as given) and
    whether a run may create it."""
    if is_server_url(raw):
        return str(raw), False
    if not isinstance(raw, dict):
        raise SpecError(
            f"ledger: expected {{path: ..., create: true}}, a postgresql://... URL or "
            f"{{url: ...}}, got {raw!r}"
        )
    led = _mapping(raw, "ledger", {"path", "url", "create"}, set())
    create = led.get("create", False)
    if not isinstance(create, bool):
        raise SpecError("ledger.create: true or false")
    if "url" in led:
        if "path" in led or not is_server_url(led["url"]):
            raise SpecError(
                "ledger.url: give a postgresql://... URL, and either url or path, not both"
            )
        return str(led["url"]), create
    if "path" not in led:
        raise SpecError("ledger: missing ['path'] (or url: postgresql://...)")
    return _path(base, led["path"], "ledger.path"), create


def load_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a sum spec; return its parsed form (paths resolved, numbers exact).

    Raises
    ------
    SpecError
        If it is not ``model: sums``, has an unknown key, lacks a required one or has a
        value of the wrong kind.
    """
    p = pathlib.Path(path)
    doc = read_spec(p)  # strict YAML (dpdask.specs)
    if not isinstance(doc, dict) or doc.get("model") != "sums":
        raise SpecError(f"{p}: not a sum spec (model: sums)")
    unknown = sorted(set(doc) - set(SPEC_KEYS))
    if unknown:
        raise SpecError(f"{p}: unknown key(s) {unknown}; allowed: {', '.join(SPEC_KEYS)}")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise SpecError(f"{p}: missing {missing}")
    base = p.parent
    release = check_id(doc["release"], "release")  # the one id rule of every spec

    data = _mapping(doc["data"], "data", _DATA_KEYS, _DATA_KEYS - {"format", "id"})
    if "id" in data:
        check_id(data["id"], "data.id")
    if data.get("format", "records") != "records":
        raise SpecError("data.format: sum specs read records (format: records, a CSV file)")
    for k in ("geography_column", "value_column"):
        if not isinstance(data[k], str) or not data[k]:
            raise SpecError(f"data.{k}: a column name is required")

    geos = doc["geographies"]
    if isinstance(geos, dict):
        g = _mapping(geos, "geographies", {"path", "column"}, {"path", "column"})
        table = pd.read_csv(_path(base, g["path"], "geographies.path"), dtype=str)
        if g["column"] not in table:
            raise SpecError(f"geographies: no column {g['column']!r} in {g['path']}")
        ids = table[g["column"]].tolist()
    elif isinstance(geos, list):
        ids = geos
    else:
        raise SpecError("geographies: a list of ids or {path: ..., column: ...}")
    ids = [str(i) for i in ids]
    if not ids or any(i in ("", "nan") for i in ids) or len(set(ids)) != len(ids):
        raise SpecError("geographies: a non-empty list of distinct, non-empty ids is required")

    b = _mapping(doc["bins"], "bins", {"low", "high", "width"}, {"low", "high", "width"})
    low, high, width = (_number(b[k], f"bins.{k}") for k in ("low", "high", "width"))
    if not (low >= 0 and high > low and width > 0):
        raise SpecError("bins: need 0 <= low < high and width > 0")
    n_bins = (high - low) / width
    if n_bins.denominator != 1 or n_bins > 100_000:
        raise SpecError("bins: (high - low) / width must be a whole number of bins (<= 100,000)")

    workload = _workload(doc.get("workload", "prefix"), float(low), float(high), int(n_bins))
    by = _by(doc.get("by", {}), data)

    t = doc.get("threshold", "svt")
    topts: dict[str, Any] = {}
    if isinstance(t, dict):
        name = t.get("name")
        if name not in _THRESHOLD_KEYS:
            raise SpecError("threshold.name: svt or recursive")
        topts = dict(_mapping(t, "threshold", _THRESHOLD_KEYS[name], {"name"}))
        del topts["name"]
        for key_, v in topts.items():
            f = _number(v, f"threshold.{key_}")
            topts[key_] = str(f) if key_ == "r" else float(f)
        t = name
    if t not in ("svt", "recursive", "none"):
        raise SpecError(f"threshold: svt, recursive or none, got {t!r}")

    mech = doc.get("mechanism", "TaMM")
    if mech not in _MECHANISMS:
        raise SpecError(f"mechanism: one of {', '.join(_MECHANISMS)}, got {mech!r}")

    s = doc.get("strategy", "hdmm")
    sopts: dict[str, Any] = {}
    if isinstance(s, dict):
        if "name" not in s:
            raise SpecError("strategy: {name: ..., options...}")
        sopts = {k_: v for k_, v in s.items() if k_ != "name"}
        s = s["name"]
    if not isinstance(s, str):
        raise SpecError(f"strategy: a name (hdmm, hierarchical, ...), got {s!r}")
    objective = sopts.pop("objective", None)
    if objective is not None and objective not in OBJECTIVES:
        raise SpecError(f"strategy.objective: one of {', '.join(OBJECTIVES)}, got {objective!r}")

    post = doc.get("postprocess", "none")
    if post not in ("none", "isotonic"):
        raise SpecError(f"postprocess: none or isotonic, got {post!r}")
    if post == "isotonic" and workload["name"] != "prefix":
        raise SpecError(
            "postprocess: isotonic needs a prefix workload (its answers are non-decreasing); "
            f"this one is {workload['name']!r}"
        )

    pr = _mapping(doc["privacy"], "privacy", {"epsilon", "threshold_share", "dataset"}, {"epsilon"})
    lifetime = None if "dataset" not in pr else _lifetime(pr["dataset"])
    budget = parse_budget(pr, "privacy", ("epsilon", "threshold_share", "dataset"))
    if not isinstance(budget, PureDP):  # pragma: no cover - only epsilon is allowed above
        raise SpecError(f"privacy: sum releases are pure DP (epsilon), got {budget!r}")
    eps = budget.epsilon
    rho = _number(pr.get("threshold_share", "0.1" if t != "none" else 0), "threshold_share")
    if t == "none" and rho != 0:
        raise SpecError("privacy.threshold_share: must be 0 (or absent) with threshold: none")
    if t != "none" and not 0 < rho < 1:
        raise SpecError("privacy.threshold_share must lie strictly between 0 and 1")

    ledger, create = _ledger(doc["ledger"], base)

    return {
        "source": p,
        "release": release,
        "data": _path(base, data["path"], "data.path"),
        "geography_column": data["geography_column"],
        "value_column": data["value_column"],
        "geographies": ids,
        "bins": (low, high, int(n_bins)),
        "workload": workload,
        "by": by,
        "threshold": t,
        "threshold_options": topts,
        "mechanism": mech,
        "strategy": s,
        "strategy_options": sopts,
        "objective": objective,
        "postprocess": post,
        "epsilon": eps,
        "rho": rho,
        "dataset_id": data.get("id"),
        "dataset_budget": lifetime,
        "output": _path(base, doc["output"], "output"),
        "ledger": ledger,
        "ledger_create": create,
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m dpdask.sums.sum_spec {run,validate,plan} SPEC [--json] [--overwrite]``."""
    from dpdask.sums.sum_plan import plan_spec, validate_spec
    from dpdask.sums.sum_release import run_spec

    ap = argparse.ArgumentParser(prog="dpdask.sums.sum_spec")
    ap.add_argument("command", choices=["run", "validate", "plan"])
    ap.add_argument("spec")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    if args.command == "plan":
        out = plan_spec(args.spec)
    elif args.command == "validate":
        out = validate_spec(args.spec, overwrite=args.overwrite)
    else:
        out = run_spec(args.spec, overwrite=args.overwrite)
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


def __getattr__(name: str) -> Any:
    # run_spec's home is dpdask.sums.sum_release, which reads specs with this module
    if name == "run_spec":
        from dpdask.sums.sum_release import run_spec

        return run_spec
    raise AttributeError(f"module 'dpdask.sums.sum_spec' has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
