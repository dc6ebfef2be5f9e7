"""Accounting integrity through the command line, tried as a hostile user would.

Each test is one of the ways budget could escape the ledger or data could be lost
(run-id reuse, a tampered ledger, the dataset cap, input copies, unsafe outputs,
ambiguous specs, keys, the budget split); every one ends with no new noise published
without a charge, nothing lost, and a clear error where the run is refused. The runs
use the real key-file path (no test keys) on tiny person records.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
from unittest import mock

import numpy as np
import pytest
import yaml
import zarr

from dpdask.cli import main
from dpdask.privacy import Head, Ledger
from dpdask.testing.ledger import TAMPER_KINDS, tamper_ledger

RECORDS = "geo,sex,age\n" + "".join(
    f"{g},{(i * 7 + j) % 2},{(i * 5 + j) % 3}\n"
    for j, g in enumerate(("0101", "0102", "0201", "0202"))
    for i in range(25)
)


_SERVER: dict[pathlib.Path, str] = {}  # a test's folder -> the server ledger its specs charge


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request, tmp_path: pathlib.Path) -> str:
    """The tests that make sense on a server run on both backends: the SQLite file, or a
    fresh database on the session's PostgreSQL server reached as its administrator (the
    operator role's refusals: ``test_accounting_postgres``, ``test_ledger_postgres``).
    Name it before ``tiny``: the specs it writes charge the backend's ledger."""
    if request.param == "postgresql":
        admin, _, _ = request.getfixturevalue("pg_ledger")
        _SERVER[tmp_path] = admin
        request.addfinalizer(lambda: _SERVER.pop(tmp_path, None))
    return str(request.param)


def _location(tmp: pathlib.Path) -> str:
    """Where the specs written in ``tmp`` charge: the server's URL or the SQLite file."""
    return _SERVER.get(tmp, str(tmp / "ledger" / "ledger.sqlite"))


def _write_spec(tmp: pathlib.Path, name: str = "spec.yaml", **changes) -> pathlib.Path:
    raw = {
        "release": "tiny",
        "data": {
            "format": "records",
            "path": str(tmp / "data" / "people.csv"),
            "geography_column": "geo",
            "levels": {"state": 2, "county": 4},
            "geographies": ["0101", "0102", "0201", "0202"],
        },
        "domain": {"sex": 2, "age": 3},
        "levels": ["state", "county"],
        "workload": "identity",
        "privacy": {"zcdp": 1, "split": {"state": 1, "county": 1}},
        "strategy": "identity",
        "output": str(tmp / "out" / "tiny.zarr"),
        "ledger": {"url": _SERVER[tmp], "create": True}
        if tmp in _SERVER
        else {"path": str(tmp / "ledger" / "ledger.sqlite"), "create": True},
        "cluster": {"n_workers": 1, "threads_per_worker": 1, "processes": False},
    }
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        elif isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    path = tmp / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture
def tiny(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    return _write_spec(tmp_path)


def _run(spec: pathlib.Path, *args: str) -> int:
    return main(["run", str(spec), "--json", "--no-progress", *args])


def _charged_then_killed(spec: pathlib.Path, run_id: str) -> None:
    """A run that is charged and then stops before publishing (as a SIGKILL would)."""
    with mock.patch("dpdask.graph._finish.finish", side_effect=KeyboardInterrupt):
        assert _run(spec, "--run-id", run_id) == 130  # Ctrl-C: one line, no traceback


def _estimates(out: pathlib.Path) -> bytes:
    g = zarr.open_group(str(out), mode="r")
    return b"".join(np.asarray(g[lv]["estimate"][:]).tobytes() for lv in ("state", "county"))


def _ledger(tmp: pathlib.Path) -> Ledger:
    return Ledger(_location(tmp))


def test_reusing_a_published_run_id_is_refused(backend, tiny, tmp_path, capsys) -> None:
    assert _run(tiny, "--run-id", "R") == 0
    out = tmp_path / "out" / "tiny.zarr"
    published = _estimates(out)
    n = len(_ledger(tmp_path))
    assert n == 2  # one charge per level
    # no work folder, no key is left behind
    assert not list((tmp_path / "out").glob(".tiny.zarr.run-*"))
    capsys.readouterr()
    for args, spec in [
        (("--run-id", "R", "--overwrite"), tiny),
        (("--run-id", "R"), _write_spec(tmp_path, "other.yaml", output=str(tmp_path / "o2.zarr"))),
    ]:
        assert _run(spec, *args) == 4
        assert "a new run id is a new run" in capsys.readouterr().err
    assert _estimates(out) == published
    assert not (tmp_path / "o2.zarr").exists()
    assert len(_ledger(tmp_path)) == n
    run = _ledger(tmp_path).run("tiny", "R")
    assert run is not None and run.state == "published"


def test_a_charged_run_whose_key_is_lost_cannot_draw_again(backend, tiny, tmp_path, capsys) -> None:
    _charged_then_killed(tiny, "K")
    work = next((tmp_path / "out").glob(".tiny.zarr.run-K"))
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    key = work / "key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # the converted copy of the confidential input is owner-only, all the way down
    (copy,) = work.glob("input-*.zarr")
    modes = {stat.S_IMODE(p.stat().st_mode) for p in [copy, *copy.rglob("*")] if p.is_dir()}
    assert modes == {0o700}
    modes = {stat.S_IMODE(p.stat().st_mode) for p in copy.rglob("*") if p.is_file()}
    assert modes == {0o600}
    # the attacker deletes the work folder and its key and resumes the charged run
    shutil.rmtree(work)
    assert _run(tiny, "--run-id", "K") == 4
    assert "key is gone" in capsys.readouterr().err
    # or brings another key
    work.mkdir(mode=0o700, exist_ok=True)
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    assert _run(tiny, "--run-id", "K") == 4
    assert "another key" in capsys.readouterr().err
    assert sorted(p.name for p in work.iterdir()) == ["key"]  # refused before reading data
    assert not (tmp_path / "out" / "tiny.zarr").exists()
    assert len(_ledger(tmp_path)) == 2
    # abandoning is recorded, and an abandoned run stays refused
    assert main(["ledger", "abandon", _location(tmp_path), "tiny", "K"]) == 0
    assert _run(tiny, "--run-id", "K") == 4
    assert "abandoned" in capsys.readouterr().err


@pytest.mark.parametrize("kind", TAMPER_KINDS)
def test_a_tampered_ledger_is_refused(tiny, tmp_path, capsys, kind) -> None:
    ledger_path = tmp_path / "ledger" / "ledger.sqlite"
    assert main(["ledger", "init", str(ledger_path)]) == 0
    snapshot = tmp_path / "snapshot.sqlite"
    shutil.copy(ledger_path, snapshot)
    assert _run(tiny, "--run-id", "A") == 0
    out = tmp_path / "out" / "tiny.zarr"
    assert main(["ledger", "verify", str(ledger_path), "--release", str(out)]) == 0
    published = _estimates(out)
    tamper_ledger(ledger_path, kind, snapshot)
    capsys.readouterr()
    assert main(["ledger", "verify", str(ledger_path)]) == 6
    assert "ledger" in capsys.readouterr().err
    again = _write_spec(tmp_path, "again.yaml", release="tiny-two",
                        output=str(tmp_path / "out" / "two.zarr"))  # fmt: skip
    assert _run(again, "--run-id", "B") == 6
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "two.zarr").exists()
    assert _estimates(out) == published


def test_a_lost_head_file_is_re_anchored_only_against_the_releases(tiny, tmp_path, capsys):
    ledger_path = tmp_path / "ledger" / "ledger.sqlite"
    head_file = ledger_path.with_name(ledger_path.name + ".head")
    assert main(["ledger", "init", str(ledger_path)]) == 0
    snapshot = tmp_path / "snapshot.sqlite"
    shutil.copy(ledger_path, snapshot)
    assert _run(tiny, "--run-id", "A") == 0
    out = tmp_path / "out" / "tiny.zarr"
    anchored = json.loads(head_file.read_text())
    charged_under = Head.parse(
        zarr.open_group(str(out), mode="r").attrs["dpdask"]["ledger"]["head"]
    )
    assert 1 < charged_under.count < anchored["count"]  # charged, then published
    again = _write_spec(tmp_path, "again.yaml", release="two",
                        output=str(tmp_path / "out" / "two.zarr"))  # fmt: skip
    head_file.unlink()
    capsys.readouterr()
    # without its head file the ledger is refused, naming the way back
    assert main(["ledger", "verify", str(ledger_path)]) == 6
    assert _run(again, "--run-id", "B") == 6
    assert f"dpdask ledger anchor {ledger_path}" in capsys.readouterr().err
    # a kept head the chain does not hold is not re-anchored
    assert main(["ledger", "anchor", str(ledger_path), "--head", "1:" + "0" * 64]) == 6
    assert "not re-anchored" in capsys.readouterr().err and not head_file.exists()
    # the chain holds the release's head: the head file is rewritten as it was
    assert main(["ledger", "anchor", str(ledger_path), "--release", str(out)]) == 0
    assert json.loads(head_file.read_text()) == anchored
    assert main(["ledger", "verify", str(ledger_path), "--release", str(out)]) == 0
    # a ledger rolled back behind its head file is never re-anchored ...
    current = ledger_path.read_bytes()
    shutil.copy(snapshot, ledger_path)
    capsys.readouterr()
    assert main(["ledger", "anchor", str(ledger_path)]) == 6
    assert "rolled back" in capsys.readouterr().err
    assert json.loads(head_file.read_text()) == anchored
    # ... nor, with the head file gone too, against a release it no longer holds
    head_file.unlink()
    assert main(["ledger", "anchor", str(ledger_path), "--release", str(out)]) == 6
    assert "not re-anchored" in capsys.readouterr().err and not head_file.exists()
    assert _run(again, "--run-id", "B") == 6
    assert not (tmp_path / "out" / "two.zarr").exists()
    # the intact ledger, re-anchored, charges again
    ledger_path.write_bytes(current)
    assert main(["ledger", "anchor", str(ledger_path), "--release", str(out)]) == 0
    assert _run(again, "--run-id", "B") == 0
    assert len(_ledger(tmp_path).charges()) == 4


def test_a_missing_ledger_is_created_only_when_asked(tiny, tmp_path, capsys) -> None:
    spec = _write_spec(tmp_path, "nocreate.yaml", ledger=str(tmp_path / "ledger" / "l.sqlite"))
    for verb in ("validate", "run"):
        assert main([verb, str(spec), "--json"]) == 6
        assert "dpdask ledger init" in capsys.readouterr().err
    assert not (tmp_path / "ledger" / "l.sqlite").exists()
    assert main(["ledger", "init", str(tmp_path / "ledger" / "l.sqlite")]) == 0
    assert main(["ledger", "init", str(tmp_path / "ledger" / "l.sqlite")]) == 2  # never again
    assert _run(spec) == 0


def test_the_dataset_lifetime_budget_holds_across_releases(backend, tiny, tmp_path, capsys) -> None:
    first = _write_spec(tmp_path, "a.yaml", release="first",
                        privacy={"dataset": {"zcdp": 1}})  # fmt: skip
    second = _write_spec(tmp_path, "b.yaml", release="second", output=str(tmp_path / "b.zarr"),
                         privacy={"dataset": {"zcdp": 1}})  # fmt: skip
    assert _run(first) == 0
    capsys.readouterr()
    assert main(["validate", str(second)]) == 3
    assert "dataset" in capsys.readouterr().err
    assert _run(second) == 3
    assert "lifetime" in capsys.readouterr().err
    assert not (tmp_path / "b.zarr").exists()
    assert main(["ledger", "show", _location(tmp_path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    (dataset,) = shown["datasets"].values()
    assert dataset["remaining"]["rho"] == "0"
    # without privacy.dataset the recorded total still applies to the same data
    third = _write_spec(tmp_path, "c.yaml", release="third", output=str(tmp_path / "c.zarr"))
    assert _run(third) == 3
    assert not (tmp_path / "c.zarr").exists()


def test_input_copies_are_private_fresh_and_removed(tiny, tmp_path, capsys) -> None:
    assert _run(tiny) == 0
    capsys.readouterr()
    leftovers = [p for p in tmp_path.rglob("*") if "input" in p.name and p.suffix == ".zarr"]
    assert leftovers == []
    # a changed source is read again: a release of other data differs by far more
    # than noise, in the direction of the change
    spec = _write_spec(tmp_path, "b.yaml", release="b", output=str(tmp_path / "b.zarr"),
                       privacy={"zcdp": 1000})  # fmt: skip
    assert _run(spec) == 0
    before = zarr.open_group(str(tmp_path / "b.zarr"), mode="r")["state/estimate"][:].sum()
    (tmp_path / "data" / "people.csv").write_text(RECORDS + "0101,0,0\n" * 400)
    spec = _write_spec(tmp_path, "c.yaml", release="c", output=str(tmp_path / "c.zarr"),
                       privacy={"zcdp": 1000})  # fmt: skip
    assert _run(spec) == 0
    after = zarr.open_group(str(tmp_path / "c.zarr"), mode="r")["state/estimate"][:].sum()
    assert after - before == pytest.approx(400, abs=5)


def test_resuming_on_changed_data_is_refused(backend, tiny, tmp_path, capsys) -> None:
    # a named dataset: the same release id stays valid when the data is corrected
    tiny = _write_spec(tmp_path, "named.yaml", data={"id": "people"})
    _charged_then_killed(tiny, "C")
    (tmp_path / "data" / "people.csv").write_text(RECORDS + "0101,1,1\n")
    capsys.readouterr()
    for verb in ("validate", "run"):
        assert main([verb, str(tiny), "--run-id", "C"]) == 4
        assert "input changed" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tiny.zarr").exists()


@pytest.mark.parametrize(
    "change",
    [
        {"workload": {"name": "marginals", "k": 1}},
        {"privacy": {"split": {"state": 1, "county": 1}, "zcdp": 1, "dataset": {"zcdp": 9}}},
        {"reconstruct": "nnls"},
    ],
    ids=["workload", "dataset-budget", "reconstruct"],
)
def test_resuming_with_a_changed_spec_is_refused(backend, tiny, tmp_path, capsys, change) -> None:
    # hdmm on either workload calibrates the same noise, so the charges alone match
    spec = _write_spec(tmp_path, "hdmm.yaml", strategy="hdmm", data={"id": "people"})
    _charged_then_killed(spec, "S")
    charged = len(_ledger(tmp_path).entries())
    changed = _write_spec(tmp_path, "hdmm.yaml", strategy="hdmm", data={"id": "people"}, **change)
    capsys.readouterr()
    for verb in ("validate", "run"):
        assert main([verb, str(changed), "--run-id", "S"]) == 4
        assert "spec changed" in capsys.readouterr().err
    assert not (tmp_path / "out" / "tiny.zarr").exists()
    assert len(_ledger(tmp_path).entries()) == charged
    # the spec it started with resumes it, charging nothing
    spec = _write_spec(tmp_path, "hdmm.yaml", strategy="hdmm", data={"id": "people"})
    assert main(["validate", str(spec), "--run-id", "S"]) == 0
    assert _run(spec, "--run-id", "S") == 0
    assert len(_ledger(tmp_path).charges()) == 2


@pytest.mark.parametrize("target", ["data", "data/people.csv", "ledger", "ledger/ledger.sqlite",
                                    ".", "notes"])  # fmt: skip
def test_unsafe_outputs_are_refused_and_nothing_is_lost(tiny, tmp_path, capsys, target) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    assert main(["ledger", "init", str(tmp_path / "ledger" / "ledger.sqlite")]) == 0
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    spec = _write_spec(tmp_path, "unsafe.yaml", output=str(tmp_path / target))
    capsys.readouterr()
    assert _run(spec, "--overwrite") == 5
    err = capsys.readouterr().err
    assert "overlaps" in err or "not a dpdask release" in err
    for p, data in files.items():
        assert p.read_bytes() == data
    assert len(_ledger(tmp_path)) == 0


def test_overwrite_replaces_only_a_release(backend, tiny, tmp_path, capsys) -> None:
    first = _write_spec(tmp_path, "a.yaml", release="a")
    assert _run(first) == 0
    out = tmp_path / "out" / "tiny.zarr"
    old = _estimates(out)
    second = _write_spec(tmp_path, "b.yaml", release="b")
    capsys.readouterr()
    assert _run(second) == 4  # exists, no --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert _run(second, "--overwrite") == 0
    assert _estimates(out) != old
    assert zarr.open_group(str(out), mode="r").attrs["dpdask"]["release"] == "b"


@pytest.mark.parametrize(
    "where", ["dpdask.graph._graph.measure_graph", "dpdask.graph._finish.finish"]
)
def test_an_overwrite_stopped_before_completion_keeps_the_old_release(tiny, tmp_path, where):
    assert _run(_write_spec(tmp_path, "a.yaml", release="a")) == 0
    out = tmp_path / "out" / "tiny.zarr"
    old = _estimates(out)
    with mock.patch(where, side_effect=KeyboardInterrupt):
        b = _write_spec(tmp_path, "b.yaml", release="b")
        assert _run(b, "--overwrite", "--run-id", "B") == 130
    assert _estimates(out) == old
    assert zarr.open_group(str(out), mode="r").attrs["dpdask"]["release"] == "a"
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name != ".tiny.zarr.run-B"] == [
        "tiny.zarr"
    ]


@pytest.mark.parametrize(
    ("privacy", "message"),
    [
        ({"zcdp": 1, "epsilon": 0.01}, "exactly one"),
        ({"zcdp": 1, "rho": 1}, "exactly one"),
        ({"delta": 1e-9}, "delta"),
        ({"zcdp": 1, "spilt": {"state": 1}}, "spilt"),
        ({"zcdp": 1, "dataset": {"zcdp": 2, "extra": 1}}, "extra"),
    ],
)
def test_ambiguous_privacy_is_refused_before_anything(tiny, tmp_path, capsys, privacy, message):
    raw = yaml.safe_load(tiny.read_text())
    raw["privacy"] = privacy
    tiny.write_text(yaml.safe_dump(raw))
    for verb in (["validate"], ["run", "--no-progress"]):
        assert main([verb[0], str(tiny), *verb[1:]]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "ledger" / "ledger.sqlite").exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("strategy", "message"),
    [({"name": "hdmm", "restarts": -1}, "restarts"), ({"name": "hdmm", "seed": "abc"}, "abc")],
)
def test_strategy_options_fail_validate_as_they_fail_run(tiny, tmp_path, capsys, strategy,
                                                         message):  # fmt: skip
    spec = _write_spec(tmp_path, "strategy.yaml", strategy=strategy)
    assert main(["ledger", "init", str(tmp_path / "ledger" / "ledger.sqlite")]) == 0
    capsys.readouterr()
    for verb in (["validate"], ["run", "--no-progress"]):
        assert main([verb[0], str(spec), *verb[1:]]) == 2
        assert message in capsys.readouterr().err
    assert len(_ledger(tmp_path).entries()) == 1  # nothing written after init
    assert not (tmp_path / "out").exists()
    # the same spec with valid options validates, and then runs
    spec = _write_spec(tmp_path, "strategy.yaml", strategy={"name": "hdmm", "restarts": 1})
    assert main(["validate", str(spec), "--json"]) == 0
    noise = json.loads(capsys.readouterr().out)["noise_scale"]
    assert _run(spec) == 0
    attrs = zarr.open_group(str(tmp_path / "out" / "tiny.zarr"), mode="r").attrs["dpdask"]
    assert noise == {lv["level"]: lv["noise_scale"] for lv in attrs["levels"]}


def test_a_remote_plain_tcp_scheduler_is_refused(tiny, tmp_path, capsys) -> None:
    # refused before any connection is attempted (the host name is never resolved)
    spec = _write_spec(tmp_path, "remote.yaml", cluster="tcp://scheduler.invalid:8786")
    assert _run(spec) == 2
    assert "insecure" in capsys.readouterr().err
    assert not (tmp_path / "ledger" / "ledger.sqlite").exists()


def test_plan_and_run_draw_the_same_noise(tiny, tmp_path, capsys) -> None:
    assert main(["plan", str(tiny), "--json"]) == 0
    planned = {
        lv["level"]: lv["noise_scale"] for lv in json.loads(capsys.readouterr().out)["levels"]
    }
    assert _run(tiny) == 0
    attrs = zarr.open_group(str(tmp_path / "out" / "tiny.zarr"), mode="r").attrs["dpdask"]
    published = {lv["level"]: lv["noise_scale"] for lv in attrs["levels"]}
    charged = {c["level"]: c["noise_scale"] for c in attrs["charges"]}
    assert planned == published == charged
    # zCDP rho = 1/2 per level, identity strategy (L2 sensitivity 1): sigma = 1
    assert planned == {"state": pytest.approx(1.0), "county": pytest.approx(1.0)}
    ledger = _ledger(tmp_path)
    assert {c.level: c.noise_scale for c in ledger.charges("tiny")} == planned
    assert ledger.contains(Head.parse(attrs["ledger"]["head"]))


def test_a_stop_between_publication_and_clean_up_is_finished_later(backend, tiny, tmp_path, capsys):
    # stopped after the release was renamed into place (and its key removed), before the
    # ledger recorded the publication: the resume records it and cleans up
    with mock.patch.object(Ledger, "publish", side_effect=KeyboardInterrupt):
        assert _run(tiny, "--run-id", "P") == 130
    work = tmp_path / "out" / ".tiny.zarr.run-P"
    assert (tmp_path / "out" / "tiny.zarr").is_dir() and not (work / "key").exists()
    assert _run(tiny, "--run-id", "P") == 0
    assert _ledger(tmp_path).run("tiny", "P").state == "published"
    assert not work.exists()
    # stopped after the ledger recorded it, before the work folder went: a rerun of the
    # run id is refused, and clears what was left
    import dpdask.graph._release as release_module

    second = _write_spec(tmp_path, "two.yaml", release="two", output=str(tmp_path / "two.zarr"))
    with mock.patch.object(release_module, "remove_work", side_effect=KeyboardInterrupt):
        assert _run(second, "--run-id", "Q") == 130
    left = tmp_path / ".two.zarr.run-Q"
    assert left.exists() and not (left / "key").exists()
    capsys.readouterr()
    assert _run(second, "--run-id", "Q") == 4
    assert "published" in capsys.readouterr().err
    assert not left.exists()


def test_a_key_file_is_complete_or_absent(tmp_path) -> None:
    from dpdask.noise import KeyFile

    path = tmp_path / "key"
    with mock.patch("os.write", side_effect=OSError("disk full")), pytest.raises(OSError):
        KeyFile.create(path)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    KeyFile.create(path)
    assert len(path.read_bytes()) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        KeyFile.create(path)
