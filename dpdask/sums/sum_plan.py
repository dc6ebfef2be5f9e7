"""``dpdask validate`` and ``dpdask plan`` for sum specs (:mod:`dpdask.sums.sum_spec`).

:func:`validate_spec` makes every check :func:`dpdask.sums.sum_release.run_spec` makes before
it charges (the spec, the output path, the ledger, the run id, the records, the budget),
writing and spending nothing. :func:`plan_spec` reads no data: the threshold is drawn
from the data, so it reports the mechanism at every threshold the run may use (SVT: its
candidates ``s c^(i-1)``; the recursive threshold is continuous and is shown on the grid
``theta0 1.2^(i-1)``, for illustration) and with no truncation, each with the variance a
release would publish (the lattice's noise scale included), and the bias bound's formula.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from dpdask.privacy import PureDP, ledger_shown
from dpdask.sums._setup import (
    BETA,
    THRESHOLD_LEVEL,
    check_budget,
    dataset_of,
    finite,
    preflight,
    probe,
    setup,
)
from dpdask.sums.sum_spec import load_spec
from dpdask.sums.thresholds import exponential_grid, recursive_margin, svt_truncation_bound

__all__ = ["format_plan", "plan_spec", "validate_spec"]


def _charges(charges: list[Any]) -> list[dict[str, Any]]:
    return [
        {"measurement": c.measurement, "level": c.level, "epsilon": str(c.privacy.epsilon)}
        for c in charges
    ]


def validate_spec(
    path: str | os.PathLike[str], *, run_id: str | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Check a sum spec and its records as a run would; charge, write and create nothing.

    Returns
    -------
    dict
        ``ok``, the release, the geographies and cells, the charges a run would make and
        the budget left.

    Raises
    ------
    SpecError
        For a bad spec or bad records.
    dpdask.publish.StoreExistsError, dpdask.publish.UnsafeOutputError
        For an output a run would refuse.
    dpdask.privacy.LedgerError
        A missing or tampered ledger, a used run id, a budget that does not fit.
    """
    from dpdask.noise import new_key
    from dpdask.publish import check_interpreter, check_unclaimed
    from dpdask.sums._records import read_records
    from dpdask.sums.accounting import split_budget

    spec = load_spec(path)
    check_interpreter()  # as a run: python -O cannot publish
    check_unclaimed(spec["output"])  # a run publishing there now
    output, ledger, rid = preflight(spec, overwrite, run_id, create=False)
    st = setup(spec)
    eps_t, eps_m = split_budget(PureDP(spec["epsilon"]), spec["rho"])
    charges, _ = probe(spec, st, rid, new_key(), eps_t, eps_m)
    dataset = dataset_of(spec)
    left = check_budget(spec, ledger, charges, dataset)
    x = read_records(spec, st.bins)
    return {
        "ok": True,
        "release": spec["release"],
        "dataset": dataset,
        "output": str(output),
        "ledger": str(ledger.path if ledger is not None else ledger_shown(spec["ledger"]))
        + ("" if ledger is not None else " (created by run)"),  # never a server's password
        "geographies": int(x.shape[0]),
        "cells": int(x.shape[1]),
        "queries": int(st.sums.shape[0]),
        "charges": _charges(charges),
        "budget_remaining": left.to_dict(),
    }


def _candidates(spec: dict[str, Any], values: np.ndarray) -> tuple[list[float], str]:
    if spec["threshold"] == "none":
        return [], "none"
    opts = spec["threshold_options"]
    top = float(values.max())
    if spec["threshold"] == "svt":
        grid = exponential_grid(opts.get("s", values[0]), opts.get("c", 1.2), top)
        return [float(g) for g in grid if g < top], "the SVT candidates below the top value"
    grid = exponential_grid(opts.get("theta0", values[0]), 1.2, top)
    return [
        float(g) for g in grid if g < top
    ], "illustrative (the recursive threshold is continuous)"


def _row(mech: Any, theta: float | None) -> dict[str, Any]:
    from dpdask.measure import lattice

    lat = lattice(mech.plan(), np.int64)
    var = np.asarray(mech.variances_at(lat.variance), dtype=float)
    return {
        "theta": finite(theta),
        "noise_scale": float(lat.noise_scale),
        "lattice_step": 2.0**-lat.k,
        "noise_variance": float(lat.variance),
        "rmse_per_query": float(math.sqrt(var.mean())),
        "max_query_stddev": float(math.sqrt(var.max())),
        "max_bias_per_record": float(np.max(mech.bias_per_record())),
    }


def _recursive_plan(dry: Any) -> dict[str, Any]:
    """The recursive threshold's bias bound as the plan can state it (before the draw)."""
    runs, pr = int(dry.theta.size), dry.params
    shift, fail = recursive_margin(
        float(dry.privacy.epsilon), pr["beta"], pr["mu"], BETA / runs,
        discrete=pr["noise"] == "discrete",
    )  # fmt: skip
    total = fail * runs
    if total >= 1:
        return {
            "kind": "unavailable",
            "text": f"the bound fails with probability {fail:.3g} per threshold: raise mu",
        }
    return {
        "kind": "high_probability",
        "probability": 1 - total,
        "text": (
            f"-bias_i <= floor((ln(theta / {pr['theta0']:g}) - {pr['mu']:g}) / "
            f"{pr['beta']:.6g} + {shift:.6g}) * bias_per_record_i at the drawn threshold"
        ),
    }


def plan_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The data-free plan of a sum spec (module notes); reads no records, charges nothing.

    Returns
    -------
    dict
        The budget split and charges, the threshold's method and candidates, and per
        candidate threshold (``theta: None``: no truncation) the Laplace noise scale, the
        root mean and the largest standard deviation of the answers and the largest
        loss per truncated record; ``bias_bound`` gives the published bound's formula.
    """
    from dpdask.noise import new_key
    from dpdask.sums.accounting import split_budget
    from dpdask.sums.mechanisms import select_strategy, sum_mechanism

    spec = load_spec(path)
    st = setup(spec)
    budget = PureDP(spec["epsilon"])
    eps_t, eps_m = split_budget(budget, spec["rho"])
    charges, dry = probe(spec, st, "plan", new_key(), eps_t, eps_m)
    name = spec["mechanism"]
    opts = {
        "strategy": spec["strategy"],
        "objective": spec["objective"],
        **spec["strategy_options"],
    }
    if name == "TiMM":  # chosen for W: once for every threshold
        opts["base"] = select_strategy(name, st.sums, None, eps_m, **{
            k: v for k, v in opts.items() if k != "base"}).strategy  # fmt: skip
    candidates, note = _candidates(spec, st.bins.values)
    rows = []
    for theta in [*candidates, None]:
        if name == "SQM":
            mech = sum_mechanism(name, st.sums, np.inf if theta is None else theta, eps_m)
        else:
            mech = sum_mechanism(name, st.sums, theta, eps_m, **opts)
        rows.append(_row(mech, theta))
    bias: dict[str, Any] = {"kind": "exact", "text": "no truncation: the sums are unbiased"}
    if dry is not None and dry.method == "svt":
        runs = int(dry.theta.size)
        frac, additive = svt_truncation_bound(dry, BETA / runs)
        bias = {
            "kind": "high_probability",
            "probability": 1 - BETA,
            "text": (
                f"-bias_i <= ({frac:g} N + {additive:.6g}) * bias_per_record_i at the drawn "
                "threshold, N the number of records (see dpdask.sums.sum_spec)"
            ),
        }
    elif dry is not None:
        bias = _recursive_plan(dry)
    return {
        "release": spec["release"],
        "model": "sums",
        "mechanism": name,
        "strategy": spec["strategy"],
        "objective": spec["objective"],
        "postprocess": spec["postprocess"],
        "workload": {**spec["workload"], "queries": st.m},
        "by": st.by,
        "budget": {
            "total": budget.to_dict(),
            "threshold_share": str(spec["rho"]),
            "threshold": None if eps_t is None else eps_t.to_dict(),
            "sums": eps_m.to_dict(),
        },
        "charges": _charges(charges),
        "threshold": {
            "method": spec["threshold"],
            "level": THRESHOLD_LEVEL,
            "runs": st.threshold_runs(name) if dry is not None else 0,
            "params": {} if dry is None else dict(dry.params),
            "candidates": note,
        },
        "thresholds": rows,
        "bias_bound": bias,
    }


def format_plan(report: dict[str, Any]) -> str:
    """The plan as a table (``dpdask plan SPEC`` without ``--json``)."""
    b = report["budget"]
    lines = [
        f"sum release {report['release']}: {report['mechanism']} "
        f"({report['strategy']}, objective {report['objective'] or 'default'}), "
        f"{report['workload']['queries']} queries"
        + "".join(f" x {len(c)} {b}" for b, c in report["by"].items()),
        f"budget {b['total']['epsilon']}: threshold {report['threshold']['method']} "
        f"{(b['threshold'] or {}).get('epsilon', 0)}, sums {b['sums']['epsilon']}",
        f"thresholds: {report['threshold']['candidates']}",
        f"{'theta':>12}{'noise':>12}{'rmse/query':>14}{'max sd':>12}{'bias/record':>14}",
    ]
    for r in report["thresholds"]:
        th = "none" if r["theta"] is None else f"{r['theta']:.6g}"
        lines.append(
            f"{th:>12}{r['noise_scale']:>12.4g}{r['rmse_per_query']:>14.4g}"
            f"{r['max_query_stddev']:>12.4g}{r['max_bias_per_record']:>14.4g}"
        )
    lines.append(f"bias: {report['bias_bound']['text']}")
    return "\n".join(lines)
