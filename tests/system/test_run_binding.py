"""Runs bound to their inputs in the ledger, and no silent ledger birth (issue 30, 1 and 5).

Tried through the command line with the real key-file path, as a hostile user would:
the work folder is untrusted storage (copied, edited, its ``source.json`` deleted),
the ledger and its head file are deleted or rolled back, releases of other ledgers
sit at the output. Every attempt ends refused with a clear one-line error before
anything is charged or written, or published correctly; never the same noise on two
inputs.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from unittest import mock

import pytest
import zarr

from dpdask.cli import main
from dpdask.noise import KeyFile, new_key
from dpdask.privacy import Ledger, zCDP
from tests.system.test_accounting import (
    RECORDS,
    _charged_then_killed,
    _estimates,
    _ledger,
    _location,
    _run,
    _write_spec,
    backend,  # noqa: F401 - the fixture, both backends
)


@pytest.fixture
def named(tmp_path: pathlib.Path) -> pathlib.Path:
    """The tiny spec with an explicit ``data.id``, as the README recommends."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    return _write_spec(tmp_path, data={"id": "people"})


def _moved(tmp: pathlib.Path) -> pathlib.Path:
    """The records with one person moved from county 0101 to 0102."""
    lines = RECORDS.splitlines(keepends=True)
    i = next(k for k, line in enumerate(lines) if line.startswith("0101,"))
    lines[i] = "0102," + lines[i].split(",", 1)[1]
    path = tmp / "data" / "moved.csv"
    path.write_text("".join(lines))
    return path


def _error_line(err: str) -> str:
    """The one line of a refusal (no traceback)."""
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if "error:" in line]
    return line


def _tree(root: pathlib.Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.usefixtures("backend")  # before named: its specs charge it
def test_a_copied_work_folder_cannot_put_the_noise_on_other_data(named, tmp_path, capsys):
    _charged_then_killed(named, "C")
    work = tmp_path / "out" / ".tiny.zarr.run-C"
    assert (work / "key").exists()
    charged = _ledger(tmp_path).entries()
    # the attacker copies the work folder beside a second output, deletes source.json
    # there and points the copy's spec at records in which one person moved county
    second = tmp_path / "out2" / "tiny.zarr"
    copy = second.with_name(".tiny.zarr.run-C")
    copy.parent.mkdir()
    shutil.copytree(work, copy)
    (copy / "source.json").unlink(missing_ok=True)
    moved = _moved(tmp_path)
    attack = _write_spec(
        tmp_path, "attack.yaml", output=str(second), data={"id": "people", "path": str(moved)}
    )
    # the same input but another output is refused too: a run publishes at one place
    same = _write_spec(tmp_path, "same.yaml", output=str(second), data={"id": "people"})
    before = _tree(tmp_path / "out2")
    capsys.readouterr()
    for spec, says in ((attack, "input changed"), (same, "publishes to")):
        for verb in (["validate"], ["run", "--json", "--no-progress"]):
            assert main([verb[0], str(spec), "--run-id", "C", *verb[1:]]) == 4
            assert says in _error_line(capsys.readouterr().err)
    assert _tree(tmp_path / "out2") == before  # nothing written
    assert not second.exists()
    assert _ledger(tmp_path).entries() == charged
    # the original resumes on its own data, charging nothing
    assert _run(named, "--run-id", "C") == 0
    assert len(_ledger(tmp_path).charges()) == 2
    published = _estimates(tmp_path / "out" / "tiny.zarr")
    # and the copy stays refused once the run is published
    assert _run(attack, "--run-id", "C") == 4
    assert not second.exists()
    assert _estimates(tmp_path / "out" / "tiny.zarr") == published


@pytest.mark.usefixtures("backend")  # before named: its specs charge it
def test_an_edited_source_json_changes_nothing(named, tmp_path, capsys) -> None:
    _charged_then_killed(named, "E")
    work = tmp_path / "out" / ".tiny.zarr.run-E"
    # a forged record of the input in the work folder, then the input changed to match
    (tmp_path / "data" / "people.csv").write_text(RECORDS + "0101,1,1\n")
    (work / "source.json").write_text(json.dumps({"content": "forged", "spec": "forged"}))
    capsys.readouterr()
    assert _run(named, "--run-id", "E") == 4
    assert "input changed" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tiny.zarr").exists()
    # the original input resumes it, whatever the work folder says
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    assert _run(named, "--run-id", "E") == 0
    (run,) = _ledger(tmp_path).runs("tiny")
    assert run.state == "published" and run.binding is not None
    assert run.binding.output == str((tmp_path / "out" / "tiny.zarr").resolve())


@pytest.mark.usefixtures("backend")  # before named: its specs charge it
def test_a_run_charged_before_runs_were_bound_is_not_resumed(named, tmp_path, capsys) -> None:
    # an older ledger: the run entry records its key, not its input or spec
    ledger = Ledger(_location(tmp_path), create=True)
    ledger.open_release("tiny", zCDP(1), "people")
    key = new_key()
    ledger.open_run("tiny", "OLD", key.fingerprint())
    work = tmp_path / "out" / ".tiny.zarr.run-OLD"
    work.mkdir(parents=True, mode=0o700)
    KeyFile.create(work / "key", key)
    entries = len(ledger.entries())
    capsys.readouterr()
    for verb in ("validate", "run"):
        assert main([verb, str(named), "--run-id", "OLD"]) == 4
        assert "older dpdask" in capsys.readouterr().err
    assert len(_ledger(tmp_path).entries()) == entries
    assert not (tmp_path / "out" / "tiny.zarr").exists()
    # abandoned, a new run id runs
    assert main(["ledger", "abandon", _location(tmp_path), "tiny", "OLD"]) == 0
    assert _run(named, "--run-id", "NEW") == 0


@pytest.mark.usefixtures("backend")  # before named: its specs charge it
def test_a_published_run_is_never_published_again(named, tmp_path, capsys) -> None:
    # stopped after the release was moved into place, before the ledger recorded it
    with mock.patch.object(Ledger, "publish", side_effect=KeyboardInterrupt):
        assert _run(named, "--run-id", "P") == 130  # Ctrl-C: one line, no traceback
    out = tmp_path / "out" / "tiny.zarr"
    # a copy of the release and its work folder at a second output
    second = tmp_path / "out2" / "tiny.zarr"
    second.parent.mkdir()
    shutil.copytree(out, second)
    shutil.copytree(out.with_name(".tiny.zarr.run-P"), second.with_name(".tiny.zarr.run-P"))
    copy = _write_spec(tmp_path, "copy.yaml", output=str(second), data={"id": "people"})
    capsys.readouterr()
    assert _run(copy, "--run-id", "P") == 4
    assert "publishes to" in capsys.readouterr().err
    assert _ledger(tmp_path).run("tiny", "P").state == "measuring"
    # the run is recorded where it was published, and only there
    assert _run(named, "--run-id", "P") == 0
    run = _ledger(tmp_path).run("tiny", "P")
    assert run.state == "published" and run.output == str(out.resolve())
    with pytest.raises(ValueError, match="already published"):
        _ledger(tmp_path).publish("tiny", "P", str(second))
    assert _run(copy, "--run-id", "P") == 4


def test_a_deleted_ledger_is_not_recreated_beside_its_releases(tiny_created, tmp_path, capsys):
    spec, out = tiny_created
    ledger_path = tmp_path / "ledger" / "ledger.sqlite"
    ledger_path.unlink()
    ledger_path.with_name("ledger.sqlite.head").unlink()
    published = _estimates(out)
    for args in (("--run-id", "B"), ("--run-id", "B", "--overwrite")):
        assert _run(spec, *args) == 6
        assert "never re-created" in _error_line(capsys.readouterr().err)
    assert main(["validate", str(spec), "--overwrite"]) == 6
    assert "never re-created" in capsys.readouterr().err
    assert not ledger_path.exists() and _estimates(out) == published
    # a new ledger for a new output is created, and says so
    other = _write_spec(tmp_path, "other.yaml", output=str(tmp_path / "elsewhere" / "t.zarr"))
    assert _run(other) == 0
    assert "created a new, empty ledger" in capsys.readouterr().err


@pytest.fixture
def tiny_created(tmp_path: pathlib.Path, capsys) -> tuple[pathlib.Path, pathlib.Path]:
    """The tiny release run once with ``ledger.create``: the ledger's birth is announced."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    spec = _write_spec(tmp_path)
    assert _run(spec, "--run-id", "A") == 0
    assert "created a new, empty ledger" in capsys.readouterr().err
    return spec, tmp_path / "out" / "tiny.zarr"


def test_a_deleted_ledger_is_not_recreated_beside_another_period(tmp_path, capsys) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    spec = _write_spec(tmp_path, "monthly.yaml", release="tiny-{period}",
                       output=str(tmp_path / "out" / "{period}" / "tiny.zarr"))  # fmt: skip
    assert _run(spec, "--period", "2026-01") == 0
    ledger_path = tmp_path / "ledger" / "ledger.sqlite"
    ledger_path.unlink()
    ledger_path.with_name("ledger.sqlite.head").unlink()
    capsys.readouterr()
    assert _run(spec, "--period", "2026-02") == 6
    assert "2026-01" in capsys.readouterr().err
    assert not ledger_path.exists() and not (tmp_path / "out" / "2026-02").exists()


def test_overwrite_refuses_a_release_of_another_ledger(tiny_created, tmp_path, capsys) -> None:
    _spec, out = tiny_created
    published = _estimates(out)
    fresh = tmp_path / "ledger2" / "fresh.sqlite"
    assert main(["ledger", "init", str(fresh)]) == 0
    other = _write_spec(tmp_path, "other.yaml", ledger={"path": str(fresh), "create": False})
    capsys.readouterr()
    for verb in (["validate"], ["run", "--no-progress"]):
        assert main([verb[0], str(other), "--overwrite", *verb[1:]]) == 6
        assert "charged to ledger" in capsys.readouterr().err
    assert _estimates(out) == published
    assert len(Ledger(fresh).entries()) == 1
    # a release charged to its own ledger replaces it
    assert _run(_write_spec(tmp_path, "again.yaml", release="again"), "--overwrite") == 0
    assert _estimates(out) != published


def test_anchor_without_the_releases_is_refused(tiny, tmp_path, capsys) -> None:
    ledger_path = tmp_path / "ledger" / "ledger.sqlite"
    head_file = ledger_path.with_name("ledger.sqlite.head")
    assert main(["ledger", "init", str(ledger_path)]) == 0
    empty = ledger_path.read_bytes()
    assert _run(tiny, "--run-id", "A") == 0
    one = ledger_path.read_bytes()
    second = _write_spec(tmp_path, "b.yaml", release="b", output=str(tmp_path / "b.zarr"))
    assert _run(second, "--run-id", "B") == 0
    anchored = head_file.read_text()
    current = ledger_path.read_bytes()
    outs = ["--release", str(tmp_path / "out" / "tiny.zarr"), "--release", str(tmp_path / "b.zarr")]
    capsys.readouterr()
    for rolled in (empty, one):  # rolled back, its head file deleted
        ledger_path.write_bytes(rolled)
        head_file.unlink(missing_ok=True)
        assert main(["ledger", "anchor", str(ledger_path)]) == 6
        err = capsys.readouterr().err
        assert "not re-anchored" in err and "--release" in err
        assert main(["ledger", "anchor", str(ledger_path), *outs]) == 6
        assert "not re-anchored" in capsys.readouterr().err and not head_file.exists()
    # the intact ledger: every release it records must be given, then it is re-anchored
    ledger_path.write_bytes(current)
    assert main(["ledger", "anchor", str(ledger_path), *outs[:2]]) == 6
    assert str(tmp_path / "b.zarr") in capsys.readouterr().err and not head_file.exists()
    assert main(["ledger", "anchor", str(ledger_path), *outs]) == 0
    assert json.loads(head_file.read_text()) == json.loads(anchored)
    assert main(["ledger", "verify", str(ledger_path), *outs]) == 0


@pytest.fixture
def tiny(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    return _write_spec(tmp_path)


def test_a_sum_run_is_bound_and_published_once(tmp_path, capsys) -> None:
    from tests.system.test_sums_release import _records, _spec

    _records(tmp_path / "people.csv")
    spec = _spec(
        tmp_path, threshold="none", mechanism="Identity", privacy="{epsilon: 1}", strategy="hdmm"
    )
    assert main(["run", spec, "--json", "--run-id", "S"]) == 0
    out = tmp_path / "out" / "wages.zarr"
    ledger = Ledger(tmp_path / "out" / "ledger.sqlite")
    run = ledger.run("wages-by-county", "S")
    assert run.state == "published" and run.binding is not None
    assert run.binding.output == str(out.resolve())
    answers = zarr.open_group(str(out), mode="r")["answers"][:]
    with pytest.raises(ValueError, match="already published"):
        ledger.publish("wages-by-county", "S", str(tmp_path / "elsewhere.zarr"))
    # its ledger deleted, the sum spec does not create another beside the release
    ledger.path.unlink()
    ledger.head_file.unlink()
    capsys.readouterr()
    assert main(["run", spec, "--json", "--overwrite"]) == 6
    assert "never re-created" in capsys.readouterr().err
    assert (zarr.open_group(str(out), mode="r")["answers"][:] == answers).all()
    assert not ledger.path.exists()


def test_the_library_path_publishes_a_bound_run_only_at_its_output(named, tmp_path) -> None:
    """A run charged through the CLI, resumed through ``dpdask.release`` with its own
    key at another path, is refused before its data is read or anything is written."""
    from dpdask.graph import release
    from dpdask.noise import KeyFile
    from dpdask.pipeline.run import plan_spec
    from dpdask.pipeline.spec import load_spec
    from dpdask.privacy import RunStateError
    from dpdask.store import open_store

    _charged_then_killed(named, "B")
    out = tmp_path / "out" / "tiny.zarr"
    work = out.with_name(".tiny.zarr.run-B")
    key = KeyFile(work / "key").load()
    spec = load_spec(named)
    plan, _ = plan_spec(spec)
    (cached,) = work.glob("input-*.zarr")
    ledger = _ledger(tmp_path)
    entries = len(ledger.entries())
    rel = release(
        plan, open_store(cached), levels=spec.levels, release_id="tiny", run_id="B",
        ledger=ledger, dataset="people", key=key,
    )  # fmt: skip
    other = tmp_path / "elsewhere" / "tiny.zarr"
    with pytest.raises(RunStateError, match="publishes to"):
        rel.to_zarr(other)
    assert not other.exists() and not other.parent.exists()
    assert len(_ledger(tmp_path).entries()) == entries
