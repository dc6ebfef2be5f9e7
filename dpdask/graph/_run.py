"""A release run's key and charges: bound in the ledger before any data is read.

Steps of a :class:`dpdask.graph.Release` run (functions of the release and the run's
:class:`~dpdask.graph._state.RunState`): data above the public bound is refused before
anything is charged (:func:`check_totals`); a new run gets a fresh key, kept owner-only
in the work folder until publication; a resumed run needs the key it was opened with;
every level is charged, all or nothing, with the key's fingerprint (:func:`charge`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from dpdask.errors import ArgumentError, DataError, LedgerMissingError, NoiseKeyError
from dpdask.graph._spine import charged_levels
from dpdask.graph._state import Level, RunState
from dpdask.noise import KeyFile, SecretKey, new_key
from dpdask.privacy import Charge, Run, RunStateError
from dpdask.store import private_dir

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = ["charge", "charges", "check_totals", "ledger_run", "level_charge"]


def _largest_range_total(counts: Any, top: np.ndarray, step: int = 1 << 24) -> int:
    """The largest total of a top-level unit of a sparse store: its finest units are a
    contiguous range (``top`` is sorted), so its total is a difference of the running
    sum of the entries' counts at two offsets; the counts are read once, in slices."""
    offsets = counts.all_offsets
    starts = np.searchsorted(top, np.arange(int(top[-1]) + 2 if top.size else 1))
    marks = offsets[starts]  # entry index where each top unit starts (and the end)
    running = np.zeros(marks.size, dtype=np.int64)
    done, acc = 0, 0
    count = counts.count
    while done < count.shape[0]:
        part = np.asarray(count[done : done + step], dtype=np.int64)
        csum = np.cumsum(part) + acc
        inside = (marks > done) & (marks <= done + part.size)
        running[inside] = csum[marks[inside] - done - 1]
        acc, done = int(csum[-1]) if part.size else acc, done + part.size
    running[marks > done] = acc
    return int(np.diff(running).max(initial=0))


def check_totals(rel: Release, client: Any) -> None:
    """Refuse data above the public bound ``max_total`` before anything is charged.

    Only levels measured on the lattice (:func:`dpdask.measure.lattice`) depend on the
    bound; the top level's units hold every person, so their totals bound every
    geography's. Nothing is read when every level is measured exactly."""
    from dpdask.measure import lattice

    dtype = rel.store.dtype
    if not rel.noise or all(lattice(L.plan, dtype, rel.max_total).exact for L in rel.released):
        return
    geo = rel.store.geography
    if rel.levels[0] == geo.levels[-1]:
        top = np.arange(geo.n_units(rel.levels[0]))
    else:
        top = geo.ancestor_index(rel.levels[0])
    if rel.store.layout == "sparse":  # the entries' counts summed between offsets
        biggest = _largest_range_total(rel.store.counts, top)
    else:
        x = rel.store.to_dask()
        per_unit = x.reshape(x.shape[0], -1).sum(axis=1, dtype=np.int64)  # type: ignore[no-untyped-call]
        totals = per_unit.compute() if client is None else client.compute(per_unit).result()
        biggest = int(np.bincount(top, weights=totals).max(initial=0)) if totals.size else 0
    if biggest > rel.max_total:
        raise DataError(
            f"a {rel.levels[0]} of the data holds {biggest} people, above the public "
            f"bound max_total = {rel.max_total} the measurement is sized for; raise "
            "max_total (nothing was charged)"
        )


def ledger_run(rel: Release) -> Run | None:
    """The release's run in its ledger, if it was opened there."""
    if rel.ledger is None:
        return None
    return rel.ledger.run(rel.release_id, rel.run_id)


def charge(rel: Release, run: RunState, opened: Run | None) -> SecretKey | None:
    """The run's key, bound to the run in the ledger and charged for, before any data
    is read (kept in ``run``): a new run gets a fresh key (kept owner-only in the work
    folder until publication); a resumed run needs the key it was opened with.

    Raises
    ------
    dpdask.errors.NoiseKeyError
        Test mode without a key, or a test-only key outside test mode.
    dpdask.errors.LedgerMissingError
        No ledger outside test mode.
    dpdask.privacy.RunStateError
        A run published or abandoned, whose key is gone, or given another key.
    """
    if not rel.noise:
        return None
    if rel.test_mode:
        if rel.key is None:
            raise NoiseKeyError("test mode needs a key (SecretKey.for_testing(seed))")
        if rel.ledger is not None:
            _charge(rel, run, rel.key)
        run.key = rel.key
        return rel.key
    if rel.ledger is None:
        raise LedgerMissingError("a ledger is required: every measurement is charged before noise")
    if rel.key is not None and rel.key.test_only:
        raise NoiseKeyError("refusing a test-only key outside test mode")
    key_path = run.work / "key"
    stored = KeyFile(key_path).load() if key_path.exists() else None
    if opened is not None and opened.state not in ("open", "measuring"):
        raise RunStateError(
            f"run {rel.run_id!r} of release {rel.release_id!r} is {opened.state}; a new run "
            "id is a new run, drawing new noise and charged again"
        )
    key = rel.key or stored
    if key is None:
        if opened is not None:
            raise RunStateError(
                f"run {rel.run_id!r} of release {rel.release_id!r} was charged but its "
                f"key is gone (no {key_path}); its noise cannot be reproduced. Abandon it "
                "(`dpdask ledger abandon`) and start a new run id, which is charged again"
            )
        key = new_key()
    if stored is not None and stored != key:
        raise RunStateError(
            f"the key given for run {rel.run_id!r} is not the one in its work folder"
        )
    if stored is None:
        private_dir(run.work)
        KeyFile.create(key_path, key)
    _charge(rel, run, key)
    run.key = key
    return key


def _charge(rel: Release, run: RunState, key: SecretKey) -> None:
    """Every level's charge with the key's fingerprint (the ledger binds the run), all
    levels or nothing; the ledger's head after them."""
    if rel.ledger is None:  # pragma: no cover - charge() checked it
        raise ArgumentError("a ledger is required: every measurement is charged before noise")
    fp = key.fingerprint()
    run.charges = [dataclasses.replace(L.charge, key_fingerprint=fp) for L in charged_levels(rel)]
    rel.ledger.open_release(rel.release_id, rel.total, rel.dataset)
    rel.ledger.charge(run.charges)  # all levels fit, or nothing is written
    run.head = rel.ledger.head()


def charges(rel: Release, run: RunState | None = None) -> list[Charge]:
    """Every level's charge (with the key's fingerprint once ``run`` bound it)."""
    if run is not None and run.charges:
        return list(run.charges)
    return [L.charge for L in charged_levels(rel)]


def level_charge(run: RunState, level: Level) -> Charge:
    """``level``'s charge in ``run``: bound to the run's key once charged."""
    for c in run.charges:
        if c.level == level.name:
            return c
    return level.charge
