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
   noise ``z`` (:func:`~dpdask.dataflow._blocks.estimate_block`): the same estimate
   as ``A^+ (A x + z)`` without the product ``A x``;
3. **consistency and answers** (``consistent-<level>``, ``answer-<level>``,
   ``publish-<level>``): the checkpointed estimates are made consistent across
   levels (children add up to parents exactly, by inverse-variance weighting), the
   workload is answered, and everything is written to a store under a temporary
   name that is renamed into place when complete. With ``reconstruct="nnls"`` or
   ``"wnnls"`` every level is measured and reconstructed by least squares, made
   consistent, and then the finest level's consistent estimates are fitted with
   non-negative ones (``nonnegative-<level>``, tasks of about ``2^19`` cells: one CPH
   unit, many small ones; :func:`~dpdask.dataflow._levels.nonneg_fit_up`; NNLS in the metric
   of that level's strategy, WNNLS in the workload's), every coarser level being the
   sum of its children: children add up to parents and estimates are non-negative by
   construction, and the dense top levels need no iterative solve. With a single
   level this is NNLS on the measurements exactly
   (:func:`~dpdask.reconstruct.nonnegative_fit`). ADMM estimates each level from its
   measurements, and the consistent estimates are then projected top-down onto
   non-negative children that add up to their parents.

Each task computes with one BLAS thread (:mod:`dpdask.dataflow._blas`): the cores are
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
:mod:`dpdask.dataflow._output`; ``attrs["dpdask"]`` records release and run ids, the
dpdask version, domain, levels, each level's budget, noise and charge, the total budget,
the dataset and the ledger's head. :func:`dpdask.open_release` reads it with xarray.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize

from dpdask import __version__
from dpdask.dataflow._aggregate import aggregate_rows, level_key
from dpdask.dataflow._blocks import (
    ESTIMATORS,
    FIT_AFTER_CONSISTENCY,
    NONNEGATIVE,
    estimate_block,
    measure_block,
    reconstruct_block,
)
from dpdask.dataflow._checkpoint import write_region
from dpdask.dataflow._level_plan import LevelPlan, mean_cell_variance
from dpdask.dataflow._levels import (
    LevelChunks,
    aggregate_level,
    bottom_up,
    level_chunks,
    nonneg_down,
    nonneg_fit_up,
    partial_rows,
    top_down,
)
from dpdask.dataflow._output import level_outputs
from dpdask.dataflow._source import private_dir
from dpdask.dataflow.store import DataStore, open_store
from dpdask.measure import _level_charge
from dpdask.noise import KeyFile, SecretKey, new_key
from dpdask.privacy import Budget, Charge, Ledger, Run, RunStateError, check_run_id
from dpdask.publish import (
    check_output,
    float_array,
    marker,
    move_into_place,
    new_run_id,
    release_attributes,
    remove_work,
    work_dir,
)

__all__ = ["LevelPlan", "Release", "release"]


@dataclass
class _Level:
    name: str
    plan: LevelPlan
    charge: Charge
    chunks: tuple[int, ...]
    unit_variance: float  # variance scalar of one unit's estimate in the tree model


class Release:
    """A lazy release; :meth:`to_zarr` runs it. Built by :func:`release`."""

    def __init__(
        self,
        store: DataStore,
        levels: tuple[str, ...],
        plans: dict[str, LevelPlan],
        *,
        release_id: str,
        run_id: str,
        total: Budget,
        reconstruct: str,
        ledger: Ledger | None,
        dataset: str | None,
        key: SecretKey | None,
        noise: bool,
        test_mode: bool,
        chunk_bytes: int,
    ):
        self.store = store
        self.levels = levels
        self.plans = plans
        self.release_id = release_id
        self.run_id = run_id
        self.total = total
        self.reconstruct = reconstruct
        self.ledger = ledger
        self.dataset = dataset
        self.key = key
        self.noise = noise
        self.test_mode = test_mode
        self.domain = store.domain
        self.lc: LevelChunks = level_chunks(store.geography, levels, store.domain.size, chunk_bytes)
        charges = {
            lv: _level_charge(plans[lv], release_id, run_id, lv, "strategy")[0] for lv in levels
        }
        same = len({tokenize(p.strategy) for p in plans.values()}) == 1
        self._levels = [
            _Level(
                lv,
                plans[lv],
                charges[lv],
                self.lc.of(lv),
                plans[lv].row_variance * (1.0 if same else mean_cell_variance(plans[lv].strategy)),
            )
            for lv in levels
        ]

    # -- what is known before running ------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Levels, units, chunks, budgets, noise and expected error, as a JSON-safe dict."""
        out = {
            "release": self.release_id,
            "run_id": self.run_id,
            "budget": self.total.to_dict(),
            "domain": self.domain.to_dict(),
            "reconstruct": self.reconstruct,
            "not_converged": getattr(self, "_reports", []),
            "levels": [],
        }
        for L in self._levels:
            qv = L.plan.query_variances()
            out["levels"].append(
                {
                    "level": L.name,
                    "units": self.store.geography.n_units(L.name),
                    "chunks": len(L.chunks),
                    "budget": L.plan.privacy.to_dict(),
                    "mechanism": L.plan.mechanism,
                    "noise_scale": L.plan.noise_scale,
                    "queries": int(qv.size),
                    "mean_query_variance": float(qv.mean()),
                    "max_query_variance": float(qv.max()),
                }
            )
        return out

    def charges(self) -> list[Charge]:
        return [L.charge for L in self._levels]

    # -- running ---------------------------------------------------------------------------
    def to_zarr(
        self,
        path: str | os.PathLike,
        *,
        overwrite: bool = False,
        client: Any = None,
        progress: bool = False,
        protected: Sequence[tuple[str, str | os.PathLike | None]] = (),
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
        run = self._ledger_run()
        previous = release_attributes(path)
        if (
            run is not None
            and run.state == "measuring"
            and previous is not None
            and (previous.get("release"), previous.get("run_id")) == (self.release_id, self.run_id)
        ):
            # published, but stopped before the ledger recorded it: record it now
            self.ledger.publish(self.release_id, self.run_id, str(path))  # type: ignore[union-attr]
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
        key = self._charge_and_key(work, run)
        private_dir(work)
        raw = self._checkpoint(work, key, client, progress)
        final = self._finish(work, raw, client, progress)
        check_output(path, overwrite, guard)  # nothing else appeared meanwhile
        move_into_place(final, path, overwrite)
        # the key goes first: a stop from here on leaves a published run without its key
        KeyFile(work / "key").delete()
        if self.ledger is not None and self.noise:
            self.ledger.publish(self.release_id, self.run_id, str(path))
        remove_work(work)
        return path

    def _ledger_run(self) -> Run | None:
        if self.ledger is None:
            return None
        return self.ledger.run(self.release_id, self.run_id)

    def _charge_and_key(self, work: pathlib.Path, run: Run | None) -> SecretKey | None:
        """The run's key, bound to the run in the ledger and charged for, before any data
        is read: a new run gets a fresh key (kept owner-only in the work folder until
        publication); a resumed run needs the key it was opened with."""
        if not self.noise:
            return None
        if self.test_mode:
            if self.key is None:
                raise ValueError("test mode needs a key (SecretKey.for_testing(seed))")
            if self.ledger is not None:
                self._charge(self.key)
            return self.key
        if self.ledger is None:
            raise ValueError("a ledger is required: every measurement is charged before noise")
        if self.key is not None and self.key.test_only:
            raise ValueError("refusing a test-only key outside test mode")
        key_path = work / "key"
        stored = KeyFile(key_path).load() if key_path.exists() else None
        if run is not None and run.state not in ("open", "measuring"):
            raise RunStateError(
                f"run {self.run_id!r} of release {self.release_id!r} is {run.state}; a new run "
                "id is a new run, drawing new noise and charged again"
            )
        key = self.key or stored
        if key is None:
            if run is not None:
                raise RunStateError(
                    f"run {self.run_id!r} of release {self.release_id!r} was charged but its "
                    f"key is gone (no {key_path}); its noise cannot be reproduced. Abandon it "
                    "(`dpdask ledger abandon`) and start a new run id, which is charged again"
                )
            key = new_key()
        if stored is not None and stored != key:
            raise RunStateError(
                f"the key given for run {self.run_id!r} is not the one in its work folder"
            )
        if stored is None:
            private_dir(work)
            KeyFile.create(key_path, key)
        self._charge(key)
        return key

    def _bind(self, key: SecretKey) -> None:
        """Put the key's fingerprint on every level's charge (the ledger binds the run)."""
        fp = key.fingerprint()
        for L in self._levels:
            L.charge = dataclasses.replace(L.charge, key_fingerprint=fp)

    def _charge(self, key: SecretKey) -> None:
        if self.ledger is None:
            raise ValueError("a ledger is required: every measurement is charged before noise")
        self._bind(key)
        self.ledger.open_release(self.release_id, self.total, self.dataset)
        self.ledger.charge(self.charges())  # all levels fit, or nothing is written
        self._head = self.ledger.head()

    def _level_data(self) -> list[da.Array]:
        """Counts of every released level, lazily, chunked as the level chunks."""
        x = self.store.to_dask().rechunk({0: self.lc.chunks[-1]})
        arrays = [x]
        for i in range(len(self.levels) - 1, 0, -1):
            name = f"aggregate-{level_key(self.levels[i - 1])}"
            arrays.insert(0, aggregate_level(arrays[0], self.lc, i, name))
        return arrays

    def _checkpoint(
        self, work: pathlib.Path, key: Any, client: Any, progress: bool
    ) -> list[zarr.Array]:
        """Measure and reconstruct every chunk not yet checkpointed in ``work``.

        Estimates are stored one geography per zarr chunk (so concurrent chunk
        writes never share a zarr chunk), and each finished chunk leaves a marker
        file written after its data: a resumed run skips exactly those.
        """
        group = zarr.open_group(str(work / "raw.zarr"), mode="a", zarr_format=3)
        markers = work / "done"
        markers.mkdir(exist_ok=True)
        reports = work / "reports"
        reports.mkdir(exist_ok=True)
        arrays, pending = [], []
        data = self._level_data()
        cell_shape = self.domain.shape
        last = len(self._levels) - 1
        for i, (L, x) in enumerate(zip(self._levels, data, strict=True)):
            arr = float_array(group, L.name, sum(L.chunks), cell_shape)
            # the finest level's sums by parent, kept so that consistency never re-reads it
            sums = None
            if i == last and i > 0:
                n_rows = sum(self.lc.parent_ranges(i))
                sums = float_array(group, f"{L.name}-sums", n_rows, cell_shape)
            arrays.append(arr)
            todo = [k for k in range(len(L.chunks)) if not marker(markers, L.name, k).exists()]
            if not todo:
                continue
            est = self._estimates(L, x, key, str(reports))
            bounds = np.cumsum((0, *L.chunks))
            sum_bounds = np.cumsum((0, *self.lc.parent_ranges(i))) if sums is not None else None
            tok = tokenize(est.name)
            for k in todo:
                write = dask.delayed(write_region, pure=False)
                extra = None if sums is None else (sums, int(sum_bounds[k]), self.lc, i, k)
                pending.append(
                    write(
                        est.blocks[k],
                        arr,
                        int(bounds[k]),
                        marker(markers, L.name, k),
                        extra,
                        dask_key_name=f"checkpoint-{level_key(L.name)}-{tokenize(tok, k)}",
                    )
                )
        if pending:
            _compute(pending, client, progress)
        return arrays

    def _estimates(self, L: _Level, x: da.Array, key: Any, reports: str) -> da.Array:
        """The level's estimates, lazily: fused ``measure-reconstruct-<level>`` tasks when
        the strategy allows (:meth:`LevelPlan.fused`), else ``measure-<level>`` then
        ``reconstruct-<level>``.

        Keys stay on the client: ``key`` (the release's secret) never enters the graph.
        Block ``k`` of ``x`` is paired with block ``k`` of the ``streamkey-<level>``
        array (``map_blocks`` pairs blocks by index and never rechunks its inputs), a
        one-element object array holding chunk ``k``'s
        :class:`~dpdask.noise.StreamKey`, which can draw only that chunk's noise (the
        task refuses a key made for another chunk)."""
        from dask.highlevelgraph import HighLevelGraph

        from dpdask.measure import stream_key

        word = level_key(L.name)
        tok = tokenize(self.release_id, self.run_id, L.name, x, self.reconstruct)
        cell_shape = self.domain.shape
        keys: da.Array | None = None
        if key is not None:
            n = x.numblocks[0]
            if n != len(L.chunks) or any(nb != 1 for nb in x.numblocks[1:]):
                raise ValueError(
                    f"level {L.name!r}: the data has blocks {x.numblocks}, "
                    f"expected ({len(L.chunks)}, 1, ...)"
                )
            kname = f"streamkey-{word}-{tok}"
            one = (1,) * (x.ndim - 1)
            blocks = {}
            for k in range(n):
                block = np.empty((1, *one), dtype=object)
                ident_k = (self.release_id, L.name, k, "strategy")
                block.flat[0] = stream_key(key, ident_k, self.run_id)
                blocks[(kname, k, *(0,) * len(one))] = block
            keys = da.Array(
                HighLevelGraph.from_collections(kname, blocks),
                kname,
                chunks=((1,) * n, *((1,) for _ in one)),
                dtype=object,
            )
        ident = (keys, self.release_id, L.name, self.run_id, L.charge, self.noise, self.test_mode)
        # NNLS and WNNLS start from least squares and are fitted after consistency
        method = "ls" if self.reconstruct in FIT_AFTER_CONSISTENCY else self.reconstruct
        if L.plan.fused(method):
            return x.map_blocks(
                estimate_block, L.plan, L.plan.pinv(), *ident,
                chunks=x.chunks,
                dtype=np.float64, name=f"measure-reconstruct-{word}-{tok}",
                meta=np.empty((0,) * x.ndim),
            )  # fmt: skip
        m = L.plan.strategy.shape[0]
        y = x.map_blocks(
            measure_block, L.plan, *ident,
            chunks=(x.chunks[0], (m,)), drop_axis=list(range(2, x.ndim)),
            dtype=np.float64, name=f"measure-{word}-{tok}",
            meta=np.empty((0, 0)),
        )  # fmt: skip
        return y.map_blocks(
            reconstruct_block, L.plan.strategy, method, cell_shape, L.plan.pinv(),
            reports, L.name, L.plan.noise_scale,
            chunks=(x.chunks[0], *((s,) for s in cell_shape)),
            new_axis=list(range(2, 1 + len(cell_shape))),
            dtype=np.float64, name=f"reconstruct-{word}-{tok}",
            meta=np.empty((0,) * (1 + len(cell_shape))),
        )  # fmt: skip

    def _finish(
        self, work: pathlib.Path, raw: Sequence[zarr.Array], client: Any, progress: bool
    ) -> pathlib.Path:
        estimates = [
            da.from_zarr(
                a,
                chunks=(L.chunks, *a.shape[1:]),
                name=f"estimate-{level_key(L.name)}-{tokenize(str(work), L.name)}",
            )
            for a, L in zip(raw, self._levels, strict=True)
        ]
        variances = [
            np.full(self.store.geography.n_units(L.name), L.unit_variance) for L in self._levels
        ]
        if len(self._levels) > 1:
            last = len(self._levels) - 1
            psum = zarr.open_array(str(work / "raw.zarr" / f"{self.levels[last]}-sums"), mode="r")
            partial = da.from_zarr(
                psum,
                chunks=(self.lc.parent_ranges(last), *psum.shape[1:]),
                name=f"partial-{tokenize(str(work), 'sums')}",
            )
            word = level_key(self.levels[last - 1])
            sums = aggregate_rows(
                partial, partial_rows(self.lc, last), self.lc.chunks[last - 1],
                f"consistent-up-{word}",
            )  # fmt: skip
            z, vz, cz, cv = bottom_up(estimates, variances, self.lc, "consistent-up", sums)
            final, fvar = top_down(z, vz, cz, cv, self.lc, "consistent")
        else:
            final, fvar = estimates, variances
        if self.reconstruct in FIT_AFTER_CONSISTENCY:
            L = self._levels[-1]
            M, weights = (
                (L.plan.strategy, 1.0 / L.plan.row_variance)
                if self.reconstruct == "nnls"
                else (L.plan.workload, None)
            )
            final = nonneg_fit_up(final, self.lc, M, weights, str(work / "reports"))
        elif self.reconstruct in NONNEGATIVE:
            final = nonneg_down(final, self.lc, "nonnegative")
        out = work / "final.zarr"
        if out.exists():
            shutil.rmtree(out)
        root = zarr.open_group(str(out), mode="w", zarr_format=3)
        geo = self.store.geography
        sources, targets = level_outputs(
            root, [(L.name, L.plan, L.unit_variance) for L in self._levels], final, fvar,
            [np.asarray(geo.ids[geo.level_index(L.name)], dtype=str) for L in self._levels],
            self.lc.parents, domain=self.domain,
        )  # fmt: skip
        stored = da.store(sources, targets, lock=False, compute=False)
        _compute([stored], client, progress)
        self._reports = sorted(
            (json.loads(p.read_text()) for p in (work / "reports").glob("*.json")),
            key=lambda r: (r["level"], r["chunk"]),
        )
        import warnings

        info = self._attributes()
        # plain keys for readers that do not know dpdask (xarray, CF tools); the full
        # record stays under "dpdask"
        root.attrs.update(
            {
                "dpdask": info,
                "title": f"dpdask release {self.release_id}",
                "release": self.release_id,
                "run_id": self.run_id,
                "dataset": self.dataset,
                "workload": info["workload"],
                "strategy": info["strategy"],
                "budget": info["budget"],
                "reconstruct": self.reconstruct,
                "levels": list(self.levels),
                "units": "persons",
                "margin_of_error": "moe90 = 1.645 * sqrt(variance), a 90% margin as ACS's",
            }
        )
        with warnings.catch_warnings():  # "not part of the Zarr v3 specification" (yet)
            warnings.simplefilter("ignore", zarr.errors.ZarrUserWarning)
            zarr.consolidate_metadata(str(out))
        return out

    def _attributes(self) -> dict[str, Any]:
        from dpdask.publish import strategy_record, workload_record

        info = self.summary()
        info.update(
            {
                "format": "dpdask-release",
                "format_version": 1,
                "dpdask_version": __version__,
                "created": datetime.datetime.now(datetime.UTC).isoformat(),
                # what the store says it was built from (a converted input's private
                # copy is gone by the time anyone reads this)
                "source": self.store.attrs.get("source") or str(self.store.path),
                "dataset": self.dataset,
                "workload": workload_record([L.plan for L in self._levels], self.levels),
                "strategy": strategy_record([L.plan for L in self._levels], self.levels),
                "test_mode": self.test_mode,
                "noise": self.noise,
                "charges": [
                    {
                        "level": c.level,
                        "measurement": c.measurement,
                        "mechanism": c.mechanism,
                        "sensitivity": c.sensitivity,
                        "noise_scale": c.noise_scale,
                        "privacy": c.privacy.to_dict(),
                    }
                    for c in self.charges()
                ],
            }
        )
        if self.ledger is not None and self.noise:
            info["ledger"] = {
                "path": str(self.ledger.path),
                "id": self.ledger.ledger_id,
                "head": str(self._head),
                "dataset": self.dataset,
                "spent": self.ledger.spent(self.release_id).to_dict(),
                "remaining": self.ledger.remaining(self.release_id).to_dict(),
            }
        return info


def _compute(items: list, client: Any, progress: bool) -> list:
    if client is not None:
        futures = client.compute(items)
        if progress:
            from distributed import progress as show

            show(futures)
        return [r for f in client.gather(futures) for r in (f if isinstance(f, list) else [f])]
    if progress:
        from dask.diagnostics import ProgressBar

        with ProgressBar():
            (res,) = (dask.compute(items),)
    else:
        res = dask.compute(items)
    return list(res[0])


def release(
    plans: Any | Mapping[str, Any],
    data: DataStore | str | os.PathLike,
    levels: Sequence[str] | None = None,
    budget_split: Mapping[str, Any] | Sequence[Any] | None = None,
    reconstruct: str = "ls",
    *,
    release_id: str = "release",
    run_id: str | None = None,
    ledger: Ledger | str | os.PathLike | None = None,
    dataset: str | None = None,
    key: SecretKey | None = None,
    noise: bool = True,
    test_mode: bool = False,
    chunk_bytes: int = 32 * 2**20,
) -> Release:
    """Build a release of a data store: a lazy Dask graph, run by :meth:`Release.to_zarr`.

    Parameters
    ----------
    plans : Plan or mapping of level to Plan
        One plan whose budget is split over the levels, or a plan per level (each
        spending its own budget).
    data : DataStore or path
        The input counts (see :mod:`dpdask.dataflow`).
    levels : sequence of str, optional
        Released levels, coarsest first; default all of the store's levels. The
        finest must be the store's finest.
    budget_split : mapping of level to share, or sequence, optional
        With a single plan: each level's share of its budget (default even).
    reconstruct : {"ls", "wls", "nnls", "wnnls", "admm-l1", "admm-enet"}
        The estimator (see :func:`~dpdask.dataflow._blocks.reconstruct_block`). Least
        squares is fused with the measurement when the strategy has full column rank;
        NNLS and WNNLS are fitted to the finest level's consistent least-squares
        estimates, the coarser levels being their sums (module notes).
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
    chunk_bytes : int
        Largest size of one chunk of estimates (a unit is never split). The default,
        32 MiB, keeps a chunk's arrays within glibc's heap (see
        :func:`~dpdask.dataflow._blocks.tune_allocator`) and workers' memory lower; on
        the CPH release of 200 counties (2 workers) 32 and 64 MiB ran alike (8.6-9.1 s
        against 8.3-8.9 s).

    Raises
    ------
    ValueError
        For levels the data does not have, plans that do not fit the domain, a
        split that does not match the levels, noise switched off outside test mode.
    """
    store = data if isinstance(data, DataStore) else open_store(data)
    geo = store.geography
    levels = tuple(geo.levels if levels is None else levels)
    for lv in levels:
        geo.level_index(lv)
    if not noise and not test_mode:
        raise ValueError("noise=False is only allowed in test mode")
    if reconstruct not in ESTIMATORS:
        raise ValueError(f"reconstruct={reconstruct!r} is not one of {ESTIMATORS}")
    if isinstance(plans, Mapping):
        missing = [lv for lv in levels if lv not in plans]
        if missing:
            raise ValueError(f"no plan for level(s) {missing}")
        if budget_split is not None:
            raise ValueError(
                "budget_split goes with a single plan; per-level plans carry their own"
            )
        level_plans = {lv: LevelPlan(plans[lv], plans[lv].privacy) for lv in levels}
        total = sum(
            (p.privacy for p in level_plans.values()), start=level_plans[levels[0]].privacy.zero()
        )
    else:
        from dpdask.privacy import split_levels  # the one split of plan, run and benchmarks

        total = plans.privacy
        try:
            budgets = split_levels(total, levels, budget_split)
        except ValueError as exc:
            raise ValueError(f"budget_split: {exc}") from None
        level_plans: dict[str, LevelPlan] = {}
        for lv, b in budgets.items():
            level_plans[lv] = LevelPlan(plans, b, like=next(iter(level_plans.values()), None))
    for lv, p in level_plans.items():
        if p.strategy.shape[1] != store.domain.size:
            raise ValueError(
                f"level {lv!r}: the plan's strategy has {p.strategy.shape[1]} columns but the "
                f"data has {store.domain.size} cells per geography"
            )
        if p.domain is not None and p.domain != store.domain:
            raise ValueError(
                f"level {lv!r}: the plan is for {p.domain}, the data is {store.domain}"
            )
    if isinstance(ledger, str | os.PathLike):
        ledger = Ledger(ledger)
    return Release(
        store, levels, level_plans, release_id=release_id,
        run_id=new_run_id() if run_id is None else check_run_id(run_id),
        total=total, reconstruct=reconstruct, ledger=ledger, dataset=dataset, key=key,
        noise=noise, test_mode=test_mode, chunk_bytes=chunk_bytes,
    )  # fmt: skip
