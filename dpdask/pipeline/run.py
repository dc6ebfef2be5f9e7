"""Running a release spec: validate it, plan it, run it.

``validate`` and ``plan`` never spend budget and ``validate`` reads the data only
to check it; ``run`` selects the strategy, charges the ledger and publishes.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from dpdask.dataflow import DataStore, open_store, read_pl94, write_store
from dpdask.domain import Domain, Geography
from dpdask.linalg import LinearQuery
from dpdask.pipeline.spec import ReleaseSpec, SpecError

__all__ = ["build_workload", "load_data", "plan_spec", "run_spec", "validate_spec"]


# -- workloads by name ----------------------------------------------------------------------
def build_workload(workload: Mapping[str, Any], domain: Domain) -> LinearQuery:
    """The workload a spec names, on ``domain`` (names: :func:`dpdask.workloads.named.named`)."""
    from dpdask.workloads.named import named

    opts = {k: v for k, v in workload.items() if k != "name"}
    try:
        return named(workload["name"], domain, **opts)
    except ValueError as exc:
        raise SpecError(f"workload: {exc}") from None


# -- data -----------------------------------------------------------------------------------
def synthetic_geography(n_units: int, n_states: int) -> Geography:
    """A state > county hierarchy with ``n_units`` counties in ``n_states`` contiguous states."""
    n_states = max(1, min(n_states, n_units))
    sizes = np.diff(np.linspace(0, n_units, n_states + 1).round().astype(int))
    parent = np.repeat(np.arange(n_states), sizes)
    states = tuple(f"{s + 1:02d}" for s in range(n_states))
    counties = tuple(f"{states[p]}{i:04d}" for i, p in enumerate(parent))
    return Geography(levels=("state", "county"), ids=(states, counties), parents=(parent,))


def _input_path(spec: ReleaseSpec) -> pathlib.Path:
    return spec.output.with_name(f".{spec.output.name}.input.zarr")


def load_data(spec: ReleaseSpec, *, write: bool = True) -> DataStore:
    """Open (or build, for P.L. 94-171 files and synthetic data) the spec's data store.

    Built stores are cached beside the output (``.<output>.input.zarr``) and reused.
    """
    fmt = spec.data.format
    if fmt == "store":
        store = open_store(spec.data.path)
    else:
        cached = _input_path(spec)
        if cached.exists():
            store = open_store(cached)
        elif not write:
            return None  # type: ignore[return-value]
        elif fmt == "pl94":
            counts, domain, geo = read_pl94(spec.data.path)
            store = write_store(cached, counts, domain, geo, source=f"P.L. 94-171 {spec.data.path}")
        elif fmt == "synthetic":
            store = _synthetic_store(spec, cached)
        elif fmt == "records":
            from dpdask.dataflow import ingest_records

            opts = dict(spec.data.options)
            if "geography_column" not in opts:
                raise SpecError("data.geography_column: required for format 'records'")
            store = ingest_records(spec.data.path, spec.domain, store=cached, **opts)
        else:  # pragma: no cover - parse_spec refuses other formats
            raise SpecError(f"data.format: {fmt!r}")
    if store.domain != spec.domain:
        raise SpecError(f"domain: the spec says {spec.domain} but the data has {store.domain}")
    return store


def _synthetic_store(spec: ReleaseSpec, path: pathlib.Path) -> DataStore:
    import tempfile

    from dpdask.dataflow import adopt_array
    from dpdask.datasets import synthetic_persons

    opts = dict(spec.data.options)
    n = int(opts.get("geographies", 50))
    geo = synthetic_geography(n, int(opts.get("states", max(1, round(n / 60)))))
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        syn = synthetic_persons(
            spec.domain, n, pathlib.Path(tmp) / "counts.zarr", seed=int(opts.get("seed", 0)),
            population=float(opts.get("population", 25_000)),
        )  # fmt: skip
        return adopt_array(syn.array, spec.domain, geo, path)


# -- the three verbs ------------------------------------------------------------------------
def _levels(spec: ReleaseSpec, store: DataStore) -> tuple[str, ...]:
    levels = spec.levels or store.geography.levels
    for lv in levels:
        if lv not in store.geography.levels:
            raise SpecError(
                f"levels: {lv!r} is not a level of the data ({list(store.geography.levels)})"
            )
    return tuple(levels)


def plan_spec(spec: ReleaseSpec, client: Any = None) -> tuple[Any, dict[str, Any]]:
    """Select the strategy (no data read) and report the expected error per level."""
    from dpdask.strategy import select

    W = build_workload(spec.workload, spec.domain)
    plan = select(
        W,
        spec.privacy,
        strategy=spec.strategy,
        domain=spec.domain,
        client=client,
        **spec.strategy_options,
    )
    levels = spec.levels or ()
    shares = spec.level_budgets(levels) if levels else {}
    report: dict[str, Any] = {
        "release": spec.release,
        "workload": spec.workload,
        "queries": int(W.shape[0]),
        "cells": int(spec.domain.size),
        "strategy": spec.strategy,
        "budget": spec.privacy.to_dict(),
        "levels": [],
    }
    from dpdask.dataflow.release import LevelPlan

    for lv, b in shares.items():
        lp = LevelPlan(plan, b)
        qv = lp.query_variances()
        report["levels"].append(
            {
                "level": lv,
                "budget": b.to_dict(),
                "noise_scale": lp.noise_scale,
                "rmse_per_query": float(math.sqrt(qv.mean())),
                "max_query_stddev": float(math.sqrt(qv.max())),
            }
        )
    return plan, report


def validate_spec(spec: ReleaseSpec) -> dict[str, Any]:
    """Check the spec against its data and ledger without spending anything.

    Returns a report; raises :class:`SpecError` (or the data reader's error) naming
    the problem.
    """
    from dpdask.privacy import Ledger

    if spec.data.path is not None and not spec.data.path.exists():
        raise SpecError(f"data.path: {spec.data.path} does not exist")
    W = build_workload(spec.workload, spec.domain)
    if W.shape[1] != spec.domain.size:
        raise SpecError(f"workload: has {W.shape[1]} columns for {spec.domain.size} cells")
    report: dict[str, Any] = {"release": spec.release, "workload_queries": int(W.shape[0])}
    if spec.data.format in ("store",) or _input_path(spec).exists():
        store = load_data(spec, write=False)
    elif spec.data.format == "pl94":
        _counts, domain, geo = read_pl94(spec.data.path)
        if domain != spec.domain:
            raise SpecError(f"domain: the spec says {spec.domain} but the data has {domain}")
        store = None
        report["units"] = {lv: geo.n_units(lv) for lv in geo.levels}
        levels = spec.levels or geo.levels
        for lv in levels:
            geo.level_index(lv)
    else:
        store = None
    if store is not None:
        levels = _levels(spec, store)
        report["units"] = {lv: store.geography.n_units(lv) for lv in levels}
    if spec.levels is not None:
        spec.level_budgets(spec.levels)
    if spec.ledger.exists():
        ledger = Ledger(spec.ledger)
        try:
            left = ledger.remaining(spec.release)
        except (KeyError, ValueError):
            left = None
        if left is not None:
            report["budget_remaining"] = left.to_dict()
            if not spec.privacy <= left:
                raise SpecError(
                    f"privacy: the release asks for {spec.privacy} but only {left} is left "
                    f"in {spec.ledger}"
                )
    report["ok"] = True
    return report


def run_spec(
    spec: ReleaseSpec,
    *,
    client: Any = None,
    run_id: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Run a release spec end to end; returns a summary of what was published."""
    from dpdask.dataflow.release import release
    from dpdask.privacy import Ledger

    plan, report = plan_spec(spec, client=client)
    store = load_data(spec)
    levels = _levels(spec, store)
    spec.ledger.parent.mkdir(parents=True, exist_ok=True)
    rel = release(
        plan, store, levels=levels,
        budget_split={lv: spec.split[lv] for lv in levels} if spec.split else None,
        reconstruct=spec.reconstruct, release_id=spec.release, run_id=run_id,
        ledger=Ledger(spec.ledger), dataset=None,
    )  # fmt: skip
    out = rel.to_zarr(spec.output, overwrite=overwrite, client=client, progress=progress)
    summary = rel.summary()
    summary["output"] = str(out)
    summary["ledger"] = str(spec.ledger)
    summary["expected"] = report["levels"]
    return summary
