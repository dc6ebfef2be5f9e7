"""The command line on the shipped PL94 Providence spec (run, plan, validate, failures)."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest
import yaml
import zarr

from dpdask.cli import main
from tests import ROOT

SPEC = ROOT / "pipelines" / "pl94-providence.yaml"


@pytest.fixture
def spec(tmp_path: pathlib.Path) -> pathlib.Path:
    raw = yaml.safe_load(SPEC.read_text())
    raw["data"]["path"] = str(ROOT / "examples" / "data" / "pl94_providence")
    raw["output"] = str(tmp_path / "out" / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    raw["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_validate_and_plan_spend_nothing(spec, tmp_path, capsys) -> None:
    assert main(["validate", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["units"]["block"] == 569
    assert main(["plan", str(spec), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [lv["level"] for lv in plan["levels"]][-1] == "block"
    assert plan["queries"] == 319
    assert not (tmp_path / "out" / "ledger.sqlite").exists()
    assert not (tmp_path / "out" / "pl94.zarr").exists()


def test_run_publishes_and_refuses_to_overspend(spec, tmp_path, capsys) -> None:
    assert main(["run", str(spec), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    out = pathlib.Path(summary["output"])
    g = zarr.open_group(str(out), mode="r")
    blocks, groups = g["block/estimate"][:], g["block_group/estimate"][:]
    sums = np.zeros_like(groups)
    np.add.at(sums, g["block/parent"][:], blocks)
    np.testing.assert_allclose(sums, groups, atol=1e-8)
    before = sorted(p.name for p in out.rglob("*"))
    # the whole budget is spent: a second run (even with --overwrite) is refused
    # before anything is read or written, and the published release is untouched
    assert main(["run", str(spec), "--json", "--no-progress", "--overwrite"]) == 3
    err = capsys.readouterr().err
    assert "left" in err or "budget" in err
    assert sorted(p.name for p in out.rglob("*")) == before


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workload": "nonsense"}, "workload"),
        ({"levels": ["state", "parish", "block"], "privacy": {"zcdp": 1}}, "parish"),
        ({"privacy": {"zcdp": -1}}, "privacy"),
        ({"domain": {"votingage": 2, "hisp": 2, "race": 62}}, "race"),
    ],
)
def test_bad_specs_fail_before_spending(spec, tmp_path, capsys, change, message) -> None:
    raw = yaml.safe_load(spec.read_text())
    raw.update(change)
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["validate", str(spec)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "ledger.sqlite").exists()


# -- every subcommand's --help documents its options ---------------------------------------
def _parsers_of(argv: list[str], monkeypatch) -> list:
    """The argparse parsers ``dpdask ARGV --help`` builds (and their sub-parsers)."""
    import argparse

    seen: list[argparse.ArgumentParser] = []
    parse = argparse.ArgumentParser.parse_args

    def recording(self, *args, **kwargs):
        seen.append(self)
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", recording)
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0, argv
    out, todo = [], list(seen)
    while todo:
        parser = todo.pop()
        out.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return out


def _commands() -> list[list[str]]:
    from dpdask.cli import COMMANDS
    from dpdask.cli._checks import benches

    return [[c] for c in sorted(set(COMMANDS) - {"bench"})] + [
        ["bench", name] for name in sorted(benches())
    ]


@pytest.mark.parametrize("argv", _commands(), ids=" ".join)
def test_every_subcommands_help_documents_its_options(argv, monkeypatch, capsys) -> None:
    import argparse

    parsers = _parsers_of(argv, monkeypatch)
    text = capsys.readouterr().out
    assert text.startswith(f"usage: dpdask {' '.join(argv)}")
    missing = set()
    options = 0
    for parser in parsers:
        for action in parser._actions:
            if action.help == "==SUPPRESS==" or action.dest in ("help", "command"):
                continue
            if isinstance(action, argparse._SubParsersAction):  # each verb says what it does
                for verb in action._choices_actions:
                    assert (verb.help or "").strip(), (parser.prog, verb.dest)
                continue
            options += 1
            name = action.option_strings[-1] if action.option_strings else action.dest
            if not (action.help or "").strip():
                missing.add((parser.prog, name))
            if parser.prog.startswith(f"dpdask {' '.join(argv)}"):
                assert name in parser.format_help(), name
    assert options, argv  # every command takes something
    assert not missing, sorted(missing)


# -- messages through logging: -q/--quiet and -v/--verbose anywhere on the line ------------
def test_quiet_and_verbose(spec, tmp_path, capsys) -> None:
    # -v: the dashboard and release page addresses and the run's progress messages
    assert main(["run", "-v", str(spec), "--no-progress"]) == 0
    captured = capsys.readouterr()
    err = captured.err
    # announced once the run exists: its id (to resume it) and the dashboard's address
    m = re.search(r"^dpdask: run pl94-providence: run id (\S+), dashboard at http://127\.0\.0\.1:"
                  r"\d+/status \(resume .*--run-id (\S+)\)$", err, re.M)  # fmt: skip
    assert m and m.group(1) == m.group(2)
    assert re.search(r"^dpdask: run pl94-providence: release page at http://\S+/dpdask$",
                     err, re.M)  # fmt: skip
    assert re.search(r"^dpdask: run \S+ of pl94-providence: reading ", err, re.M)
    assert re.search(r"^dpdask: run \S+ of pl94-providence: published ", err, re.M)
    assert "published pl94-providence" in captured.out  # the result stays on stdout
    assert "Sending large graph" not in err
    # refused in preflight: no run existed, so no run id or dashboard is announced;
    # errors speak CLI flags
    assert main(["run", str(spec), "--no-progress"]) == 4
    err = capsys.readouterr().err
    assert "dashboard" not in err and "run id" not in err and "reading" not in err
    assert "--overwrite" in err and "overwrite=True" not in err
    # -q (after the verb's own arguments too): errors only
    assert main(["run", str(spec), "--no-progress", "--quiet"]) == 4
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()]
    assert err.startswith("dpdask run: error: ") and "--overwrite" in err


def test_bench_lists_the_installed_benchmarks_and_says_how_to_install_none(monkeypatch, capsys):
    """`dpdask bench` finds benchmarks by entry point (the `benchmarks/` distribution);
    without any it says how to install them, in one line, exit 2."""
    from dpdask.cli import _checks, main

    names = set(_checks.benches())
    assert {"release", "select", "ldp", "topdown", "census"} <= names
    monkeypatch.setattr(_checks, "entry_points", lambda group: [])
    assert main(["bench", "select"]) == 2
    err = capsys.readouterr().err
    assert "pip install -e benchmarks" in err


# -- plan shows the noise the run draws ------------------------------------------------------
def test_plan_prints_the_variances_the_run_publishes(tmp_path, capsys) -> None:
    """``dpdask plan`` and ``dpdask run`` make the levels' plans the same way: the scale and
    variances plan prints per level are those the run reports and publishes, and they are
    of the noise drawn on the lattice (above the nominal calibration for HDMM's
    non-integral strategy), through the real key-file path."""
    raw = {
        "release": "tiny",
        "data": {"format": "synthetic", "geographies": 5, "states": 1, "seed": 2,
                 "population": 300},
        "domain": {"a": 3, "b": 4, "c": 2},
        "levels": ["county"],
        "workload": {"name": "marginals", "k": 2},
        "privacy": {"zcdp": "0.5"},
        "strategy": "hdmm",
        "output": str(tmp_path / "out" / "tiny.zarr"),
        "ledger": {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True},
        "cluster": {"n_workers": 1, "threads_per_worker": 1, "processes": False},
    }  # fmt: skip
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["plan", str(spec)]) == 0
    text = capsys.readouterr().out
    assert "nominal" in text and "drawn" in text
    assert main(["plan", str(spec), "--json"]) == 0
    (planned,) = json.loads(capsys.readouterr().out)["levels"]
    assert planned["noise"] == "drawn"
    assert planned["noise_scale"] > planned["nominal_noise_scale"]  # the lattice's, larger
    assert not (tmp_path / "out").exists()  # plan spends and writes nothing
    assert main(["run", str(spec), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (ran,) = summary["levels"]
    for key in ("noise_scale", "nominal_noise_scale", "noise_variance"):
        assert ran[key] == planned[key], key
    for key in ("mean_query_variance", "max_query_variance"):
        assert ran[key] == pytest.approx(planned[key], rel=1e-12), key
    published = np.asarray(zarr.open_group(summary["output"], mode="r")["county/variance"][:])
    assert published.shape[0] == 5
    # one level: no consistency step, every unit's answers have the planned variances
    np.testing.assert_allclose(published.mean(axis=1), planned["mean_query_variance"], rtol=1e-12)
    np.testing.assert_allclose(published.max(axis=1), planned["max_query_variance"], rtol=1e-12)
