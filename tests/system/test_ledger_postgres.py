"""A shared ledger on a real PostgreSQL server, through whole releases and the CLI.

Release jobs use the operator role, the administrator registers datasets; tried as a
hostile user would (another dataset id for the same data, an unregistered dataset)
and as many machines would (20 processes, each with its own connection, racing for a
lifetime budget that holds exactly 5 releases). Oracles: the server's table read with
psycopg, the SQLite backend's release with the same fixed test key, exact arithmetic.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from unittest import mock

import numpy as np
import psycopg
import pytest
import yaml
import zarr

import dpdask.graph._finish as finishing
from dpdask.cli import main
from dpdask.graph import release
from dpdask.noise import SecretKey
from dpdask.privacy import Ledger, zCDP
from dpdask.publish import release_attributes
from tests.helpers import make_plan
from tests.pg_race import race
from tests.system.test_accounting import RECORDS, _estimates, _write_spec


def _count(url: str, kind: str) -> int:
    with psycopg.connect(url) as con:
        return con.execute("SELECT count(*) FROM dpdask.entries WHERE kind = %s", (kind,))\
            .fetchone()[0]  # fmt: skip


@pytest.fixture
def shared(pg_ledger):
    """A server ledger, its dataset ``cef`` registered with rho = 5 by the administrator
    through the CLI: ``(admin URL, operator URL)``."""
    admin, operator, role = pg_ledger
    assert main(["ledger", "init", admin, "--operator-role", role]) == 0
    assert main(["ledger", "dataset", admin, "cef", "--zcdp", "5"]) == 0
    return admin, operator


def test_twenty_processes_race_for_five_releases(shared):
    """20 processes (forked from one server that imported dpdask once:
    ``tests/pg_race.py``), each with its own connection opened before the start, race
    to charge ``cef``, whose lifetime budget holds exactly 5 of their releases."""
    admin, operator = shared
    outcomes = race(operator, 20)
    assert [i for i, _, _ in outcomes] == list(range(20))  # every process reported
    results = [o for _, o, _ in outcomes]
    assert results.count("published") == 5 and results.count("refused") == 15, outcomes
    assert all("dataset 'cef'" in m for _, o, m in outcomes if o == "refused")
    assert _count(admin, "charge") == 5
    ledger = Ledger(admin)
    assert ledger.dataset_remaining("cef") == zCDP(0)
    assert main(["ledger", "verify", operator]) == 0


def test_a_release_charged_on_the_server_is_the_sqlite_release(store, tmp_path, pg_ledger):
    st, _ = store
    admin, _, _ = pg_ledger
    outs = []
    for where in (str(tmp_path / "l.sqlite"), admin):
        ledger = Ledger.init(where)
        r = release(make_plan(), st, release_id="rel", run_id="one", ledger=ledger,
                     key=SecretKey.for_testing(7), test_mode=True)  # fmt: skip
        out = tmp_path / f"out-{len(outs)}.zarr"
        r.to_zarr(out, progress=False)
        g = zarr.open_group(str(out), mode="r")
        outs.append({k: np.asarray(g[k]["estimate"][:]) for k in ("state", "county", "tract")})
        assert ledger.run("rel", "one").state == "published"
        assert ledger.spent("rel") == zCDP(1)
    for k in outs[0]:
        assert outs[0][k].tobytes() == outs[1][k].tobytes()


@pytest.fixture
def people(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    return tmp_path


def _spec(tmp: pathlib.Path, ledger: object, name: str = "spec.yaml", **changes) -> pathlib.Path:
    """The accounting tests' tiny spec, its ``ledger:`` replaced by ``ledger``."""
    path = _write_spec(tmp, name, **changes)
    raw = yaml.safe_load(path.read_text())
    raw["ledger"] = ledger
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _error(capsys) -> str:
    """The one line of a refused command's error (after its progress lines)."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("dpdask"), lines
    return lines[-1]


def _run(spec: pathlib.Path, *args: str) -> int:
    return main(["run", str(spec), "--json", "--no-progress", *args])


def test_jobs_charge_one_authority_through_the_cli(people, shared, capsys):
    admin, operator = shared
    spec = _spec(people, operator, data={"id": "cef"})
    assert _run(spec) == 0
    password = operator.split(":")[2].split("@")[0]
    printed = capsys.readouterr()
    summary = json.loads(printed.out)
    assert summary["ledger"].startswith("postgresql://operator_")
    assert password not in printed.out + printed.err
    out = people / "out" / "tiny.zarr"
    recorded = release_attributes(out)["ledger"]
    assert recorded["path"].startswith("postgresql://operator_") and password not in json.dumps(
        recorded
    )
    assert main(["ledger", "verify", operator, "--release", str(out)]) == 0
    assert _count(admin, "source") == 1
    # the run's own entry names the ledger it charged, as the operator reached it
    with psycopg.connect(admin) as con:
        (body,) = con.execute("SELECT body FROM dpdask.entries WHERE kind = 'run'").fetchone()
    assert json.loads(body)["ledger"] == summary["ledger"] and password not in body
    capsys.readouterr()
    # the same people under another dataset id, or another file name: refused before
    # anything is read or charged
    charges = _count(admin, "charge")
    for n, data in enumerate(({"id": "cef-copy"}, {"id": None})):
        renamed = _spec(people, {"url": operator}, f"s{n}.yaml", data=data, release=f"copy{n}",
                        output=str(people / "out" / f"other{n}.zarr"))  # fmt: skip
        assert _run(renamed) == 4
        err = _error(capsys)
        assert "source of dataset 'cef'" in err, err
    assert _count(admin, "charge") == charges
    assert not (people / "out" / "other0.zarr").exists()


def test_an_unregistered_dataset_is_refused_before_reading(people, shared, capsys):
    admin, operator = shared
    before = _count(admin, "run")
    spec = _spec(people, operator, data={"id": "acs"}, privacy={"dataset": {"zcdp": 10}})
    capsys.readouterr()
    assert _run(spec) == 6
    assert "'acs' is not registered" in _error(capsys)
    assert _count(admin, "run") == before and not (people / "out").exists()
    # the operator cannot register it through the CLI either
    assert main(["ledger", "dataset", operator, "acs", "--zcdp", "10"]) == 6
    assert "only the administrator" in _error(capsys)
    assert main(["ledger", "abandon", operator, "x", "y"]) == 4


def test_migrate_through_the_cli(people, pg_ledger, capsys):
    admin, operator, role = pg_ledger
    spec = _write_spec(people)
    assert _run(spec) == 0
    lite = people / "ledger" / "ledger.sqlite"
    out = people / "out" / "tiny.zarr"
    assert main(["ledger", "migrate", str(lite), "--to", admin, "--operator-role", role]) == 0
    assert main(["ledger", "verify", operator, "--release", str(out)]) == 0
    assert Ledger(operator).report()["releases"] == Ledger(lite).report()["releases"]


@pytest.fixture
def own_server():
    """A server of this test's own, to stop and start again."""
    from tests import pg_server as pg

    if pg.unavailable() or os.environ.get("DPDASK_TEST_PG_URL"):
        pytest.skip("needs a throwaway server of its own")
    server = pg.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_server_stopped_mid_run_fails_closed_then_resumes(people, own_server, capsys):
    admin, operator, role = own_server.new_ledger_database()
    assert main(["ledger", "init", admin, "--operator-role", role]) == 0
    assert main(["ledger", "dataset", admin, "cef", "--zcdp", "5"]) == 0
    spec = _spec(people, operator, data={"id": "cef"})
    finish = finishing.finish

    def stop_then_finish(self, *args, **kwargs):  # measured and charged: the server goes
        own_server.halt()
        return finish(self, *args, **kwargs)

    capsys.readouterr()
    with mock.patch.object(finishing, "finish", stop_then_finish):
        assert _run(spec, "--run-id", "one") == 1
    assert "ledger server" in _error(capsys)
    out = people / "out" / "tiny.zarr"
    assert not out.exists()  # failed closed: nothing published
    assert _run(spec, "--run-id", "one") == 1  # the server is still down: fails at once
    assert "cannot reach the ledger server" in _error(capsys)
    own_server.resume()
    charges = _count(admin, "charge")
    assert Ledger(operator).run("tiny", "one").state == "measuring"
    # the noise measured before the stop (checkpoints), and the release it made then
    work = people / "out" / ".tiny.zarr.run-one"
    final = work / "final.zarr"
    drawn = {p: p.read_bytes() for p in work.rglob("*")
             if p.is_file() and p.name != "key" and final not in p.parents}  # fmt: skip
    assert drawn and final.is_dir()
    shutil.copytree(final, people / "before.zarr")
    with mock.patch("dpdask.graph._release.remove_work"):  # kept, to be compared
        assert _run(spec, "--run-id", "one") == 0  # the same run id resumes: no new charge
    assert {p: p.read_bytes() for p in drawn} == drawn  # the same noise, not drawn again
    assert _estimates(out) == _estimates(people / "before.zarr")
    assert _count(admin, "charge") == charges
    assert Ledger(operator).run("tiny", "one").state == "published"
    assert main(["ledger", "verify", operator, "--release", str(out)]) == 0


def test_jobs_racing_through_the_cli_lose_before_reading(people, pg_ledger):
    admin, operator, role = pg_ledger
    assert main(["ledger", "init", admin, "--operator-role", role]) == 0
    assert main(["ledger", "dataset", admin, "cef", "--zcdp", "2"]) == 0  # two releases
    specs = [
        _spec(people, operator, f"s{i}.yaml", release=f"job{i}", data={"id": "cef"},
              output=str(people / "out" / f"job{i}.zarr"))
        for i in range(4)
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])}
    procs = [
        subprocess.Popen([sys.executable, "-m", "dpdask.cli", "run", str(s), "--json",
                          "--no-progress"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for s in specs
    ]  # fmt: skip
    done = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    won = [i for i, (rc, _, _) in enumerate(done) if rc == 0]
    lost = [i for i, (rc, _, _) in enumerate(done) if rc != 0]
    assert len(won) == 2 and len(lost) == 2, [e[-500:] for _, _, e in done]
    for i in lost:
        assert "dataset 'cef'" in done[i][2].strip().splitlines()[-1], done[i][2][-2000:]
        # refused before reading: no work folder was made, no release opened
        assert not list((people / "out").glob(f".job{i}.zarr*"))
        assert not (people / "out" / f"job{i}.zarr").exists()
    assert _count(admin, "release") == 2 and _count(admin, "charge") > 0
    assert Ledger(operator).dataset_remaining("cef") == zCDP(0)
    assert main(["ledger", "verify", operator]) == 0


def test_anchor_on_a_server_checks_heads_and_writes_nothing(people, shared, capsys):
    """The server keeps the chain's head: there is no head file to rewrite. ``anchor``
    says so, checks the heads it is given (as ``verify`` would) and writes nothing."""
    admin, operator = shared
    assert _run(_spec(people, operator, data={"id": "cef"})) == 0
    out = people / "out" / "tiny.zarr"
    with psycopg.connect(admin) as con:
        before = con.execute("SELECT * FROM dpdask.entries ORDER BY seq").fetchall()
    capsys.readouterr()
    for args in ([], ["--release", str(out)], ["--head", str(Ledger(operator).head())]):
        assert main(["ledger", "anchor", operator, *args]) == 0
        said = capsys.readouterr().out
        assert "nothing to anchor" in said and "rewritten:" not in said, said
        assert not args or "in the ledger" in said
    wrong = f"{len(before)}:{'0' * 64}"  # a head this chain never held
    assert main(["ledger", "anchor", operator, "--head", wrong]) == 6  # the ledger refuses
    assert "not in" in _error(capsys)
    with psycopg.connect(admin) as con:
        assert con.execute("SELECT * FROM dpdask.entries ORDER BY seq").fetchall() == before


def test_a_job_the_server_refuses_is_one_line_before_reading(people, shared, pg_server, capsys,
                                                             monkeypatch):  # fmt: skip
    """A wrong password, an unreachable server, a role without the grant to append:
    ``dpdask run`` says so in one line, before it reads the data or charges."""
    import dpdask.pipeline.run as run_module

    admin, operator = shared
    password = operator.split(":")[2].split("@")[0]
    reads: list[int] = []
    monkeypatch.setattr(run_module, "load_data", lambda *a, **k: reads.append(1))
    with psycopg.connect(admin) as con:
        before = con.execute("SELECT count(*) FROM dpdask.entries").fetchone()[0]
    role = operator.split("//")[1].split(":")[0]
    # exit statuses (dpdask.cli._exit): a server that refuses or cannot be reached is a
    # failure (1: retry or fix the connection); a missing grant is the ledger's refusal (6)
    cases = [
        (operator.replace(password, "wrong"), "refuses the login", None, 1),
        ("postgresql://someone:secret@127.0.0.1:1/ledger", "cannot reach", None, 1),
        (operator, "no grant to append", f"REVOKE INSERT ON dpdask.entries FROM {role}", 6),
    ]
    capsys.readouterr()
    for n, (url, says, sql, code) in enumerate(cases):
        if sql:
            pg_server.sql(sql, dbname=admin.rsplit("/", 1)[1])
        spec = _spec(people, url, f"s{n}.yaml", data={"id": "cef"})
        assert _run(spec) == code
        err = capsys.readouterr().err
        assert "Traceback" not in err and says in err.strip().splitlines()[-1], err
        assert password not in err and "secret" not in err
    assert reads == [] and not (people / "out").exists()
    with psycopg.connect(admin) as con:
        assert con.execute("SELECT count(*) FROM dpdask.entries").fetchone()[0] == before
