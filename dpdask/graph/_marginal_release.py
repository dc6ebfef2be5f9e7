"""A marginal release from records: residual measurements per chunk of units on Dask.

The residual strategy (:mod:`dpdask.strategy.residual`) needs no data vector: each
chunk of a level's units is one task (``measure-residual-<level>-<token>``) that gets
the chunk's records (unit and attribute codes) and its own
:class:`~dpdask.noise.StreamKey`, counts the records' marginals, measures
``sqrt(u_A) H_A m_A`` on the lattice with discrete Gaussian noise
(:func:`dpdask.measure.residual.measure_records`), reconstructs every requested
marginal in marginal space (:class:`~dpdask.reconstruct.residual.ResidualEstimates`)
and writes the chunk's slice of each published table in the work folder. Every level
is charged once, all or nothing, before any task runs (:func:`charge_marginals`).

Published (``final.zarr`` in the work folder, moved into place by the caller): per
level a group per marginal, ``<level>/marginals/<a>-<b>-<c>``, with ``estimate``
(``geography`` by the attributes), and ``variance`` and ``moe90`` per unit (every cell
of a unit's table has the same variance). Within a level the marginals are consistent:
summing a table over an attribute gives the published table without it, exactly up to
rounding. Levels are measured independently (each with its share of the budget) and
then fitted jointly by least squares (:mod:`dpdask.graph._marginal_levels`, up to
``MAX_FIT_UNITS`` finest units; the root attribute ``levels_fitted_jointly`` says
whether): a parent's tables then equal the sums of its children's.
"""

from __future__ import annotations

import math
import pathlib
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpdask.domain import Domain, Geography
from dpdask.noise import MeasurementId, SecretKey
from dpdask.privacy import Charge

__all__ = ["MarginalLevel", "charge_marginals", "levels_of", "marginal_name", "write_marginals"]

MOE90_Z = 1.645
_CHUNK_BYTES = 64 * 2**20


def marginal_name(domain: Domain, attrs: Sequence[int]) -> str:
    """The group name of a marginal: its attributes' names joined by dashes."""
    names = list(domain)
    return "-".join(names[i] for i in attrs) if attrs else "total"


@dataclass(frozen=True)
class MarginalLevel:
    """One released level: its plan, its units and its records (unit, codes)."""

    name: str
    plan: Any  # a ResidualPlan at the level's budget
    ids: tuple[str, ...]
    units: np.ndarray  # each record's unit at this level
    codes: np.ndarray  # (records, d)


def levels_of(
    geography: Geography, levels: Sequence[str], plans: Mapping[str, Any], finest: np.ndarray,
    codes: np.ndarray,
) -> list[MarginalLevel]:  # fmt: skip
    """Each released level's records, placed in its units by the public universe."""
    out = []
    for lv in levels:
        if lv == geography.levels[-1]:
            units = np.asarray(finest, np.int64)
        else:
            units = np.asarray(geography.ancestor_index(lv), np.int64)[finest]
        ids = tuple(str(i) for i in geography.ids[geography.levels.index(lv)])
        out.append(MarginalLevel(lv, plans[lv], ids, units, codes))
    return out


def charge_marginals(
    ledger: Any, levels: Sequence[MarginalLevel], release: str, run_id: str, key: SecretKey,
    total: Any, dataset: str | None,
) -> list[Charge]:  # fmt: skip
    """Charge every level's measurement, all or nothing, bound to ``key``, before any
    record is measured; a resumed run's charges are found and nothing is added."""
    from dpdask.measure.residual import residual_charge

    fp = key.fingerprint()
    charges = [residual_charge(L.plan, release, run_id, L.name, "strategy", fp) for L in levels]
    ledger.open_release(release, total, dataset)
    ledger.charge(charges)
    return charges


def _chunk_task(
    path: str, level: str, plan: Any, start: int, stop: int, units: np.ndarray,
    codes: np.ndarray, key: Any, ident: MeasurementId, receipt: Charge, run_id: str,
    sets: list[tuple[int, ...]], names: list[str], test_mode: bool,
) -> int:  # fmt: skip
    """Measure one chunk's residuals, reconstruct its marginals and write their slices."""
    import zarr

    from dpdask.graph._blocks import trim_heap, tune_allocator

    tune_allocator()  # the sampler's and the transforms' blocks come from the heap
    from dpdask.measure.residual import measure_records, residual_lattice
    from dpdask.reconstruct.residual import ResidualEstimates

    y = measure_records(
        plan, units, codes, stop - start, key, ident, receipt, run_id, test_mode=test_mode
    )
    est = ResidualEstimates.from_plan(plan, y, residual_lattice(plan).variance)
    del y
    root = zarr.open_group(path, mode="r+")
    for S, name in zip(sets, names, strict=True):
        arr = root[f"{level}/marginals/{name}/estimate"]
        arr[start:stop] = est.marginal(S)  # type: ignore[index]
    del est
    trim_heap()  # the next task starts from the memory it needs
    return stop - start


def write_marginals(
    path: pathlib.Path, levels: Sequence[MarginalLevel], domain: Domain,
    sets: Sequence[tuple[int, ...]], key: SecretKey, charges: Sequence[Charge], release: str,
    run_id: str, client: Any, attrs: Mapping[str, Any], *, test_mode: bool = False,
    geography: Geography | None = None,
) -> dict[str, int]:  # fmt: skip
    """Write every level's marginal tables to a new zarr group at ``path``.

    The arrays are laid out first (chunked along ``geography`` as the tasks are), then
    one task per chunk writes its rows; variances come from the plan and the lattice,
    data-free. With ``geography`` and more than one level, the levels are then fitted
    jointly (:mod:`dpdask.graph._marginal_levels`, one ``fit-levels`` task per
    marginal): a parent's tables equal the sums of its children's, and each unit's
    variance is the fit's. Returns the number of chunks of each level.
    """
    import zarr
    from dask.base import compute, tokenize
    from dask.delayed import delayed

    from dpdask.measure import stream_key
    from dpdask.measure.residual import residual_lattice, strategy_rows
    from dpdask.reconstruct.residual import ResidualEstimates

    sets = [tuple(sorted(S)) for S in sets]
    names = [marginal_name(domain, S) for S in sets]
    attr_names = list(domain)
    lats = [residual_lattice(L.plan) for L in levels]
    fit = _joint_fit(geography, levels, [lat.variance for lat in lats])
    attrs = {**attrs, "levels_fitted_jointly": fit is not None}
    root = zarr.open_group(str(path), mode="w-", attributes=dict(attrs))
    tasks = []
    layouts: list[tuple[Any, ...]] = []
    n_chunks: dict[str, int] = {}
    for lv, (L, charge) in enumerate(zip(levels, charges, strict=True)):
        plan = L.plan
        g = len(L.ids)
        per_unit = max(sum(math.prod(domain.shape[i] for i in S) for S in sets), 1) * 8
        rows = strategy_rows(plan)
        chunk = max(1, min(g, _CHUNK_BYTES // max(per_unit + 8 * rows, 1)))
        lat = lats[lv]
        u = dict(zip(plan.marginals.residual_sets(), plan.precision, strict=True))
        zero = {A: np.zeros(tuple(domain.shape[i] for i in A)) for A in u}
        probe = ResidualEstimates(domain.shape, zero, {A: lat.variance / float(u[A]) for A in u})
        for S, name in zip(sets, names, strict=True):
            dims = ["geography", *(attr_names[i] for i in S)]
            shape = (g, *(domain.shape[i] for i in S))
            v = np.full(g, float(probe.variance(S)))
            if fit is not None:  # the joint fit's variances, in units of the level's noise
                v = fit[1][fit[2][lv]] * float(probe.variance(S)) / lat.variance
            layouts.append((L.name, name, dims, shape, chunk, v, L.ids, _label(lat, fit)))
        root.create_group(f"{L.name}/marginals")
        order = np.argsort(L.units, kind="stable")
        units, codes = L.units[order], L.codes[order]
        bounds = np.searchsorted(units, np.arange(0, g + chunk, chunk).clip(max=g))
        token = tokenize(release, run_id, L.name, g, chunk)
        n_chunks[L.name] = -(-g // chunk)
        for c, start in enumerate(range(0, g, chunk)):
            stop = min(g, start + chunk)
            lo, hi = bounds[c], bounds[c + 1]
            ident = MeasurementId(release, L.name, c, "strategy")
            sk = stream_key(key, ident, run_id)
            tasks.append(
                delayed(_chunk_task, pure=False)(
                    str(path), L.name, plan, start, stop, units[lo:hi] - start,
                    codes[lo:hi], sk, ident, charge, run_id, sets, names, test_mode,
                    dask_key_name=(f"measure-residual-{L.name}-{token}", c),
                )
            )  # fmt: skip
    # the tables' groups first, in batches on the workers (zarr's metadata is CPU-bound)
    token = tokenize(release, run_id, "layout")
    n_batch = max(1, min(len(layouts), 16))
    batches = [
        delayed(_layout_batch, pure=False)(
            str(path), layouts[b::n_batch], dask_key_name=(f"layout-marginals-{token}", b)
        )
        for b in range(n_batch)
    ]
    for step in (batches, tasks):
        if client is None:
            compute(*step, scheduler="sync")  # type: ignore[no-untyped-call]
        else:
            client.gather(client.compute(step))
    if fit is not None:
        token = tokenize(release, run_id, "fit")
        fits = [
            delayed(_fit_task, pure=False)(
                str(path), name, [L.name for L in levels], fit[0], fit[2],
                dask_key_name=(f"fit-levels-{token}", j),
            )
            for j, name in enumerate(names)
        ]  # fmt: skip
        if client is None:
            compute(*fits, scheduler="sync")  # type: ignore[no-untyped-call]
        else:
            client.gather(client.compute(fits))
    with warnings.catch_warnings():  # consolidated metadata: "not part of Zarr v3" (yet)
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(str(path))
    return n_chunks


def _joint_fit(
    geography: Geography | None, levels: Sequence[MarginalLevel], variances: list[float]
) -> tuple[np.ndarray, np.ndarray, list[slice]] | None:
    """The joint fit of the levels, or ``None`` (one level, no geography, too many units,
    or levels whose plans differ in more than their noise)."""
    from dpdask.graph._marginal_levels import MAX_FIT_UNITS, level_fit, level_maps

    if geography is None or len(levels) < 2 or len(levels[-1].ids) > MAX_FIT_UNITS:
        return None
    u = levels[0].plan.precision
    if any(not np.array_equal(L.plan.precision, u) for L in levels):
        return None
    return level_fit(level_maps(geography, [L.name for L in levels]), variances)


def _fit_task(path: str, name: str, levels: list[str], M: np.ndarray, slices: list[slice]) -> None:
    """Replace one marginal's tables at every level by the joint fit ``M`` of them all."""
    import zarr

    from dpdask.graph._blocks import tune_allocator

    tune_allocator()
    root = zarr.open_group(path, mode="r+")
    arrays = [root[f"{lv}/marginals/{name}/estimate"] for lv in levels]
    cells = math.prod(arrays[0].shape[1:])  # type: ignore[union-attr]
    Y = np.empty((M.shape[1], cells))
    for a, sl in zip(arrays, slices, strict=True):  # read in place: one copy of the tables
        Y[sl] = np.asarray(a[:]).reshape(-1, cells)  # type: ignore[index]
    X = M @ Y
    del Y
    for a, sl in zip(arrays, slices, strict=True):
        a[:] = X[sl].reshape(a.shape)  # type: ignore[union-attr,index]


def _layout_batch(
    path: str,
    layouts: list[tuple[Any, ...]],
) -> int:
    """Lay out several marginals' groups under their level's ``marginals`` group."""
    import zarr

    parents: dict[str, Any] = {}
    for level, name, dims, shape, chunk, variance, ids, label in layouts:
        if level not in parents:
            parents[level] = zarr.open_group(f"{path}/{level}/marginals", mode="r+")
        _layout(parents[level], name, dims, shape, chunk, variance, ids, label)
    return len(layouts)


def _label(lat: Any, fit: Any) -> dict[str, Any]:
    """What a marginal's variance is of: its (linear) published estimate."""
    from dpdask.graph._uncertainty import DESCRIBES_PUBLISHED, NOISE, UNCERTAINTY_OF

    what = (
        "least-squares estimate from all levels' residual measurements, fitted jointly"
        if fit is not None
        else "least-squares estimate from this level's residual measurements"
    )
    law = str(getattr(lat, "mechanism", "discrete_gaussian")).replace("_", " ")
    noise = f"{law}, variance {float(lat.variance):.6g} per measured residual row"
    return {UNCERTAINTY_OF: what, DESCRIBES_PUBLISHED: True, NOISE: noise}


def _layout(
    root: Any, group: str, dims: list[str], shape: tuple[int, ...], chunk: int,
    variance: np.ndarray, ids: Sequence[str], label: Mapping[str, Any],
) -> None:  # fmt: skip
    """One marginal's group: ``estimate`` (filled by the tasks), ``variance`` and
    ``moe90`` per unit (every cell of a unit's table has the same), and the coordinates,
    with xarray's dimension names; ``label`` says what the uncertainty is of
    (:mod:`dpdask.graph._uncertainty`)."""
    g = root.create_group(group, attributes={"attributes": dims[1:]})
    est = g.create_array(
        "estimate", shape=shape, chunks=(chunk, *shape[1:]), dtype="float64", fill_value=0.0,
        compressors=None,  # noisy float estimates do not compress; skip the codec's time
        dimension_names=dims, attributes={"units": "persons"},
    )  # fmt: skip
    del est
    for name, value in (("variance", variance), ("moe90", MOE90_Z * np.sqrt(variance))):
        a = g.create_array(
            name, shape=(len(ids),), dtype="float64", dimension_names=["geography"],
            attributes=dict(label),
        )  # fmt: skip
        a[:] = value
    geo = g.create_array("geography", shape=(len(ids),), dtype=str, dimension_names=["geography"])
    geo[:] = np.asarray(ids, dtype=str)
    for dim, n in zip(dims[1:], shape[1:], strict=True):
        a = g.create_array(dim, shape=(n,), dtype="int64", dimension_names=[dim])
        a[:] = np.arange(n)
