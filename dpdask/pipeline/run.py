"""Running a release spec: validate it, plan it, run it.

``validate`` and ``plan`` never spend budget and ``validate`` reads the data only
to check it; ``run`` selects the strategy, charges the ledger and publishes.
"""

from __future__ import annotations

import logging
import math
import pathlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpdask.pipeline import _marginal_run as marginal
from dpdask.pipeline._data import (
    check_input,
    data_geography,
    dataset_id,
    load_data,
    plan_geography,
    source_print,
    synthetic_geography,
)
from dpdask.pipeline._outcome import check_before_charging, claimed, failure_reported, validating
from dpdask.pipeline._resume import check_run_key, check_same_run, run_binding
from dpdask.pipeline._spec_plan import (
    check_pass_groups,
    level_passes,
    passes_option,
    passes_statement,
)
from dpdask.pipeline.invariants import checked_constraints
from dpdask.pipeline.spec import ReleaseSpec, SpecError
from dpdask.privacy import (
    BudgetExceededError,
    Ledger,
    LedgerConflictError,
    LedgerMissingError,
    RunStateError,
    bind_source,
    check_dataset_fits,
    check_release_opening,
    check_run_id,
    check_source,
    hold_dataset,
    ledger_exists,
    ledger_files,
    split_levels,
)
from dpdask.privacy.neighbours import both_relations, check_same_noise
from dpdask.publish import (
    check_output,
    check_replaced,
    new_run_id,
    open_ledger,
    period_outputs,
    release_attributes,
    remove_work,
    work_dir,
)
from dpdask.store import DataStore, SourcePrint
from dpdask.workloads.named import build_workload

log = logging.getLogger("dpdask")

__all__ = [
    "build_workload",
    "check_input",
    "dataset_id",
    "load_data",
    "plan_geography",
    "plan_spec",
    "plan_spec_levels",
    "run_spec",
    "synthetic_geography",
    "validate_spec",
]


# -- the three verbs ------------------------------------------------------------------------
def _levels(spec: ReleaseSpec, store: DataStore) -> tuple[str, ...]:
    levels = spec.levels or store.geography.levels
    for lv in levels:
        if lv not in store.geography.levels:
            raise SpecError(
                f"levels: {lv!r} is not a level of the data ({list(store.geography.levels)})"
            )
    return tuple(levels)


def _level_split(spec: ReleaseSpec, levels: tuple[str, ...]) -> dict[str, Any] | None:
    """The levels' shares of a single plan's budget, as ``plan`` and ``run`` pass them to
    :func:`dpdask.graph.level_plans` (None: even, or per-level plans)."""
    if spec.per_level or not spec.split:
        return None
    return {lv: spec.split[lv] for lv in levels}


def _counts_dtype(spec: ReleaseSpec) -> Any:
    """The dtype of the spec's counts, known before the data is read: a store's (its
    metadata), integers for every input converted into one (stores hold integers)."""
    import numpy as np

    from dpdask.store import open_store

    if spec.data.format == "store" and spec.data.path is not None and spec.data.path.exists():
        return open_store(spec.data.path).dtype
    return np.dtype(np.int64)


def plan_spec(spec: ReleaseSpec, client: Any = None) -> tuple[Any, dict[str, Any]]:
    """Select the strategy (no data read) and report the expected error per level.

    Returns one plan whose budget the levels split, or, for a spec with one workload per
    level (``workload: {levels: ...}``), a mapping of level to the plan selected for that
    level's workload with that level's share of the budget.
    """
    chosen, report, _levels = plan_spec_levels(spec, client)
    return chosen, report


def plan_spec_levels(
    spec: ReleaseSpec, client: Any = None
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """:func:`plan_spec`, and every released level's plan as the run makes it
    (:func:`dpdask.graph.level_plans`, its noise as drawn for the input's dtype; none
    for a marginal spec or a spec without levels)."""
    from dpdask.graph import annotate_spine, level_plans, spine_levels
    from dpdask.strategy import select

    if marginal.is_marginal_spec(spec):
        return (*marginal.plan_report(spec), {})
    levels = spec.levels or ()
    shares = spec.level_budgets(levels) if levels else {}

    def choose(W: Any, budget: Any, level: str | None = None) -> Any:
        name, options = (
            (spec.strategy, spec.strategy_options) if level is None else spec.level_strategy(level)
        )
        return select(W, budget, strategy=name, domain=spec.domain, client=client, **options)

    report: dict[str, Any] = {
        "release": spec.release,
        "workload": spec.workload,
        "cells": int(spec.domain.size),
        "strategy": spec.strategy,
        "budget": spec.privacy.to_dict(),  # add/remove: what is charged
        "neighbours": spec.neighbours.name,  # the relation the spec states its budget in
        "budgets": both_relations(spec.privacy),  # the same noise in each relation
        "levels": [],
    }
    if spec.invariants:  # the counts published without noise, and the constraints
        report["invariants"] = spec.invariants.statement()
    stated = passes_statement(spec)
    plans: dict[str, Any] = {}
    if spec.per_level:
        from concurrent.futures import ThreadPoolExecutor

        # every level's selection at once (each may also use the cluster's workers)
        with ThreadPoolExecutor(max_workers=max(1, len(shares))) as pool:
            futures = {
                lv: pool.submit(choose, build_workload(spec.level_workload(lv), spec.domain), b, lv)
                for lv, b in shares.items()
            }
            plans = {lv: f.result() for lv, f in futures.items()}
        report["queries"] = {lv: int(p.workload.shape[0]) for lv, p in plans.items()}
    else:
        W = build_workload(spec.workload, spec.domain)
        plan = choose(W, spec.privacy)
        report["queries"] = int(W.shape[0])
    chosen = plans if spec.per_level else plan
    for p in plans.values() if spec.per_level else [plan]:  # before anything is charged
        check_same_noise(p.strategy, spec.neighbours)
    # the levels' plans as the run makes them (release() calls level_plans with the
    # same split), their noise as drawn for the input's dtype
    spine, geo = None, plan_geography(spec) if spec.spine and levels else None
    if geo is not None:  # units reusing their parent's estimate; budgets moved up
        spine = spine_levels(geo, levels)
    elif spec.spine:
        report["spine"] = "units reusing their parent are known once the data is read"
    moves = None if spine is None else spine.moves
    lps = (
        level_plans(
            chosen, levels, _level_split(spec, levels), dtype=_counts_dtype(spec), moves=moves
        )
        if levels
        else {}
    )
    if stated is not None:  # the multi-pass top-down: each level's passes, in order
        report["passes"] = {**stated, "levels": level_passes(spec, lps)}
    for lv, lp in lps.items():
        qv = lp.query_variances()
        row = {
            "level": lv,
            "budget": lp.privacy.to_dict(),
            "noise_scale": lp.drawn_scale,  # what the measure step draws, data units
            "nominal_noise_scale": lp.noise_scale,  # the calibration's
            "noise": "nominal" if lp.drawn is None else "drawn",  # which noise_scale is
            "noise_variance": lp.row_variance,
            "mean_query_variance": float(qv.mean()),
            "max_query_variance": float(qv.max()),
            "rmse_per_query": float(math.sqrt(qv.mean())),
            "max_query_stddev": float(math.sqrt(qv.max())),
        }
        if spec.per_level:
            row["workload"] = spec.level_workload(lv)["name"]
            row["strategy"] = spec.level_strategy(lv)[0]
        report["levels"].append(row)
    annotate_spine(spine, report["levels"], lps)
    return (plans if spec.per_level else plan), report, lps


def _check_workloads(spec: ReleaseSpec) -> int:
    """Build every workload the spec names, and check the query groups its passes name;
    the largest number of queries."""
    from dpdask.graph import group_rows

    queries = 0
    for w in spec.workloads():
        W = build_workload(w, spec.domain)
        if W.shape[1] != spec.domain.size:
            raise SpecError(f"workload: has {W.shape[1]} columns for {spec.domain.size} cells")
        names = [g for g, _rows in group_rows(W)]
        check_pass_groups(spec.passes, names, f"workload {w.get('name')!r}")
        queries = max(queries, int(W.shape[0]))
    return queries


@dataclass(frozen=True)
class _Checked:
    """What the checks before a run establish (no budget spent, nothing published)."""

    ledger: Ledger | None  # None: validating a spec whose ledger is still to be created
    dataset: str
    source: SourcePrint
    output: pathlib.Path
    run_id: str
    work: pathlib.Path
    resuming: bool


def _open_ledger(spec: ReleaseSpec, *, dry: bool = False) -> Ledger | None:
    """The spec's ledger, verified; created (saying so) only with ``ledger.create`` and
    where no release of another ledger is published at the output or, for a scheduled
    spec, at another period's output. ``dry``: create nothing (``None`` if it would)."""
    outputs = period_outputs(spec.output, spec.period)
    return open_ledger(spec.ledger, create=spec.ledger_create, outputs=outputs, dry=dry)


def _preflight(
    spec: ReleaseSpec, run_id: str | None, overwrite: bool, *, create: bool, hold: bool = False
) -> _Checked:
    """Every check ``run`` makes before it reads data or charges, in that order: the
    output path, the ledger (verified), the dataset's and release's budgets, the run id
    and, for a resume, that the ledger binds the run to this input, spec and output.
    ``hold`` (a run, not a validation): a new run holds its dataset on a server ledger
    from before the budget check until its charge commits (:func:`hold_dataset`)."""
    check_input(spec)
    run_id = check_run_id(run_id) if run_id is not None else new_run_id()
    output = spec.output.absolute()
    work = work_dir(output, run_id)
    ledger = _open_ledger(spec, dry=not create)
    protected = [("input data", spec.data.path), *ledger_files(spec.ledger), ("work folder", work)]
    if spec.source is not None:
        protected.append(("release spec", spec.source))
    run = ledger.run(spec.release, run_id) if ledger is not None else None
    # a named dataset's budgets are checked before the input is even hashed (a resume
    # hashes it first: the ledger binds the run to it)
    source = None if spec.data.id and run is None else source_print(spec)
    dataset = dataset_id(spec, source)
    previous = release_attributes(output)
    done_here = (
        previous is not None
        and previous.get("release") == spec.release
        and previous.get("run_id") == run_id
    )
    if run is not None and run.state not in ("open", "measuring"):
        if work.exists():  # a stop between publication and clean-up left it behind
            remove_work(work)
        raise RunStateError(
            f"run {run_id!r} of release {spec.release!r} is {run.state}; a new run id is a "
            "new run, drawing new noise and charged again"
        )
    if run is not None and source is not None:  # the ledger decides, not the work folder
        check_same_run(run, run_binding(spec, output, source))
    if not (run is not None and run.state == "measuring" and done_here):
        check_output(output, overwrite, protected)
    if previous is not None and overwrite and not done_here:
        check_replaced(output, ledger)
    resuming = run is not None
    if run is not None and not done_here:
        check_run_key(run, work)
    if ledger is not None and hold and not resuming:  # a run, not validate
        hold_dataset(ledger, dataset)  # a shared ledger: other jobs wait until we charge
    if ledger is not None:
        _check_budgets(spec, ledger, dataset, resuming)
    source = source or source_print(spec)
    if ledger is not None:  # one budget authority: the same source under one dataset id
        check_source(ledger, dataset, source.content)
    return _Checked(ledger, dataset, source, output, run_id, work, resuming)


def _check_budgets(spec: ReleaseSpec, ledger: Ledger, dataset: str, resuming: bool) -> None:
    opened, total = check_release_opening(
        ledger, spec.release, spec.privacy, dataset, spec.dataset_budget
    )
    if resuming:
        return  # the run's charges are already in the ledger
    left = ledger.remaining(spec.release) if opened is not None else spec.privacy
    if not spec.privacy <= left:
        raise BudgetExceededError(
            f"privacy: release {spec.release!r} asks for {spec.privacy!r} but only {left!r} is "
            f"left in {ledger.path}"
        )
    check_dataset_fits(ledger, spec.release, spec.privacy, dataset, total)


def _check_data(spec: ReleaseSpec, checked: _Checked) -> tuple[dict[str, int], tuple[str, ...]]:
    """Read (and, for records, scan) the input as ``run`` will; units per released level
    and the unit attributes the data carries."""
    with tempfile.TemporaryDirectory(prefix=".dpdask-validate-") as tmp:
        work = checked.work if spec.data.format == "store" else pathlib.Path(tmp) / "work"
        geo, attributes = data_geography(spec, work, checked.source)
        levels = spec.levels or geo.levels
        for lv in levels:
            if lv not in geo.levels:
                raise SpecError(f"levels: {lv!r} is not a level of the data ({list(geo.levels)})")
        if levels[-1] != geo.levels[-1]:
            raise SpecError(
                f"levels: the finest released level must be the data's finest, {geo.levels[-1]!r}"
            )
        split_levels(spec.privacy, levels, spec.split)
        if spec.invariants:  # feasible from public input, as run checks it before charging
            checked_constraints(spec, load_data(spec, work, checked.source), levels)
    return {lv: geo.n_units(lv) for lv in levels}, attributes


def validate_spec(
    spec: ReleaseSpec, run_id: str | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Make every check ``run`` makes before charging, spending and writing nothing.

    The spec's fields, the workload, the output path, the ledger (verified), the
    dataset's and the release's remaining budget, the run id, the strategy (selected as
    ``run`` and ``plan`` select it, so its options are checked) and the data itself
    (read and checked as ``run`` reads it). A spec that validates fails ``run`` only
    for reasons outside the spec and its data (a crash, a full disk).

    Returns a report; raises :class:`SpecError`, a :class:`~dpdask.privacy.LedgerError`
    or the data reader's error, naming the problem (and see :func:`validating`).
    """
    validating(spec)
    if marginal.is_marginal_spec(spec):  # records never counted into a data vector
        return marginal.validate_marginals(spec, _preflight(spec, run_id, overwrite, create=False))
    queries = _check_workloads(spec)
    checked = _preflight(spec, run_id, overwrite, create=False)
    _plan, planned = plan_spec(spec)  # the strategy's options fail here, not in run
    units, attributes = _check_data(spec, checked)
    report: dict[str, Any] = {
        "release": spec.release,
        "dataset": checked.dataset,
        "workload_queries": queries,
        "units": units,
        "unit_attributes": list(attributes),  # public per-unit attributes of the data
        "noise_scale": {lv["level"]: lv["noise_scale"] for lv in planned["levels"]},
    }
    if spec.invariants:  # published without noise, and the constraints (checked above)
        report["invariants"] = planned["invariants"]
    if "passes" in planned:  # the multi-pass top-down's, each level's
        report["passes"] = planned["passes"]
    if checked.ledger is not None:
        try:
            report["budget_remaining"] = checked.ledger.remaining(spec.release).to_dict()
        except LedgerConflictError:  # the release is not open yet
            report["budget_remaining"] = spec.privacy.to_dict()
        left = checked.ledger.dataset_remaining(checked.dataset)
        if left is not None:
            report["dataset_remaining"] = left.to_dict()
    report["ok"] = True
    return report


def run_spec(
    spec: ReleaseSpec,
    *,
    client: Any = None,
    run_id: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    on_start: Callable[[str, str | None], None] | None = None,
) -> dict[str, Any]:
    """Run a release spec end to end; returns a summary of what was published.

    Every check of :func:`validate_spec` comes first, under the output's claim
    (:func:`claimed`), and a ledger is created only once they pass; then the strategy
    is selected, the data is read (into the run's private work folder), every level
    is charged and the release is measured, reconstructed and published. The same
    ``run_id`` resumes an interrupted run (same key, same noise, no new charge); a
    published or abandoned run id is refused. ``on_start(run_id, dashboard_link)`` is
    called once the run exists, before its first charge; see :func:`failure_reported`.
    """
    check_before_charging(spec)
    if not marginal.is_marginal_spec(spec):
        _check_workloads(spec)
    if not ledger_exists(spec.ledger) and not spec.ledger_create:
        _open_ledger(spec, dry=True)  # raises, naming the fix
    run_id = check_run_id(run_id) if run_id is not None else new_run_id()
    from dpdask.dashboard import RunTracker, shown_path
    from dpdask.pipeline._outcome import resume_command

    tracker = RunTracker(client, spec.release, run_id)  # the scheduler serves /dpdask now
    with claimed(spec):
        checked = _preflight(spec, run_id, overwrite, create=False, hold=True)
        # shown at /dpdask from now on, while its strategy is selected (no absolute path)
        tracker.start(
            checked.dataset, resume_command(spec, run_id, spec_path=shown_path(spec.source))
        )
        with failure_reported(spec, checked.run_id, checked.work, on_failure=tracker.failed):
            return _run_checked(spec, checked, client, overwrite, progress, on_start, tracker)


def _run_checked(
    spec: ReleaseSpec, checked: _Checked, client: Any, overwrite: bool, progress: bool,
    on_start: Callable[[str, str | None], None] | None, tracker: Any,
) -> dict[str, Any]:  # fmt: skip
    """:func:`run_spec` once its output is claimed and its preflight passed."""
    from dpdask.graph import Progress, release

    if marginal.is_marginal_spec(spec):
        return marginal.run_marginals(spec, checked, client, overwrite, on_start)

    selecting = Progress("select", {}) if progress else None  # the strategy, data-free
    plan, report = plan_spec(spec, client=client)
    if selecting is not None:
        selecting.close()
    tracker.step("reading data")
    log.info("run %s of %s: reading %s data into %s", checked.run_id, spec.release,
             spec.data.format, checked.work)  # fmt: skip
    store = load_data(spec, checked.work, checked.source)
    levels = _levels(spec, store)
    checked_cons = checked_constraints(spec, store, levels)  # infeasible: refused, no charge
    # per level, built a chunk of units at a time in the tasks: kept by the top-down fit
    constraints = None if checked_cons is None else checked_cons.lazy()
    if checked.ledger is None:  # every check passed: a new ledger may be born
        checked = _preflight(spec, checked.run_id, overwrite, create=True, hold=True)
    ledger = checked.ledger
    if ledger is None:  # pragma: no cover - _preflight(create=True) always opens one
        raise LedgerMissingError(f"ledger: no ledger at {spec.ledger}")
    if spec.dataset_budget is not None:  # checked above, before the data was read
        ledger.set_dataset_total(checked.dataset, spec.dataset_budget)
    bind_source(ledger, checked.dataset, checked.source.content)  # first release: its source
    rel = release(
        plan, store, levels=levels,
        budget_split=_level_split(spec, levels),
        reconstruct=spec.reconstruct, integer=spec.integer, simulate=spec.simulate,
        passes=passes_option(spec.passes), slack=spec.slack,
        spine=spec.spine,
        constraints=constraints, release_id=spec.release,
        invariants=None if checked_cons is None else checked_cons.statement(),
        run_id=checked.run_id,
        ledger=ledger, dataset=checked.dataset, neighbours=spec.neighbours.name,
    )  # fmt: skip
    if on_start is not None:  # the run exists: announce it, before its first charge
        on_start(checked.run_id, getattr(client, "dashboard_link", None))
    base = spec.source.parent if spec.source is not None else None  # paths shown from here
    binding = run_binding(spec, checked.output, checked.source)
    # the run's first charge records what it is bound to; a resume's must match it
    with (
        ledger.bound(spec.release, checked.run_id, binding),
        tracker.releasing(rel, ledger, plan=report, base=base),  # its levels at /dpdask
    ):
        out = rel.to_zarr(
            checked.output, overwrite=overwrite, client=client, progress=progress,
            protected=[("input data", spec.data.path), *ledger_files(spec.ledger)],
        )  # fmt: skip
    log.info("run %s of %s: published %s (ledger head %s)", checked.run_id, spec.release,
             out, ledger.head())  # fmt: skip
    summary = rel.summary()
    summary["output"] = str(out)
    summary["ledger"] = str(ledger.path)  # a server's URL without its password
    summary["dataset"] = checked.dataset
    summary["expected"] = report["levels"]
    return summary
