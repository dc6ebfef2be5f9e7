"""The ledger on a PostgreSQL server: separation of duties, one budget authority,
migration and clear errors, tried as a hostile operator would.

Oracles: the server's tables read back with psycopg as the administrator (not through
the Ledger class), an independent SHA-256 of the chain's digest, and the SQLite ledger
the server's copy was migrated from.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import pickle
import subprocess
import sys
import time

import psycopg
import pytest

from dpdask.errors import LedgerPermissionError, LedgerServerError
from dpdask.privacy import (
    Charge,
    Head,
    Ledger,
    LedgerConflictError,
    LedgerError,
    LedgerMissingError,
    LedgerTamperedError,
    bind_source,
    check_source,
    migrate_ledger,
    source_dataset,
    zCDP,
)


def _charge(release="r", run="run1", name="A", rho="0.25") -> Charge:
    return Charge(release, run, "county", name, "gaussian", 1.0, 2.0, zCDP(rho), "fp-" + run)


def _table(url: str) -> list[tuple]:
    """Every row of the entries table, read with psycopg."""
    with psycopg.connect(url) as con:
        return con.execute("SELECT seq, kind, body, prev, hash FROM dpdask.entries ORDER BY seq")\
            .fetchall()  # fmt: skip


def _oracle_digest(ledger_id: str, seq: int, kind: str, body: str, prev: str) -> str:
    """The chain's digest, written again from its definition: SHA-256 over each part's
    UTF-8 bytes, each preceded by its length as 8 big-endian bytes."""
    data = b""
    for part in (ledger_id, str(seq), kind, body, prev):
        raw = part.encode()
        data += len(raw).to_bytes(8, "big") + raw
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def shared(pg_ledger):
    """A server ledger with a registered dataset, an operator's release, a charged run:
    ``(admin URL, operator URL, operator role)``."""
    admin, operator, role = pg_ledger
    led = Ledger.init(admin, operator_role=role)
    led.set_dataset_total("cef", zCDP(2))
    op = Ledger(operator)
    op.open_release("r", zCDP(1), "cef")
    op.charge(_charge())
    return admin, operator, role


def test_the_server_computes_the_same_chain(shared):
    admin, _, _ = shared
    rows = _table(admin)
    with psycopg.connect(admin) as con:
        ledger_id = con.execute("SELECT value FROM dpdask.meta WHERE key = 'ledger'").fetchone()[0]
        server = [con.execute("SELECT dpdask.digest(%s, %s, %s, %s, %s)",
                              (ledger_id, str(r[0]), r[1], r[2], r[3])).fetchone()[0]
                  for r in rows]  # fmt: skip
    prev = "0" * 64
    for (seq, kind, body, before, digest), theirs in zip(rows, server, strict=True):
        assert before == prev
        assert digest == _oracle_digest(ledger_id, seq, kind, body, before) == theirs
        prev = digest
    assert [r[1] for r in rows] == ["init", "dataset", "release", "run", "charge", "state"]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM dpdask.entries WHERE kind = 'charge'",
        "UPDATE dpdask.entries SET body = '{}' WHERE kind = 'charge'",
        "TRUNCATE dpdask.entries",
        "DROP TABLE dpdask.entries",
        "DROP TRIGGER entries_chain ON dpdask.entries",
        "DROP TRIGGER entries_no_edit ON dpdask.entries",
        "ALTER TABLE dpdask.entries DISABLE ROW LEVEL SECURITY",
        "DROP POLICY operator_appends ON dpdask.entries",
        "ALTER TABLE dpdask.entries DISABLE TRIGGER ALL",
        "DELETE FROM dpdask.meta",
        "UPDATE dpdask.meta SET value = 'x'",
        "INSERT INTO dpdask.meta VALUES ('operator', 'me')",
        "CREATE TABLE dpdask.entries_copy AS SELECT * FROM dpdask.entries",
        "DROP SCHEMA dpdask CASCADE",
        "CREATE OR REPLACE FUNCTION dpdask.operator_may_insert(a text, b text) RETURNS "
        "boolean LANGUAGE sql AS 'SELECT true'",
        "LOCK TABLE dpdask.entries IN ACCESS EXCLUSIVE MODE",
        "INSERT INTO dpdask.entries VALUES (99, 'charge', '{}', 'x', 'y')",
    ],
)
def test_the_operator_cannot_edit_the_ledger(shared, sql):
    admin, operator, _ = shared
    before = _table(admin)
    refused = (psycopg.errors.InsufficientPrivilege, psycopg.errors.IntegrityConstraintViolation)
    with psycopg.connect(operator) as con, pytest.raises(refused):  # in a transaction
        con.execute(sql)
    assert _table(admin) == before
    assert Ledger(operator).verify() == Head(len(before), before[-1][4])


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        ("dataset", {"dataset": "cef", "total": zCDP(100).to_dict()}),
        ("dataset", {"dataset": "other", "total": zCDP(100).to_dict()}),
        ("state", {"release": "r", "run_id": "run1", "state": "abandoned"}),
        ("release", {"release": "r2", "budget": zCDP(1).to_dict(), "dataset": "unregistered"}),
        ("release", {"release": "r2", "budget": zCDP(1).to_dict(), "dataset": None}),
        ("init", {"schema": 2}),
    ],
)
def test_a_well_chained_admin_entry_is_refused_to_the_operator(shared, kind, body):
    # the operator computes a correct next entry by hand: only the grants stop it
    admin, operator, _ = shared
    before = _table(admin)
    with psycopg.connect(operator) as con:
        ledger_id = con.execute("SELECT value FROM dpdask.meta WHERE key = 'ledger'").fetchone()[0]
    seq, prev = len(before) + 1, before[-1][4]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    row = (seq, kind, text, prev, _oracle_digest(ledger_id, seq, kind, text, prev))
    with psycopg.connect(operator, autocommit=True) as con:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            con.execute("INSERT INTO dpdask.entries VALUES (%s, %s, %s, %s, %s)", row)
    assert _table(admin) == before


def test_the_administrator_may_what_the_operator_may_not(shared):
    admin, operator, _ = shared
    op, adm = Ledger(operator), Ledger(admin)
    before = _table(admin)
    for attempt in (
        lambda: op.set_dataset_total("acs", zCDP(1)),
        lambda: op.abandon("r", "run1"),
        lambda: op.open_release("r2", zCDP(1), "acs"),
        lambda: op.open_release("r3", zCDP(1)),
    ):
        with pytest.raises(LedgerPermissionError, match="administrator"):
            attempt()
    assert _table(admin) == before
    adm.set_dataset_total("acs", zCDP(1))
    adm.abandon("r", "run1")
    op.open_release("r2", zCDP(1), "acs")
    assert op.run("r", "run1").state == "abandoned"
    assert op.dataset_total("acs") == zCDP(1)


def test_the_operator_cannot_roll_the_ledger_back(shared):
    """The rollback tests of the SQLite backend have no server equivalent to run.

    On SQLite the attack is on files: copy the ledger and its head file, publish, put
    the copies back (``test_a_tampered_ledger_is_refused[rollback]``,
    ``test_a_lost_head_file_is_re_anchored_only_against_the_releases``,
    ``test_anchor_without_the_releases_is_refused``, the state machine's ``rollback``).
    On a server the operator holds no file to copy or restore: the chain and its head
    are the server's, and the operator's role can neither delete the entries written
    since (nor truncate them) nor restore the database; so those tests stay SQLite's,
    and this one shows the attack fails at its first step."""
    _, operator, _ = shared
    op = Ledger(operator)
    head = op.head()
    op.publish("r", "run1", "/out/a.zarr")
    with psycopg.connect(operator, autocommit=True) as con:
        for sql in (f"DELETE FROM dpdask.entries WHERE seq > {head.count}",
                    "TRUNCATE dpdask.entries"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                con.execute(sql)
    assert op.run("r", "run1").state == "published"
    assert op.head().count == head.count + 1 and op.contains(head)


def test_the_operator_runs_a_release_life(shared):
    _, operator, _ = shared
    op = Ledger(operator)
    assert op.charge(_charge()) == 0  # a retry
    op.publish("r", "run1", "/out/r.zarr")
    op.charge([_charge(run="run2", name=n, rho="0.25") for n in ("A", "B")])
    assert op.remaining("r") == zCDP("0.25")
    assert op.dataset_remaining("cef") == zCDP("1.25")


def test_one_source_one_dataset(ledger_location):
    led = Ledger.init(ledger_location)
    led.set_dataset_total("cef", zCDP(2))
    assert bind_source(led, "cef", "abc")
    assert not bind_source(led, "cef", "abc")  # the first release's source stays
    assert not bind_source(led, "free", "xyz")  # no lifetime budget: nothing recorded
    assert source_dataset(led, "abc") == "cef" and source_dataset(led, "xyz") is None
    check_source(led, "cef", "abc")
    before = led.head()
    for attempt in (lambda: check_source(led, "renamed", "abc"),
                    lambda: bind_source(led, "renamed", "abc")):  # fmt: skip
        with pytest.raises(LedgerConflictError, match="'cef'"):
            attempt()
    assert led.head() == before


def test_an_operator_finds_an_unregistered_dataset_before_anything(shared):
    admin, operator, _ = shared
    before = _table(admin)
    with pytest.raises(LedgerPermissionError, match="not registered"):
        check_source(Ledger(operator), "acs", "fingerprint")
    check_source(Ledger(admin), "acs", "fingerprint")  # the administrator registers it later
    assert _table(admin) == before


def test_migrate_keeps_the_chain_and_its_heads(tmp_path, pg_ledger):
    admin, operator, role = pg_ledger
    lite = Ledger.init(tmp_path / "l.sqlite")
    lite.set_dataset_total("cef", zCDP(2))
    lite.open_release("r", zCDP(1), "cef")
    lite.charge(_charge())
    published = lite.head()
    lite.publish("r", "run1", "/out/r.zarr")
    head = migrate_ledger(tmp_path / "l.sqlite", admin, role)
    server = Ledger(operator)
    assert head == lite.head() == server.head()
    assert server.ledger_id == lite.ledger_id and server.contains(published)
    assert [e.hash for e in server.entries()] == [e.hash for e in lite.entries()]
    assert server.report()["releases"] == lite.report()["releases"]
    server.charge(_charge(run="run2"))  # the operator goes on appending
    with pytest.raises(LedgerError, match="never re-created"):
        migrate_ledger(tmp_path / "l.sqlite", admin, role)


def test_a_tampered_sqlite_ledger_is_not_migrated(tmp_path, pg_ledger):
    admin, _, role = pg_ledger
    lite = Ledger.init(tmp_path / "l.sqlite")
    lite.open_release("r", zCDP(1))
    lite.head_file.unlink()
    with pytest.raises(LedgerTamperedError):
        migrate_ledger(tmp_path / "l.sqlite", admin, role)
    with pytest.raises(LedgerMissingError):
        Ledger(admin)


def test_the_password_is_never_shown_and_the_ledger_pickles(shared):
    _, operator, _ = shared
    password = operator.split(":")[2].split("@")[0]
    op = Ledger(operator)
    shown = [str(op.path), repr(op), json.dumps(op.report())]
    assert all(password not in s for s in shown) and "operator_" in str(op.path)
    again = pickle.loads(pickle.dumps(op))
    assert again.head() == op.head()
    code = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).head())"
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(op),
                         capture_output=True, check=True)  # fmt: skip
    assert out.stdout.decode().strip() == str(op.head())


def test_connection_errors_are_one_clear_line(shared, pg_server):
    admin, operator, role = shared
    password = operator.split(":")[2].split("@")[0]
    wrong = operator.replace(password, "wrong")
    with pytest.raises(LedgerServerError, match="refuses the login") as info:
        Ledger(wrong)
    assert "wrong" not in str(info.value) and "\n" not in str(info.value)
    start = time.monotonic()
    with pytest.raises(LedgerServerError, match="cannot reach") as info:
        Ledger("postgresql://someone:secret@127.0.0.1:1/ledger")
    assert "secret" not in str(info.value) and time.monotonic() - start < 30
    pg_server.sql(f"REVOKE INSERT ON dpdask.entries FROM {role}",
                  dbname=admin.rsplit("/", 1)[1])  # fmt: skip
    with pytest.raises(LedgerPermissionError, match="no grant to append"):
        check_source(Ledger(operator), "cef", "fp")
    pg_server.sql(f"REVOKE ALL ON ALL TABLES IN SCHEMA dpdask FROM {role}",
                  dbname=admin.rsplit("/", 1)[1])  # fmt: skip
    with pytest.raises(LedgerPermissionError, match="no grant to read"):
        Ledger(operator)


def test_a_lost_connection_fails_closed_then_reconnects(shared, pg_server):
    _, operator, role = shared
    op = Ledger(operator)
    before = op.head()
    pg_server.sql(
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
    )
    with pytest.raises(LedgerServerError, match="lost the ledger server"):
        op.charge(_charge(run="run2"))
    assert op.head() == before  # nothing was written; the next call reconnects
    assert op.charge(_charge(run="run2")) == 1


def test_operator_role_must_be_separate(pg_ledger, pg_server):
    admin, _, _ = pg_ledger
    user = admin.split("//")[1].split(":")[0]
    for role, match in ((user, "administrator itself"), ("nobody_here", "no role")):
        with pytest.raises(LedgerError, match=match):
            Ledger.init(admin, operator_role=role)
    with pytest.raises(LedgerMissingError):
        Ledger(admin)


def _spec_with(ledger: object):
    from dpdask.pipeline.spec import parse_spec

    return parse_spec(
        {"release": "r", "data": {"format": "synthetic", "geographies": 4}, "domain": "pl94",
         "workload": "identity", "strategy": "identity", "privacy": {"zcdp": 1},
         "output": "out.zarr", "ledger": ledger},
        base=pathlib.Path("/base"),
    )  # fmt: skip


def test_a_spec_names_a_server_ledger() -> None:
    from dpdask.errors import SpecError

    url = "postgresql://op@db.example:5432/ledger?sslmode=verify-full"
    assert _spec_with(url).ledger == url
    spec = _spec_with({"url": url, "create": True})
    assert spec.ledger == url and spec.ledger_create
    assert _spec_with("ledger.sqlite").ledger == pathlib.Path("/base/ledger.sqlite")
    for bad in ({"url": url, "path": "l.sqlite"}, {"url": "mysql://x/y"}, {"url": url, "x": 1}):
        with pytest.raises(SpecError, match="ledger"):
            _spec_with(bad)


@pytest.mark.parametrize(
    ("sql", "match"),
    [
        ("DROP TRIGGER entries_chain ON dpdask.entries", "entries_chain"),
        ("ALTER TABLE dpdask.entries DISABLE TRIGGER entries_no_edit", "entries_no_edit"),
        ("DROP TRIGGER entries_no_truncate ON dpdask.entries", "entries_no_truncate"),
        ("ALTER TABLE dpdask.entries DISABLE ROW LEVEL SECURITY", "row-level security"),
        ("GRANT UPDATE ON dpdask.entries TO {role}", "UPDATE"),
        ("GRANT TRUNCATE, DELETE ON dpdask.entries TO {role}", "DELETE"),
        ("GRANT {admin} TO {role}", "no longer separated"),
    ],
)
def test_guards_the_administrator_lowers_are_refused(shared, pg_server, sql, match):
    # the administrator (or the server's superuser) can lower the server's guards;
    # every job then refuses the ledger
    admin, operator, role = shared
    user = admin.split("//")[1].split(":")[0]
    pg_server.sql(sql.format(role=role, admin=user), dbname=admin.rsplit("/", 1)[1])
    for url in (operator, admin):
        with pytest.raises(LedgerTamperedError, match=match):
            Ledger(url)
