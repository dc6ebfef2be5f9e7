"""A run piped to files reports its steps on standard error in plain lines.

A scheduler's log must say which step and level a run was in, and must not fill with
carriage returns and escape sequences (a bar is drawn only on a terminal); standard
output keeps the one result. The run is a subprocess of ``python -m dpdask.cli`` with
both streams redirected to files, on tiny person records, through the real key file.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys

import pytest

from dpdask.graph import Progress
from tests.system.test_accounting import RECORDS, _write_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _cli(tmp: pathlib.Path, *argv: str) -> tuple[int, bytes, bytes]:
    out, err = tmp / "stdout.txt", tmp / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with out.open("wb") as o, err.open("wb") as e:
        rc = subprocess.run(
            [sys.executable, "-m", "dpdask.cli", *argv], stdout=o, stderr=e, env=env,
            cwd=tmp, timeout=600, check=False,
        ).returncode  # fmt: skip
    return rc, out.read_bytes(), err.read_bytes()


@pytest.mark.parametrize("reconstruct", ["ls", "topdown"])
def test_a_piped_run_reports_labelled_steps_in_plain_lines(tmp_path, reconstruct):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    spec = _write_spec(tmp_path, reconstruct=reconstruct)
    rc, out, err = _cli(tmp_path, "run", str(spec), "--json")
    assert rc == 0, err.decode()
    for stream in (out, err):
        assert b"\r" not in stream and b"\x1b" not in stream
    result = json.loads(out)  # standard output holds the one result object, nothing else
    assert result["ok"] is True and result["release"] == "tiny"
    lines = err.decode().splitlines()
    steps = [line for line in lines if line.startswith("dpdask: ")]
    # every step says when it starts and ends, in the order a release takes them
    for step in ("select", "measure-reconstruct", "publish"):
        assert f"dpdask: {step}: started" in steps, lines
        assert any(s.startswith(f"dpdask: {step}: done") for s in steps), lines
    order = [next(i for i, s in enumerate(steps) if s.startswith(f"dpdask: {step}: "))
             for step in ("select", "measure-reconstruct", "publish")]  # fmt: skip
    assert order == sorted(order)
    # the chunks measured are counted per level, named in the line
    for level in ("state", "county"):
        assert any(s.startswith(f"dpdask: measure-reconstruct {level}: ") for s in steps), lines


def test_no_progress_and_quiet_leave_standard_error_to_errors(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    spec = _write_spec(tmp_path)
    rc, out, err = _cli(tmp_path, "run", str(spec), "--no-progress")
    assert rc == 0, err.decode()
    assert b"dpdask: select" not in err and b"\r" not in out + err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_only_on_a_terminal():
    plain, tty = io.StringIO(), _Terminal()
    for stream in (plain, tty):
        p = Progress("measure-reconstruct", {"county": 20}, stream=stream)
        for _ in range(20):
            p.update("county")
        p.close()
    text = plain.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    # a start, one line per tenth (not one per chunk), an end
    assert lines[0] == "dpdask: measure-reconstruct: started"
    counted = [line for line in lines if line.startswith("dpdask: measure-reconstruct county: ")]
    assert len(counted) == 10 and counted[-1].startswith(
        "dpdask: measure-reconstruct county: 20/20 (100%"
    )
    assert lines[-1].startswith("dpdask: measure-reconstruct: done")
    assert "\r" in tty.getvalue() and "[" + "#" * 30 + "] 20/20" in tty.getvalue()
