"""Fault injection at scale (``dpdask faults``): workers and the client killed at random
points of a multi-level release on the real key-file path, resumed, and compared bit for
bit with an uninterrupted run of the same key, with one charge per measurement.

The slow test runs a few trials through the command on a tiny three-level release (so
that it stays under a minute); ``dpdask faults pipelines/pl94-providence.yaml --trials
20`` runs the full exercise.
"""

from __future__ import annotations

import json
import pathlib
import stat

import numpy as np
import pytest
import yaml
import zarr

from dpdask.cli import main
from dpdask.pipeline.spec import load_spec
from dpdask.publish import work_dir
from dpdask.testing.fault_injection import (
    FAULT_KINDS,
    TRIAL_CLUSTER,
    compare_releases,
    format_summary,
    place_key,
    trial_spec,
)
from dpdask.testing.fault_injection._trial import _clean_up_published
from dpdask.testing.fault_injection._watch import KillPlan, watched_run

pytest.importorskip("distributed")
pytest.importorskip("psutil")

# 2 states > 4 counties > 8 tracts, 20 people in each tract
RECORDS = "geo,sex,age\n" + "".join(
    f"{g},{(i * 7 + j) % 2},{(i * 5 + j) % 3}\n"
    for j, g in enumerate(f"{s}{c}{t}" for s in ("01", "02") for c in ("01", "02") for t in "12")
    for i in range(20)
)


def _tiny_spec(tmp: pathlib.Path) -> pathlib.Path:
    """A three-level release of person records, its output and ledger beside it
    (relative paths, as a user writes them)."""
    (tmp / "data").mkdir()
    (tmp / "data" / "people.csv").write_text(RECORDS)
    raw = {
        "release": "tiny-faults",
        "data": {
            "format": "records",
            "path": "data/people.csv",
            "geography_column": "geo",
            "levels": {"state": 2, "county": 4, "tract": 5},
            "geographies": [f"{s}{c}{t}" for s in ("01", "02") for c in ("01", "02") for t in "12"],
        },
        "domain": {"sex": 2, "age": 3},
        "levels": ["state", "county", "tract"],
        "workload": "identity",
        "privacy": {"zcdp": 1, "split": {"state": 1, "county": 1, "tract": 1}},
        "strategy": "identity",
        "reconstruct": "ls",
        "output": "out/tiny.zarr",
        "ledger": {"path": "out/ledger.sqlite", "create": True},
        "cluster": "tcp://127.0.0.1:8786",
    }
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# -- the building blocks ----------------------------------------------------------------------
def test_trial_spec_keeps_the_specs_output_and_ledger_untouched(tmp_path) -> None:
    spec = _tiny_spec(tmp_path)
    rewritten = load_spec(trial_spec(spec, tmp_path / "trial", reconstruct="admm-l1"))
    original = load_spec(spec)
    assert rewritten.output == (tmp_path / "trial" / "tiny.zarr").absolute()
    assert rewritten.ledger == (tmp_path / "trial" / "ledger.sqlite").absolute()
    assert rewritten.ledger_create
    assert rewritten.data.path == original.data.path  # still the same input
    assert rewritten.cluster == TRIAL_CLUSTER  # never the spec's scheduler
    assert rewritten.reconstruct == "admm-l1" and original.reconstruct == "ls"
    assert rewritten.levels == original.levels and rewritten.privacy == original.privacy


def test_trial_spec_resolves_a_scheduled_release_once(tmp_path) -> None:
    spec = _tiny_spec(tmp_path)
    raw = yaml.safe_load(spec.read_text())
    raw["release"], raw["output"] = "tiny-{period}", "out/tiny-{period}.zarr"
    spec.write_text(yaml.safe_dump(raw))
    rewritten = load_spec(trial_spec(spec, tmp_path / "trial", period="2026-11"))
    assert rewritten.release == "tiny-2026-11"
    assert rewritten.output == (tmp_path / "trial" / "tiny-2026-11.zarr").absolute()


def test_place_key_is_private(tmp_path) -> None:
    key = place_key(tmp_path / "out.zarr", "R", b"k" * 32)
    assert key == work_dir(tmp_path / "out.zarr", "R") / "key"
    assert key.read_bytes() == b"k" * 32
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    with pytest.raises(FileExistsError):  # never over an existing run's folder
        place_key(tmp_path / "out.zarr", "R", b"k" * 32)


def test_compare_releases_sees_one_flipped_bit(tmp_path) -> None:
    def store(name: str, x: np.ndarray) -> pathlib.Path:
        g = zarr.open_group(str(tmp_path / name), mode="w", zarr_format=3)
        g.create_group("county").create_array("estimate", data=x)
        g.attrs["dpdask"] = {"release": "r", "run_id": "R", "created": name}
        return tmp_path / name

    x = np.linspace(0, 1, 12).reshape(3, 4)
    y = x.copy()
    y.view(np.uint64)[1, 2] ^= 1  # the last bit of one value
    z = x.copy()
    z[0, 0] = -0.0 if x[0, 0] == 0 else z[0, 0]  # 0.0 and -0.0 compare equal, not bitwise
    assert compare_releases(store("a", x), store("b", x.copy())) == []  # "created" ignored
    assert compare_releases(store("c", x), store("d", y)) == ["county/estimate: 1 bytes differ"]
    assert compare_releases(store("e", x), store("f", z)) == ["county/estimate: 1 bytes differ"]


def test_faults_command_refuses_no_trials(tmp_path, capsys) -> None:
    assert main(["faults", str(_tiny_spec(tmp_path)), "--trials", "0"]) == 2
    assert "trials must be a positive integer" in capsys.readouterr().err


def test_a_run_stopped_before_its_clean_up_is_cleaned_by_its_retry(tmp_path) -> None:
    """A client stopped between the ledger's record of publication and the removal of the
    work folder leaves the folder: the trial retries the run id, as a user would, which
    removes it and is refused as published. A key still there is a problem it reports."""
    folder = tmp_path / "trial"
    spec = trial_spec(_tiny_spec(tmp_path), folder)
    out = load_spec(spec).output
    work = work_dir(out, "R")
    first = watched_run(spec, "R", work, tmp_path / "run.log", KillPlan())
    assert first.returncode == 0 and out.is_dir() and not work.exists()
    place_key(out, "R", b"k" * 32)  # as if the stop had come before the key's deletion too
    record: dict = {}
    problems: list[str] = []
    _clean_up_published(spec, "R", work, folder, record, problems)
    assert record["published_retry"] == {"exit": 4, "work_left": False}
    assert problems == ["the run's key is still in its work folder after publication"]
    assert not work.exists() and out.is_dir()


# -- the trials ------------------------------------------------------------------------------
@pytest.mark.slow
def test_faults_command_every_trial_passes(tmp_path, capsys) -> None:
    spec = _tiny_spec(tmp_path)
    code = main(
        ["faults", str(spec), "--trials", "3", "--seed", "3", "--reconstruct", "admm-l1",
         "--workdir", str(tmp_path / "trials"), "--json"]
    )  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert code == 0, json.dumps(summary["failures"], indent=1)
    assert summary["failures"] == []
    assert summary["trials"] == 3 and set(summary["faults"]) == set(FAULT_KINDS)
    assert summary["completed"] == summary["bit_identical"] == summary["charges_ok"] == 3
    assert summary["worker_kills"] + summary["client_kills"] >= 2  # faults were delivered
    for trial in summary["details"]:
        assert trial["completed"] and trial["bit_identical"] and not trial["problems"]
    assert "every trial passed" in format_summary(summary)
    # the spec's own output and ledger were never touched
    assert not (tmp_path / "out").exists()
