"""Each way a command ends has its documented exit status and, with ``--json``, one object.

A scheduler must tell "over budget" from "already published" from "bad spec" without
reading the message: every refusal kind is provoked here through the command line on
tiny person records with the real key-file path, and checked against the table the
README and ``dpdask --help`` document (``dpdask.cli.EXIT_CODES``).
"""

from __future__ import annotations

import json
import pathlib
import re
from unittest import mock

import pytest

from dpdask.cli import EXIT_CODES, main
from dpdask.testing.ledger import tamper_ledger
from tests.system.test_accounting import RECORDS, _write_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: the documented table, written out: a test of the code must not read it from the code
DOCUMENTED = {"ok": 0, "failure": 1, "invalid": 2, "budget": 3, "published": 4, "output": 5,
              "ledger": 6, "interrupted": 130}  # fmt: skip


@pytest.fixture
def tiny(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    return _write_spec(tmp_path)


def _json(capsys, argv: list[str], kind: str, error: str | None = None) -> dict:
    """Run ``argv`` with ``--json``; check its status, its one object and its one line."""
    capsys.readouterr()
    rc = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert rc == DOCUMENTED[kind], err
    (line,) = out.splitlines()  # one object, on one line
    obj = json.loads(line)
    if kind == "ok":
        assert obj["ok"] is True
        return obj
    assert obj["ok"] is False and obj["kind"] == kind and obj["exit_code"] == rc, obj
    if error is not None:
        assert obj["error"] == error
    (said,) = err.strip().splitlines()  # and the one line on standard error says the same
    assert obj["message"] and obj["message"] in said and "Traceback" not in err
    return obj


def test_the_table_is_documented_alike_in_the_code_the_help_and_the_readme(capsys):
    assert {k: v[0] for k, v in EXIT_CODES.items()} == DOCUMENTED
    assert len(set(DOCUMENTED.values())) == len(DOCUMENTED)  # distinct
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    readme = (ROOT / "README.md").read_text()
    for kind, code in DOCUMENTED.items():
        assert re.search(rf"^\s+{code}\s+{kind}\s", text, re.M), kind
        assert f"| {code} | `{kind}` |" in readme, kind


def test_invalid_spec(tiny, tmp_path, capsys):
    bad = _write_spec(tmp_path, "bad.yaml", colour="blue")
    for verb in ("validate", "plan", "run"):
        obj = _json(capsys, [verb, str(bad)], "invalid", "SpecError")
        assert "colour" in obj["message"]
    assert not (tmp_path / "out").exists()


def test_a_command_line_argparse_refuses(tiny, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", str(tiny), "--json", "--no-such-option"])
    assert stop.value.code == DOCUMENTED["invalid"]
    out, err = capsys.readouterr()
    obj = json.loads(out)
    assert obj["ok"] is False and obj["kind"] == "invalid" and "--no-such-option" in err


def test_over_budget_then_already_published(tiny, tmp_path, capsys):
    first = _write_spec(tmp_path, "a.yaml", release="first", privacy={"dataset": {"zcdp": 1}})
    obj = _json(capsys, ["run", str(first), "--run-id", "A"], "ok")
    assert obj["release"] == "first"
    second = _write_spec(tmp_path, "b.yaml", release="second", output=str(tmp_path / "b.zarr"),
                         privacy={"dataset": {"zcdp": 1}})  # fmt: skip
    for verb in ("validate", "run"):
        _json(capsys, [verb, str(second)], "budget", "BudgetExceededError")
    assert not (tmp_path / "b.zarr").exists()
    # the same spec again: its output holds the release
    for verb in ("validate", "run"):
        _json(capsys, [verb, str(first)], "published", "StoreExistsError")
    # its published run id, even asked to replace the output
    _json(capsys, ["run", str(first), "--run-id", "A", "--overwrite"], "published",
          "RunStateError")  # fmt: skip
    ledger = str(tmp_path / "ledger" / "ledger.sqlite")
    _json(capsys, ["ledger", "abandon", ledger, "first", "A"], "published", "RunStateError")
    _json(capsys, ["ledger", "init", ledger], "invalid")  # never over an old one
    assert _json(capsys, ["ledger", "show", ledger], "ok")["releases"]


def test_unsafe_output(tiny, tmp_path, capsys):
    onto_input = _write_spec(tmp_path, "x.yaml", output=str(tmp_path / "data" / "people.csv"))
    for verb in ("validate", "run"):
        _json(capsys, [verb, str(onto_input), "--overwrite"], "output", "UnsafeOutputError")
    assert (tmp_path / "data" / "people.csv").read_text() == RECORDS


def test_ledger_refusals(tiny, tmp_path, capsys):
    missing = tmp_path / "nowhere.sqlite"
    _json(capsys, ["ledger", "show", str(missing)], "ledger", "LedgerMissingError")
    ledger = tmp_path / "ledger" / "ledger.sqlite"
    _json(capsys, ["run", str(tiny)], "ok")
    snapshot = tmp_path / "snapshot.sqlite"
    snapshot.write_bytes(ledger.read_bytes())
    tamper_ledger(ledger, "edit", snapshot)
    _json(capsys, ["ledger", "verify", str(ledger)], "ledger", "LedgerTamperedError")
    again = _write_spec(tmp_path, "again.yaml", release="again", output=str(tmp_path / "c.zarr"))
    _json(capsys, ["run", str(again)], "ledger", "LedgerTamperedError")
    assert not (tmp_path / "c.zarr").exists()


@pytest.mark.parametrize(
    ("raised", "kind"),
    [
        (RuntimeError("a bug"), "failure"),
        (OSError(28, "No space left on device"), "failure"),
        (KeyboardInterrupt(), "interrupted"),
    ],
)
def test_failures_and_interruptions(tiny, capsys, raised, kind):
    with mock.patch("dpdask.cli._release.model_of", side_effect=raised):
        obj = _json(capsys, ["validate", str(tiny)], kind, type(raised).__name__)
    if kind == "failure":
        assert obj["message"]


def test_export(tiny, tmp_path, capsys):
    _json(capsys, ["export", str(tmp_path / "data"), "--level", "county"], "invalid")
    _json(capsys, ["run", str(tiny)], "ok")
    out = tmp_path / "county.csv"
    args = ["export", str(tmp_path / "out" / "tiny.zarr"), "--level", "county", "--format",
            "csv", "--out", str(out)]  # fmt: skip
    obj = _json(capsys, args, "ok")
    assert obj["rows"] > 0 and pathlib.Path(obj["out"]) == out and out.exists()
    _json(capsys, args, "published", "StoreExistsError")  # exists: --overwrite to replace
