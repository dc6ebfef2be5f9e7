"""The persistent privacy ledger: durability, idempotent retries, refusal, append-only.

Oracles: the SQLite file read back with the standard library, or the server's table
with psycopg (not through the Ledger class), exact budget arithmetic, and a second
process. Every test that needs a ledger runs on both backends (``ledger_location``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from fractions import Fraction
from urllib.parse import urlsplit

import pytest

from dpdask.privacy import (
    ApproxDP,
    BudgetExceededError,
    Charge,
    Ledger,
    LedgerConflictError,
    PureDP,
    RunBinding,
    RunStateError,
    zCDP,
)

QUARTER = zCDP("0.25")


def _charge(run="run1", level="county", name="A", privacy=QUARTER, scale=2.0, **kw):
    return Charge(
        release=kw.get("release", "r"),
        run_id=run,
        level=level,
        measurement=name,
        mechanism=kw.get("mechanism", "gaussian"),
        sensitivity=kw.get("sensitivity", 1.0),
        noise_scale=scale,
        privacy=privacy,
        key_fingerprint=kw.get("key", "fp-" + run),
    )


def _bodies(ledger: Ledger, kind: str) -> list[dict]:
    """Entry bodies of one kind, read from the store itself (the SQLite file with the
    standard library, or the server's table with psycopg), not through dpdask."""
    query = "SELECT body FROM {}entries WHERE kind = %s ORDER BY seq"
    if ledger.head_file is None:
        import psycopg

        with psycopg.connect(ledger._location) as con:
            rows = con.execute(query.format("dpdask."), (kind,)).fetchall()
    else:
        con = sqlite3.connect(ledger.path)
        try:
            rows = con.execute(query.format("").replace("%s", "?"), (kind,)).fetchall()
        finally:
            con.close()
    return [json.loads(body) for (body,) in rows]


def _rows(ledger) -> list[tuple]:
    """The charges, read from the store itself (:func:`_bodies`)."""
    return [
        (b["release"], b["run_id"], b["level"], b["measurement"], b["privacy"])
        for b in _bodies(ledger, "charge")
    ]


@pytest.fixture
def ledger(ledger_location) -> Ledger:
    led = Ledger.init(ledger_location)
    led.open_release("r", zCDP(1))
    return led


def test_charge_is_persisted_and_readable_independently(ledger):
    assert ledger.charge(_charge()) == 1
    rows = _rows(ledger)
    assert rows[0][:4] == ("r", "run1", "county", "A")
    assert rows[0][4] == {"type": "zCDP", "rho": "1/4"}
    # a new Ledger on the same file sees the charge
    again = Ledger(ledger._location)
    assert again.spent("r") == zCDP("0.25")
    assert again.find("r", "run1", "county", "A") == _charge()


def test_retry_charges_nothing_new_run_charges_again(ledger):
    assert ledger.charge(_charge()) == 1
    assert ledger.charge(_charge()) == 0
    assert len(ledger) == 1
    assert ledger.charge(_charge(run="run2")) == 1
    assert ledger.spent("r") == zCDP("0.5")


def test_conflicting_charge_under_same_identity_is_refused(ledger):
    ledger.charge(_charge())
    with pytest.raises(LedgerConflictError, match="new run id"):
        ledger.charge(_charge(scale=1.0, privacy=zCDP(1)))
    assert len(ledger) == 1


def test_over_budget_is_refused_naming_what_is_left(ledger):
    ledger.charge(_charge(name="A", privacy=zCDP("0.75")))
    before = _rows(ledger)
    with pytest.raises(BudgetExceededError, match=r"only zCDP\(rho=0.25\) of its zCDP\(rho=1\)"):
        ledger.charge(_charge(name="B", privacy=zCDP("0.5")))
    assert _rows(ledger) == before
    assert ledger.remaining("r") == zCDP("0.25")
    # exactly filling the budget is allowed (exact arithmetic, no float slack needed)
    for part in zCDP("0.25").split(3):
        ledger.charge(_charge(name=f"C{len(ledger)}", privacy=part))
    assert ledger.remaining("r") == zCDP(0)


def test_many_charges_are_atomic(ledger):
    batch = [_charge(name=n, privacy=zCDP("0.4")) for n in ("A", "B", "C")]  # 1.2 > 1
    with pytest.raises(BudgetExceededError):
        ledger.charge(batch)
    assert len(ledger) == 0
    assert ledger.check(batch[:2]) == 2
    assert len(ledger) == 0  # check never writes
    assert ledger.charge(batch[:2]) == 2


def test_dataset_total_caps_all_releases(ledger_location):
    led = Ledger.init(ledger_location)
    led.set_dataset_total("cef", zCDP(1))
    led.set_dataset_total("cef", zCDP(1))  # idempotent
    with pytest.raises(LedgerConflictError):
        led.set_dataset_total("cef", zCDP(2))
    led.open_release("r1", zCDP(1), dataset="cef")
    led.open_release("r2", zCDP(1), dataset="cef")
    led.charge(_charge(release="r1", privacy=zCDP("0.75")))
    with pytest.raises(BudgetExceededError, match="dataset 'cef'"):
        led.charge(_charge(release="r2", privacy=zCDP("0.5")))
    assert led.dataset_remaining("cef") == zCDP("0.25")


def test_pure_charges_convert_tightly_into_zcdp(ledger):
    # eps = 1 pure DP is 1/2-zCDP: two of them fill a rho = 1 budget
    for name in ("A", "B"):
        ledger.charge(_charge(name=name, mechanism="laplace", privacy=PureDP(1)))
    assert ledger.spent("r") == zCDP(1)
    with pytest.raises(BudgetExceededError):
        ledger.charge(_charge(name="C", mechanism="laplace", privacy=PureDP("0.01")))


def test_incompatible_charge_kind_is_refused(ledger):
    with pytest.raises(LedgerConflictError, match="cannot be accounted"):
        ledger.charge(_charge(privacy=ApproxDP(1, "1e-9")))
    assert len(ledger) == 0


def test_unopened_release_is_refused(ledger_location):
    led = Ledger.init(ledger_location)
    with pytest.raises(LedgerConflictError, match="open_release"):
        led.charge(_charge())
    led.open_release("r", PureDP(1))
    with pytest.raises(LedgerConflictError):
        led.open_release("r", PureDP(2))


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE entries SET body = '{}' WHERE kind = 'charge'",
        "DELETE FROM entries WHERE kind = 'charge'",
        "DELETE FROM meta",
        "UPDATE meta SET value = 'x'",
    ],
)
def test_ledger_is_append_only(ledger, sql):
    if ledger.head_file is None:
        pytest.skip("the server's roles: tests/unit/test_ledger_postgres.py")
    ledger.charge(_charge())
    con = sqlite3.connect(ledger.path)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            con.execute(sql)
    finally:
        con.close()
    assert len(ledger) == 1


def test_concurrent_charges_never_overspend(ledger):
    # eight threads race for a budget that fits four charges
    errors: list[Exception] = []

    def work(i: int) -> None:
        try:
            ledger.charge(_charge(name=f"M{i}", privacy=zCDP("0.25")))
        except BudgetExceededError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ledger) == 4 and len(errors) == 4
    assert ledger.spent("r") == zCDP(1)


def test_other_process_sees_committed_charge(ledger):
    ledger.charge(_charge(privacy=zCDP(Fraction(1, 3))))
    code = (
        "import sys; from dpdask.privacy import Ledger; "
        "print(Ledger(sys.argv[1]).remaining('r').to_dict()['rho'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, ledger._location], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "2/3"


def test_ledger_pickles_by_path(ledger):
    import pickle

    assert pickle.loads(pickle.dumps(ledger)).path == ledger.path


@pytest.mark.parametrize(
    "kw",
    [
        {"run": ""},
        {"mechanism": "cauchy"},
        {"scale": 0.0},
        {"scale": float("nan")},
        {"sensitivity": -1.0},
        {"privacy": 0.5},
    ],
)
def test_bad_charges_raise(kw):
    with pytest.raises((TypeError, ValueError)):
        _charge(**kw)


def test_a_bound_run_records_its_input_spec_and_output(ledger, tmp_path):
    bind = RunBinding("input-1", "spec-1", str(tmp_path / "a.zarr"))
    with ledger.bound("r", "run1", bind):
        ledger.charge(_charge())
    (body,) = _bodies(ledger, "run")
    assert body["binding"] == {"source": "input-1", "spec": "spec-1",
                               "output": str(tmp_path / "a.zarr")}  # fmt: skip
    assert Ledger(ledger._location).run("r", "run1").binding == bind
    # a resume with the same binding charges nothing; any other one is refused, unwritten
    with ledger.bound("r", "run1", bind):
        assert ledger.charge(_charge()) == 0
    entries = len(ledger.entries())
    for other, says in [
        (RunBinding("input-2", "spec-1", bind.output), "input changed"),
        (RunBinding("input-1", "spec-2", bind.output), "spec changed"),
        (RunBinding("input-1", "spec-1", str(tmp_path / "b.zarr")), "publishes to"),
    ]:
        with ledger.bound("r", "run1", other), pytest.raises(RunStateError, match=says):
            ledger.charge(_charge(name="B"))
        with pytest.raises(RunStateError, match=says):
            ledger.open_run("r", "run1", "fp-run1", other)
    assert len(ledger.entries()) == entries
    # outside the block the binding is no longer applied to new runs
    ledger.charge(_charge(run="run2"))
    assert ledger.run("r", "run2").binding is None


def test_a_run_without_a_binding_is_not_resumed_bound(ledger, tmp_path):
    ledger.charge(_charge())  # as an older dpdask recorded runs
    bind = RunBinding("input-1", "spec-1", str(tmp_path / "a.zarr"))
    with ledger.bound("r", "run1", bind), pytest.raises(RunStateError, match="older dpdask"):
        ledger.charge(_charge(name="B"))
    assert len(ledger) == 1


def test_a_run_is_published_once_and_where_it_is_bound(ledger, tmp_path):
    a, b = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    ledger.open_run("r", "bound", "fp-bound", RunBinding("i", "s", a))
    ledger.charge(_charge(run="bound", key="fp-bound"))
    with pytest.raises(RunStateError, match="bound to the output"):
        ledger.publish("r", "bound", b)
    ledger.publish("r", "bound", a)
    ledger.publish("r", "bound", a)  # recording it again changes nothing
    # an unbound run too: once published at one place, never at another
    ledger.charge(_charge(run="free"))
    ledger.publish("r", "free", a)
    entries = len(ledger.entries())
    for run in ("bound", "free"):
        with pytest.raises(RunStateError, match="already published"):
            ledger.publish("r", run, b)
    assert len(ledger.entries()) == entries
    assert [r.output for r in Ledger(ledger._location).published_runs()] == [a, a]


def test_a_run_records_the_ledger_it_charged(ledger):
    # the oracle: the location written again by hand, a server's URL without its password
    where = ledger._location
    if ledger.head_file is None:
        u = urlsplit(where)
        expected = f"{u.scheme}://{u.username}@{u.hostname}:{u.port}{u.path}"
    else:
        expected = os.path.abspath(where)
    ledger.charge(_charge())  # a run opened by its first charge
    ledger.open_run("r", "run2", "fp-run2")  # and one opened first
    bodies = _bodies(ledger, "run")
    assert [b["ledger"] for b in bodies] == [expected, expected]
    if ledger.head_file is None:
        password = urlsplit(where).password
        assert password and all(password not in json.dumps(b) for b in bodies)
    again = Ledger(where)
    assert [again.run("r", r).ledger for r in ("run1", "run2")] == [expected, expected]
    runs = again.report()["releases"]["r"]["runs"]
    assert [r["ledger"] for r in runs] == [expected, expected]


def test_a_run_recorded_without_its_ledger_still_loads(ledger):
    # a run entry as dpdask wrote it before runs recorded their ledger
    with ledger._chain.transaction() as (_, append):
        append("run", {"release": "r", "run_id": "old", "key_fingerprint": "fp-old"})
    again = Ledger(ledger._location)
    assert again.run("r", "old").ledger is None
    assert again.charge(_charge(run="old", key="fp-old")) == 1  # it still charges
    assert again.run("r", "old").state == "measuring" and again.run("r", "old").ledger is None
    assert again.report()["releases"]["r"]["runs"][0]["ledger"] is None
