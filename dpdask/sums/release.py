"""Running a sum release: the threshold, the mechanism, the charges, the noise and the
published group, in the order :mod:`dpdask.sums.spec` documents (with the bias bound)."""

from __future__ import annotations

import datetime
import math
import os
import shutil
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.privacy import PureDP
from dpdask.sums._records import read_records
from dpdask.sums.spec import load_spec

__all__ = ["THRESHOLD_LEVEL", "run_spec"]


_CHUNK = 256  # geographies per measured chunk
_BETA = 0.05  # failure probability of the published SVT bound on truncated records
THRESHOLD_LEVEL = "all"


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
    """Run the sum release of the spec at ``path`` (:mod:`dpdask.sums.spec`); return a summary.

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
    x = read_records(spec, bins)  # raises before anything is charged
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
        "charges": [c.published() for c in ledger.charges(release) if c.run_id == run_id],
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
