"""A release as one Dask graph: aggregate, measure, reconstruct, make consistent, answer, publish.

:func:`release` builds a lazy :class:`Release` from a data store and a plan (or a
plan per level); :meth:`Release.to_zarr` runs it:

1. **refuse early**: the output path, the plans and the budget are checked and
   every level's privacy charge is written to the ledger, all or nothing,
   before any data is read;
2. **measure and reconstruct** (tasks ``aggregate-<level>``, ``measure-<level>``,
   ``reconstruct-<level>``, ``checkpoint-<level>``): each geography chunk of each
   level is measured with keyed noise and reconstructed; the estimate is
   checkpointed in the run's work folder (for the finest level, with its sums by
   parent, so that the consistency step reads the largest level once) and the
   chunk is marked done. For least squares with a strategy of full column rank
   and a structured pseudo-inverse the two steps are one task,
   ``measure-reconstruct-<level>``, computing ``x + A^+ z`` with the chunk's keyed
   noise ``z`` (:func:`~dpdask.graph._blocks.estimate_block`): the same estimate
   as ``A^+ (A x + z)`` without the product ``A x``;
3. **consistency and answers** (``consistent-<level>``, ``answer-<level>``,
   ``publish-<level>``): the checkpointed estimates are made consistent across
   levels (children add up to parents exactly, by inverse-variance weighting), the
   workload is answered, and everything is written to a store under a temporary
   name that is renamed into place when complete. With ``reconstruct="nnls"`` or
   ``"wnnls"`` every level is measured and reconstructed by least squares, made
   consistent, and then the finest level's consistent estimates are fitted with
   non-negative ones (``nonnegative-<level>``, tasks of about ``2^19`` cells: one CPH
   unit, many small ones; :func:`~dpdask.graph._levels.nonneg_fit_up`; NNLS in the metric
   of that level's strategy, WNNLS in the workload's), every coarser level being the
   sum of its children: children add up to parents and estimates are non-negative by
   construction, and the dense top levels need no iterative solve. With a single
   level this is NNLS on the measurements exactly
   (:func:`~dpdask.reconstruct.nonnegative_fit`). ADMM estimates each level from its
   measurements, and the consistent estimates are then projected top-down onto
   non-negative children that add up to their parents.

Each task computes with one BLAS thread (:mod:`dpdask.graph._blas`): the cores are
shared among tasks, and the release does not depend on the cluster it runs on.

A run is bound in the ledger to the fingerprint of its key (:class:`dpdask.privacy.Run`).
A run interrupted anywhere is resumed by running again with the same run id: the
charges are found in the ledger (nothing new is charged), the key is read back
from the work folder and checked against the ledger, finished chunks are skipped and
the rest are recomputed with the same noise, so the output is bit-identical to an
uninterrupted run. A published or abandoned run id is refused, and so is a charged run
whose key is gone. The published attributes record the ledger's head after the
charges (``attrs["dpdask"]["ledger"]["head"]``), for ``dpdask ledger verify --release``.

Output layout: a zarr v3 group with a group per level (``estimate``, ``answers``,
``variance``, ids, parents, query labels and attribute categories as coordinates, zarr
``dimension_names`` on every array, consolidated metadata), described in
:mod:`dpdask.graph._output`; ``attrs["dpdask"]`` records release and run ids, the
dpdask version, domain, levels, each level's budget, noise and charge, the total budget,
the dataset and the ledger's head. :func:`dpdask.open_release` reads it with xarray.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, DomainError, ShapeError
from dpdask.graph import _finish, _graph, _run, _topdown
from dpdask.graph._blocks import ESTIMATORS, NONNEGATIVE
from dpdask.graph._bound import release_bound
from dpdask.graph._caches import forget_specs
from dpdask.graph._chunked import ChunkedConstraints
from dpdask.graph._configure import configure
from dpdask.graph._levels import LevelChunks
from dpdask.graph._multipass import level_constraints, multipass_summary
from dpdask.graph._pass_options import PassesOption, resolve_passes
from dpdask.graph._plans import LevelShares, PlanLike, level_plans, realised, total_budget
from dpdask.graph._spine import Spine, annotate_spine, spine_option
from dpdask.graph._state import Level, RunState
from dpdask.graph._unbiased import UNBIASED_LIMIT
from dpdask.noise import KeyFile, SecretKey
from dpdask.privacy import Budget, Ledger, RunStateError, check_run_id
from dpdask.privacy.neighbours import ADD_REMOVE, as_neighbours, both_relations
from dpdask.publish import (
    check_output,
    move_into_place,
    new_run_id,
    release_attributes,
    remove_work,
    work_dir,
)
from dpdask.reconstruct.topdown import Constraints, Pass
from dpdask.store import DataStore, open_store, private_dir
from dpdask.strategy import Plan

__all__ = ["Release", "release"]


@dataclass(frozen=True, eq=False)
class Release:
    """A lazy release, a frozen configuration; :meth:`to_zarr` runs it. Built by
    :func:`release`.

    Its steps are functions of it and of the run's state
    (:class:`~dpdask.graph._state.RunState`, the only thing a run changes): the
    charge (:func:`~dpdask.graph._run.charge`), the measure graph
    (:func:`~dpdask.graph._graph.measure_graph`, or
    :func:`~dpdask.graph._topdown.measure_topdown`) and the finish
    (:func:`~dpdask.graph._finish.finish`).

    Attributes
    ----------
    store : DataStore
        The input counts.
    levels : tuple of str
        The released levels, coarsest first.
    plans : mapping of str to Plan
        Each level's plan (:func:`~dpdask.graph.level_plans`), its noise as drawn.
    released : tuple of Level
        Each level's plan, charge (before a key binds it), chunks and unit variance.
    lc : LevelChunks
        How the levels are chunked.
    neighbours : str
        The neighbour relation its budget was stated in (its budgets are add/remove).
    simulate : int
        Trials of the simulation of a non-linear estimator's error (:mod:`._simulate`).
    unbiased_limit : int
        Units times queries up to which a top-down level publishes unbiased answers
        (:mod:`._unbiased`).
    passes, constraints, slack
        A multi-pass top-down release's passes and constraints per level
        (:mod:`~dpdask.graph._multipass`; None otherwise), and its slack.
    invariants : mapping, optional
        The spec's statement of the counts published without noise and the
        constraints (:meth:`dpdask.pipeline.invariants.ReleaseConstraints.statement`).
    spine : Spine, optional
        With ``spine=True``, the units reusing their parent's estimate (:mod:`._spine`).
    runs : list of RunState
        The runs :meth:`to_zarr` made of this release (the last one's reports are in
        :meth:`summary`).
    """

    store: DataStore
    levels: tuple[str, ...]
    plans: Mapping[str, Plan]
    release_id: str
    run_id: str
    total: Budget
    reconstruct: str
    ledger: Ledger | None
    dataset: str | None
    key: SecretKey | None
    noise: bool
    test_mode: bool
    integer: bool
    max_total: int
    lc: LevelChunks
    released: tuple[Level, ...]
    neighbours: str = ADD_REMOVE.name
    simulate: int = 0
    unbiased_limit: int = UNBIASED_LIMIT
    passes: Mapping[str, tuple[Pass, ...]] | None = None
    constraints: Mapping[str, Constraints | ChunkedConstraints] | None = None
    slack: float = 0.0
    invariants: Mapping[str, Any] | None = None
    spine: Spine | None = None
    runs: list[RunState] = field(default_factory=list, repr=False)

    @property
    def multipass(self) -> bool:
        """Whether this is a multi-pass top-down release (passes or constraints)."""
        return self.passes is not None

    @property
    def domain(self) -> Domain:
        """The data's domain."""
        return self.store.domain

    # -- what is known before running ------------------------------------------------
    def summary(self, run: RunState | None = None) -> dict[str, Any]:
        """Levels, units, chunks, budgets, noise and expected error, as a JSON-safe dict
        (with the reports of ``run``, by default the last run's)."""
        if run is None and self.runs:
            run = self.runs[-1]
        levels: list[dict[str, Any]] = []
        out: dict[str, Any] = {
            "release": self.release_id,
            "run_id": self.run_id,
            "budget": self.total.to_dict(),  # add/remove, as charged
            "neighbours": self.neighbours,  # the relation the budget was stated in
            "budgets": both_relations(self.total),  # the same noise in each relation
            "domain": self.domain.to_dict(),
            "reconstruct": self.reconstruct,
            "integer": self.integer,
            "spine": self.spine is not None,
            "simulate": self.simulate,
            **multipass_summary(self),
            **({"invariants": dict(self.invariants)} if self.invariants else {}),
            "unbiased_limit": self.unbiased_limit,
            "max_total": self.max_total,
            "not_converged": [] if run is None else run.reports,
            **({"rounding_gap": dict(run.rounding)} if run is not None and run.rounding else {}),
            "levels": levels,
        }
        for L in self.released:
            qv = L.plan.query_variances()
            levels.append(
                {
                    "level": L.name,
                    "units": self.store.geography.n_units(L.name),
                    "chunks": len(L.chunks),
                    "budget": L.plan.privacy.to_dict(),
                    "mechanism": L.plan.mechanism,
                    "noise_scale": L.plan.drawn_scale,  # the scale drawn, in data units
                    "nominal_noise_scale": L.plan.noise_scale,  # the plan's calibration
                    "noise_variance": L.plan.row_variance,  # of one draw, as drawn
                    "queries": int(qv.size),
                    "mean_query_variance": float(qv.mean()),
                    "max_query_variance": float(qv.max()),
                }
            )
        annotate_spine(self.spine, levels, self.plans)  # units reusing their parent, moves
        return out

    # -- running ---------------------------------------------------------------------------
    def to_zarr(
        self,
        path: str | os.PathLike[str],
        *,
        overwrite: bool = False,
        client: Any = None,  # a distributed.Client (untyped)
        progress: bool = False,
        protected: Sequence[tuple[str, str | os.PathLike[str] | None]] = (),
    ) -> pathlib.Path:
        """Run the release and publish it at ``path``.

        Parameters
        ----------
        path : str or path-like
            The output store (a local directory); written under a temporary name and
            renamed into place when complete.
        overwrite : bool
            Replace an earlier dpdask release at ``path`` (only once the new one is
            complete). Anything at ``path`` that is not a dpdask release is never replaced.
        client : distributed.Client, optional
            Where to run; the current Dask scheduler if omitted.
        progress : bool
            Show a progress bar on the terminal.
        protected : sequence of (what, path)
            Further paths the output must not overlap (the input data and the ledger of
            the store and the ledger given are always protected).

        Returns
        -------
        pathlib.Path
            The published store.

        Raises
        ------
        StoreExistsError
            If a release exists at ``path`` and ``overwrite`` is false (before anything
            is charged).
        UnsafeOutputError
            If ``path`` overlaps the input, the ledger or the work folder, or exists and
            is not a dpdask release.
        dpdask.privacy.RunStateError
            If the run id was published or abandoned, or its key is not the run's.
        dpdask.privacy.BudgetExceededError
            If the charges do not fit the budget (before any data is read).
        """
        path = pathlib.Path(os.path.abspath(path))
        work = work_dir(path, self.run_id)
        run = _run.ledger_run(self)
        if (
            run is not None
            and run.binding is not None
            and run.binding.output != os.path.realpath(path)
        ):
            raise RunStateError(
                f"run {self.run_id!r} of release {self.release_id!r} publishes to "
                f"{run.binding.output}, not {path}: a run's noise is published once, where "
                "it was bound (nothing was charged)"
            )
        previous = release_attributes(path)
        if (
            run is not None
            and run.state == "measuring"
            and previous is not None
            and (previous.get("release"), previous.get("run_id")) == (self.release_id, self.run_id)
        ):
            # published, but stopped before the ledger recorded it: record it now
            if self.ledger is not None:
                self.ledger.publish(self.release_id, self.run_id, str(path))
            remove_work(work)
            return path
        guard = [
            ("input data", self.store.path),
            ("work folder", work),
            *protected,
        ]
        if self.ledger is not None:
            guard += [("ledger", self.ledger.path), ("ledger head file", self.ledger.head_file)]
        path = check_output(path, overwrite, guard)
        _run.check_totals(self, client)
        forget_specs(client)  # no worker keeps the spec of every task it ran
        state = RunState(work)
        self.runs.append(state)
        _run.charge(self, state, run)
        private_dir(work)
        measure = (
            _topdown.measure_topdown if self.reconstruct == "topdown" else _graph.measure_graph
        )
        raw = measure(self, state, client, progress)
        final = _finish.finish(self, state, raw, client, progress)
        check_output(path, overwrite, guard)  # nothing else appeared meanwhile
        move_into_place(final, path, overwrite)
        # the key goes first: a stop from here on leaves a published run without its key
        KeyFile(work / "key").delete()
        if self.ledger is not None and self.noise:
            self.ledger.publish(self.release_id, self.run_id, str(path))
        remove_work(work)
        return path


def release(
    plans: PlanLike | Mapping[str, PlanLike],
    data: DataStore | str | os.PathLike[str],
    levels: Sequence[str] | None = None,
    budget_split: LevelShares | None = None,
    reconstruct: str = "ls",
    *,
    release_id: str = "release",
    run_id: str | None = None,
    ledger: Ledger | str | os.PathLike[str] | None = None,
    dataset: str | None = None,
    key: SecretKey | None = None,
    noise: bool = True,
    test_mode: bool = False,
    chunk_bytes: int = 32 * 2**20,
    integer: bool = False,
    max_total: int | None = None,
    neighbours: str = ADD_REMOVE.name,
    simulate: int | None = None,
    unbiased_limit: int = UNBIASED_LIMIT,
    passes: PassesOption = None,
    slack: float = 0.0,
    constraints: Mapping[str, Constraints | ChunkedConstraints] | None = None,
    invariants: Mapping[str, Any] | None = None,
    spine: bool = False,
) -> Release:
    """Build a release of a data store: a lazy Dask graph, run by :meth:`Release.to_zarr`.

    Parameters
    ----------
    plans : Plan or mapping of level to Plan
        One plan whose budget is split over the levels, or a plan per level (each
        spending its own budget).
    data : DataStore or path
        The input counts (see :mod:`dpdask.store`).
    levels : sequence of str, optional
        Released levels, coarsest first; default all of the store's levels. The
        finest must be the store's finest.
    budget_split : mapping of level to share, or sequence, optional
        With a single plan: each level's share of its budget (default even).
    reconstruct : {"ls", "wls", "nnls", "wnnls", "admm-l1", "admm-enet", "topdown"}
        The estimator (see :func:`~dpdask.graph._blocks.reconstruct_block`). Least
        squares is fused with the measurement when the strategy has full column rank;
        NNLS and WNNLS are fitted to the finest level's consistent least-squares
        estimates, the coarser levels being their sums (module notes). ``"topdown"``
        fits the top level non-negative and then each parent's children inside it
        (:mod:`dpdask.graph._topdown`); its published variances are each level's own
        least-squares variances, not those of the (biased) non-negative estimates, and
        say so: beside them it publishes the RMSE of its answers by simulation
        (``simulate``) and the unbiased least-squares answers (``unbiased_limit``).
    release_id, run_id : str
        Identify the release in the ledger and the noise; the same run id resumes.
    ledger : Ledger or path
        The privacy ledger; required unless ``test_mode``.
    dataset : str, optional
        The dataset whose total budget (configured in the ledger) this release draws on.
    key : SecretKey, optional
        The noise key; by default a fresh one from the OS, kept (owner-only) in the
        run's work folder until publication.
    noise, test_mode : bool
        ``noise=False`` (allowed only with ``test_mode=True``) publishes exact
        counts: the oracle for tests. ``test_mode`` also admits test-only keys.
    integer : bool
        With ``reconstruct="topdown"``: integer estimates that add up exactly at every
        level (controlled rounding, :func:`dpdask.reconstruct.topdown.round_children`).
    max_total : int, optional
        The public bound on one geography's total (at any level) for which float data
        or a non-integer strategy is measured on the lattice
        (:func:`dpdask.measure.lattice`): a smaller bound gives a finer grid and less
        added noise; a geography above it is refused before anything is charged. By
        default the largest top-level total the constraints publish, if they publish
        every one, else ``DEFAULT_MAX_TOTAL`` (:func:`~dpdask.graph._bound.release_bound`).
    neighbours : {"add-remove", "change-one"}
        The neighbour relation the caller stated the budget in, published with the
        release (:mod:`dpdask.privacy.neighbours`). It changes no noise: the plans'
        budgets are add/remove budgets, converted by the caller (a spec's
        ``privacy.neighbours`` is).
    passes, slack, constraints : optional
        With ``reconstruct="topdown"``, the multi-pass top-down with constraints
        (:mod:`~dpdask.graph._multipass`): ``passes`` ``"default"`` (the total, then the
        cells), a list of workload query groups or each level's ``Pass`` list (None:
        today's top-down, or one constrained pass); ``slack`` (0: earlier answers kept
        exactly); ``constraints`` per level, a row per unit (kept by fits and rounding),
        or every level's :class:`~dpdask.graph.ChunkedConstraints` (built per chunk).
    invariants : mapping, optional
        What the counts published without noise and the constraints are, as a spec
        states them: recorded in the summary and the release's attributes.
    spine : bool
        With ``reconstruct="topdown"``: a parent's only child reuses its estimate, a level
        of only children is not measured and its budget moves up (:mod:`._spine`).
    chunk_bytes : int
        Largest size of one chunk of estimates (a unit is never split). The default,
        32 MiB, keeps a chunk's arrays within glibc's heap (see
        :func:`~dpdask.graph._blocks.tune_allocator`) and workers' memory lower
        (BENCHMARKS.md compares chunk sizes).

    Raises
    ------
    dpdask.errors.DomainError
        For levels the data does not have, or a plan for another domain.
    dpdask.errors.ShapeError
        For a plan whose strategy does not fit the data's cells.
    dpdask.errors.ArgumentError
        For a split that does not match the levels, a level without a plan, an unknown
        estimator, ``integer`` without top-down, noise switched off outside test mode.
    dpdask.errors.PlanError
        If a level's budget cannot be spent with its plan (all ``ValueError``).
    """
    store = data if isinstance(data, DataStore) else open_store(data)
    geo = store.geography
    levels = tuple(geo.levels if levels is None else levels)
    for lv in levels:
        try:
            geo.level_index(lv)
        except ValueError as exc:  # a level the data does not have
            raise DomainError(str(exc)) from None
    if not noise and not test_mode:
        raise ArgumentError("noise=False is only allowed in test mode")
    if reconstruct not in ESTIMATORS:
        raise ArgumentError(f"reconstruct={reconstruct!r} is not one of {ESTIMATORS}")
    if integer and reconstruct != "topdown":
        raise ArgumentError("integer=True goes with reconstruct='topdown'")
    trials = _count("simulate", 1 if simulate is None else simulate)
    simulated = reconstruct == "topdown" or reconstruct in NONNEGATIVE
    if simulate is not None and trials and not simulated:
        raise ArgumentError(f"simulate goes with a non-linear estimator, not {reconstruct!r}")
    limit = _count("unbiased_limit", unbiased_limit)
    if (passes is not None or constraints is not None) and reconstruct != "topdown":
        raise ArgumentError("passes and constraints go with reconstruct='topdown'")
    as_neighbours(neighbours)  # a known relation (PlanError otherwise)
    per_level = isinstance(plans, Mapping)
    sp = spine_option(spine, reconstruct, per_level, geo, levels)
    level_plans_ = level_plans(plans, levels, budget_split, moves=None if sp is None else sp.moves)
    for lv, p in level_plans_.items():
        if p.strategy.shape[1] != store.domain.size:
            raise ShapeError(
                f"level {lv!r}: the plan's strategy has {p.strategy.shape[1]} columns but the "
                f"data has {store.domain.size} cells per geography"
            )
        if p.domain is not None and p.domain != store.domain:
            raise DomainError(
                f"level {lv!r}: the plan is for {p.domain}, the data is {store.domain}"
            )
    max_total = release_bound(max_total, constraints, levels[0])
    if noise:  # published variances are those of the noise the measure step draws
        level_plans_ = {lv: realised(p, store.dtype, max_total) for lv, p in level_plans_.items()}
    total = total_budget(level_plans_) if isinstance(plans, Mapping) else plans.privacy
    if isinstance(ledger, str | os.PathLike):
        ledger = Ledger(ledger)
    run_id = new_run_id() if run_id is None else check_run_id(run_id)
    lc, released = configure(
        store, levels, level_plans_, release_id, run_id, reconstruct, chunk_bytes
    )
    level_passes = resolve_passes(passes, slack, level_plans_, constraints is not None)
    cons = level_constraints(
        constraints, levels, [geo.ids[geo.level_index(lv)] for lv in levels], lc.parents,
        store.domain.size,
    )  # fmt: skip
    return Release(
        store, levels, level_plans_, release_id, run_id, total, reconstruct, ledger, dataset,
        key, noise, test_mode, integer, max_total, lc, released, str(neighbours),
        trials if simulated else 0, limit, level_passes, cons, float(slack),
        None if invariants is None else dict(invariants), sp,
    )  # fmt: skip


def _count(name: str, value: object) -> int:
    """A non-negative integer argument, or an ``ArgumentError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)
