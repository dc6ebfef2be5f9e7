"""Fail before charging, report truthfully: the edges of a release run, through the CLI.

Each test is one way budget was spent with nothing published, or a failure was
misreported (issue 30, case 6): two runs racing for one output, ``python -O``, a
full ledger disk, a full output disk, Ctrl-C, announcements of runs that never
existed, and files left behind by refused runs. Runs use the real key-file path on
tiny person records (the spec of :mod:`tests.system.test_accounting`).
"""

from __future__ import annotations

import errno
import os
import pathlib
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from unittest import mock

import pytest
import yaml

from dpdask.cli import main
from dpdask.errors import LedgerStorageError
from dpdask.privacy import Ledger, zCDP
from dpdask.privacy import _chain as chain_module
from dpdask.publish import claim_output, lock_path
from tests import ROOT
from tests.system.test_accounting import (
    RECORDS,
    _location,
    _write_spec,
    backend,  # noqa: F401 - the fixture, both backends
)


@pytest.fixture
def tiny(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    return _write_spec(tmp_path)


def _run(spec: pathlib.Path, *args: str) -> int:
    return main(["run", str(spec), "--json", "--no-progress", *args])


def _ledger_path(tmp: pathlib.Path) -> pathlib.Path:
    return tmp / "ledger" / "ledger.sqlite"


def _tree(tmp: pathlib.Path) -> dict[str, bytes | None]:
    """Every path under ``tmp`` (folders as None, files with their bytes), except the
    spec files and the input."""
    out: dict[str, bytes | None] = {}
    for p in sorted(tmp.rglob("*")):
        rel = str(p.relative_to(tmp))
        if rel.endswith(".yaml") or rel.startswith("data"):
            continue
        out[rel] = None if p.is_dir() else p.read_bytes()
    return out


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("dpdask run:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


def _env() -> dict[str, str]:
    # optimised bytecode cached across runs, as tests/unit/test_measure.py does
    cache = os.path.join(tempfile.gettempdir(), "dpdask-opt")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=cache)
    env.pop("PYTHONOPTIMIZE", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


# -- two runs, one output --------------------------------------------------------------
def test_a_run_whose_output_is_claimed_is_refused_before_anything(tiny, tmp_path, capsys):
    out = tmp_path / "out" / "tiny.zarr"
    with claim_output(out) as lock:
        assert lock == lock_path(out) and oct(lock.stat().st_mode & 0o777) == "0o600"
        before = _tree(tmp_path)
        assert _run(tiny) == 5
        line = _one_line(capsys.readouterr().err)
        assert "another run is publishing" in line and "nothing was charged" in line
        assert _tree(tmp_path) == before  # no ledger, no work folder, no output
        assert main(["validate", str(tiny)]) == 5  # validate refuses what run refuses
        assert "another run is publishing" in capsys.readouterr().err
    assert not lock.exists() and not (tmp_path / "out").exists()  # the claim left nothing
    assert _run(tiny) == 0


_HOLD = """
import pathlib, sys, time
from dpdask.cli import main
import dpdask.graph._finish as finishing

finish = finishing.finish
go = pathlib.Path(sys.argv[2])

def held(self, *args, **kwargs):  # charged and measured: wait before publishing
    pathlib.Path(sys.argv[3]).write_text("charged")
    deadline = time.monotonic() + 120
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return finish(self, *args, **kwargs)

finishing.finish = held
sys.exit(main(["run", sys.argv[1], "--no-progress", "--run-id", "A"]))
"""


@pytest.mark.usefixtures("backend")  # before tiny: its spec charges it
def test_two_processes_racing_for_one_output_charge_once(tiny, tmp_path):
    # the first run is charged and holds the output; the second, a separate process on
    # the real CLI path, is refused before it is charged; the first then publishes
    go, charged = tmp_path / "go", tmp_path / "charged"
    first = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tiny), str(go), str(charged)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not charged.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert charged.exists(), first.communicate()
        second = subprocess.run(
            [sys.executable, "-m", "dpdask.cli", "run", str(tiny), "--no-progress",
             "--run-id", "B"],
            env=_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        go.write_text("go")
        _out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert second.returncode == 5, second.stderr  # output locked
    assert "another run is publishing" in second.stderr and "Traceback" not in second.stderr
    assert "run id B" not in second.stderr  # never announced: that run never existed
    ledger = Ledger(_location(tmp_path))
    assert [(r.run_id, r.state) for r in ledger.runs("tiny")] == [("A", "published")]
    assert {c.run_id for c in ledger.charges("tiny")} == {"A"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tiny.zarr"]


# -- python -O -------------------------------------------------------------------------
def test_python_O_is_refused_before_the_ledger_is_touched(tiny, tmp_path):
    def run_O(verb: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-O", "-m", "dpdask.cli", verb, str(tiny)],
            env=_env(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    for verb in ("run", "validate"):
        done = run_O(verb)
        assert done.returncode == 2, done.stderr
        assert "python -O" in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not (tmp_path / "ledger").exists() and not (tmp_path / "out").exists()
    # with a ledger already there: not one byte of it changes
    assert main(["ledger", "init", str(_ledger_path(tmp_path))]) == 0
    before = _tree(tmp_path)
    assert run_O("run").returncode == 2
    assert _tree(tmp_path) == before


# -- a full ledger disk ----------------------------------------------------------------
def _full_after(pages: int | None = None):
    """``sqlite3.connect`` on a disk that is full: no page beyond those the database
    has (or ``pages``) can be written, so sqlite itself reports SQLITE_FULL."""
    real = sqlite3.connect

    def connect(*args, **kwargs):
        con = real(*args, **kwargs)
        count = con.execute("PRAGMA page_count").fetchone()[0] if pages is None else pages
        con.execute(f"PRAGMA max_page_count = {count}")
        return con

    return mock.patch.object(chain_module.sqlite3, "connect", connect)


def _fills_after(inserts: int):
    """``sqlite3.connect`` on a disk that fills after ``inserts`` more ledger entries:
    every later insert fails as sqlite fails on a full disk."""
    real = sqlite3.connect
    left = [inserts]

    class Full(sqlite3.Connection):
        def execute(self, sql, *args):
            if sql.lstrip().upper().startswith("INSERT"):
                if left[0] <= 0:
                    exc = sqlite3.OperationalError("database or disk is full")
                    exc.sqlite_errorcode = sqlite3.SQLITE_FULL
                    raise exc
                left[0] -= 1
            return super().execute(sql, *args)

    def connect(*args, **kwargs):
        return real(*args, factory=Full, **kwargs)

    return mock.patch.object(chain_module.sqlite3, "connect", connect)


def test_a_full_ledger_disk_is_not_reported_as_a_corrupt_ledger(tmp_path):
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    with _full_after(), pytest.raises(LedgerStorageError) as caught:
        for i in range(10_000):  # until the last page is full: sqlite's own SQLITE_FULL
            ledger.set_dataset_total(f"dataset-{i}", zCDP(1))
    message = str(caught.value)
    assert "full" in message and "intact" in message and "do not restore a backup" in message
    assert "not a readable ledger" not in message and "restore it from" not in message
    reopened = Ledger(tmp_path / "ledger.sqlite")  # verifies the chain and the head
    assert reopened.head() == ledger.head() and reopened.head().count > 1


def test_a_head_file_the_full_disk_cannot_advance_leaves_the_ledger_intact(tmp_path):
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with (
        mock.patch.object(chain_module, "_write_head", side_effect=full),
        pytest.raises(LedgerStorageError, match="committed"),
    ):
        ledger.set_dataset_total("ds", zCDP(2))
    reopened = Ledger(tmp_path / "ledger.sqlite")  # the head file one entry behind: fine
    assert reopened.dataset_total("ds") == zCDP(2)
    # no temporary head file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.sqlite", "ledger.sqlite.head"]


def test_a_ledger_whose_creation_fills_the_disk_is_not_left_behind(tiny, tmp_path, capsys):
    with _full_after(pages=1):
        assert _run(tiny) == 1  # the system failed: not a refusal
    line = _one_line(capsys.readouterr().err)
    assert "full" in line and "none was created" in line and "was not charged" in line
    assert not _ledger_path(tmp_path).exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("inserts", [0, 1, 2, 3, 5])
def test_a_run_on_a_full_ledger_disk_says_so_and_resumes(tiny, tmp_path, capsys, inserts):
    assert main(["ledger", "init", str(_ledger_path(tmp_path))]) == 0
    with _fills_after(inserts):
        assert _run(tiny, "--run-id", "F") == 1
    line = _one_line(capsys.readouterr().err)
    assert "disk holding it is full" in line and "intact" in line
    assert "not a readable ledger" not in line and "restore it from" not in line
    assert main(["ledger", "verify", str(_ledger_path(tmp_path))]) == 0
    run = Ledger(_ledger_path(tmp_path)).run("tiny", "F")
    if run is None:
        assert "run F was not charged" in line
        assert not (tmp_path / "out" / ".tiny.zarr.run-F").exists()
    else:
        assert f"`dpdask run {tiny} --run-id F`" in line
    capsys.readouterr()
    assert _run(tiny, "--run-id", "F") == 0  # space freed: the same run publishes
    assert Ledger(_ledger_path(tmp_path)).run("tiny", "F").state == "published"


# -- a full output disk, Ctrl-C --------------------------------------------------------
def test_a_full_output_disk_is_one_line_with_the_resume_command(tiny, tmp_path, capsys):
    import dpdask.graph._release as release_module

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out"))
    with mock.patch.object(release_module, "move_into_place", side_effect=full):
        assert _run(tiny, "--run-id", "D") == 1
    line = _one_line(capsys.readouterr().err)
    assert os.strerror(errno.ENOSPC) in line
    assert f"resume it (same noise, no new charge) with `dpdask run {tiny} --run-id D`" in line
    assert _run(tiny, "--run-id", "D") == 0
    assert Ledger(_ledger_path(tmp_path)).run("tiny", "D").state == "published"


@pytest.mark.usefixtures("backend")
def test_ctrl_c_after_the_charge_is_one_line_with_the_resume_command(tiny, tmp_path, capsys):
    period = _write_spec(tmp_path, "p.yaml", release="tiny-{period}",
                         output=str(tmp_path / "out" / "{period}.zarr"))  # fmt: skip
    with mock.patch("dpdask.graph._finish.finish", side_effect=KeyboardInterrupt):
        assert _run(period, "--run-id", "K", "--period", "2026-11") == 130
    line = _one_line(capsys.readouterr().err)
    resume = f"dpdask run {period} --run-id K --period 2026-11"
    assert line.startswith("dpdask run: interrupted") and resume in line
    assert main(["run", *resume.split()[2:], "--no-progress"]) == 0
    assert Ledger(_location(tmp_path)).run("tiny-2026-11", "K").state == "published"


def test_ctrl_c_before_the_charge_leaves_nothing(tiny, tmp_path, capsys):
    import dpdask.pipeline.run as run_module

    with mock.patch.object(run_module, "_levels", side_effect=KeyboardInterrupt):
        assert _run(tiny, "--run-id", "E") == 130
    line = _one_line(capsys.readouterr().err)
    assert "run E was not charged" in line and "--run-id E`" not in line
    assert _tree(tmp_path) == {}  # no ledger, no work folder (with its converted input)


# -- refused runs: no announcement, nothing left behind ---------------------------------
def _not_a_release(tmp: pathlib.Path) -> dict:
    (tmp / "out" / "tiny.zarr").mkdir(parents=True)
    (tmp / "out" / "tiny.zarr" / "mine.txt").write_text("not a release")
    return {}


def _bad_records(tmp: pathlib.Path) -> dict:
    (tmp / "data" / "people.csv").write_text(RECORDS + "0101,1,7\n")  # age 7 of 3
    return {}


def _spent(tmp: pathlib.Path) -> dict:
    other = _write_spec(tmp, "first.yaml", output=str(tmp / "first.zarr"))
    assert _run(other) == 0
    return {}


def _published_run_id(tmp: pathlib.Path) -> dict:
    other = _write_spec(tmp, "first.yaml", output=str(tmp / "first.zarr"), release="other")
    assert _run(other, "--run-id", "X") == 0
    return {"release": "other", "args": ["--run-id", "X"]}  # X of release other: published


def _small_dataset(tmp: pathlib.Path) -> dict:
    return {"privacy": {"zcdp": 1, "split": {"state": 1, "county": 1}, "dataset": {"zcdp": 0.5}}}


def _plain_tcp(tmp: pathlib.Path) -> dict:
    return {"cluster": "tcp://scheduler.invalid:8786"}


@pytest.mark.parametrize(
    ("setup", "says", "code"),  # code: the documented exit status of the refusal's kind
    [
        (_not_a_release, "is not a dpdask release", 5),
        (_bad_records, "age", 2),
        (_spent, "only", 3),
        (_published_run_id, "is published", 4),
        (_small_dataset, "privacy.dataset", 2),
        (_plain_tcp, "insecure", 2),
    ],
    ids=[
        "output-not-a-release",
        "bad-records",
        "budget-spent",
        "run-id-published",
        "dataset-budget",
        "plain-tcp",
    ],
)
def test_a_refused_run_announces_nothing_and_leaves_nothing(tmp_path, capsys, setup, says,
                                                            code):  # fmt: skip
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    changes = setup(tmp_path)
    args = changes.pop("args", [])
    spec = _write_spec(tmp_path, **changes)
    capsys.readouterr()
    before = _tree(tmp_path)
    assert main(["validate", str(spec), *args]) == code  # validate refuses it as run does
    assert says in capsys.readouterr().err
    assert _tree(tmp_path) == before
    assert _run(spec, *args) == code
    err = capsys.readouterr().err
    line = _one_line(err)
    assert says in line
    assert "dashboard" not in err and "resume" not in err
    assert _tree(tmp_path) == before  # no new ledger, work folder, lock or output


def test_a_dataset_budget_below_the_release_budget_is_a_spec_error(tiny, tmp_path):
    from dpdask.pipeline.run import run_spec, validate_spec
    from dpdask.pipeline.spec import SpecError, load_spec

    def spec(rho: float):
        privacy = {"zcdp": 1, "split": {"state": 1, "county": 1}, "dataset": {"zcdp": rho}}
        return load_spec(_write_spec(tmp_path, privacy=privacy))

    for verb in (validate_spec, run_spec):
        with pytest.raises(SpecError, match=r"^privacy\.dataset: "):
            verb(spec(0.999))
    assert _tree(tmp_path) == {}
    assert validate_spec(spec(1))["ok"]  # equal: the release fits exactly


def test_a_remote_plain_tcp_scheduler_fails_validate(tiny, tmp_path, monkeypatch, capsys):
    # from the environment too, as run takes it; the host name is never resolved
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://scheduler.invalid:8786")
    raw = yaml.safe_load(tiny.read_text())
    raw.pop("cluster")
    tiny.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(tiny)]) == 2
    err = capsys.readouterr().err
    assert "cluster: " in err and "DASK_SCHEDULER_ADDRESS" in err and "insecure" in err


def test_the_claim_survives_a_killed_holder(tmp_path):
    # a lock file left by a killed process is harmless: the lock ended with it
    out = tmp_path / "out.zarr"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from dpdask.publish import claim_output
            with claim_output({str(out)!r}):
                print("held", flush=True)
                time.sleep(300)
        """)],
        env=_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        from dpdask.errors import OutputLockedError

        with pytest.raises(OutputLockedError), claim_output(out):
            pass
    finally:
        holder.kill()
        holder.wait(30)
        holder.stdout.close()
    assert lock_path(out).exists()  # killed: it could not remove its lock file
    with claim_output(out):
        pass
    assert not lock_path(out).exists()


def test_a_sum_release_whose_output_is_claimed_is_refused_before_anything(tmp_path, capsys):
    # sum specs publish through the same claim
    from tests.system.test_sums_release import _records
    from tests.system.test_sums_release import _spec as sum_spec

    _records(tmp_path / "people.csv")
    spec = sum_spec(tmp_path)
    before = _tree(tmp_path)
    with claim_output(tmp_path / "out" / "wages.zarr"):
        assert main(["run", spec, "--json"]) == 5
    assert "another run is publishing" in _one_line(capsys.readouterr().err)
    assert _tree(tmp_path) == before  # no ledger, no output
    assert main(["run", spec, "--json"]) == 0
