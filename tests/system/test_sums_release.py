"""A release of wages by county from a ``model: sums`` spec (issue 23, part 4)."""

from __future__ import annotations

import json
import pathlib
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import zarr

from dpdask.cli import main
from dpdask.privacy import Head, Ledger

COUNTIES = ["c01", "c02", "c03", "c04"]
HIGH, WIDTH = 2000, 20  # 100 bins


def _records(path: pathlib.Path, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)  # the data only; the noise comes from the run's key
    sizes = [3000, 1500, 800, 0]  # c04 has no records: still published
    rows = []
    for county, n in zip(COUNTIES, sizes, strict=True):
        wage = np.minimum(rng.lognormal(6.3, 0.6, n), HIGH)
        rows.append(pd.DataFrame({"county": county, "wage": np.round(wage, 2)}))
    df = pd.concat(rows, ignore_index=True)
    df.to_csv(path, index=False)
    return df


def _spec(tmp: pathlib.Path, name: str = "spec.yaml", output: str = "out/wages.zarr", **kw) -> str:
    lines = {
        "model": "sums",
        "release": "wages-by-county",
        "data": "{format: records, path: people.csv, geography_column: county, value_column: wage}",
        "geographies": "[" + ", ".join(COUNTIES) + "]",
        "bins": f"{{low: 0, high: {HIGH}, width: {WIDTH}}}",
        "workload": "prefix",
        "threshold": "svt",
        "mechanism": "TaMM",
        "strategy": "{name: hdmm, restarts: 1}",
        "privacy": "{epsilon: 1, threshold_share: 0.1}",
        "output": output,
        "ledger": "{path: out/ledger.sqlite, create: true}",
    }
    lines.update(kw)
    p = tmp / name
    p.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return str(p)


def _true_truncated_prefix(df: pd.DataFrame, theta: float) -> np.ndarray:
    edges = np.linspace(0, HIGH, HIGH // WIDTH + 1)
    upper = edges[1:]
    out = np.zeros((len(COUNTIES), upper.size))
    for g, county in enumerate(COUNTIES):
        w = df.loc[df.county == county, "wage"].to_numpy()
        j = np.clip(np.searchsorted(edges, w, side="left") - 1, 0, upper.size - 1)
        x = np.bincount(j, minlength=upper.size)
        out[g] = np.cumsum(x * np.minimum(upper, theta))
    return out


@pytest.mark.parametrize("threshold", ["svt", "{name: svt, r: 0.95}"])
def test_wages_by_county_release(tmp_path, capsys, threshold):
    df = _records(tmp_path / "people.csv")
    spec = _spec(tmp_path, threshold=threshold)
    assert main(["run", spec, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    out = tmp_path / "out" / "wages.zarr"
    assert summary["output"] == str(out.resolve())

    root = zarr.open_group(str(out), mode="r")
    info = root.attrs["dpdask"]
    answers = root["answers"][:]
    variance = root["variance"][:]
    per_record = root["bias_per_record"][:]
    assert answers.shape == (4, 100) and variance.shape == (100,)
    assert list(root["ids"][:]) == COUNTIES
    assert np.all(variance > 0) and np.all(per_record >= 0)

    # threshold, mechanism, budget split, bias bound, ledger head, run id in the attributes
    th = info["threshold"]
    assert th["method"] == "svt" and Fraction(th["privacy"]["epsilon"]) == Fraction(1, 10)
    theta = th["theta"]  # None: SVT stopped at no candidate, nothing is truncated
    if threshold != "svt":  # r = 0.95: about 5% of the records are truncated
        assert theta is not None and theta < HIGH and per_record.max() > 0
    assert info["mechanism"]["name"] == "TaMM"
    assert Fraction(info["budget"]["threshold"]["epsilon"]) == Fraction(1, 10)
    assert Fraction(info["budget"]["sums"]["epsilon"]) == Fraction(9, 10)
    bias = info["bias_bound"]
    if theta is None:
        theta = np.inf
        assert bias["kind"] == "exact" and bias["bound"] == 0 and not per_record.any()
    else:
        assert bias["kind"] == "high_probability" and 0 < bias["probability"] < 1
        assert "N" in bias["text"]
    assert info["run_id"] == summary["run_id"]

    ledger = Ledger(tmp_path / "out" / "ledger.sqlite")
    # the head after both charges; publishing the run appends one more entry
    assert ledger.contains(Head.parse(info["ledger"]["head"]))
    assert Head.parse(info["ledger"]["head"]).count == ledger.head().count - 1
    charges = ledger.charges("wages-by-county")
    assert sorted(c.measurement for c in charges) == ["sums", "threshold"]
    assert {c.run_id for c in charges} == {summary["run_id"]}
    total = sum(Fraction(c.privacy.epsilon) for c in charges)
    assert total == 1
    assert ledger.run("wages-by-county", summary["run_id"]).state == "published"

    # close to the true truncated prefix sums: noise within 10 sd, bias within its bound
    truth = _true_truncated_prefix(df, theta)
    assert np.all(np.abs(answers - truth) <= 10 * np.sqrt(variance)[None, :] + 1e-6)
    untruncated = _true_truncated_prefix(df, np.inf)
    if bias["kind"] == "high_probability":
        n = len(df)
        bound = bias["truncated_records_fraction_of_N"] * n + bias["truncated_records_additive"]
        assert np.all(untruncated - truth <= bound * per_record[None, :] + 1e-6)
    assert np.all(untruncated - truth >= -1e-6)

    # rerunning is refused: the output exists ...
    before = len(ledger.charges())
    assert main(["run", spec]) == 2
    assert "already holds a release" in capsys.readouterr().err
    # ... and, to another output, the budget is spent (nothing charged either way)
    spec2 = _spec(tmp_path, "spec2.yaml", output="out/wages2.zarr")
    assert main(["run", spec2]) == 2
    assert "is left" in capsys.readouterr().err
    assert len(Ledger(tmp_path / "out" / "ledger.sqlite").charges()) == before
    assert not (tmp_path / "out" / "wages2.zarr").exists()


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"wage": "-5"}, "negative"),
        ({"wage": ""}, "without a wage"),
        ({"wage": "abc"}, "non-numeric"),
        ({"county": "c99"}, "not in geographies"),
        ({"wage": "99999"}, "outside the bins"),
    ],
)
def test_bad_records_refused_before_charging(tmp_path, capsys, bad, message):
    df = _records(tmp_path / "people.csv").astype(str)
    for col, v in bad.items():
        df.loc[5, col] = v
    df.to_csv(tmp_path / "people.csv", index=False)
    assert main(["run", _spec(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "nothing was charged" in err
    assert len(Ledger(tmp_path / "out" / "ledger.sqlite").charges()) == 0
    assert not (tmp_path / "out" / "wages.zarr").exists()


def test_no_threshold_identity_one_charge(tmp_path, capsys):
    _records(tmp_path / "people.csv")
    spec = _spec(
        tmp_path, threshold="none", mechanism="Identity", privacy="{epsilon: 1}", strategy="hdmm"
    )
    assert main(["run", spec, "--json"]) == 0
    info = zarr.open_group(str(tmp_path / "out" / "wages.zarr"), mode="r").attrs["dpdask"]
    assert info["threshold"]["method"] == "none" and info["bias_bound"]["bound"] == 0.0
    charges = Ledger(tmp_path / "out" / "ledger.sqlite").charges()
    assert [c.measurement for c in charges] == ["sums"]


def test_unknown_spec_key(tmp_path, capsys):
    _records(tmp_path / "people.csv")
    assert main(["run", _spec(tmp_path, colour="blue")]) == 2
    assert "unknown key" in capsys.readouterr().err
