"""``dpdask.Session`` charges and publishes exactly as ``dpdask run`` does.

The notebook example (``examples/notebook.py``) runs as a script in a subprocess, on
the local cluster it starts, with a fixed key placed where every run keeps its key (the
run's work folder): the real key-file path, not a test mode. The equivalent release
spec, written by hand from the same records, runs through the command line with the
same key and run id. The two ledgers must hold the same charges and the two releases
the same arrays, bit for bit.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
import zarr

from dpdask.cli import main
from dpdask.errors import BudgetExceededError, DataError, SpecError
from dpdask.noise import KeyFile, SecretKey
from dpdask.privacy import Ledger, zCDP
from dpdask.publish import work_dir

pytest.importorskip("distributed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "notebook.py"
RELEASE, RUN = "people-2026", "fixedkey"
KEY = SecretKey(bytes(range(32)))  # a fixed key, but not a test-only one: the real path


def _notebook():
    """The example as a module (its records and universe), without running it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dpdask_notebook_example", NOTEBOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _place_key(output: pathlib.Path) -> None:
    work = work_dir(output, RUN)
    work.mkdir(parents=True, mode=0o700)
    KeyFile.create(work / "key", KEY)


def _cli_spec(tmp: pathlib.Path, nb) -> pathlib.Path:
    """The release spec a user would write for the notebook's release."""
    people = nb.people()
    people.to_csv(tmp / "people.csv", index=False)
    raw = {
        "release": RELEASE,
        "data": {
            "format": "records",
            "path": "people.csv",
            "id": "synthetic-people",
            "geography_column": "geoid",
            "levels": {"state": 2, "county": 5, "tract": 11},
            "geographies": nb.tracts(),
            "categories": {"sex": ["female", "male"], "hispanic": ["not hispanic", "hispanic"]},
        },
        "domain": {"sex": 2, "agegroup": 4, "hispanic": 2},
        "levels": ["state", "county", "tract"],
        "workload": {"name": "marginals", "k": 2},
        "privacy": {"zcdp": 1, "dataset": {"zcdp": 4}},
        "strategy": "hdmm",
        "output": "cli/people-2026.zarr",
        "ledger": {"path": "cli/ledger.sqlite", "create": True},
        "cluster": {"n_workers": 1, "threads_per_worker": 1, "processes": False},
    }
    path = tmp / "people.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _arrays(path: pathlib.Path) -> dict[str, np.ndarray]:
    group = zarr.open_group(str(path), mode="r")
    return {name: np.asarray(arr[...]) for name, arr in group.arrays()} | {
        f"{lv}/{name}": np.asarray(arr[...])
        for lv, sub in group.groups()
        for name, arr in sub.arrays()
    }


def _charges(ledger: Ledger) -> list[tuple]:
    return [
        (c.release, c.run_id, c.level, c.measurement, c.mechanism, c.sensitivity,
         c.noise_scale, c.privacy, c.key_fingerprint)
        for c in ledger.charges()
    ]  # fmt: skip


def test_the_notebook_releases_as_the_cli_does(tmp_path) -> None:
    nb = _notebook()
    folder = tmp_path / "session"
    _place_key(folder / f"{RELEASE}.zarr")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, str(NOTEBOOK), str(folder), RUN],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "margin of error" in done.stdout

    spec = _cli_spec(tmp_path, nb)
    _place_key(tmp_path / "cli" / f"{RELEASE}.zarr")
    assert main(["run", str(spec), "--run-id", RUN, "--no-progress", "--json"]) == 0

    ours, theirs = Ledger(folder / "ledger.sqlite"), Ledger(tmp_path / "cli" / "ledger.sqlite")
    assert _charges(ours) == _charges(theirs)
    assert {c.key_fingerprint for c in ours.charges()} == {KEY.fingerprint()}
    assert ours.spent(RELEASE) == theirs.spent(RELEASE) == zCDP(1)
    assert ours.dataset(RELEASE) == theirs.dataset(RELEASE) == "synthetic-people"
    assert ours.dataset_remaining("synthetic-people") == zCDP(3)
    (run,) = ours.runs(RELEASE)
    assert run.state == "published" and run.run_id == RUN
    # the key was used and then removed with the work folder, as dpdask run removes it
    assert not work_dir(folder / f"{RELEASE}.zarr", RUN).exists()

    a, b = _arrays(folder / f"{RELEASE}.zarr"), _arrays(tmp_path / "cli" / f"{RELEASE}.zarr")
    assert sorted(a) == sorted(b)
    assert {"tract/answers", "tract/variance", "state/estimate"} <= set(a)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        if a[name].dtype.kind in "biufc":  # numbers: the same bytes
            assert a[name].tobytes() == b[name].tobytes(), name
        else:  # text: the same values (object arrays' bytes are pointers)
            assert a[name].tolist() == b[name].tolist(), name
    # the release's record too, but for when and where it was written
    ra = dict(zarr.open_group(str(folder / f"{RELEASE}.zarr"), mode="r").attrs)
    rb = dict(zarr.open_group(str(tmp_path / "cli" / f"{RELEASE}.zarr"), mode="r").attrs)
    volatile = {"created", "source", "ledger", "dpdask_version"}
    da, db = ({k: v for k, v in r.pop("dpdask").items() if k not in volatile} for r in (ra, rb))
    assert ra == rb and da == db
    assert da["charges"] and da["test_mode"] is False
    # the 24th tract is published though nobody lives there (the universe is declared)
    assert [str(x) for x in a["tract/ids"]] == sorted(nb.tracts())


def test_the_notebook_releases_in_at_most_five_lines_of_dpdask_calls() -> None:
    tree = ast.parse(NOTEBOOK.read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    calls = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            text = ast.unparse(node.func)
            if re.match(r"^(dpdask|session|plan)\.", text):
                calls.add(node.lineno)
    assert 3 <= len(calls) <= 5, calls


# -- refusals before anything is charged or written --------------------------------------
def _frame() -> pd.DataFrame:
    return pd.DataFrame({"geoid": ["0101", "0102", "0201"], "sex": [0, 1, 1]})


UNIVERSE = ["0101", "0102", "0201", "0202"]


def test_bad_inputs_are_refused_naming_the_field(tmp_path) -> None:
    from dpdask import Session

    common = dict(geography_column="geoid", levels={"state": 2, "county": 4}, folder=tmp_path)
    with pytest.raises(SpecError, match="geographies"):
        Session(_frame(), domain={"sex": 2}, **common)
    with pytest.raises(SpecError, match=r"domain\.sex"):  # never read from the values
        Session(_frame(), geographies=UNIVERSE, **common)
    numeric = _frame().assign(geoid=[101, 102, 201])
    with pytest.raises(DataError, match="text") as info:
        Session(numeric, geographies=UNIVERSE, domain={"sex": 2}, **common)
    assert "101" not in str(info.value)  # the records' ids are never shown
    assert not any(tmp_path.iterdir())


def test_a_session_cap_and_a_stray_record_refuse_before_any_charge(tmp_path) -> None:
    from dpdask import Session

    stray = pd.concat([_frame(), pd.DataFrame({"geoid": ["0909"], "sex": [0]})])
    with Session(
        stray, geographies=UNIVERSE, geography_column="geoid", levels={"state": 2, "county": 4},
        domain={"sex": 2}, folder=tmp_path, budget=zCDP("1/2"),
        cluster={"n_workers": 1, "threads_per_worker": 1, "processes": False},
    ) as s:  # fmt: skip
        plan = s.plan("identity", zCDP(1), strategy="identity")
        with pytest.raises(BudgetExceededError, match="session"):
            s.release(plan, "capped")
        plan = s.plan("identity", zCDP("1/2"), strategy="identity")
        with pytest.raises(DataError) as info:
            s.release(plan, "stray", progress=False)
        assert "0909" not in str(info.value)
        assert s.spent.session is None  # the ledger never existed
    ledger = tmp_path / "ledger.sqlite"
    assert not ledger.exists() or Ledger(ledger).charges() == []
    assert not (tmp_path / "stray.zarr").exists()


# -- counts in memory: one dataset, whichever session holds it ----------------------------
def test_counts_in_two_sessions_draw_on_one_lifetime_budget(tmp_path) -> None:
    xr = pytest.importorskip("xarray")
    from dpdask import Geography, Session

    geo = Geography.from_geoids(UNIVERSE, {"state": 2, "county": 4})
    counts = np.arange(4 * 2 * 3).reshape(4, 2, 3) % 5
    local = {"n_workers": 1, "threads_per_worker": 1, "processes": False}
    ledger = tmp_path / "ledger.sqlite"
    first = Session(
        counts, geographies=geo, domain={"sex": 2, "age": 3}, folder=tmp_path,
        ledger=ledger, create_ledger=True, dataset_budget=zCDP("3/2"), cluster=local,
    )  # fmt: skip
    with first:
        tree = first.release(first.plan("identity", zCDP(1), strategy="identity"), "one",
                             progress=False)  # fmt: skip
        assert tree["county"].ds.estimate.shape == (4, 2, 3)
        assert list(tree.children) == ["state", "county"]
        assert first.spent.session == zCDP(1)
        assert first.remaining.dataset == zCDP("1/2")
    # the same counts as a DataArray, in a new session: the same dataset, charged again
    array = xr.DataArray(counts, dims=("county", "sex", "age"), coords={"county": UNIVERSE})
    with Session(array, geographies=geo, folder=tmp_path, ledger=ledger, cluster=local) as s:
        assert s.dataset == first.dataset and s.dataset.startswith("sha256-")
        assert s.remaining.dataset == zCDP("1/2")
        with pytest.raises(BudgetExceededError):
            s.release(s.plan("identity", zCDP(1), strategy="identity"), "two", progress=False)
    assert [c.release for c in Ledger(ledger).charges()] == ["one", "one"]
    assert not (tmp_path / "two.zarr").exists()


def test_an_interrupted_release_resumes_with_its_key_and_no_second_charge(tmp_path) -> None:
    from unittest import mock

    from dpdask import Session

    local = {"n_workers": 1, "threads_per_worker": 1, "processes": False}
    with Session(
        _frame(), geographies=UNIVERSE, geography_column="geoid", domain={"sex": 2},
        levels={"state": 2, "county": 4}, folder=tmp_path, cluster=local,
    ) as s:  # fmt: skip
        plan = s.plan("identity", zCDP(1), strategy="identity")
        with (
            mock.patch("dpdask.graph._finish.finish", side_effect=KeyboardInterrupt),
            pytest.raises(KeyboardInterrupt) as info,
        ):
            s.release(plan, "resumed", run_id="R1", progress=False)
        assert any("run_id='R1'" in note for note in info.value.__notes__)
        key = work_dir(tmp_path / "resumed.zarr", "R1") / "key"
        fingerprint = KeyFile(key).load().fingerprint()
        assert s.spent.session == zCDP(1)  # charged once, before any noise
        tree = s.release(plan, "resumed", run_id="R1", progress=False)
        assert s.spent.session == zCDP(1)  # the resume charged nothing more
        assert tree.attrs["run_id"] == "R1"
        with pytest.raises(Exception, match="published"):  # never published twice
            s.release(plan, "resumed", run_id="R1", progress=False, overwrite=True)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    assert {c.key_fingerprint for c in ledger.charges()} == {fingerprint}
    assert [r.state for r in ledger.runs("resumed")] == ["published"]
    assert not key.exists()


def test_a_given_client_is_used_and_left_open(tmp_path) -> None:
    from distributed import Client

    from dpdask import Session

    with Client(processes=False, n_workers=1, threads_per_worker=1) as client:
        with Session(
            _frame(), geographies=UNIVERSE, geography_column="geoid", domain={"sex": 2},
            levels={"state": 2, "county": 4}, folder=tmp_path, client=client,
        ) as s:  # fmt: skip
            assert s.client is client
            s.release(s.plan("identity", zCDP(1), strategy="identity"), "given", progress=False)
            with pytest.raises(ValueError, match="run id") as info:  # the CLI's run id rule
                s.release(s.plan("identity", zCDP(1), strategy="identity"), "bad",
                          run_id="../x", progress=False)  # fmt: skip
            assert not getattr(info.value, "__notes__", [])  # nothing charged: no resume
        assert client.status == "running"
        assert client.run_on_scheduler(lambda: 1) == 1
    assert (tmp_path / "given.zarr").exists() and not (tmp_path / "bad.zarr").exists()
