"""One door for every kind of release, tried as a hostile user would (issue 30, parts 3-4).

The same adversarial checks run against a count spec, a local-model spec and a sum spec,
through the command line (``dpdask.cli.main``) with real key files and ledgers:

* an output (or a local ``strategy_file``) naming an input, the ledger, its head file or
  the spec, or a symbolic link, is refused with one line and no byte of any file changes;
* a rerun without ``--overwrite`` is refused; ``--overwrite`` never replaces a file dpdask
  did not publish;
* ``--run-id`` and ``--period`` are honoured or refused, never accepted and ignored;
* specs are strict YAML: a repeated key (the issue's ``privacy: {zcdp: 0.01, zcdp: 100}``
  on two lines), an alias bomb (refused in well under a second), an oversized file;
* release ids are one rule: no ``../../etc/x``, no direction-override character.
"""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np
import pandas as pd
import pytest
import yaml

from dpdask.cli import main
from dpdask.privacy import Ledger
from tests import ROOT

MODELS = ("counts", "local", "sums")
# the count spec's person records (geo, sex, age): 4 counties of 25 people
RECORDS = "geo,sex,age\n" + "".join(
    f"{g},{(i * 7 + j) % 2},{(i * 5 + j) % 3}\n"
    for j, g in enumerate(("0101", "0102", "0201", "0202"))
    for i in range(25)
)


class Door:
    """One model's spec in ``tmp``: its raw mapping, the files a hostile spec may aim at,
    and the key the spec writes to."""

    def __init__(self, model: str, tmp: pathlib.Path) -> None:
        self.model, self.tmp = model, tmp
        self.spec = tmp / "spec.yaml"
        self.ledger = tmp / "ledger" / "ledger.sqlite"
        self.ledger.parent.mkdir(parents=True)
        Ledger(self.ledger, create=True)  # a real ledger (and head file) to protect
        (tmp / "data").mkdir()
        self.raw = getattr(self, f"_{model}")()
        self.write()
        if model == "local":  # the devices' strategy file, written by plan
            assert main(["plan", str(self.spec)]) == 0

    # -- the three kinds of spec ------------------------------------------------------------
    def _counts(self) -> dict:
        self.input = self.tmp / "data" / "people.csv"
        self.input.write_text(RECORDS)
        return {
            "release": "tiny",
            "data": {
                "format": "records",
                "path": str(self.input),
                "geography_column": "geo",
                "levels": {"state": 2, "county": 4},
                "geographies": ["0101", "0102", "0201", "0202"],
            },
            "domain": {"sex": 2, "age": 3},
            "levels": ["state", "county"],
            "workload": "identity",
            "privacy": {"zcdp": 1, "split": {"state": 1, "county": 1}},
            "strategy": "identity",
            "output": str(self.tmp / "out" / "tiny.zarr"),
            "ledger": {"path": str(self.ledger), "create": True},
            "cluster": {"n_workers": 1, "threads_per_worker": 1, "processes": False},
        }

    def _local(self) -> dict:
        self.input = self.tmp / "data" / "responses.csv"
        raw = yaml.safe_load((ROOT / "examples" / "ldp" / "spec.yaml").read_text())
        raw.update(
            responses=str(self.input),
            strategy_file=str(self.tmp / "strategy.json"),
            output=str(self.tmp / "out" / "estimates.csv"),
        )
        rng = np.random.default_rng(3)  # the data only
        pd.DataFrame(
            {"response": rng.integers(0, 8, 300), "geography": rng.choice(["A", "B"], 300)}
        ).to_csv(self.input, index=False)
        return raw

    def _sums(self) -> dict:
        self.input = self.tmp / "data" / "people.csv"
        rng = np.random.default_rng(4)  # the data only
        pd.DataFrame(
            {"county": rng.choice(["c01", "c02"], 200), "wage": rng.uniform(0, 100, 200).round(2)}
        ).to_csv(self.input, index=False)
        return {
            "model": "sums",
            "release": "wages",
            "data": {
                "format": "records",
                "path": str(self.input),
                "geography_column": "county",
                "value_column": "wage",
            },
            "geographies": ["c01", "c02"],
            "bins": {"low": 0, "high": 100, "width": 10},
            "threshold": "none",
            "mechanism": "Identity",
            "privacy": {"epsilon": 1},
            "output": str(self.tmp / "out" / "wages.zarr"),
            "ledger": {"path": str(self.ledger), "create": True},
        }

    # -- helpers ---------------------------------------------------------------------------
    @property
    def budget_form(self) -> str:
        return "zcdp" if self.model == "counts" else "epsilon"

    @property
    def output(self) -> pathlib.Path:
        return pathlib.Path(self.raw["output"])

    def target(self, name: str) -> pathlib.Path:
        """A file a hostile spec aims its output at."""
        return {
            "input": self.input,
            "ledger": self.ledger,
            "ledger head": self.ledger.with_name(self.ledger.name + ".head"),
            "spec": self.spec,
        }[name]

    def write(self, **changes) -> pathlib.Path:
        self.raw.update(changes)
        self.spec.write_text(yaml.safe_dump(self.raw, sort_keys=False))
        return self.spec

    def run(self, verb: str = "run", *args: str) -> int:
        extra = ["--no-progress"] if verb == "run" else []
        return main([verb, str(self.spec), "--json", *extra, *args])

    def files(self) -> dict[str, bytes]:
        """Every regular file under the test folder, with its bytes."""
        return {
            str(p.relative_to(self.tmp)): p.read_bytes()
            for p in sorted(self.tmp.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }


@pytest.fixture(params=MODELS)
def door(request, tmp_path: pathlib.Path) -> Door:
    return Door(request.param, tmp_path)


def _one_error(err: str, verb: str) -> str:
    """The one error line a refused verb prints (count runs log their dashboard first)."""
    errors = [line for line in err.strip().splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(f"dpdask {verb}: error: "), err
    assert "Traceback" not in err
    return errors[0]


def _unchanged(before: dict[str, bytes], door: Door) -> None:
    after = door.files()
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"changed or removed: {changed}"


# -- outputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("aim", ["input", "ledger", "ledger head", "spec"])
def test_an_output_never_replaces_what_it_must_protect(door, capsys, aim) -> None:
    door.write(output=str(door.target(aim)))
    before = door.files()
    for verb in ("validate", "run"):
        assert door.run(verb, "--overwrite") == 5
        line = _one_error(capsys.readouterr().err, verb)
        assert "overlaps" in line or "not a dpdask release" in line
    _unchanged(before, door)


@pytest.mark.parametrize("aim", ["input", "ledger", "ledger head", "spec", "output"])
def test_a_local_strategy_file_never_replaces_what_it_must_protect(tmp_path, capsys, aim):
    door = Door("local", tmp_path)
    target = door.output if aim == "output" else door.target(aim)
    if aim == "output":  # an earlier estimate file, published by dpdask
        assert door.run("run") == 0
    door.write(strategy_file=str(target))
    before = door.files()
    assert door.run("plan", "--overwrite") == 5
    line = _one_error(capsys.readouterr().err, "plan")
    assert "overlaps" in line or "not a dpdask release" in line
    _unchanged(before, door)


@pytest.mark.parametrize("link_to", ["nothing", "a file", "an earlier release"])
def test_never_through_a_symbolic_link(door, capsys, link_to) -> None:
    victim = door.tmp / "elsewhere" / door.output.name
    victim.parent.mkdir()
    if link_to == "a file":
        victim.write_bytes(b"precious")
    elif link_to == "an earlier release":
        door.write(output=str(victim))
        assert door.run("run") == 0
        capsys.readouterr()
    link = door.tmp / "out" / door.output.name
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(victim)
    door.write(output=str(link))
    before = door.files()
    for verb in ("validate", "run"):
        assert door.run(verb, "--overwrite") == 5
        assert "symbolic link" in _one_error(capsys.readouterr().err, verb)
    _unchanged(before, door)
    assert victim.exists() == (link_to != "nothing")


def test_a_local_strategy_file_is_never_written_through_a_link(tmp_path, capsys) -> None:
    door = Door("local", tmp_path)
    link = tmp_path / "link.json"
    link.symlink_to(door.input)
    door.write(strategy_file=str(link))
    before = door.files()
    assert door.run("plan", "--overwrite") == 5
    assert "symbolic link" in _one_error(capsys.readouterr().err, "plan")
    _unchanged(before, door)


def test_a_rerun_needs_overwrite_and_overwrite_needs_a_dpdask_artefact(door, capsys) -> None:
    honours_run_id = door.model != "local"
    args = ["--run-id", "first"] if honours_run_id else []
    assert door.run("run", *args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    if honours_run_id:  # honoured, not ignored
        assert summary["run_id"] == "first"
    before = door.files()
    assert door.run("run") == 4  # no --overwrite: the published output stays
    assert "already holds" in _one_error(capsys.readouterr().err, "run")
    _unchanged(before, door)
    # a file dpdask did not publish is never replaced, even with --overwrite
    precious = door.output.with_name("precious" + door.output.suffix)
    if door.output.is_dir():
        precious.mkdir()
        (precious / "zarr.json").write_text('{"attributes": {}}')
    else:
        precious.write_bytes(door.output.read_bytes())  # same bytes, but no sidecar
    door.write(output=str(precious))
    before = door.files()
    for verb in ("validate", "run"):
        assert door.run(verb, "--overwrite") == 5
        assert "not a dpdask release" in _one_error(capsys.readouterr().err, verb)
    _unchanged(before, door)


def test_local_overwrite_replaces_only_its_own_files(tmp_path, capsys) -> None:
    door = Door("local", tmp_path)
    assert door.run("run") == 0
    first = door.output.read_bytes()
    assert door.run("plan") == 4  # the strategy file exists: --overwrite to replace it
    assert "already holds" in _one_error(capsys.readouterr().err, "plan")
    assert door.run("plan", "--overwrite") == 0
    assert door.run("run", "--overwrite") == 0
    side = json.loads(door.output.with_name(door.output.name + ".dpdask.json").read_text())
    assert side["release"] == "survey-prefix" and side["kind"] == "local-estimates"
    assert door.output.read_bytes() == first  # same strategy, same responses: same answers
    # an edited output is no longer dpdask's: its sidecar no longer vouches for it
    door.output.write_bytes(first + b"edited\n")
    assert door.run("run", "--overwrite") == 5
    assert "not a dpdask release" in _one_error(capsys.readouterr().err, "run")
    assert door.output.read_bytes() == first + b"edited\n"


def test_a_missing_geography_column_is_one_line(tmp_path, capsys) -> None:
    door = Door("local", tmp_path)
    pd.DataFrame({"response": [0, 1], "county": ["A", "B"]}).to_csv(door.input, index=False)
    for verb in ("validate", "run"):
        assert door.run(verb) == 2
        line = _one_error(capsys.readouterr().err, verb)
        assert "geography_column" in line and "county" in line
    assert not door.output.exists()


# -- options: honoured or refused -------------------------------------------------------------
@pytest.mark.parametrize("verb", ["run", "validate", "plan"])
def test_period_is_honoured_or_refused(door, capsys, verb) -> None:
    before = door.files()
    assert door.run(verb, "--period", "2026-11") == 2  # none of these specs is scheduled
    line = _one_error(capsys.readouterr().err, verb)
    assert "period" in line
    _unchanged(before, door)
    assert not door.output.exists()


@pytest.mark.parametrize("run_id", ["bad/../id", "", "a\n"])
@pytest.mark.parametrize("verb", ["run", "validate"])
def test_run_id_is_honoured_or_refused(door, capsys, verb, run_id) -> None:
    before = door.files()
    rc = door.run(verb, "--run-id", run_id)
    assert rc == 2
    line = _one_error(capsys.readouterr().err, verb)
    # count and sum runs read the run id (and refuse this one); the local model refuses any
    assert ("run id" in line) if door.model != "local" else ("--run-id" in line)
    _unchanged(before, door)
    assert not door.output.exists()


def test_options_a_model_does_not_use_are_refused(capsys, tmp_path) -> None:
    local, sums = Door("local", tmp_path / "l"), Door("sums", tmp_path / "s")
    for door, argv in (
        (local, ["run", "--scheduler", "tcp://127.0.0.1:1"]),
        (local, ["plan", "--save", "x.npz"]),
        (sums, ["run", "--scheduler", "tcp://127.0.0.1:1"]),
        (sums, ["plan", "--save", "x.npz"]),
        (sums, ["plan", "--overwrite"]),
    ):
        assert door.run(*argv) == 2
        assert argv[1] in _one_error(capsys.readouterr().err, argv[0])
    assert not (pathlib.Path.cwd() / "x.npz").exists()


# -- strict YAML ------------------------------------------------------------------------------
def test_a_repeated_key_is_refused_naming_it_and_its_line(door, capsys) -> None:
    form = door.budget_form
    privacy = {k: v for k, v in door.raw["privacy"].items() if k != form}
    door.write(privacy="PRIVACY")
    lines = [f"  {form}: 0.01", f"  {form}: 100"] + [f"  {k}: {json.dumps(v)}"
                                                       for k, v in privacy.items()]  # fmt: skip
    text = door.spec.read_text().replace("privacy: PRIVACY", "privacy:\n" + "\n".join(lines))
    door.spec.write_text(text)
    line_no = text.splitlines().index(f"  {form}: 100") + 1
    before = door.files()
    for verb in ("validate", "run", "plan"):
        assert door.run(verb) == 2
        line = _one_error(capsys.readouterr().err, verb)
        assert f"duplicate key '{form}'" in line and f"line {line_no}," in line
    _unchanged(before, door)


def test_an_alias_bomb_fails_fast(door, capsys) -> None:
    bomb = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        bomb.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    text = door.spec.read_text().replace("release: ", "release: *i\nold_release: ")
    door.spec.write_text("\n".join(bomb) + "\n" + text)
    for verb in ("validate", "run", "plan"):
        start = time.perf_counter()
        assert door.run(verb) == 2
        assert time.perf_counter() - start < 0.5
        assert "anchor" in _one_error(capsys.readouterr().err, verb)


def test_an_oversized_spec_is_refused(door, capsys) -> None:
    door.spec.write_text(door.spec.read_text() + "#" * (1 << 20) + "\n")
    assert door.run("validate") == 2
    assert "larger than" in _one_error(capsys.readouterr().err, "validate")


@pytest.mark.parametrize("release", ["../../etc/x", "a\u202eb", "a/b", "a\nb", ".."])
def test_release_ids_follow_one_rule(door, capsys, release) -> None:
    door.write(release=release)
    before = door.files()
    for verb in ("validate", "run"):
        assert door.run(verb) == 2
        assert "release" in _one_error(capsys.readouterr().err, verb)
    _unchanged(before, door)
    assert not door.output.exists()


@pytest.mark.parametrize("aim", ["input", "ledger", "ledger head", "spec"])
def test_a_saved_plan_never_replaces_what_it_must_protect(tmp_path, capsys, aim) -> None:
    """``dpdask plan --save`` goes through the same output check as a release."""
    door = Door("counts", tmp_path)
    before = door.files()
    assert door.run("plan", "--save", str(door.target(aim)), "--overwrite") == 5
    assert "overlaps" in _one_error(capsys.readouterr().err, "plan")
    assert door.files() == before


def test_a_saved_plan_replaces_only_a_plan(tmp_path, capsys) -> None:
    from dpdask.strategy import Plan

    door = Door("counts", tmp_path)
    other = tmp_path / "notes.npz"
    other.write_bytes(b"not a plan")
    assert door.run("plan", "--save", str(other), "--overwrite") == 5
    assert "not a dpdask" in _one_error(capsys.readouterr().err, "plan")
    assert other.read_bytes() == b"not a plan"
    saved = tmp_path / "plan.npz"
    assert door.run("plan", "--save", str(saved)) == 0
    first = saved.read_bytes()
    assert door.run("plan", "--save", str(saved)) == 4  # exists: needs --overwrite
    assert saved.read_bytes() == first
    assert door.run("plan", "--save", str(saved), "--overwrite") == 0
    assert Plan.load(saved).noise_scale > 0
    link = tmp_path / "link.npz"
    link.symlink_to(saved)
    assert door.run("plan", "--save", str(link), "--overwrite") == 5
    assert link.is_symlink()


def test_a_run_racing_another_for_its_output_is_refused(door, capsys) -> None:
    """Every kind of release claims its output first: while another run holds it, a
    run is refused with one line and writes (or charges) nothing."""
    from dpdask.publish import claim_output

    before = door.files()
    with claim_output(door.output):
        assert door.run("run") == 5
        assert "publishing" in _one_error(capsys.readouterr().err, "run").lower()
    assert door.files() == before
