"""The ledger's storage: an append-only, hash-chained log in one SQLite file, and its head.

Every fact the ledger holds (its creation, a dataset's lifetime total, a release's
budget, a run and its key fingerprint, a charge, a run's change of state) is one
*entry*: a sequence number, a kind, a canonical JSON body and two SHA-256 digests,
``prev`` (the previous entry's hash, 64 zeros for the first) and
``hash = SHA-256(ledger id, seq, kind, body, prev)``. Changing, removing or
reordering any entry breaks the chain from there on.

The *head* (entry count and last hash) is also written, after every commit, to a
small file beside the database, ``<ledger>.head``. Opening a ledger checks, before
anything else is read:

* the file exists (a missing ledger is never created silently: that takes
  :meth:`Chain.create`, i.e. ``dpdask ledger init`` or ``ledger: {create: true}``),
  and is a SQLite database with this schema, its triggers intact;
* the chain recomputes, entry by entry;
* the head file names this ledger, and the entry it names is in the chain: a ledger
  rolled back to an older copy, truncated or swapped for another is refused.

What this defends, and what it does not: it detects any edit, deletion, truncation
or rollback of the ledger made without also rewriting the head file, and any whose
result is not a self-consistent chain. Someone with write access who rewrites the
whole chain *and* the head file consistently (or deletes both) is not detected here;
every published release records the head it was charged under, so ``dpdask ledger
verify --release OUT.zarr`` finds such a rewrite as soon as a published head is
missing from the chain, and a site that copies the head (``dpdask ledger show``) to
a place the writer cannot change (write-once storage, a signed commit, an auditor's
mailbox) can check it later with ``dpdask ledger verify --head COUNT:HASH``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpdask.errors import (
    ArgumentError,
    LedgerError,
    LedgerMissingError,
    LedgerStorageError,
    LedgerTamperedError,
)

__all__ = [
    "SCHEMA_VERSION",
    "Chain",
    "Entry",
    "Head",
    "LedgerError",
    "LedgerMissingError",
    "LedgerTamperedError",
]

SCHEMA_VERSION = 2
_ZERO = "0" * 64
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    seq INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    prev TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE);
"""
_TABLES = ("meta", "entries")
_TRIGGERS = tuple(f"{t}_no_{op}" for t in _TABLES for op in ("update", "delete"))


@dataclass(frozen=True)
class Head:
    """The ledger's head: how many entries, and the hash of the last one."""

    count: int
    hash: str

    def __str__(self) -> str:
        return f"{self.count}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> Head:
        """Read ``COUNT:HASH`` (as :meth:`__str__` writes it)."""
        count, sep, digest = str(text).strip().partition(":")
        if not sep or not count.isdigit() or len(digest) != 64:
            raise ArgumentError(f"a ledger head is COUNT:HASH (64 hex digits), got {text!r}")
        return cls(int(count), digest.lower())

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "hash": self.hash}


@dataclass(frozen=True)
class Entry:
    """One entry of the chain."""

    seq: int
    kind: str
    body: dict[str, Any]
    prev: str
    hash: str


def canonical(body: dict[str, Any]) -> str:
    """The canonical JSON text of an entry's body (sorted keys, no spaces)."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _digest(ledger_id: str, seq: int, kind: str, body: str, prev: str) -> str:
    h = hashlib.sha256()
    for part in (ledger_id, str(seq), kind, body, prev):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def verify_rows(
    ledger_id: str, rows: Iterable[tuple[int, str, str, str, str]], where: object
) -> list[Entry]:
    """The entries of ``rows`` (seq, kind, body, prev, hash), checked: the hash chain
    recomputes from the first entry, an ``init``, and every body is canonical JSON.
    Shared by every store of the chain; ``where`` names the ledger in errors."""
    entries = []
    prev = _ZERO
    for i, (seq, kind, body, before, digest) in enumerate(rows, start=1):
        if seq != i or before != prev or digest != _digest(ledger_id, seq, kind, body, before):
            raise LedgerTamperedError(
                f"the ledger {where} was edited: its hash chain breaks at entry {i}"
            )
        try:
            parsed = json.loads(body)
        except ValueError:
            raise LedgerTamperedError(f"entry {i} of {where} is not JSON") from None
        if canonical(parsed) != body:
            raise LedgerTamperedError(f"entry {i} of {where} is not canonical JSON")
        entries.append(Entry(seq, kind, parsed, before, digest))
        prev = digest
    if not entries or entries[0].kind != "init":
        raise LedgerTamperedError(f"the ledger {where} has no entries: it was emptied")
    return entries


def head_path(path: Path) -> Path:
    """Where the head of the ledger at ``path`` is kept."""
    return path.with_name(path.name + ".head")


class Chain:
    """The hash-chained entry log of one ledger file (see the module notes).

    Use :meth:`create` for a new ledger and ``Chain(path)`` to open one; both verify.
    """

    def __init__(self, path: str | os.PathLike[str], *, check_head: bool = True):
        self.path = Path(path)
        self.head_file = head_path(self.path)
        if not self.path.exists():
            if self.head_file.exists():
                raise LedgerTamperedError(
                    f"the ledger {self.path} is missing but its head file {self.head_file} "
                    "is there: the ledger was deleted or moved; restore it"
                )
            raise LedgerMissingError(
                f"there is no ledger at {self.path}; create one with "
                f"`dpdask ledger init {self.path}` (or `ledger: {{path: ..., create: true}}` "
                "in the spec)"
            )
        with self._connect() as con:
            self.ledger_id = self._check_schema(con)
            self.read(con, check_head=check_head)

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> Chain:
        """Create a new, empty ledger at ``path`` (refusing an existing one or its head)."""
        path = Path(path)
        if path.exists() or head_path(path).exists():
            raise LedgerError(
                f"{path} (or its head file) already exists; a ledger is never re-created"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        try:
            cls._initialise(path)
        except BaseException as exc:  # a ledger half-born is no ledger: none is left
            path.unlink(missing_ok=True)
            head_path(path).unlink(missing_ok=True)
            storage = (
                _storage_error(path, exc, creating=True) if isinstance(exc, Exception) else None
            )
            if storage is None:
                raise
            raise storage from None
        return cls(path)

    @staticmethod
    def _initialise(path: Path) -> None:
        """Write the schema, the triggers, the first entry and the head file."""
        ledger_id = secrets.token_hex(16)
        con = sqlite3.connect(path, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=DELETE")
            con.execute("PRAGMA synchronous=EXTRA")
            con.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    con.execute(statement)
            for table in _TABLES:
                for op in ("UPDATE", "DELETE"):
                    con.execute(
                        f"CREATE TRIGGER {table}_no_{op.lower()} BEFORE {op} ON {table} "
                        "BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END"
                    )
            con.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [("schema", str(SCHEMA_VERSION)), ("ledger", ledger_id)],
            )
            body = canonical({"schema": SCHEMA_VERSION, "time": time.time()})
            digest = _digest(ledger_id, 1, "init", body, _ZERO)
            con.execute("INSERT INTO entries VALUES (1, 'init', ?, ?, ?)", (body, _ZERO, digest))
            con.execute("COMMIT")
        finally:
            con.close()
        _write_head(head_path(path), ledger_id, Head(1, digest))

    # -- reading -------------------------------------------------------------------
    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # the file must exist: sqlite would otherwise create an empty database
        if not self.path.is_file():
            raise LedgerTamperedError(f"the ledger {self.path} has gone (deleted or moved)")
        try:
            con = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, timeout=60.0,
                                  isolation_level=None)  # fmt: skip
        except sqlite3.Error as exc:
            raise LedgerTamperedError(f"cannot open the ledger {self.path}: {exc}") from None
        try:
            con.execute("PRAGMA journal_mode=DELETE")
            # EXTRA: fsync the database and, on commit, the journal's directory
            con.execute("PRAGMA synchronous=EXTRA")
            yield con
        except sqlite3.DatabaseError as exc:
            storage = _storage_error(self.path, exc)
            if storage is not None:
                raise storage from None
            raise LedgerTamperedError(
                f"the ledger {self.path} is not a readable ledger database ({exc}); "
                "it was truncated, overwritten or corrupted: restore it from a backup"
            ) from None
        finally:
            con.close()

    def _check_schema(self, con: sqlite3.Connection) -> str:
        if self.path.stat().st_size == 0:
            raise LedgerTamperedError(
                f"the ledger {self.path} is empty (0 bytes): it was truncated; restore it"
            )
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
        if not set(_TABLES) <= names:
            raise LedgerTamperedError(
                f"{self.path} is not a dpdask ledger (or an old one without a hash chain): "
                f"it has no {sorted(set(_TABLES) - names)} table(s)"
            )
        missing = sorted(set(_TRIGGERS) - names)
        if missing:
            raise LedgerTamperedError(
                f"the ledger {self.path} has lost its append-only trigger(s) {missing}: "
                "it was edited"
            )
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("schema") != str(SCHEMA_VERSION) or "ledger" not in meta:
            raise LedgerTamperedError(
                f"{self.path} has ledger schema {meta.get('schema')!r}; this dpdask reads "
                f"schema {SCHEMA_VERSION}"
            )
        ledger_id: str = meta["ledger"]
        return ledger_id

    def read(
        self, con: sqlite3.Connection | None = None, *, check_head: bool = True
    ) -> list[Entry]:
        """Every entry, verified: the chain recomputes and contains the head file's head."""
        if con is None:
            with self._connect() as c:
                return self.read(c, check_head=check_head)
        if not con.in_transaction:
            # a read transaction holds off writers' commits (and so their head updates)
            # until the head file has been compared with what was read
            con.execute("BEGIN")
            try:
                return self.read(con, check_head=check_head)
            finally:
                con.execute("COMMIT")
        rows = con.execute("SELECT seq, kind, body, prev, hash FROM entries ORDER BY seq")
        entries = verify_rows(self.ledger_id, rows.fetchall(), self.path)
        if check_head:
            self._check_head(entries)
        return entries

    def _check_head(self, entries: list[Entry]) -> None:
        try:
            raw = json.loads(self.head_file.read_text())
            anchored = Head(int(raw["count"]), str(raw["hash"]))
            ledger_id = str(raw["ledger"])
        except FileNotFoundError:
            raise LedgerTamperedError(
                f"the ledger's head file {self.head_file} is missing; restore it, or "
                f"re-anchor it with `dpdask ledger anchor {self.path} --release OUT.zarr ... "
                "--head COUNT:HASH ...`, which first checks that the chain holds the head "
                "of every release published from it and every head you kept"
            ) from None
        except (ValueError, KeyError, TypeError):
            raise LedgerTamperedError(f"the head file {self.head_file} is unreadable") from None
        if ledger_id != self.ledger_id:
            raise LedgerTamperedError(
                f"the ledger {self.path} is not the one its head file names: it was replaced"
            )
        if not self.contains(anchored, entries):
            raise LedgerTamperedError(
                f"the ledger {self.path} holds {len(entries)} entries but its head file says "
                f"{anchored.count}: it was truncated or rolled back to an older copy"
            )

    @staticmethod
    def contains(head: Head, entries: list[Entry]) -> bool:
        """Whether ``head`` is a head this chain has passed through."""
        return 1 <= head.count <= len(entries) and entries[head.count - 1].hash == head.hash

    # -- writing -------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[tuple[list[Entry], _Appender]]:
        """A write-locked transaction: yields the verified entries and an appender;
        commits durably (then advances the head file) or rolls back."""
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                entries = self.read(con)
                app = _Appender(con, self.ledger_id, entries)
                yield entries, app
            except BaseException:
                if con.in_transaction:  # sqlite rolls back by itself on a full disk
                    con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
        if app.added:
            try:
                self.advance_head(app.head)
            except OSError as exc:  # committed; the head file names an earlier entry
                storage = _storage_error(self.path, exc, committed=True)
                if storage is None:
                    raise
                raise storage from None

    def advance_head(self, head: Head) -> None:
        """Write ``head`` to the head file unless it already names a later entry."""
        with open(self.path, "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = json.loads(self.head_file.read_text())
                if int(current["count"]) >= head.count:
                    return
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                pass
            _write_head(self.head_file, self.ledger_id, head)

    def reanchor(self, heads: Iterable[Head] = ()) -> Head:
        """Write the head file from the chain as it stands (its head file was lost).

        The chain must verify and hold every head of ``heads`` (heads recorded by
        published releases, or kept elsewhere). An existing head file must name this
        ledger and an entry of the chain: a ledger rolled back, truncated or replaced
        behind its head file is refused, never re-anchored.

        Raises
        ------
        LedgerTamperedError
            If the chain does not verify, misses one of ``heads``, or does not hold
            the entry an existing head file names.
        """
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")  # no writer advances the head meanwhile
            try:
                entries = self.read(con, check_head=False)
                if self.head_file.exists():
                    self._check_head(entries)
                for h in heads:
                    if not self.contains(h, entries):
                        raise LedgerTamperedError(
                            f"head {h} is not in {self.path}: the ledger was rewritten or "
                            "rolled back since; it is not re-anchored"
                        )
                head = Head(len(entries), entries[-1].hash)
                _write_head(self.head_file, self.ledger_id, head)
            finally:
                con.execute("ROLLBACK")
        return head


class _Appender:
    """Appends entries inside one transaction, extending the chain."""

    def __init__(self, con: sqlite3.Connection, ledger_id: str, entries: list[Entry]):
        self.con, self.ledger_id = con, ledger_id
        self.head = Head(len(entries), entries[-1].hash)
        self.added: list[Entry] = []

    def __call__(self, kind: str, body: dict[str, Any]) -> Entry:
        text = canonical({**body, "time": time.time()})
        seq = self.head.count + 1
        digest = _digest(self.ledger_id, seq, kind, text, self.head.hash)
        self._insert((seq, kind, text, self.head.hash, digest))
        entry = Entry(seq, kind, json.loads(text), self.head.hash, digest)
        self.added.append(entry)
        self.head = Head(seq, digest)
        return entry

    def _insert(self, row: tuple[int, str, str, str, str]) -> None:
        self.con.execute("INSERT INTO entries VALUES (?, ?, ?, ?, ?)", row)


# sqlite's result codes of a file system that failed, not of a damaged database
_FULL = (sqlite3.SQLITE_FULL,)
_STORAGE = (
    sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM,
    sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED,
)  # fmt: skip
_FULL_ERRNO = (errno.ENOSPC, errno.EDQUOT)


def _storage_error(
    path: Path, exc: BaseException, committed: bool = False, creating: bool = False
) -> LedgerStorageError | None:
    """The error to raise when the ledger's file system, not its content, failed (a
    full disk above all, which is no reason to restore a backup: that would roll the
    ledger back); ``None`` for anything else."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    full = primary in _FULL or getattr(exc, "errno", None) in _FULL_ERRNO
    if not (full or primary in _STORAGE or (isinstance(exc, OSError) and committed)):
        return None
    what = "the disk holding it is full" if full else f"its file system failed ({exc})"
    if creating:
        return LedgerStorageError(f"cannot create the ledger {path}: {what}; none was created")
    state = (
        "the entry was committed but the head file is one step behind, which the ledger accepts"
        if committed
        else "the write was rolled back"
    )
    return LedgerStorageError(
        f"cannot write the ledger {path}: {what}; {state}, and the ledger is intact (do "
        "not restore a backup: that would roll it back). Free space and run again"
    )


def _write_head(path: Path, ledger_id: str, head: Head) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{time.time_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            os.write(fd, json.dumps({"ledger": ledger_id, **head.to_dict()}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no partial head file behind
        raise
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
