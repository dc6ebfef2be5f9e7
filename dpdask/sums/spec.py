"""Sum-release specs: sums of a numeric attribute per geography, with a private threshold.

A sum spec is a YAML mapping with ``model: sums``; ``dpdask run SPEC`` dispatches such a
spec here (:func:`run_spec`; also ``python -m dpdask.sums.spec run SPEC``). Example::

    model: sums
    release: wages-by-county
    data: {format: records, path: people.csv, geography_column: county, value_column: wage}
    geographies: [c01, c02, c03]     # every geography published (or {path: f.csv, column: id})
    bins: {low: 0, high: 20000, width: 20}
    workload: prefix                 # prefix sums over the bins, or {name: prefix, every: 10}
    threshold: svt                   # svt | recursive | none, or {name: svt, r: 0.998, s: 20}
    mechanism: TaMM                  # Identity | Workload | TiMM | TaMM
    strategy: hdmm                   # how TiMM / TaMM choose A, or {name: hdmm, restarts: 1}
    privacy: {epsilon: 1, threshold_share: 0.1}
    output: out/wages.zarr
    ledger: {path: out/ledger.sqlite, create: true}

Relative paths are relative to the spec file; unknown keys are errors. The list of
geographies is public and part of the spec: every listed geography is published (a
geography without records gets noisy zeros), and a record of an unlisted one is an error
(publishing only the geographies present would reveal who is in the data).

What a run does, in order (every step raises before the next one runs):

1. the spec is checked; the output path must be free (or an earlier dpdask release with
   ``--overwrite``) and must not overlap the data or the ledger; the ledger is opened
   (verified) or created when ``ledger.create``;
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
SQM (one threshold and budget share per query) is not offered by specs.

The published group holds ``answers`` (geography x query), ``variance`` (query; the
variance of every answer, the same for every geography), ``ids`` (geography),
``query_upper`` (the upper value of every prefix), ``bias_per_record`` (query) and, in
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
candidate's ``q F - p N`` is at least ``-alpha`` (Dwork and Roth, Theorem 3.24). A
geography's own truncated records are at most that many. The attribute records this bound
as a formula in ``N``; it does not invent a number. For the recursive threshold no
bound on ``n_trunc`` is derived here and the attribute says so (only ``bias_per_record``
is published). With no threshold the bias is zero.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import shutil
import sys
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from dpdask.errors import SpecError
from dpdask.privacy import PureDP

__all__ = ["SPEC_KEYS", "SpecError", "load_spec", "main", "run_spec"]

SPEC_KEYS = (
    "model",
    "release",
    "data",
    "geographies",
    "bins",
    "workload",
    "threshold",
    "mechanism",
    "strategy",
    "privacy",
    "output",
    "ledger",
)
_REQUIRED = ("release", "data", "geographies", "bins", "privacy", "output", "ledger")
_DATA_KEYS = {"format", "path", "geography_column", "value_column"}
_MECHANISMS = ("Identity", "Workload", "TiMM", "TaMM")
_THRESHOLD_KEYS = {"svt": {"name", "r", "s", "c"}, "recursive": {"name", "theta0", "beta", "mu"}}
_CHUNK = 256  # geographies per measured chunk
_BETA = 0.05  # failure probability of the published SVT bound on truncated records
THRESHOLD_LEVEL = "all"


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


def load_spec(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a sum spec; return its parsed form (paths resolved, numbers exact).

    Raises
    ------
    SpecError
        If it is not ``model: sums``, has an unknown key, lacks a required one or has a
        value of the wrong kind.
    """
    import yaml

    p = pathlib.Path(path)
    doc = yaml.safe_load(p.read_text())
    if not isinstance(doc, dict) or doc.get("model") != "sums":
        raise SpecError(f"{p}: not a sum spec (model: sums)")
    unknown = sorted(set(doc) - set(SPEC_KEYS))
    if unknown:
        raise SpecError(f"{p}: unknown key(s) {unknown}; allowed: {', '.join(SPEC_KEYS)}")
    missing = [k for k in _REQUIRED if k not in doc]
    if missing:
        raise SpecError(f"{p}: missing {missing}")
    base = p.parent
    release = doc["release"]
    if not isinstance(release, str) or not release:
        raise SpecError(f"release: a non-empty string is required, got {release!r}")

    data = _mapping(doc["data"], "data", _DATA_KEYS, _DATA_KEYS - {"format"})
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
    k = (high - low) / width
    if k.denominator != 1 or k > 100_000:
        raise SpecError("bins: (high - low) / width must be a whole number of bins (<= 100,000)")

    w = doc.get("workload", "prefix")
    every = 1
    if isinstance(w, dict):
        w = _mapping(w, "workload", {"name", "every"}, {"name"})
        every = w.get("every", 1)
        w = w["name"]
    if w != "prefix":
        raise SpecError(f"workload: only prefix sums are offered (prefix), got {w!r}")
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= int(k):
        raise SpecError(f"workload.every: an integer in [1, {int(k)}], got {every!r}")

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
    if mech == "SQM":
        raise SpecError("mechanism: SQM (a threshold per query) is not offered by specs")
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

    pr = _mapping(doc["privacy"], "privacy", {"epsilon", "threshold_share"}, {"epsilon"})
    eps = _number(pr["epsilon"], "privacy.epsilon")
    if eps <= 0:
        raise SpecError("privacy.epsilon must be positive (sum releases are pure DP)")
    rho = _number(pr.get("threshold_share", "0.1" if t != "none" else 0), "threshold_share")
    if t == "none" and rho != 0:
        raise SpecError("privacy.threshold_share: must be 0 (or absent) with threshold: none")
    if t != "none" and not 0 < rho < 1:
        raise SpecError("privacy.threshold_share must lie strictly between 0 and 1")

    led = _mapping(doc["ledger"], "ledger", {"path", "create"}, {"path"})
    create = led.get("create", False)
    if not isinstance(create, bool):
        raise SpecError("ledger.create: true or false")

    return {
        "source": p,
        "release": release,
        "data": _path(base, data["path"], "data.path"),
        "geography_column": data["geography_column"],
        "value_column": data["value_column"],
        "geographies": ids,
        "bins": (low, high, int(k)),
        "every": int(every),
        "threshold": t,
        "threshold_options": topts,
        "mechanism": mech,
        "strategy": s,
        "strategy_options": sopts,
        "epsilon": eps,
        "rho": rho,
        "output": _path(base, doc["output"], "output"),
        "ledger": _path(base, led["path"], "ledger.path"),
        "ledger_create": create,
    }


def _read_records(spec: dict[str, Any], bins: Any) -> np.ndarray:
    """The histogram of every listed geography over the bins (int64, ``(g, k)``).

    Raises
    ------
    SpecError
        Listing every problem found, before anything is charged.
    """
    gcol, vcol = spec["geography_column"], spec["value_column"]
    path = spec["data"]
    if not path.exists():
        raise SpecError(f"data.path: {path} does not exist")
    df = pd.read_csv(path, dtype={gcol: str}, keep_default_na=True)
    cols = [c for c in (gcol, vcol) if c not in df]
    if cols:
        raise SpecError(f"{path}: no column(s) {cols} (columns: {list(df.columns)})")
    problems = []
    geo = df[gcol]
    if geo.isna().any():
        problems.append(f"{int(geo.isna().sum())} record(s) without a {gcol}")
    ids = spec["geographies"]
    known = geo.notna() & geo.isin(ids)
    unknown = sorted(set(geo[geo.notna() & ~known]))
    if unknown:
        problems.append(f"{gcol} value(s) not in geographies: {unknown[:10]}")
    raw = df[vcol]
    vals = pd.to_numeric(raw, errors="coerce").astype(float)
    if raw.isna().any():
        problems.append(f"{int(raw.isna().sum())} record(s) without a {vcol}")
    bad = (raw.notna() & vals.isna()) | (np.isinf(vals))
    if bad.any():
        problems.append(f"{int(bad.sum())} record(s) with a non-numeric or infinite {vcol}")
    fin = vals[np.isfinite(vals)]
    if (fin < 0).any():
        problems.append(f"{int((fin < 0).sum())} record(s) with a negative {vcol}")
    lo, hi = bins.edges[0], bins.edges[-1]
    out = ((fin < lo) & (fin >= 0)) | (fin > hi)
    if out.any():
        problems.append(f"{int(out.sum())} record(s) with {vcol} outside the bins [{lo}, {hi}]")
    if problems:
        raise SpecError(f"{path}: invalid records, nothing was charged: " + "; ".join(problems))
    g = pd.Categorical(geo, categories=ids).codes.astype(np.int64)
    j = bins.index(vals.to_numpy())
    k = bins.size
    flat = np.bincount(g * k + j, minlength=len(ids) * k)
    return flat.reshape(len(ids), k).astype(np.int64)


def _threshold(spec: dict[str, Any], counts: np.ndarray, values: np.ndarray, eps: Any, rng: Any):
    from dpdask.sums import recursive_threshold, svt_threshold

    opts = dict(spec["threshold_options"])
    width = float(values[0])  # the first representative value: the smallest candidate
    if spec["threshold"] == "svt":
        opts.setdefault("s", width)
        return svt_threshold(counts, values, eps, rng, **opts)
    opts.setdefault("theta0", width)
    return recursive_threshold(counts, values, eps, rng, **opts)


def _bias_record(spec: dict[str, Any], result: Any, mech: Any, eps_t: Any) -> dict[str, Any]:
    if result is None:
        return {"kind": "exact", "bound": 0.0, "text": "no truncation: the sums are unbiased"}
    if not math.isfinite(result.value):
        return {"kind": "exact", "bound": 0.0, "text": "SVT chose no threshold: unbiased"}
    if result.method != "svt":
        return {
            "kind": "unavailable",
            "text": (
                "no valid bound on the number of truncated records is derived for the "
                "recursive threshold; |bias_i| <= n_trunc * bias_per_record_i with n_trunc "
                "(the records above theta) not released"
            ),
        }
    r = Fraction(result.params["r"])
    p, q = r.numerator, r.denominator
    delta = max(p, q - p)
    K = int(result.params["candidates"])
    alpha = 8 * delta / float(eps_t) * math.log(4 * K / _BETA)
    return {
        "kind": "high_probability",
        "probability": 1 - _BETA,
        "truncated_records_fraction_of_N": float(1 - r),
        "truncated_records_additive": alpha / q,
        "text": (
            f"with probability >= {1 - _BETA}, -bias_i <= ((1 - r) N + alpha / q) * "
            "bias_per_record_i, N the (unreleased) number of records, r = p / q = "
            f"{r}, alpha = 8 max(p, q - p) / eps_threshold * ln(4 K / beta) = {alpha:.6g}; "
            "the bias is never positive (see dpdask.sums.spec)"
        ),
    }


def run_spec(
    path: str | os.PathLike, *, overwrite: bool = False, run_id: str | None = None
) -> dict[str, Any]:
    """Run the sum release of the spec at ``path`` (module notes); return a summary.

    Raises
    ------
    SpecError
        For a bad spec or bad records (nothing charged).
    dpdask.publish.StoreExistsError
        If the output exists and ``overwrite`` is false.
    dpdask.privacy.BudgetExceededError
        If the release's budget is spent (nothing charged).
    """
    import zarr

    from dpdask.domain import Domain
    from dpdask.measure import charge_level, lattice, measure
    from dpdask.noise import KeyedRNG, MeasurementId, new_key
    from dpdask.privacy import Charge, Ledger, LedgerMissingError, RunStateError, check_run_id
    from dpdask.publish import RELEASE_FORMAT, check_output, move_into_place, new_run_id
    from dpdask.sums import NumericBins, SumWorkload, split_budget, sum_mechanism
    from dpdask.sums import threshold_charge as make_threshold_charge

    spec = load_spec(path)
    release, level = spec["release"], spec["geography_column"]
    ledger_path = spec["ledger"]
    output = check_output(
        spec["output"],
        overwrite,
        [
            ("input data", spec["data"]),
            ("ledger", ledger_path),
            ("ledger head file", ledger_path.with_name(ledger_path.name + ".head")),
            ("release spec", spec["source"]),
        ],
    )
    if not ledger_path.exists() and not spec["ledger_create"]:
        raise LedgerMissingError(
            f"ledger: there is no ledger at {ledger_path}; create it with `dpdask ledger init` "
            "or write `ledger: {path: ..., create: true}`"
        )
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(ledger_path, create=spec["ledger_create"])
    run_id = check_run_id(run_id) if run_id is not None else new_run_id()
    if ledger.run(release, run_id) is not None:
        raise RunStateError(
            f"run {run_id!r} of release {release!r} is in the ledger; sum runs cannot resume "
            "(their key is not kept): abandon it and start a new run id"
        )

    low, high, k = spec["bins"]
    bins = NumericBins.uniform(float(low), float(high), k)
    x = _read_records(spec, bins)  # raises before anything is charged
    values = bins.values

    budget = PureDP(spec["epsilon"])
    eps_t, eps_m = split_budget(budget, spec["rho"])
    key = new_key()
    fp = key.fingerprint()
    ledger.open_release(release, budget)
    # both charges must fit before either is made
    probe = [Charge(release, run_id, level, "sums", "laplace", 1.0, 1.0, eps_m, fp)]
    dry = None
    if spec["threshold"] != "none":
        test_rng = KeyedRNG.for_testing(0, identity="dry")  # parameters only, no data
        dry = _threshold(spec, np.zeros(k, np.int64), values, eps_t.epsilon, test_rng)
        probe.append(make_threshold_charge(dry, release, run_id, THRESHOLD_LEVEL, "threshold", key))
    ledger.check(probe)

    result = None
    theta = None
    if dry is not None:
        charge_t = make_threshold_charge(dry, release, run_id, THRESHOLD_LEVEL, "threshold", key)
        ledger.charge(charge_t)  # durably, before the threshold's noise is drawn
        ident = MeasurementId(release, THRESHOLD_LEVEL, 0, "threshold")
        rng = KeyedRNG(key, {"run": run_id, "measurement": ident})
        result = _threshold(spec, x.sum(axis=0), values, eps_t.epsilon, rng)
        again = make_threshold_charge(result, release, run_id, THRESHOLD_LEVEL, "threshold", key)
        if not again._same_as(charge_t):  # pragma: no cover - parameters are data-free
            raise RuntimeError("the threshold's charge depends on the data")
        theta = result.value

    attr = spec["value_column"]
    sums = SumWorkload(Domain(**{attr: k}), attr, values, bins.prefixes(spec["every"]))
    mech = sum_mechanism(
        spec["mechanism"], sums, theta, eps_m, strategy=spec["strategy"],
        **spec["strategy_options"],
    )  # fmt: skip
    plan = mech.plan()
    charge_level(plan, ledger, release, run_id, level, "sums", key=key)  # once, all chunks
    parts = []
    for c, start in enumerate(range(0, x.shape[0], _CHUNK)):
        ident = MeasurementId(release, level, c, "sums")
        z = measure(plan, x[start : start + _CHUNK], key, ident, ledger, run_id)
        parts.append(mech.answer(z))
    answers = np.concatenate(parts, axis=0)
    lat = lattice(plan, np.int64)
    inflate = float(lat.noise_scale) / float(plan.noise_scale)
    variance = np.asarray(mech.query_variances(), dtype=float) * inflate**2
    per_record = np.asarray(mech.bias_per_record(), dtype=float)
    upper = values[np.asarray(bins.prefixes(spec["every"]).hi)]

    head = ledger.head()
    info = {
        "format": RELEASE_FORMAT,
        "format_version": 1,
        "kind": "sums",
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "release": release,
        "run_id": run_id,
        "level": level,
        "attribute": attr,
        "bins": {"low": float(low), "high": float(high), "count": k, "values": "upper ends"},
        "workload": {"name": "prefix", "every": spec["every"], "queries": int(answers.shape[1])},
        "threshold": (
            {"method": "none", "theta": None}
            if result is None
            else {**result.to_dict(), "privacy": result.privacy.to_dict()}
        ),
        "mechanism": {
            "name": mech.name,
            "template": mech.template,
            "noise": lat.mechanism,
            "noise_scale": float(lat.noise_scale),
            "sensitivity": float(lat.sensitivity),
            "lattice_step": 2.0**-lat.k,
            "privacy": eps_m.to_dict(),
        },
        "budget": {
            "total": budget.to_dict(),
            "threshold_share": str(spec["rho"]),
            "threshold": None if eps_t is None else eps_t.to_dict(),
            "sums": eps_m.to_dict(),
        },
        "variance": (
            "variance[i] = 2 s^2 ||row i of W T M^+||^2 with the published noise scale s: "
            "an upper bound on the discrete Laplace noise's variance; answers are biased "
            "by truncation only (bias_bound)"
        ),
        "bias_bound": _bias_record(spec, result, mech, None if eps_t is None else eps_t.epsilon),
        "charges": [
            {
                "level": c.level,
                "measurement": c.measurement,
                "mechanism": c.mechanism,
                "sensitivity": c.sensitivity,
                "noise_scale": c.noise_scale,
                "privacy": c.privacy.to_dict(),
            }
            for c in ledger.charges(release)
            if c.run_id == run_id
        ],
        "ledger": {
            "path": str(ledger.path),
            "id": ledger.ledger_id,
            "head": str(head),
            "spent": ledger.spent(release).to_dict(),
            "remaining": ledger.remaining(release).to_dict(),
        },
    }
    tmp = output.with_name(f".{output.name}.partial-{os.getpid()}-{run_id}")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        root = zarr.open_group(str(tmp), mode="w-", zarr_format=3)
        root.create_array(
            "answers", shape=answers.shape, dtype="float64", dimension_names=("geography", "query")
        )[:] = answers
        root.create_array("variance", shape=variance.shape, dtype="float64",
                          dimension_names=("query",))[:] = variance  # fmt: skip
        root.create_array("bias_per_record", shape=per_record.shape, dtype="float64",
                          dimension_names=("query",))[:] = per_record  # fmt: skip
        root.create_array("query_upper", shape=upper.shape, dtype="float64",
                          dimension_names=("query",))[:] = upper  # fmt: skip
        ids = np.asarray(spec["geographies"], dtype=str)
        root.create_array("ids", shape=ids.shape, dtype=str, dimension_names=("geography",))[:] = (
            ids
        )
        root.attrs.update({"dpdask": info, "release": release, "run_id": run_id})
        move_into_place(tmp, output, overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    ledger.publish(release, run_id, str(output))
    return {
        "release": release,
        "run_id": run_id,
        "output": str(output),
        "geographies": int(answers.shape[0]),
        "queries": int(answers.shape[1]),
        "threshold": info["threshold"]["theta"],
        "mechanism": mech.name,
        "ledger": str(ledger.path),
        "ledger_head": str(head),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m dpdask.sums.spec run SPEC [--json] [--overwrite]``."""
    ap = argparse.ArgumentParser(prog="dpdask.sums.spec")
    ap.add_argument("command", choices=["run"])
    ap.add_argument("spec")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    args = ap.parse_args(argv)
    print(
        json.dumps(run_spec(args.spec, overwrite=args.overwrite), indent=None if args.json else 2)
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
