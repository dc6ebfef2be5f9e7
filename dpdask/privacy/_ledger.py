"""The persistent, append-only privacy ledger (SQLite from the standard library).

The ledger records every measurement a release makes: release id, run id,
level, measurement, mechanism, sensitivity, noise scale and the privacy charged.
A charge is committed and synced to disk *before* any noise is drawn, so that a
crash can never leave noise drawn but not accounted for.

Accounting rules

* A charge is identified by ``(release, run_id, level, measurement)``. Charging
  the same identity again with the same parameters (a retry after a crash) adds
  nothing; with different parameters it is refused. A new run id is a new charge.
* Parallel composition: the chunks of one geography level partition the people,
  so a level's measurement is charged once, not once per chunk. The chunk is
  therefore not part of a charge's identity.
* Sequential composition: everything charged to a release (all levels, all
  measurements, all runs) is added up and must fit within the release's budget;
  everything charged to the releases of a dataset must fit within the dataset's
  total, if one is configured. Charges are converted to the budget's definition
  before adding (pure epsilon to ``epsilon**2/2``-zCDP, pure to ``(epsilon, 0)``),
  which is the tight way round.
* Append-only: triggers refuse ``UPDATE`` and ``DELETE`` on every table.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpdask.privacy._budget import Budget
from dpdask.privacy._mechanisms import MECHANISM_NORM

__all__ = ["BudgetExceededError", "Charge", "Ledger", "LedgerConflictError"]

SCHEMA_VERSION = "1"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS datasets (
    dataset TEXT PRIMARY KEY, total TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS releases (
    release TEXT PRIMARY KEY, dataset TEXT, budget TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS charges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    release TEXT NOT NULL REFERENCES releases(release),
    run_id TEXT NOT NULL,
    level TEXT NOT NULL,
    measurement TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    sensitivity REAL NOT NULL,
    noise_scale REAL NOT NULL,
    privacy TEXT NOT NULL,
    created REAL NOT NULL,
    UNIQUE (release, run_id, level, measurement));
"""
_TABLES = ("meta", "datasets", "releases", "charges")
_SELECT_CHARGES = (
    "SELECT release, run_id, level, measurement, mechanism, sensitivity, noise_scale, "
    "privacy FROM charges"
)


class BudgetExceededError(ValueError):
    """A charge would exceed a release's budget or a dataset's total."""


class LedgerConflictError(ValueError):
    """A charge or registration contradicts what the ledger already holds."""


@dataclass(frozen=True)
class Charge:
    """One measurement's privacy charge.

    Parameters
    ----------
    release, run_id, level, measurement : str
        The identity of the charge (the geography chunk is deliberately absent:
        chunks of one level compose in parallel).
    mechanism : str
        ``"laplace"``, ``"gaussian"``, ``"discrete_laplace"`` or ``"discrete_gaussian"``.
    sensitivity : float
        The strategy's sensitivity in the mechanism's norm (L1 or L2).
    noise_scale : float
        Laplace scale or Gaussian sigma.
    privacy : Budget
        What the measurement costs (the plan's per-measurement budget).
    """

    release: str
    run_id: str
    level: str
    measurement: str
    mechanism: str
    sensitivity: float
    noise_scale: float
    privacy: Budget

    def __post_init__(self) -> None:
        for name in ("release", "run_id", "level", "measurement"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"charge {name} must be a non-empty string, got {value!r}")
        if self.mechanism not in MECHANISM_NORM:
            raise ValueError(f"unknown mechanism {self.mechanism!r}")
        for name in ("sensitivity", "noise_scale"):
            value = float(getattr(self, name))
            if not math.isfinite(value) or value < 0 or (name == "noise_scale" and value == 0):
                raise ValueError(f"charge {name} must be finite and positive, got {value!r}")
            object.__setattr__(self, name, value)
        if not isinstance(self.privacy, Budget):
            raise TypeError(f"charge privacy must be a Budget, got {self.privacy!r}")

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.release, self.run_id, self.level, self.measurement)

    def _same_as(self, other: Charge) -> bool:
        return (
            self.mechanism == other.mechanism
            and self.sensitivity == other.sensitivity
            and self.noise_scale == other.noise_scale
            and self.privacy == other.privacy
        )


def _budget_json(b: Budget) -> str:
    return json.dumps(b.to_dict(), sort_keys=True)


def _budget_from(text: str) -> Budget:
    return Budget.from_dict(json.loads(text))


class Ledger:
    """A persistent, append-only record of privacy charges in one SQLite file.

    Parameters
    ----------
    path : str or Path
        The database file (created on first use, with its tables).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from dpdask.privacy import zCDP
    >>> ledger = Ledger(pathlib.Path(tempfile.mkdtemp()) / "ledger.sqlite")
    >>> ledger.open_release("pl94", zCDP(1))
    >>> c = Charge("pl94", "run1", "county", "A", "gaussian", 1.0, 2.0, zCDP("0.125"))
    >>> ledger.charge(c)
    1
    >>> ledger.charge(c)  # a retry of the same run charges nothing
    0
    >>> ledger.remaining("pl94")
    zCDP(rho=0.875)
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        with self._connect() as con:
            con.executescript("BEGIN IMMEDIATE;" + _SCHEMA)
            for table in _TABLES:
                for op in ("UPDATE", "DELETE"):
                    con.execute(
                        f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} "
                        f"ON {table} BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END"
                    )
            row = con.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                con.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                con.execute("ROLLBACK")
                raise LedgerConflictError(f"{self.path} has ledger schema {row[0]!r}")
            con.execute("COMMIT")

    # -- plumbing --------------------------------------------------------
    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        con = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=DELETE")
            # EXTRA: fsync the database and, on commit, the journal's directory
            con.execute("PRAGMA synchronous=EXTRA")
            con.execute("PRAGMA foreign_keys=ON")
            yield con
        finally:
            con.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """An immediate (write-locked) transaction, committed durably or rolled back."""
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    def __reduce__(self) -> tuple:
        return (Ledger, (str(self.path),))

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    # -- registration ------------------------------------------------------
    def set_dataset_total(self, dataset: str, total: Budget) -> None:
        """Configure the total budget of ``dataset`` across all its releases and runs.

        Set once; setting the same total again is a no-op, a different one raises
        :class:`LedgerConflictError` (the ledger is append-only).
        """
        _check_name(dataset, "dataset")
        _check_budget(total, "dataset total")
        with self._write() as con:
            row = con.execute("SELECT total FROM datasets WHERE dataset = ?", (dataset,)).fetchone()
            if row is not None:
                if _budget_from(row[0]) != total:
                    raise LedgerConflictError(
                        f"dataset {dataset!r} already has total {_budget_from(row[0])!r}"
                    )
                return
            con.execute(
                "INSERT INTO datasets VALUES (?, ?, ?)", (dataset, _budget_json(total), time.time())
            )

    def open_release(self, release: str, budget: Budget, dataset: str | None = None) -> None:
        """Register ``release`` with its budget (and the dataset it draws on).

        Re-opening with the same budget and dataset is a no-op (resuming); a
        different one raises :class:`LedgerConflictError`.
        """
        _check_name(release, "release")
        _check_budget(budget, "release budget")
        if dataset is not None:
            _check_name(dataset, "dataset")
        with self._write() as con:
            row = con.execute(
                "SELECT budget, dataset FROM releases WHERE release = ?", (release,)
            ).fetchone()
            if row is not None:
                if _budget_from(row[0]) != budget or row[1] != dataset:
                    raise LedgerConflictError(
                        f"release {release!r} is already open with budget "
                        f"{_budget_from(row[0])!r} on dataset {row[1]!r}"
                    )
                return
            con.execute(
                "INSERT INTO releases VALUES (?, ?, ?, ?)",
                (release, dataset, _budget_json(budget), time.time()),
            )

    # -- charging ----------------------------------------------------------
    def charge(self, charges: Charge | Iterable[Charge]) -> int:
        """Record charges atomically, all or none, durably, before noise is drawn.

        Charges already recorded with the same identity and parameters are
        skipped (a retry). The rest must fit, together, within each release's
        remaining budget and each dataset's remaining total.

        Returns
        -------
        int
            The number of new charges written (0 for a pure retry).

        Raises
        ------
        BudgetExceededError
            If the new charges do not fit; the message says how much is left.
            Nothing is written.
        LedgerConflictError
            If an identity was charged with other parameters, or a release is not open.
        """
        items = self._dedupe(charges)
        if not items:
            return 0
        with self._write() as con:
            todo = self._new_charges(con, items)
            self._check_fits(con, todo)
            now = time.time()
            con.executemany(
                "INSERT INTO charges (release, run_id, level, measurement, mechanism, "
                "sensitivity, noise_scale, privacy, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        *c.key,
                        c.mechanism,
                        c.sensitivity,
                        c.noise_scale,
                        _budget_json(c.privacy),
                        now,
                    )
                    for c in todo
                ],
            )
        return len(todo)

    def check(self, charges: Charge | Iterable[Charge]) -> int:
        """Raise as :meth:`charge` would, without writing. Returns how many are new."""
        items = self._dedupe(charges)
        with self._connect() as con:
            todo = self._new_charges(con, items)
            self._check_fits(con, todo)
        return len(todo)

    def find(self, release: str, run_id: str, level: str, measurement: str) -> Charge | None:
        """The recorded charge with this identity, or ``None``."""
        with self._connect() as con:
            return _lookup(con, (release, run_id, level, measurement))

    def charges(self, release: str | None = None) -> list[Charge]:
        """All recorded charges (of one release), in the order they were written."""
        sql = _SELECT_CHARGES
        args: tuple = ()
        if release is not None:
            sql += " WHERE release = ?"
            args = (release,)
        with self._connect() as con:
            rows = con.execute(sql + " ORDER BY seq", args).fetchall()
        return [_row_charge(r) for r in rows]

    def __len__(self) -> int:
        with self._connect() as con:
            return int(con.execute("SELECT COUNT(*) FROM charges").fetchone()[0])

    def budget(self, release: str) -> Budget:
        """The budget ``release`` was opened with."""
        with self._connect() as con:
            return self._release(con, release)[0]

    def spent(self, release: str) -> Budget:
        """Everything charged to ``release`` so far, in its budget's definition."""
        with self._connect() as con:
            budget, _ = self._release(con, release)
            return _total(budget, self._privacies(con, "release = ?", (release,)))

    def remaining(self, release: str) -> Budget:
        """The part of ``release``'s budget not yet charged."""
        with self._connect() as con:
            budget, _ = self._release(con, release)
            return _left(budget, _total(budget, self._privacies(con, "release = ?", (release,))))

    def dataset_remaining(self, dataset: str) -> Budget | None:
        """The part of ``dataset``'s total not yet charged (``None`` if no total is set)."""
        with self._connect() as con:
            total = self._dataset_total(con, dataset)
            if total is None:
                return None
            return _left(total, _total(total, self._dataset_privacies(con, dataset)))

    # -- internals -----------------------------------------------------------
    @staticmethod
    def _dedupe(charges: Charge | Iterable[Charge]) -> list[Charge]:
        items = [charges] if isinstance(charges, Charge) else list(charges)
        seen: dict[tuple, Charge] = {}
        for c in items:
            if not isinstance(c, Charge):
                raise TypeError(f"expected a Charge, got {type(c).__name__}")
            if c.key in seen and not seen[c.key]._same_as(c):
                raise LedgerConflictError(f"two different charges share the identity {c.key}")
            seen[c.key] = c
        return list(seen.values())

    def _new_charges(self, con: sqlite3.Connection, items: Sequence[Charge]) -> list[Charge]:
        todo = []
        for c in items:
            old = _lookup(con, c.key)
            if old is None:
                todo.append(c)
                continue
            if not old._same_as(c):
                raise LedgerConflictError(
                    f"{c.key} was already charged as {old.mechanism} scale {old.noise_scale!r} "
                    f"costing {old.privacy!r}; refusing a different charge under the same "
                    "identity (use a new run id)"
                )
        return todo

    def _check_fits(self, con: sqlite3.Connection, todo: Sequence[Charge]) -> None:
        by_release: dict[str, list[Charge]] = {}
        for c in todo:
            by_release.setdefault(c.release, []).append(c)
        by_dataset: dict[str, list[Charge]] = {}
        for release, cs in by_release.items():
            budget, dataset = self._release(con, release)
            spent = _total(budget, self._privacies(con, "release = ?", (release,)))
            _require_fits(budget, spent, [c.privacy for c in cs], f"release {release!r}")
            if dataset is not None:
                by_dataset.setdefault(dataset, []).extend(cs)
        for dataset, cs in by_dataset.items():
            total = self._dataset_total(con, dataset)
            if total is None:
                continue
            spent = _total(total, self._dataset_privacies(con, dataset))
            _require_fits(total, spent, [c.privacy for c in cs], f"dataset {dataset!r}")

    @staticmethod
    def _release(con: sqlite3.Connection, release: str) -> tuple[Budget, str | None]:
        row = con.execute(
            "SELECT budget, dataset FROM releases WHERE release = ?", (release,)
        ).fetchone()
        if row is None:
            raise LedgerConflictError(
                f"release {release!r} is not open in the ledger; call open_release first"
            )
        return _budget_from(row[0]), row[1]

    @staticmethod
    def _dataset_total(con: sqlite3.Connection, dataset: str) -> Budget | None:
        row = con.execute("SELECT total FROM datasets WHERE dataset = ?", (dataset,)).fetchone()
        return None if row is None else _budget_from(row[0])

    @staticmethod
    def _privacies(con: sqlite3.Connection, where: str, args: tuple) -> list[Budget]:
        rows = con.execute(f"SELECT privacy FROM charges WHERE {where}", args).fetchall()
        return [_budget_from(r[0]) for r in rows]

    def _dataset_privacies(self, con: sqlite3.Connection, dataset: str) -> list[Budget]:
        return self._privacies(
            con, "release IN (SELECT release FROM releases WHERE dataset = ?)", (dataset,)
        )


def _check_name(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")


def _check_budget(value: Any, what: str) -> None:
    if not isinstance(value, Budget):
        raise TypeError(f"{what} must be a PureDP, ApproxDP or zCDP budget, got {value!r}")


def _row_charge(row: tuple) -> Charge:
    return Charge(*row[:7], privacy=_budget_from(row[7]))


def _lookup(con: sqlite3.Connection, key: tuple[str, str, str, str]) -> Charge | None:
    row = con.execute(
        _SELECT_CHARGES + " WHERE release = ? AND run_id = ? AND level = ? AND measurement = ?",
        key,
    ).fetchone()
    return None if row is None else _row_charge(row)


def _as_kind(budget: Budget, charge: Budget) -> Budget:
    """``charge`` in ``budget``'s definition, or a clear error."""
    try:
        return budget._coerce(charge)
    except TypeError:
        raise LedgerConflictError(
            f"a charge of {charge!r} cannot be accounted in a {type(budget).__name__} budget"
        ) from None


def _total(budget: Budget, charges: Iterable[Budget]) -> Budget:
    out = budget.zero()
    for c in charges:
        out = out + _as_kind(budget, c)
    return out


def _left(budget: Budget, spent: Budget) -> Budget:
    values = [max(a - b, 0) for a, b in zip(budget._values(), spent._values(), strict=True)]
    return budget._new(values)


def _require_fits(budget: Budget, spent: Budget, new: Sequence[Budget], what: str) -> None:
    asked = _total(budget, new)
    if not (spent + asked <= budget):
        raise BudgetExceededError(
            f"{what}: the new charges total {asked!r} but only {_left(budget, spent)!r} "
            f"of its {budget!r} is left"
        )
