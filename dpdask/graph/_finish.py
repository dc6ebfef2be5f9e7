"""Finishing a release: consistency across levels, answers, the published record.

The last step of a :class:`dpdask.graph.Release` run (:func:`finish`): the checkpointed
estimates are made consistent (``consistent-<level>``), fitted non-negative where
asked, answered (``answer-<level>``) and written with the release's attributes into
``final.zarr`` in the work folder, ready to be moved into place.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize

from dpdask import __version__
from dpdask.errors import ShapeError
from dpdask.graph._blocks import NONNEGATIVE
from dpdask.graph._caches import forget
from dpdask.graph._checkpoint import read_chunks
from dpdask.graph._consistent import consistent_estimates
from dpdask.graph._levels import partial_rows
from dpdask.graph._output import LevelGroup, level_outputs
from dpdask.graph._output_sparse import sparse_level_outputs
from dpdask.graph._progress import compute_items
from dpdask.graph._run import charges
from dpdask.graph._simulate import publish_simulated, simulate_dense, simulate_topdown
from dpdask.graph._spine import spine_unbiased
from dpdask.graph._state import RunState
from dpdask.graph._topdown import sparse_entries
from dpdask.graph._unbiased import publish_unbiased, unbiased_levels
from dpdask.graph._uncertainty import estimator_label, published_label
from dpdask.store import aggregate_rows, level_key

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = ["attributes", "finish"]


def finish(
    rel: Release, run: RunState, raw: Sequence[pathlib.Path], client: Any, progress: bool
) -> pathlib.Path:
    """Make the checkpointed estimates consistent, answer the workload and write them,
    with the release's record, into ``final.zarr`` in the run's work folder."""
    work = run.work
    out = work / "final.zarr"
    if out.exists():
        shutil.rmtree(out)
    root = zarr.open_group(str(out), mode="w", zarr_format=3)
    geo = rel.store.geography
    ids = [np.asarray(geo.ids[geo.level_index(L.name)], dtype=str) for L in rel.released]
    levels = [(L.name, L.plan, L.unit_variance) for L in rel.released]
    if rel.reconstruct == "topdown":
        entries = [
            [sparse_entries(folder, k) for k in range(len(L.chunks))]
            for folder, L in zip(raw, rel.released, strict=True)
        ]
        sources, targets = sparse_level_outputs(
            root, levels, raw, [L.chunks for L in rel.released], entries, ids,
            rel.lc.parents, rel.domain,
            {
                "what": estimator_label("topdown", rel.integer, rel.multipass),
                "describes_published": False,
            },
            _topdown_extra(rel, run, raw, client, progress),
        )  # fmt: skip
    else:
        sources, targets = _dense_outputs(rel, root, work, raw, levels, ids)
    stored = da.store(sources, targets, lock=False, compute=False)  # type: ignore[arg-type]
    compute_items([stored], client, progress, "publish")
    if rel.reconstruct in NONNEGATIVE:  # simulated around what was just written
        sims = simulate_dense(rel, run, root, client, progress)
        what = published_label(rel.reconstruct)
        for i, L in enumerate(rel.released):
            group = root[L.name]
            if not isinstance(group, zarr.Group):  # pragma: no cover - written above
                raise ShapeError(f"level {L.name!r} of the output is not a group")
            lg = LevelGroup(group, (), [], L.plan.workload, None, None)
            publish_simulated(lg, None if sims is None else sims[i], L.plan, what)
    _write_attributes(rel, run, root, out)
    forget(client)  # the per-level caches of the workers (:mod:`._caches`)
    return out


def _topdown_extra(
    rel: Release, run: RunState, raw: Sequence[pathlib.Path], client: Any, progress: bool
) -> Any:
    """What a top-down level publishes beside its estimate: the simulated RMSE of its
    answers (:mod:`~dpdask.graph._simulate`, computed here) and the unbiased
    least-squares answers of its measurements (:mod:`~dpdask.graph._unbiased`)."""
    sims = simulate_topdown(rel, run, raw, client, progress)
    unbiased = unbiased_levels(rel, run.work)
    what = published_label(rel.reconstruct, rel.integer, rel.multipass)

    def extra(i: int, lg: Any) -> list[tuple[Any, Any]]:
        L = rel.released[i]
        publish_simulated(lg, None if sims is None else sims[i], L.plan, what)
        pairs = publish_unbiased(lg, unbiased[i], L.plan, L.chunks, level_key(L.name))
        spine_unbiased(rel, i, lg.group)  # why a spine unit's answers are not its own
        return pairs

    return extra


def _dense_outputs(
    rel: Release,
    root: zarr.Group,
    work: pathlib.Path,
    raw: Sequence[pathlib.Path],
    levels: list[tuple[str, Any, float]],
    ids: list[np.ndarray],
) -> tuple[list[da.Array], list[zarr.Array[Any]]]:
    """Consistent (and, for NNLS and ADMM, non-negative) estimates of every level from
    their checkpoints, and their outputs (:func:`~dpdask.graph._output.level_outputs`)."""
    cells = tuple(rel.domain.shape)
    estimates = [
        read_chunks(
            folder,
            L.chunks,
            cells,
            f"estimate-{level_key(L.name)}-{tokenize(str(work), L.name)}",
        )
        for folder, L in zip(raw, rel.released, strict=True)
    ]
    variances = [
        np.full(rel.store.geography.n_units(L.name), L.unit_variance) for L in rel.released
    ]
    sums = None
    if len(rel.released) > 1:
        last = len(rel.released) - 1
        partial = read_chunks(
            work / "raw" / f"{rel.levels[last]}-sums", rel.lc.parent_ranges(last), cells,
            f"partial-{tokenize(str(work), 'sums')}",
        )  # fmt: skip
        word = level_key(rel.levels[last - 1])
        sums = aggregate_rows(
            partial, partial_rows(rel.lc, last), rel.lc.chunks[last - 1],
            f"consistent-up-{word}",
        )  # fmt: skip
    final, fvar = consistent_estimates(rel, estimates, variances, str(work / "reports"), sums=sums)
    return level_outputs(
        root, levels, final, fvar, ids, rel.lc.parents, domain=rel.domain,
        sparse_estimates=rel.reconstruct in NONNEGATIVE, reconstruct=rel.reconstruct,
        extra=_unbiased_extra(rel, work) if rel.reconstruct in NONNEGATIVE else None,
    )  # fmt: skip


def _unbiased_extra(rel: Release, work: pathlib.Path) -> Any:
    """What a non-negative (NNLS, WNNLS, ADMM) level publishes beside its estimate: the
    unbiased least-squares answers of its measurements (:mod:`~dpdask.graph._unbiased`)
    (the simulated RMSE is added once the estimates are written: :func:`finish`)."""
    unbiased = unbiased_levels(rel, work)

    def extra(i: int, lg: Any) -> list[tuple[Any, Any]]:
        L = rel.released[i]
        return publish_unbiased(lg, unbiased[i], L.plan, L.chunks, level_key(L.name))

    return extra


def _write_attributes(rel: Release, run: RunState, root: zarr.Group, out: pathlib.Path) -> None:
    """The release's record in the root's attributes, then the consolidated metadata."""
    run.reports = sorted(
        (json.loads(p.read_text()) for p in (run.work / "reports").glob("*.json")),
        key=lambda r: (r["level"], r["chunk"]),
    )
    for p in sorted((run.work / "rounding").glob("*.json")):  # integer multi-pass fits
        r = json.loads(p.read_text())
        run.rounding[r["level"]] = max(run.rounding.get(r["level"], 0.0), float(r["gap"]))
    import warnings

    info = attributes(rel, run)
    # plain keys for readers that do not know dpdask (xarray, CF tools); the full
    # record stays under "dpdask"
    root.attrs.update(
        {
            "dpdask": info,
            "title": f"dpdask release {rel.release_id}",
            "release": rel.release_id,
            "run_id": rel.run_id,
            "dataset": rel.dataset,
            "workload": info["workload"],
            "strategy": info["strategy"],
            "budget": info["budget"],  # add/remove, as charged
            "neighbours": info["neighbours"],  # the relation the budget was stated in
            "reconstruct": rel.reconstruct,
            "levels": list(rel.levels),
            "units": "persons",
            "margin_of_error": "moe90 = 1.645 * sqrt(variance), a 90% margin as ACS's",
            "uncertainty_of": estimator_label(rel.reconstruct, rel.integer, rel.multipass),
            # the counts published without noise, and the constraints, as the spec states
            **({"invariants": info["invariants"]} if "invariants" in info else {}),
        }
    )
    with warnings.catch_warnings():  # "not part of the Zarr v3 specification" (yet)
        warnings.simplefilter("ignore", zarr.errors.ZarrUserWarning)
        zarr.consolidate_metadata(str(out))


def attributes(rel: Release, run: RunState) -> dict[str, Any]:
    """The release's published record: its summary, provenance and charges."""
    from dpdask.publish import strategy_record, workload_record

    info = rel.summary(run)
    info.update(
        {
            "format": "dpdask-release",
            "format_version": 1,
            "dpdask_version": __version__,
            "created": datetime.datetime.now(datetime.UTC).isoformat(),
            # what the store says it was built from (a converted input's private
            # copy is gone by the time anyone reads this)
            "source": rel.store.attrs.get("source") or str(rel.store.path),
            "dataset": rel.dataset,
            "workload": workload_record([L.plan for L in rel.released], rel.levels),
            "strategy": strategy_record([L.plan for L in rel.released], rel.levels),
            "test_mode": rel.test_mode,
            "noise": rel.noise,
            "uncertainty_of": estimator_label(rel.reconstruct, rel.integer, rel.multipass),
            "charges": [c.published() for c in charges(rel, run)],
        }
    )
    if rel.ledger is not None and rel.noise:
        info["ledger"] = {
            "path": str(rel.ledger.path),
            "id": rel.ledger.ledger_id,
            "head": str(run.head),
            "dataset": rel.dataset,
            "spent": rel.ledger.spent(rel.release_id).to_dict(),
            "remaining": rel.ledger.remaining(rel.release_id).to_dict(),
        }
    return info
