"""``dpdask plan`` / ``dpdask run`` on a local-model spec, and ``dpdask bench ldp``."""

from __future__ import annotations

import json
import pathlib
import shutil

import numpy as np
import pandas as pd

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
    rows = json.loads(capsys.readouterr().out)["grid"]
    # the optimised strategy is never worse than any baseline, nor better than the bound
    for r in rows:
        assert r["lower_bound"] <= r["optimized"] * (1 + 1e-9)
        assert r["optimized"] <= min(r["baselines"].values()) * (1 + 1e-9)
