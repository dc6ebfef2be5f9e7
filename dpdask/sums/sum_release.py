"""Running a sum release: the threshold, the mechanism, the charges, the noise and the
published group, in the order :mod:`dpdask.sums.sum_spec` documents (with the bias bound)."""

from __future__ import annotations

import datetime
import os
import shutil
from typing import Any

import numpy as np

from dpdask.privacy import PureDP
from dpdask.sums._records import read_records
from dpdask.sums._setup import (
    THRESHOLD_LEVEL,
    bias_record,
    binding,
    check_budget,
    dataset_of,
    preflight,
    probe,
    register,
    setup,
)
from dpdask.sums._setup import threshold as draw_threshold
from dpdask.sums.sum_spec import load_spec

__all__ = ["THRESHOLD_LEVEL", "run_spec"]


_CHUNK = 256  # geographies per measured chunk


def run_spec(
    path: str | os.PathLike[str], *, overwrite: bool = False, run_id: str | None = None
) -> dict[str, Any]:
    """Run the sum release of the spec at ``path`` (:mod:`dpdask.sums.sum_spec`); return a summary.

    Raises
    ------
    SpecError
        For a bad spec or bad records (nothing charged).
    dpdask.publish.StoreExistsError
        If the output exists and ``overwrite`` is false.
    dpdask.privacy.BudgetExceededError
        If the release's budget is spent (nothing charged).
    dpdask.publish.OutputLockedError
        If another run is publishing to the output now (nothing charged).
    """
    from dpdask.publish import claim_output

    spec = load_spec(path)
    with claim_output(spec["output"]):  # python -O and a racing run: refused here
        return _release(spec, overwrite=overwrite, run_id=run_id)


def _release(spec: dict[str, Any], *, overwrite: bool, run_id: str | None) -> dict[str, Any]:
    import zarr

    from dpdask.measure import charge_level, lattice, measure
    from dpdask.noise import KeyedRNG, MeasurementId, new_key
    from dpdask.publish import RELEASE_FORMAT, check_output, move_into_place
    from dpdask.sums import split_budget, sum_mechanism
    from dpdask.sums import threshold_charge as make_threshold_charge

    release, level = spec["release"], spec["geography_column"]
    output, ledger, run_id = preflight(spec, overwrite, run_id, create=False)
    st = setup(spec)
    budget = PureDP(spec["epsilon"])
    eps_t, eps_m = split_budget(budget, spec["rho"])
    key = new_key()
    charges, dry = probe(spec, st, run_id, key, eps_t, eps_m)
    dataset = dataset_of(spec)
    check_budget(spec, ledger, charges, dataset, hold=True)  # before the data is read
    x = read_records(spec, st.bins)  # raises before anything is charged
    if ledger is None:  # every check passed: a new ledger may be born now, not before
        output, ledger, run_id = preflight(spec, overwrite, run_id, create=True)
    values = st.bins.values
    k = st.bins.size
    low, high = st.bins.edges[0], st.bins.edges[-1]

    register(spec, ledger, dataset)  # its lifetime budget and, first, its source
    ledger.open_release(release, budget, dataset)
    ledger.check(charges)  # both charges must fit before either is made
    # the run is bound to its key, input, spec and output before its first charge
    ledger.open_run(release, run_id, key.fingerprint(), binding(spec, output))

    result = None
    if dry is not None:
        if eps_t is None:  # pragma: no cover - a threshold is charged only with its budget
            raise RuntimeError("a threshold without a budget")
        charge_t = charges[1]
        ledger.charge(charge_t)  # durably, before the threshold's noise is drawn
        ident = MeasurementId(release, THRESHOLD_LEVEL, 0, "threshold")
        rng = KeyedRNG(key, {"run": run_id, "measurement": ident})
        runs = st.threshold_runs(spec["mechanism"])
        result = draw_threshold(spec, st.per_bin(x), values, eps_t.epsilon / runs, rng, runs)
        again = make_threshold_charge(result, release, run_id, THRESHOLD_LEVEL, "threshold", key)
        if not again._same_as(charge_t):  # pragma: no cover - parameters are data-free
            raise RuntimeError("the threshold's charge depends on the data")

    attr = spec["value_column"]
    mech = sum_mechanism(
        spec["mechanism"], st.sums, st.thetas(result, spec["mechanism"]), eps_m,
        strategy=spec["strategy"], objective=spec["objective"], **spec["strategy_options"],
    )  # fmt: skip
    plan = mech.plan()
    charge_level(plan, ledger, release, run_id, level, "sums", key=key)  # once, all chunks
    parts = []
    for c, start in enumerate(range(0, x.shape[0], _CHUNK)):
        ident = MeasurementId(release, level, c, "sums")
        chunk = x[start : start + _CHUNK].reshape(-1, *st.domain.shape)
        z = measure(plan, chunk, key, ident, ledger, run_id)
        parts.append(mech.answer(z))
    shape = (*st.group_shape, st.m)
    answers = np.concatenate(parts, axis=0).reshape(x.shape[0], *shape)
    lat = lattice(plan, np.int64)
    variance = np.asarray(mech.variances_at(lat.variance), dtype=float).reshape(shape)
    per_record = np.asarray(mech.bias_per_record(), dtype=float).reshape(shape)
    raw = answers
    if spec["postprocess"] == "isotonic":
        from dpdask.sums.metrics import monotone

        rows = answers.reshape(-1, st.m)
        weights = np.broadcast_to(1.0 / variance, answers.shape).reshape(rows.shape)
        answers = monotone(rows, weights).reshape(answers.shape)
    mech_info = {
        "name": mech.name,
        "template": getattr(mech, "template", "sum-SQM"),
        "objective": getattr(mech, "info", {}).get("objective"),
    }

    head = ledger.head()
    info = {
        "format": RELEASE_FORMAT,
        "format_version": 1,
        "kind": "sums",
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "release": release,
        "run_id": run_id,
        "dataset": dataset,
        "level": level,
        "attribute": attr,
        "bins": {"low": float(low), "high": float(high), "count": k, "values": "upper ends"},
        "workload": {**spec["workload"], "queries": st.m},
        "by": st.by,
        "threshold": (
            {"method": "none", "theta": None}
            if result is None
            else {
                **result.to_dict(),
                "runs": int(result.theta.size),
                "privacy": (result.privacy * int(result.theta.size)).to_dict(),
            }
        ),
        "mechanism": {
            **mech_info,
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
            "variance[i] = v ||row i of W T M^+||^2, v the variance of the discrete "
            "Laplace noise drawn on each measured row (scale noise_scale on its lattice); "
            "answers are biased by truncation only (bias_bound)"
        ),
        "bias_bound": bias_record(result),
        "postprocess": (
            {"method": "none"}
            if raw is answers
            else {
                "method": "isotonic",
                "text": "answers: weighted isotonic fit per row (weights 1 / variance) of "
                "answers_raw; variance is the raw answers'",
            }
        ),
        "charges": [c.published() for c in ledger.charges(release) if c.run_id == run_id],
        "ledger": {
            "path": str(ledger.path),
            "id": ledger.ledger_id,
            "head": str(head),
            "dataset": dataset,
            "spent": ledger.spent(release).to_dict(),
            "remaining": ledger.remaining(release).to_dict(),
        },
    }
    tmp = output.with_name(f".{output.name}.partial-{os.getpid()}-{run_id}")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        root = zarr.open_group(str(tmp), mode="w-", zarr_format=3)
        dims = (*st.by, "query")
        arrays = {
            "answers": (answers, ("geography", *dims)),
            **({} if raw is answers else {"answers_raw": (raw, ("geography", *dims))}),
            "variance": (variance, dims),
            "bias_per_record": (per_record, dims),
            "query_lower": (np.asarray(st.lower, dtype=float), ("query",)),
            "query_upper": (np.asarray(st.upper, dtype=float), ("query",)),
        }
        for name, (arr, dn) in arrays.items():
            root.create_array(name, shape=arr.shape, dtype="float64", dimension_names=dn)[:] = arr
        labels = {"ids": (spec["geographies"], "geography")}
        labels.update({f"by_{b}": (cats, b) for b, cats in st.by.items()})
        for name, (lab, dim) in labels.items():
            arr = np.asarray(lab, dtype=str)
            root.create_array(name, shape=arr.shape, dtype=str, dimension_names=(dim,))[:] = arr
        root.attrs.update({"dpdask": info, "release": release, "run_id": run_id})
        check_output(output, overwrite)  # nothing else (nor a link) appeared meanwhile
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
        "queries": int(np.prod(shape)),
        "threshold": info["threshold"]["theta"],
        "mechanism": mech.name,
        "ledger": str(ledger.path),
        "ledger_head": str(head),
    }
