"""A release run's key and charges: bound in the ledger before any data is read.

Part of :class:`dpdask.release._release.Release` (a mixin): a new run gets a fresh
key, kept owner-only in the work folder until publication; a resumed run needs the
key it was opened with; every level is charged, all or nothing, with the key's
fingerprint.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import numpy as np

from dpdask.errors import DataError
from dpdask.noise import KeyFile, SecretKey, new_key
from dpdask.privacy import Charge, Run, RunStateError
from dpdask.release._state import ReleaseState
from dpdask.store import private_dir


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


class RunKeys(ReleaseState):
    """The key and charge steps of a :class:`~dpdask.release._release.Release`."""

    def _check_totals(self, client: Any) -> None:
        """Refuse data above the public bound ``max_total`` before anything is charged.

        Only levels measured on the lattice (:func:`dpdask.measure.lattice`) depend on
        the bound; the top level's units hold every person, so their totals bound every
        geography's. Nothing is read when every level is measured exactly."""
        from dpdask.measure import lattice

        dtype = self.store.dtype
        if not self.noise or all(
            lattice(L.plan, dtype, self.max_total).exact for L in self._levels
        ):
            return
        geo = self.store.geography
        if self.levels[0] == geo.levels[-1]:
            top = np.arange(geo.n_units(self.levels[0]))
        else:
            top = geo.ancestor_index(self.levels[0])
        if self.store.layout == "sparse":  # the entries' counts summed between offsets
            biggest = _largest_range_total(self.store.counts, top)
        else:
            x = self.store.to_dask()
            per_unit = x.reshape(x.shape[0], -1).sum(axis=1, dtype=np.int64)
            totals = per_unit.compute() if client is None else client.compute(per_unit).result()
            biggest = int(np.bincount(top, weights=totals).max(initial=0)) if totals.size else 0
        if biggest > self.max_total:
            raise DataError(
                f"a {self.levels[0]} of the data holds {biggest} people, above the public "
                f"bound max_total = {self.max_total} the measurement is sized for; raise "
                "max_total (nothing was charged)"
            )

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

    def charges(self) -> list[Charge]:
        """Every level's charge (with the key's fingerprint once bound)."""
        return [L.charge for L in self._levels]
