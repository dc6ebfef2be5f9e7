"""Sum releases (``model: sums``) charged to a shared ledger on a PostgreSQL server.

The spec names the server as ``ledger: postgresql://...`` or ``{url: ...}``; the jobs
use the operator role, the administrator registers the dataset. Tried through the CLI
as a hostile user would: the same records under another dataset id, an unregistered
dataset, the password looked for in everything printed and recorded. Oracles: the
server's table read with psycopg as the administrator, the CLI's ``ledger verify``.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pandas as pd
import psycopg
import pytest

from dpdask.cli import main
from dpdask.privacy import Ledger
from dpdask.publish import release_attributes


def _rows(url: str, kind: str) -> list[dict]:
    """The bodies of the server's entries of ``kind``, read with psycopg."""
    with psycopg.connect(url) as con:
        rows = con.execute("SELECT body FROM dpdask.entries WHERE kind = %s ORDER BY seq",
                           (kind,)).fetchall()  # fmt: skip
    return [json.loads(r[0]) for r in rows]


def _spec(tmp: pathlib.Path, ledger: str, name: str = "spec.yaml", **kw: str) -> pathlib.Path:
    lines = {
        "model": "sums",
        "release": "wages",
        "data": "{format: records, path: people.csv, geography_column: county, "
        "value_column: wage, id: payroll}",
        "geographies": "[c1, c2]",
        "bins": "{low: 0, high: 100, width: 10}",
        "workload": "prefix",
        "threshold": "svt",
        "mechanism": "Identity",
        "privacy": "{epsilon: 1}",
        "output": "out/wages.zarr",
        "ledger": ledger,
    }
    lines.update(kw)
    path = tmp / name
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return path


@pytest.fixture
def server(tmp_path, pg_ledger):
    """A server ledger with dataset ``payroll`` registered (epsilon 1.5) by the
    administrator through the CLI, and a records file: ``(admin URL, operator URL)``."""
    admin, operator, role = pg_ledger
    assert main(["ledger", "init", admin, "--operator-role", role]) == 0
    assert main(["ledger", "dataset", admin, "payroll", "--epsilon", "1.5"]) == 0
    rng = np.random.default_rng(0)  # the data only
    wages = np.round(rng.uniform(0, 100, 60), 2)
    pd.DataFrame({"county": ["c1", "c2"] * 30, "wage": wages}).to_csv(
        tmp_path / "people.csv", index=False
    )
    return admin, operator


def _last_error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[-1].startswith("dpdask"), lines
    return lines[-1]


def test_a_sum_release_charges_the_server_ledger(tmp_path, server, capsys):
    admin, operator = server
    password = operator.split(":")[2].split("@")[0]
    spec = _spec(tmp_path, operator)  # the plain URL form
    capsys.readouterr()
    assert main(["validate", str(spec), "--json"]) == 0
    assert main(["run", str(spec), "--json"]) == 0
    printed = capsys.readouterr()
    summary = json.loads(printed.out.strip().splitlines()[-1])
    assert password not in printed.out + printed.err
    assert summary["ledger"].startswith("postgresql://operator_")
    out = tmp_path / "out" / "wages.zarr"
    recorded = release_attributes(out)["ledger"]
    assert recorded["path"] == summary["ledger"] and password not in json.dumps(recorded)
    # the server holds the run, its two charges (threshold and sums) and the source
    charges = _rows(admin, "charge")
    assert sorted(c["measurement"] for c in charges) == ["sums", "threshold"]
    assert {c["run_id"] for c in charges} == {summary["run_id"]}
    assert [s["dataset"] for s in _rows(admin, "source")] == ["payroll"]
    assert Ledger(operator).run("wages", summary["run_id"]).state == "published"
    assert main(["ledger", "verify", operator, "--release", str(out)]) == 0


def test_a_sum_spec_names_the_server_as_url(tmp_path, server, capsys):
    admin, operator = server
    spec = _spec(tmp_path, "{url: " + operator + "}")
    capsys.readouterr()
    assert main(["run", str(spec), "--json"]) == 0
    assert len(_rows(admin, "charge")) == 2
    for bad, field in ((f"{{url: {operator}, path: l.sqlite}}", "ledger.url"),
                       ("{url: mysql://x/y}", "ledger.url"),
                       (f"{{url: {operator}, user: x}}", "unknown key")):  # fmt: skip
        assert main(["validate", str(_spec(tmp_path, bad, "bad.yaml"))]) == 2
        assert field in _last_error(capsys)


def test_a_sum_release_is_one_budget_authority(tmp_path, server, capsys, monkeypatch):
    import dpdask.sums._records as records
    import dpdask.sums.sum_release as rel

    admin, operator = server
    assert main(["run", str(_spec(tmp_path, operator))]) == 0
    runs = len(_rows(admin, "run"))
    capsys.readouterr()
    reads: list[int] = []
    for module in (rel, records):  # what run and validate read the records with
        monkeypatch.setattr(module, "read_records", lambda *a, **k: reads.append(1))
    other = tmp_path / "other.csv"  # other people's records
    other.write_text("county,wage\nc1,10\nc2,20\n")
    # the same records under another id, a dataset nobody registered, and the last of
    # the lifetime budget: refused before the records are read or anything is charged
    # exit statuses (dpdask.cli._exit): the ledger's refusals of a dataset's identity
    # (4) or of an unregistered dataset (6), and a spent budget (3)
    for n, (data_id, path, privacy, message, code) in enumerate((
        ("payroll-copy", "people.csv", "{epsilon: 0.5}", "source of dataset 'payroll'", 4),
        ("acs", other.name, "{epsilon: 0.5, dataset: {epsilon: 9}}", "'acs' is not registered", 6),
        ("payroll", "people.csv", "{epsilon: 1}", "dataset 'payroll'", 3),
    )):  # fmt: skip
        spec = _spec(
            tmp_path, operator, f"s{n}.yaml", release=f"w{n}", privacy=privacy,
            output=f"out/w{n}.zarr",
            data=f"{{format: records, path: {path}, geography_column: county, "
            f"value_column: wage, id: {data_id}}}",
        )  # fmt: skip
        for verb in ("validate", "run"):
            assert main([verb, str(spec)]) == code, (verb, data_id)
            assert message in _last_error(capsys), (verb, data_id)
        assert not (tmp_path / "out" / f"w{n}.zarr").exists()
    assert reads == []  # every refusal came before the records were read
    assert len(_rows(admin, "run")) == runs and len(_rows(admin, "charge")) == 2
