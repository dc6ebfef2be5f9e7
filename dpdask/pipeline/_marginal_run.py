"""Run a marginal release spec: ``strategy: residual`` over person records.

Chosen by :func:`is_marginal_spec` (``strategy: residual``, or a workload given as a
list of attribute sets): the spec's checks, output claim, ledger, run binding, key and
work folder are those of every release (:func:`dpdask.pipeline.run_spec`), but the
records are never counted into a data vector: each level's plan is the residual plan
of the marginal workload at the level's share of the budget, every level is charged
before any record is measured, and the tables are measured and reconstructed per chunk
of units on Dask (:mod:`dpdask.graph._marginal_release`), then published atomically.
"""

from __future__ import annotations

import datetime
import itertools
from typing import Any

from dpdask.errors import PlanError
from dpdask.pipeline.spec import ReleaseSpec, SpecError

__all__ = [
    "is_marginal_spec",
    "marginal_sets",
    "plan_marginals",
    "plan_report",
    "run_marginals",
    "validate_marginals",
]


def is_marginal_spec(spec: ReleaseSpec) -> bool:
    """Whether the spec is released by the residual path (module notes)."""
    return spec.strategy == "residual" or spec.workload.get("name") == "marginal-sets"


def marginal_sets(spec: ReleaseSpec) -> tuple[list[tuple[int, ...]], list[float]]:
    """The workload's attribute sets (indices in the domain) and weights."""
    if spec.per_level:
        raise SpecError("workload: a marginal release has one workload for every level")
    w = spec.workload
    names = list(spec.domain)
    if w.get("name") == "marginals":
        k = int(w.get("k", 1))
        if not 0 <= k <= len(names):
            raise SpecError(f"workload.marginals.k: {k} is not between 0 and {len(names)}")
        sets = list(itertools.combinations(range(len(names)), k))
        return sets, [1.0] * len(sets)
    if w.get("name") != "marginal-sets":
        raise SpecError("workload: strategy 'residual' needs {marginals: {k: K}} or a list of sets")
    sets, weights = [], []
    for j, (attrs, weight) in enumerate(zip(w["sets"], w["weights"], strict=True)):
        unknown = [a for a in attrs if a not in names]
        if unknown:
            raise SpecError(f"workload.marginals[{j}]: {unknown[0]!r} is not an attribute")
        sets.append(tuple(sorted(names.index(a) for a in attrs)))
        weights.append(float(weight))
    return sets, weights


def plan_marginals(spec: ReleaseSpec, levels: tuple[str, ...]) -> dict[str, Any]:
    """The residual plan of each released level at its share of the budget."""
    from dpdask.strategy.residual import MarginalWorkload, plan_residual

    if spec.neighbours.name != "add-remove":  # residual bases have negative Gram entries
        raise SpecError(
            "privacy.neighbours: a residual (marginal) release states its budget in "
            "add-remove terms only"
        )
    sets, weights = marginal_sets(spec)
    W = MarginalWorkload(spec.domain.shape, sets, weights)
    budgets = spec.level_budgets(levels)
    objective = spec.strategy_options.get("objective", "sum")
    try:
        base = plan_residual(W, budgets[levels[0]], domain=spec.domain, objective=objective)
        return {lv: base.at(budgets[lv]) for lv in levels}
    except PlanError as exc:
        raise SpecError(f"strategy: {exc}") from None


def plan_report(spec: ReleaseSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """``dpdask plan`` of a marginal spec: each level's plan and expected error, data-free."""
    import math

    import numpy as np

    if not spec.levels:
        raise SpecError("levels: a marginal release names its released levels")
    plans = plan_marginals(spec, spec.levels)
    rows = []
    for lv, p in plans.items():
        v = np.repeat(p.marginal_variances(), p.marginals.cells())
        rows.append({
            "level": lv, "budget": p.privacy.to_dict(), "noise_scale": float(p.noise_scale),
            "rmse_per_query": float(math.sqrt(v.mean())),
            "max_query_stddev": float(math.sqrt(v.max())),
        })  # fmt: skip
    first = next(iter(plans.values()))
    report = {
        "release": spec.release, "workload": spec.workload, "cells": int(spec.domain.size),
        "strategy": "residual", "budget": spec.privacy.to_dict(),
        "queries": int(first.marginals.cells().sum()), "levels": rows,
    }  # fmt: skip
    return plans, report


def _read(spec: ReleaseSpec) -> Any:
    from dpdask.store import read_codes

    if spec.data.format != "records":
        raise SpecError("data.format: a marginal release reads person records (format: records)")
    opts = dict(spec.data.options)
    col = opts.pop("geography_column")
    keep = ("levels", "attribute_columns", "categories", "unknown_geography", "blocksize")
    extra = sorted(k for k in opts if k not in (*keep, "geographies"))
    if extra:
        raise SpecError(f"data.{extra[0]}: not used by a marginal release")
    return read_codes(
        spec.data.path, spec.domain, col, geographies=opts["geographies"],
        **{k: opts[k] for k in keep if k in opts},
    )  # fmt: skip


def validate_marginals(spec: ReleaseSpec, checked: Any) -> dict[str, Any]:
    """What :func:`dpdask.pipeline.validate_spec` reports for a marginal spec: the
    records read and checked, the plans selected; nothing charged or written."""
    geography, _finest, _codes = _read(spec)
    levels = tuple(spec.levels or geography.levels)
    plans = plan_marginals(spec, levels)
    sets, _ = marginal_sets(spec)
    return {
        "release": spec.release,
        "dataset": checked.dataset,
        "workload_queries": sum(p.marginals.cells().sum() for p in plans.values()) // len(plans),
        "marginals": len(sets),
        "units": {lv: geography.n_units(lv) for lv in levels},
        "noise_scale": {lv: float(p.noise_scale) for lv, p in plans.items()},
        "ok": True,
    }


def run_marginals(
    spec: ReleaseSpec, checked: Any, client: Any, overwrite: bool, on_start: Any = None
) -> dict[str, Any]:
    """Release the spec's marginals once its output is claimed and its preflight passed
    (the tail of :func:`dpdask.pipeline.run_spec` for this path)."""
    from dpdask.graph import charge_marginals, levels_of, write_marginals
    from dpdask.noise import KeyFile, new_key
    from dpdask.pipeline._resume import run_binding
    from dpdask.pipeline.run import _preflight
    from dpdask.privacy import RunStateError, bind_source, ledger_files
    from dpdask.publish import RELEASE_FORMAT, check_output, move_into_place, remove_work
    from dpdask.store import private_dir

    geography, finest, codes = _read(spec)  # raises before anything is charged
    levels = tuple(spec.levels or geography.levels)
    for lv in levels:
        if lv not in geography.levels:
            raise SpecError(
                f"levels: {lv!r} is not a level of the universe {list(geography.levels)}"
            )
    plans = plan_marginals(spec, levels)
    if checked.ledger is None:  # every check passed: a new ledger may be born
        checked = _preflight(spec, checked.run_id, overwrite, create=True)
    ledger, work, output = checked.ledger, checked.work, checked.output
    if spec.dataset_budget is not None:
        ledger.set_dataset_total(checked.dataset, spec.dataset_budget)
    bind_source(ledger, checked.dataset, checked.source.content)
    run = ledger.run(spec.release, checked.run_id)
    key_path = work / "key"
    key = KeyFile(key_path).load() if key_path.exists() else None
    if key is None and run is not None:
        raise RunStateError(
            f"run {checked.run_id!r} was charged but its key is gone; abandon it "
            "(`dpdask ledger abandon`) and start a new run id"
        )
    if key is None:
        key = new_key()
        private_dir(work)
        KeyFile.create(key_path, key)
    lvls = levels_of(geography, levels, plans, finest, codes)
    sets, _ = marginal_sets(spec)
    binding = run_binding(spec, output, checked.source)
    if on_start is not None:  # the run exists: announce it, before its first charge
        on_start(checked.run_id, getattr(client, "dashboard_link", None))
    with ledger.bound(spec.release, checked.run_id, binding):
        charges = charge_marginals(
            ledger, lvls, spec.release, checked.run_id, key, spec.privacy, checked.dataset
        )
    attrs = {
        "dpdask": {
            "format": RELEASE_FORMAT,
            "format_version": 1,
            "kind": "marginals",
            "created": datetime.datetime.now(datetime.UTC).isoformat(),
            "release": spec.release,
            "run_id": checked.run_id,
            "dataset": checked.dataset,
            "levels": list(levels),
            "strategy": "residual",
            "budget": spec.privacy.to_dict(),
            "charges": [c.published() for c in charges],
            "marginals": [[list(spec.domain)[i] for i in S] for S in sets],
            "margin_of_error": "moe90 = 1.645 * sqrt(variance)",
        },
        "release": spec.release,
        "run_id": checked.run_id,
        "levels": list(levels),
    }
    final = work / "final.zarr"
    if final.exists():
        import shutil

        shutil.rmtree(final)
    chunks = write_marginals(final, lvls, spec.domain, sets, key, charges, spec.release,
                    checked.run_id, client, attrs, geography=geography)  # fmt: skip
    protected = [("input data", spec.data.path), *ledger_files(spec.ledger), ("work folder", work)]
    check_output(output, overwrite, protected)
    move_into_place(final, output, overwrite)
    KeyFile(key_path).delete()
    ledger.publish(spec.release, checked.run_id, str(output))
    remove_work(work)
    return {
        "release": spec.release,
        "run_id": checked.run_id,
        "output": str(output),
        "ledger": str(ledger.path),
        "dataset": checked.dataset,
        "levels": [
            {
                "level": L.name,
                "units": len(L.ids),
                "chunks": chunks[L.name],
                "noise_scale": float(L.plan.noise_scale),
            }
            for L in lvls
        ],
        "marginals": len(sets),
        "strategy": "residual",
    }
