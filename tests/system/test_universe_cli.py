"""A records release publishes its declared universe of units, whatever the records hold,
tried through the command line with a real ledger and the real key-file path.

One stray record (a county no one declared) is refused by ``validate`` and ``run``
before any charge, with its count and never its id; with ``unknown_geography: drop``
the release publishes exactly the declared units, a county without records included.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import yaml
import zarr

from dpdask.cli import main
from dpdask.privacy import Ledger

pytest.importorskip("distributed")

STRAY = "01é01"
COUNTIES = ["0101", "0102", "0201", "0202", "0203"]  # 0203: declared, nobody lives there
STATES = ["01", "02"]
RECORDS = "geo,sex,age\n" + "".join(
    f"{g},{(i * 7 + j) % 2},{(i * 5 + j) % 3}\n"
    for j, g in enumerate(COUNTIES[:4])
    for i in range(25)
)


def _spec(tmp: pathlib.Path, release: str, records: str, **data) -> pathlib.Path:
    (tmp / f"{release}.csv").write_text(records)
    (tmp / "geographies.csv").write_text(
        "state,county\n" + "".join(f"{c[:2]},{c}\n" for c in COUNTIES)
    )
    raw = {
        "release": release,
        "data": {
            "format": "records",
            "path": f"{release}.csv",
            "geography_column": "geo",
            "levels": {"state": 2, "county": 4},
            "geographies": "geographies.csv",
            **data,
        },
        "domain": {"sex": 2, "age": 3},
        "levels": ["state", "county"],
        "workload": "identity",
        "privacy": {"zcdp": 1, "split": {"state": 1, "county": 1}},
        "strategy": "identity",
        "output": f"out/{release}.zarr",
        "ledger": {"path": "ledger/ledger.sqlite", "create": True},
        "cluster": {"n_workers": 1, "threads_per_worker": 1, "processes": False},
    }
    path = tmp / f"{release}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return path


def _run(spec: pathlib.Path, *args: str) -> int:
    return main(["run", str(spec), "--json", "--no-progress", *args])


def _ids(out: pathlib.Path, level: str) -> list[str]:
    return [str(x) for x in np.asarray(zarr.open_group(str(out), mode="r")[level]["ids"][:])]


def test_a_stray_record_is_refused_before_any_charge(tmp_path, capsys) -> None:
    assert _run(_spec(tmp_path, "first", RECORDS)) == 0
    ledger_path = tmp_path / "ledger" / "ledger.sqlite"
    before = (len(Ledger(ledger_path)), Ledger(ledger_path).head())
    snapshot = ledger_path.read_bytes()
    capsys.readouterr()

    stray = _spec(tmp_path, "second", RECORDS + f"{STRAY},0,1\n")
    for command in (["validate", str(stray)], ["run", str(stray), "--no-progress"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert STRAY not in err
        last = err.strip().splitlines()[-1]  # the error: one line, counts only
        assert last.startswith(f"dpdask {command[0]}: error: 1 record(s) have a geography outside")
        assert "1 whose 'county' id is not a unit of it" in last
    assert (len(Ledger(ledger_path)), Ledger(ledger_path).head()) == before
    assert ledger_path.read_bytes() == snapshot
    assert not (tmp_path / "out" / "second.zarr").exists()
    assert Ledger(ledger_path).run("second", "x") is None


def test_drop_publishes_exactly_the_universe(tmp_path, capsys) -> None:
    records = RECORDS + f"{STRAY},0,1\n0301,1,2\n 0101,0,0\n"
    spec = _spec(tmp_path, "dropping", records, unknown_geography="drop")
    assert main(["validate", str(spec)]) == 0
    assert _run(spec) == 0
    out = tmp_path / "out" / "dropping.zarr"
    assert _ids(out, "state") == STATES
    assert _ids(out, "county") == COUNTIES  # 0203 too, with no record
    err = capsys.readouterr().err
    assert STRAY not in err and "0301" not in err and "dropped" not in err


def test_a_spec_without_a_universe_is_refused_before_reading(tmp_path, capsys) -> None:
    spec = _spec(tmp_path, "old", RECORDS)
    raw = yaml.safe_load(spec.read_text())
    del raw["data"]["geographies"]
    raw["data"]["path"] = "does-not-exist.csv"  # never read: the spec is refused first
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    for command in ("validate", "run"):
        assert main([command, str(spec)]) == 2
        assert "data.geographies: required for format 'records'" in capsys.readouterr().err
    assert not (tmp_path / "ledger").exists() and not (tmp_path / "out").exists()
