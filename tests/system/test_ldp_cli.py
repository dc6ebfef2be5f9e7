"""``dpdask plan`` / ``dpdask run`` on a local-model spec, and ``dpdask bench ldp``."""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import numpy as np
import pandas as pd
import pytest

from dpdask.cli import main
from dpdask.ldp.strategy import LocalStrategy
from dpdask.linalg import Prefix
from tests import ROOT


def test_plan_then_run_a_local_collection(tmp_path: pathlib.Path, capsys) -> None:
    for name in ("spec.yaml",):
        shutil.copy(ROOT / "examples" / "ldp" / name, tmp_path / name)
    spec = tmp_path / "spec.yaml"
    assert main(["plan", str(spec), "--json"]) == 0
    json.loads(capsys.readouterr().out)  # the plan, as one JSON object
    strategy = LocalStrategy.from_json((tmp_path / "strategy.json").read_text())
    assert strategy.epsilon <= 1
    # people's responses, drawn from the strategy's columns (two geographies)
    rng = np.random.default_rng(7)
    Q = strategy.Q
    types = rng.integers(0, Q.shape[1], size=4000)
    responses = [rng.choice(Q.shape[0], p=Q[:, t] / Q[:, t].sum()) for t in types]
    geo = np.where(np.arange(types.size) < 2500, "A", "B")
    pd.DataFrame({"response": responses, "geography": geo}).to_parquet(
        tmp_path / "responses.parquet"
    )
    assert main(["validate", str(spec), "--json"]) == 0  # checks every response, writes nothing
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["people"] == 4000 and report["geographies"] == 2
    assert not (tmp_path / "estimates.csv").exists()
    assert main(["run", str(spec), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["people"] == 4000 and summary["geographies"] == 2
    out = pd.read_csv(tmp_path / "estimates.csv")
    truth = {g: np.bincount(types[geo == g], minlength=Q.shape[1]) for g in ("A", "B")}
    W = Prefix(Q.shape[1]).dense()
    for _, row in out.iterrows():
        est = row[[c for c in out.columns if c.startswith("q")]].to_numpy(float)
        exact = W @ truth[row["geography"]]
        # within 6 standard deviations of the per-person worst-case variance
        sd = np.sqrt(row["people"] * strategy.worst_variance(Prefix(Q.shape[1])))
        assert np.all(np.abs(est - exact) <= 6 * sd + 1e-9)


def test_bench_ldp_runs_from_the_command_line(capsys) -> None:
    args = ["bench", "ldp", "--json", "--part", "grid", "--n", "8", "--epsilon", "1",
            "--workload", "histogram"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["grid"]
    assert out["grid_summary"]["cells"] == 1 and out["grid_summary"]["losing_cells"] == []
    # the optimised strategy is never worse than any baseline, nor better than the bound
    for r in rows:
        assert r["lower_bound"] <= r["optimized"] * (1 + 1e-9)
        assert r["optimized"] <= min(r["baselines"].values()) * (1 + 1e-9)


def test_bench_ldp_defaults_are_the_issue_grid_and_speed_sizes() -> None:
    import argparse

    from dpdask_benchmarks import ldp as bench_ldp

    parser = argparse.ArgumentParser()
    bench_ldp.add_arguments(parser)
    args = parser.parse_args([])
    assert args.n is None and args.part == "grid"
    assert bench_ldp.GRID_NS == (64, 256, 1024) and bench_ldp.SPEED_NS == (256, 1024)
    assert args.epsilon == [0.5, 1.0, 2.0, 4.0] and len(args.workload) == 6


def test_grid_summary_reports_a_losing_cell() -> None:
    from dpdask_benchmarks.ldp import grid_summary

    rows = [
        {"workload": "prefix", "n": 64, "epsilon": 1.0, "improvement": 2.0,
         "at_or_below_best": True, "wall_time_s": 1.5},
        {"workload": "histogram", "n": 64, "epsilon": 4.0, "improvement": 0.9,
         "at_or_below_best": False, "wall_time_s": 3.0},
        {"workload": "histogram", "n": 256, "epsilon": 4.0, "improvement": 1.0,
         "at_or_below_best": True, "wall_time_s": 4.0},
    ]  # fmt: skip
    s = grid_summary(rows)
    assert s["cells"] == 3 and s["at_or_below_best"] == 2 and s["strictly_below_best"] == 1
    assert s["losing_cells"] == [{"workload": "histogram", "n": 64, "epsilon": 4.0}]
    assert s["min_improvement"] == 0.9 and s["max_improvement"] == 2.0
    assert s["max_wall_time_s"] == {"64": 3.0, "256": 4.0}


def test_bench_ldp_speed_part_times_the_given_sizes(capsys) -> None:
    assert main(["bench", "ldp", "--json", "--part", "speed", "--n", "8"]) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    assert [r["n"] for r in speed] == [8] and speed[0]["wall_time_s"] > 0


@pytest.mark.parametrize("output", ["responses.csv", "strategy.json", "spec.yaml"])
def test_local_output_never_overwrites_an_input(tmp_path: pathlib.Path, capsys, output) -> None:
    shutil.copy(ROOT / "examples" / "ldp" / "spec.yaml", tmp_path / "spec.yaml")
    assert main(["plan", str(tmp_path / "spec.yaml")]) == 0
    pd.DataFrame({"response": [0, 1, 2], "geography": ["A", "A", "B"]}).to_csv(
        tmp_path / "responses.csv", index=False
    )
    text = (tmp_path / "spec.yaml").read_text()
    text = re.sub(r"(?m)^responses:.*$", "responses: responses.csv", text)
    text = re.sub(r"(?m)^output:.*$", f"output: {output}", text)
    (tmp_path / "spec.yaml").write_text(text)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for verb in ("validate", "run"):
        assert main([verb, str(tmp_path / "spec.yaml")]) == 5
        assert "overlaps" in capsys.readouterr().err  # one line, nothing written
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_local_validate_refuses_out_of_range_responses(tmp_path: pathlib.Path, capsys) -> None:
    shutil.copy(ROOT / "examples" / "ldp" / "spec.yaml", tmp_path / "spec.yaml")
    assert main(["plan", str(tmp_path / "spec.yaml")]) == 0
    m = LocalStrategy.from_json((tmp_path / "strategy.json").read_text()).Q.shape[0]
    pd.DataFrame({"response": [0, m], "geography": ["A", "B"]}).to_parquet(
        tmp_path / "responses.parquet"
    )
    assert main(["validate", str(tmp_path / "spec.yaml")]) == 2
    assert "range" in capsys.readouterr().err
