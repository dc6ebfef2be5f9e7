"""The ledger's chain on a PostgreSQL server, with separation of duties by database roles.

The same hash-chained entries as the SQLite store (:mod:`dpdask.privacy._chain`), in
the schema ``dpdask`` of one database: ``meta`` (ledger id, schema version, operator
role) and ``entries``. The head is the server's last entry: there is no head file to
roll back, and the operator role cannot restore, truncate or edit the database.

Roles (created by the site's database administrator; ``dpdask ledger init URL
--operator-role ROLE`` is run as the *administrator*, the role named in URL):

* the **administrator** owns the schema: it registers datasets and their lifetime
  budgets (``dpdask ledger dataset``), retires runs (``dpdask ledger abandon``),
  migrates and repairs. As the owner it can still do anything to its tables (drop
  them, rewrite the chain): what protects against it is the database's own audit
  and backups, and the heads published releases record (``dpdask ledger verify
  --release``).
* the **operator** (the role release jobs use) has ``USAGE`` on the schema,
  ``SELECT`` on both tables and ``INSERT`` on ``entries`` only: no ``UPDATE``,
  ``DELETE``, ``TRUNCATE``, DDL or ownership, enforced by grants. A row-level policy
  (owned by the administrator) lets it insert only the entries of a release's life:
  a release on a *registered* dataset, a run, a charge, a run becoming ``measuring``
  or ``published``, and the first source fingerprint of a registered dataset.

A trigger refuses any insert that does not extend the chain (the next sequence
number, the last hash, the right digest), and writers serialise on a transaction
advisory lock, so concurrent jobs on many machines append one after another and each
re-checks the budgets against every entry committed before it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dpdask.errors import (
    LedgerError,
    LedgerMissingError,
    LedgerPermissionError,
    LedgerServerError,
    LedgerTamperedError,
)
from dpdask.privacy._chain import (
    _ZERO,
    SCHEMA_VERSION,
    Chain,
    Entry,
    Head,
    _Appender,
    _digest,
    canonical,
    verify_rows,
)
from dpdask.privacy._pg_schema import GRANTS, SCHEMA

if TYPE_CHECKING:
    import psycopg

__all__ = ["ServerChain", "is_server_url", "redact"]

_SCHEMES = ("postgresql://", "postgres://")
_LOCK = 0x64706461736B  # the writers' advisory lock ("dpdask")


def is_server_url(location: object) -> bool:
    """Whether ``location`` names a ledger on a PostgreSQL server (``postgresql://...``)."""
    return isinstance(location, str) and location.lower().startswith(_SCHEMES)


def redact(url: str) -> str:
    """``url`` without its password (in the user part or the query), to print or record."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = user.split(":", 1)[0] + "@" + host
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "password"])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class ServerChain:
    """The hash-chained entry log of one ledger on a PostgreSQL server.

    Use :meth:`create` (as the administrator) for a new ledger, ``ServerChain(url)``
    to open one; both verify the whole chain. The interface is :class:`Chain`'s.
    """

    head_file: None = None  # the server keeps the head
    _held: psycopg.Connection[Any] | None = None  # the session holding a dataset (hold)

    def __init__(self, url: str, *, check_head: bool = True):
        self.url = url
        self.path = redact(url)
        self._local = threading.local()  # one connection per process and thread
        with self._session() as con:
            self.ledger_id = self._check_schema(con)
            self.read(con)

    @classmethod
    def create(
        cls, url: str, operator_role: str | None = None, copy: Sequence[Entry] = (),
        ledger_id: str | None = None,
    ) -> ServerChain:  # fmt: skip
        """Create the ledger's schema in the database of ``url`` (run as its administrator);
        ``operator_role`` may then only read and append (see the module notes).

        ``copy`` and ``ledger_id``: the verified entries and identity of a ledger to
        migrate, copied verbatim so that its chain, and the heads its releases
        recorded, verify on the server."""
        from psycopg import sql

        chain = cls.__new__(cls)
        chain.url, chain.path, chain._local = url, redact(url), threading.local()
        with chain._session() as con, con.transaction():
            if con.execute("SELECT to_regnamespace('dpdask')").fetchone() != (None,):
                raise LedgerError(
                    f"{chain.path} already holds a dpdask ledger; a ledger is never re-created"
                )
            if operator_role is not None:
                role = con.execute("SELECT rolsuper, rolname = current_user FROM pg_roles "
                                   "WHERE rolname = %s", (operator_role,)).fetchone()  # fmt: skip
                if role is None:
                    raise LedgerError(
                        f"--operator-role: there is no role {operator_role!r} on the server; "
                        "create it first (CREATE ROLE ... LOGIN PASSWORD ...)"
                    )
                if role[0] or role[1]:
                    raise LedgerError(
                        f"--operator-role: {operator_role!r} is a superuser or the "
                        "administrator itself; the operator must be a role of its own "
                        "without superuser rights, or nothing separates the duties"
                    )
            con.execute(SCHEMA)
            ledger_id = ledger_id or secrets.token_hex(16)
            con.execute(
                "INSERT INTO dpdask.meta VALUES ('schema', %s), ('ledger', %s), ('operator', %s)",
                (str(SCHEMA_VERSION), ledger_id, operator_role or ""),
            )
            if operator_role is not None:
                con.execute(sql.SQL(GRANTS).format(role=sql.Identifier(operator_role)))
            body = canonical({"schema": SCHEMA_VERSION, "time": time.time()})
            rows = [(e.seq, e.kind, canonical(e.body), e.prev, e.hash) for e in copy] or [
                (1, "init", body, _ZERO, _digest(ledger_id, 1, "init", body, _ZERO))
            ]
            with con.cursor() as cur:  # the trigger checks each row extends the chain
                cur.executemany("INSERT INTO dpdask.entries VALUES (%s, %s, %s, %s, %s)", rows)
        chain.close()
        return cls(url)

    # -- connections -------------------------------------------------------------------
    def _connection(self) -> psycopg.Connection[Any]:
        con: psycopg.Connection[Any] | None = getattr(self._local, "con", None)
        if con is not None and not con.closed and self._local.pid == os.getpid():
            return con
        con = self._open()
        self._local.con, self._local.pid = con, os.getpid()
        self._local.token = _ThreadToken()
        weakref.finalize(self._local.token, _close_in, con, os.getpid())
        return con

    def _open(self) -> psycopg.Connection[Any]:
        """A new connection, or a one-line error saying why there is none."""
        try:
            import psycopg
        except ImportError:
            raise LedgerError(
                f"the ledger {self.path} is on a PostgreSQL server, which needs psycopg: "
                "pip install 'dpdask[postgresql]'"
            ) from None
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        try:
            params = conninfo_to_dict(self.url)
        except psycopg.Error as exc:
            raise LedgerError(f"ledger: {self.path} is not a valid server URL: "
                              f"{_first_line(exc)}") from None  # fmt: skip
        params.setdefault("connect_timeout", 10)
        params.setdefault("application_name", "dpdask-ledger")
        try:
            return psycopg.connect(make_conninfo("", **params), autocommit=True)
        except psycopg.OperationalError as exc:
            why = _first_line(exc)
            if "password" in why or "authentication" in why:
                raise LedgerServerError(
                    f"the ledger server {self.path} refuses the login ({why}): check the user "
                    "and password (PGPASSWORD, PGPASSFILE or the URL)"
                ) from None
            if "certificate" in why or "SSL" in why:
                raise LedgerServerError(
                    f"the ledger server {self.path} fails the TLS check ({why}): check "
                    "sslmode and sslrootcert (PGSSLROOTCERT)"
                ) from None
            raise LedgerServerError(f"cannot reach the ledger server {self.path}: {why}") from None

    @contextmanager
    def _session(self) -> Iterator[psycopg.Connection[Any]]:
        """The connection, with the server's errors turned into one-line ledger errors."""
        import psycopg

        con = self._connection()
        try:
            yield con
        except psycopg.errors.InsufficientPrivilege as exc:
            raise LedgerPermissionError(
                f"the role of {self.path} may not do this on the ledger ({_first_line(exc)}): "
                "registering datasets, abandoning runs and repairs are the administrator's"
            ) from None
        except psycopg.OperationalError as exc:
            self.close()
            raise LedgerServerError(
                f"lost the ledger server {self.path}: {_first_line(exc)}; nothing was "
                "committed by the interrupted step; run again (the same run id resumes)"
            ) from None
        except psycopg.Error as exc:
            raise LedgerError(
                f"the ledger server {self.path} refused: {_first_line(exc)}"
            ) from None

    def close(self) -> None:
        """Close this thread's connection (the next use reconnects)."""
        con = getattr(self._local, "con", None)
        self._local.con = None
        if con is not None and self._local.pid == os.getpid():
            con.close()

    def _check_schema(self, con: psycopg.Connection[Any]) -> str:
        found = con.execute(
            "SELECT has_schema_privilege(current_user, oid, 'USAGE') "
            "FROM pg_namespace WHERE nspname = 'dpdask'"
        ).fetchone()
        if found is None:
            raise LedgerMissingError(
                f"there is no ledger on {self.path}; its administrator creates one with "
                f"`dpdask ledger init {self.path} --operator-role ROLE`"
            )
        if not found[0] or not self.may("SELECT"):
            raise LedgerPermissionError(
                f"the role of {self.path} has no grant to read the ledger; its administrator "
                "grants it with `dpdask ledger init ... --operator-role ROLE`"
            )
        meta = dict(con.execute("SELECT key, value FROM dpdask.meta").fetchall())
        if meta.get("schema") != str(SCHEMA_VERSION) or "ledger" not in meta:
            raise LedgerTamperedError(
                f"{self.path} has ledger schema {meta.get('schema')!r}; this dpdask reads "
                f"schema {SCHEMA_VERSION}"
            )
        self._check_guards(con, meta.get("operator") or None)
        return str(meta["ledger"])

    def _check_guards(self, con: psycopg.Connection[Any], operator: str | None) -> None:
        """Refuse a ledger whose server-side guards were dropped or disabled, or whose
        operator role was granted more than reading and appending."""
        on = {r[0] for r in con.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'dpdask.entries'::regclass "
            "AND tgenabled <> 'D'").fetchall()}  # fmt: skip
        lost = sorted({"entries_chain", "entries_no_edit", "entries_no_truncate"} - on)
        row = con.execute("SELECT relrowsecurity FROM pg_class "
                          "WHERE oid = 'dpdask.entries'::regclass").fetchone()  # fmt: skip
        if lost or not (row and row[0]):
            raise LedgerTamperedError(
                f"the ledger on {self.path} has lost its guard(s) "
                f"{lost or ['row-level security']}: its administrator disabled or dropped "
                "them; restore them (or the database) before any job charges it"
            )
        if operator is None:
            return
        more = con.execute(
            "SELECT p FROM unnest(ARRAY['UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', "
            "'TRIGGER']) AS p WHERE EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s) "
            "AND has_table_privilege(%s, 'dpdask.entries', p)",
            (operator, operator),
        ).fetchall()
        owner = con.execute(
            "SELECT pg_has_role(%s, nspowner, 'USAGE') OR rolsuper FROM pg_namespace, pg_roles "
            "WHERE nspname = 'dpdask' AND rolname = %s",
            (operator, operator),
        ).fetchone()
        if more or (owner and owner[0]):
            raise LedgerTamperedError(
                f"the operator role {operator!r} of {self.path} may "
                f"{[p for (p,) in more] or ['own the ledger']} its entries: the duties are "
                "no longer separated; its administrator revokes that first"
            )

    # -- reading -------------------------------------------------------------------------
    def read(self, con: Any = None, *, check_head: bool = True) -> list[Entry]:
        """Every entry, verified (the server keeps the head: there is no head file)."""
        if con is None:
            with self._session() as c:
                return self.read(c)
        rows = con.execute("SELECT seq, kind, body, prev, hash FROM dpdask.entries ORDER BY seq")
        return verify_rows(self.ledger_id, rows.fetchall(), self.path)

    contains = staticmethod(Chain.contains)

    def may(self, privilege: str) -> bool:
        """Whether this connection's role holds ``privilege`` (``SELECT``, ``INSERT``) on
        the ledger's entries (``False`` if the table is gone)."""
        with self._session() as con:
            row = con.execute(
                "SELECT to_regclass('dpdask.entries') IS NOT NULL AND "
                "has_table_privilege(current_user, 'dpdask.entries', %s)",
                (privilege,),
            ).fetchone()
        return bool(row and row[0])

    def is_administrator(self) -> bool:
        """Whether this connection's role may register datasets and retire runs."""
        with self._session() as con:
            row = con.execute(
                "SELECT pg_has_role(current_user, nspowner, 'USAGE') "
                "FROM pg_namespace WHERE nspname = 'dpdask'"
            ).fetchone()
        return bool(row and row[0])

    # -- writing ---------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[tuple[list[Entry], _Appender]]:
        """A transaction holding the writers' lock: yields the verified entries and an
        appender; commits (the server's synchronous commit) or rolls back."""
        with self._session() as con, con.transaction():
            con.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            entries = self.read(con)
            app = _ServerAppender(con, self.ledger_id, entries, self.path)
            yield entries, app
        if any(e.kind in ("charge", "state") for e in app.added):
            self.release_hold()  # a held dataset's charge is committed: the next job may check

    def hold(self, name: str, timeout_s: float = 600.0) -> None:
        """Hold ``name`` (a dataset) against other jobs until this process commits its
        charge (or :meth:`release_hold`): jobs checking the same dataset's budget then
        see every charge of the jobs before them, so a job that loses the race is
        refused before it reads data. A lock of the server's session: a job that dies
        releases it."""
        import psycopg

        self.release_hold()
        key = int.from_bytes(hashlib.sha256(f"dpdask-dataset:{name}".encode()).digest()[:8],
                             "big", signed=True)  # fmt: skip
        con = self._open()
        try:
            con.execute(f"SET lock_timeout = {int(timeout_s * 1000)}")
            con.execute("SELECT pg_advisory_lock(%s)", (key,))
        except psycopg.errors.LockNotAvailable:
            con.close()
            raise LedgerServerError(
                f"dataset {name!r}: another job has been charging it on {self.path} for "
                f"{timeout_s:.0f} s; try again later"
            ) from None
        except psycopg.Error as exc:
            con.close()
            raise LedgerServerError(f"the ledger server {self.path}: {_first_line(exc)}") from None
        self._held = con

    def release_hold(self) -> None:
        """Let other jobs check the held dataset (closing the hold's session)."""
        con = getattr(self, "_held", None)
        self._held = None
        if con is not None:
            con.close()

    def reanchor(self, heads: Iterable[Head] = ()) -> Head:
        """Check that the chain holds every head of ``heads``; return its head. The
        server keeps the head, so there is no head file to rewrite."""
        entries = self.read()
        for h in heads:
            if not self.contains(h, entries):
                raise LedgerTamperedError(
                    f"head {h} is not in {self.path}: the ledger was rewritten since"
                )
        return Head(len(entries), entries[-1].hash)

    def __del__(self) -> None:
        try:
            self.release_hold()
            self.close()
        except Exception:  # interpreter shutdown
            pass


class _ThreadToken:
    """Kept in a thread's ``threading.local`` beside its connection; when it goes (the
    thread ended, or the chain was collected, even in a reference cycle), a finalizer
    closes the connection: none is left open for the collector."""


def _close_in(con: psycopg.Connection[Any], pid: int) -> None:
    if os.getpid() == pid:  # never a connection a forked child inherited
        con.close()


class _ServerAppender(_Appender):
    """Appends entries to the server's table inside one transaction."""

    def __init__(self, con: psycopg.Connection[Any], ledger_id: str, entries: list[Entry],
                 where: str):  # fmt: skip
        self.pg, self.ledger_id, self.where = con, ledger_id, where
        self.head = Head(len(entries), entries[-1].hash)
        self.added: list[Entry] = []

    def _insert(self, row: tuple[int, str, str, str, str]) -> None:
        import psycopg

        try:
            with self.pg.transaction():  # a savepoint: the message names the entry
                self.pg.execute("INSERT INTO dpdask.entries VALUES (%s, %s, %s, %s, %s)", row)
        except psycopg.errors.InsufficientPrivilege:
            raise LedgerPermissionError(_refusal(row[1], row[2], self.where)) from None


def _refusal(kind: str, body: str, where: str) -> str:
    """Why the operator may not append this entry, in one line."""
    import json

    b = json.loads(body)
    if kind == "dataset":
        return (
            f"dataset {b.get('dataset')!r}: only the administrator of {where} registers "
            f"datasets and their lifetime budgets (`dpdask ledger dataset URL ID ...`)"
        )
    if kind == "release" or kind == "source":
        return (
            f"dataset {b.get('dataset')!r} is not registered on {where}"
            + (" or its source is already registered" if kind == "source" else "")
            + ": its administrator registers it (`dpdask ledger dataset URL "
            f"{b.get('dataset')} --zcdp RHO`)"
        )
    if kind == "state":
        return (f"run {b.get('run_id')!r}: only the administrator of {where} may make a run "
                f"{b.get('state')} (`dpdask ledger abandon`)")  # fmt: skip
    return f"the role of {where} may not append a {kind!r} entry to the ledger"
