"""test_accounting's hostile-user runs, on a shared ledger on the PostgreSQL server.

Release jobs use the operator role; the administrator registers the dataset and is
the only one who can abandon a run. The same refusals hold as on SQLite, through the
CLI with the real key-file path.
"""

from __future__ import annotations

import os
import shutil

import pytest

from dpdask.cli import main
from dpdask.privacy import Ledger
from tests.system.test_accounting import RECORDS, _charged_then_killed, _estimates, _run
from tests.system.test_ledger_postgres import _spec


@pytest.fixture
def server_tiny(tmp_path, pg_ledger):
    """The tiny spec charged to a server ledger as its operator; dataset ``people``
    registered by the administrator with rho = 1 (one release of the spec's budget):
    ``(spec, admin URL, operator URL)``."""
    admin, operator, role = pg_ledger
    assert main(["ledger", "init", admin, "--operator-role", role]) == 0
    assert main(["ledger", "dataset", admin, "people", "--zcdp", "1"]) == 0
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    return _spec(tmp_path, operator, data={"id": "people"}), admin, operator


def test_reusing_a_published_run_id_is_refused(server_tiny, tmp_path, capsys) -> None:
    spec, _, operator = server_tiny
    assert _run(spec, "--run-id", "R") == 0
    out = tmp_path / "out" / "tiny.zarr"
    published = _estimates(out)
    n = len(Ledger(operator))
    capsys.readouterr()
    other = _spec(tmp_path, operator, "other.yaml", data={"id": "people"},
                  output=str(tmp_path / "o2.zarr"))  # fmt: skip
    for args, s in [(("--run-id", "R", "--overwrite"), spec), (("--run-id", "R"), other)]:
        assert _run(s, *args) == 4
        assert "a new run id is a new run" in capsys.readouterr().err
    assert _estimates(out) == published and not (tmp_path / "o2.zarr").exists()
    assert len(Ledger(operator)) == n
    # a new run id is a new charge: the release's budget is spent
    assert _run(spec, "--run-id", "S", "--overwrite") == 3
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "zCDP(rho=0) is left in postgresql://operator_" in err
    assert operator.split(":")[2].split("@")[0] not in err  # never the password
    assert _estimates(out) == published and len(Ledger(operator)) == n


def test_a_charged_run_whose_key_is_lost_is_abandoned_by_the_admin(server_tiny, tmp_path,
                                                                   capsys) -> None:  # fmt: skip
    spec, admin, operator = server_tiny
    _charged_then_killed(spec, "K")
    work = next((tmp_path / "out").glob(".tiny.zarr.run-K"))
    shutil.rmtree(work)  # the attacker deletes the key and resumes the charged run
    capsys.readouterr()
    assert _run(spec, "--run-id", "K") == 4
    assert "key is gone" in capsys.readouterr().err
    work.mkdir(mode=0o700)
    (work / "key").write_bytes(os.urandom(32))
    (work / "key").chmod(0o600)
    assert _run(spec, "--run-id", "K") == 4  # or brings another key
    assert "another key" in capsys.readouterr().err
    assert sorted(p.name for p in work.iterdir()) == ["key"]  # refused before reading
    # the operator cannot retire the run; the administrator can, and it stays refused
    assert main(["ledger", "abandon", operator, "tiny", "K"]) == 6
    assert "only the administrator" in capsys.readouterr().err
    assert Ledger(operator).run("tiny", "K").state == "measuring"
    assert main(["ledger", "abandon", admin, "tiny", "K"]) == 0
    assert _run(spec, "--run-id", "K") == 4
    assert "abandoned" in capsys.readouterr().err


def test_resuming_on_changed_data_is_refused(server_tiny, tmp_path, capsys) -> None:
    spec, _, operator = server_tiny
    _charged_then_killed(spec, "C")
    (tmp_path / "data" / "people.csv").write_text(RECORDS + "0101,1,1\n")
    capsys.readouterr()
    for verb in ("validate", "run"):
        assert main([verb, str(spec), "--run-id", "C"]) == 4
        assert "input changed" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tiny.zarr").exists()
    assert Ledger(operator).run("tiny", "C").state == "measuring"
