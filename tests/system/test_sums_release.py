"""A release of wages by county from a ``model: sums`` spec (issue 23, part 4)."""

from __future__ import annotations

import itertools
import json
import math
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


@pytest.mark.parametrize(
    "threshold", ["svt", "{name: svt, r: 0.95}", "recursive", "{name: recursive, mu: 3}"]
)
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
    method = "recursive" if "recursive" in threshold else "svt"
    assert th["method"] == method and Fraction(th["privacy"]["epsilon"]) == Fraction(1, 10)
    theta = th["theta"]  # None: SVT stopped at no candidate, nothing is truncated
    if "0.95" in threshold:  # r = 0.95: about 5% of the records are truncated
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
        assert "N" in bias["text"] if method == "svt" else bias["truncated_records"] >= 0
        if "mu: 3" in threshold:  # a large enough mu affords the stated 95%
            assert bias["probability"] >= 0.95
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
        if method == "svt":
            frac, additive = (bias[f"truncated_records_{k}"] for k in ("fraction_of_N", "additive"))
            bound = frac * n + additive
        else:
            # the count bound holds with the published probability only (about 0.86 at
            # mu = 0.5; its coverage is checked by Monte Carlo in test_sums_bounds):
            # here, the per-record part with the true number of truncated records
            assert bias["truncated_records"] >= 0
            edges = np.linspace(0, HIGH, HIGH // WIDTH + 1)
            upper = edges[1:][np.clip(np.searchsorted(edges, df.wage, "left") - 1, 0, None)]
            bound = int(np.sum(upper > theta))
        assert np.all(untruncated - truth <= bound * per_record[None, :] + 1e-6)
    assert np.all(untruncated - truth >= -1e-6)

    # rerunning is refused: the output exists ...
    before = len(ledger.charges())
    assert main(["run", spec]) == 4
    assert "already holds a release" in capsys.readouterr().err
    # ... and, to another output, the budget is spent (nothing charged either way)
    spec2 = _spec(tmp_path, "spec2.yaml", output="out/wages2.zarr")
    assert main(["run", spec2]) == 3
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
    # refused before the ledger that ledger.create allows was born: nothing left behind
    assert not (tmp_path / "out" / "ledger.sqlite").exists()
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


# -- validate, plan, SQM, ranges, sums by group (model: sums) ------------------------------
def _records_by_sex(path: pathlib.Path, seed: int = 2) -> pd.DataFrame:
    df = _records(path, seed)
    rng = np.random.default_rng(seed + 100)  # the data only
    df["sex"] = rng.choice(["F", "M"], len(df))
    df.to_csv(path, index=False)
    return df


def test_validate_and_plan_charge_nothing_and_match_the_run(tmp_path, capsys):
    _records(tmp_path / "people.csv")
    spec = _spec(tmp_path, strategy="{name: hdmm, restarts: 1, seed: 3}")
    ledger_path = tmp_path / "out" / "ledger.sqlite"
    assert main(["validate", spec, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["geographies"] == 4 and report["cells"] == 100
    assert [c["measurement"] for c in report["charges"]] == ["sums", "threshold"]
    assert sum(Fraction(c["epsilon"]) for c in report["charges"]) == 1
    assert not ledger_path.exists() and not (tmp_path / "out" / "wages.zarr").exists()

    assert main(["plan", spec, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert not ledger_path.exists()
    rows = {r["theta"]: r for r in plan["thresholds"]}
    assert None in rows and plan["threshold"]["method"] == "svt"
    assert plan["bias_bound"]["kind"] == "high_probability"
    assert main(["plan", spec]) == 0 and "rmse/query" in capsys.readouterr().out

    assert main(["run", spec, "--json"]) == 0
    capsys.readouterr()
    root = zarr.open_group(str(tmp_path / "out" / "wages.zarr"), mode="r")
    theta = root.attrs["dpdask"]["threshold"]["theta"]
    # the plan's row at the drawn threshold is what the release publishes
    row = rows[theta] if theta in rows else rows[None]
    published = root["variance"][:]
    assert row["rmse_per_query"] == pytest.approx(float(np.sqrt(published.mean())), rel=1e-9)
    assert row["max_bias_per_record"] == pytest.approx(float(root["bias_per_record"][:].max()))

    # after the run: validate refuses the taken output, and the spent budget elsewhere
    assert main(["validate", spec]) == 4
    assert "already holds a release" in capsys.readouterr().err
    spec2 = _spec(tmp_path, "spec2.yaml", output="out/other.zarr")
    assert main(["validate", spec2]) == 3
    assert "is left" in capsys.readouterr().err
    assert len(Ledger(ledger_path).charges()) == 2


@pytest.mark.parametrize("mu", [0.5, 3])
def test_plan_states_the_recursive_bias_bound(tmp_path, capsys, mu):
    _records(tmp_path / "people.csv")
    spec = _spec(tmp_path, threshold=f"{{name: recursive, mu: {mu}}}")
    assert main(["plan", spec, "--json"]) == 0
    bias = json.loads(capsys.readouterr().out)["bias_bound"]
    assert bias["kind"] == "high_probability" and "ln(theta" in bias["text"]
    # mu / beta = 2.5 mu / eps_threshold with the default beta: only mu = 3 affords 95%
    assert (bias["probability"] >= 0.95) == (mu == 3)


def test_validate_refuses_bad_records_and_missing_ledger(tmp_path, capsys):
    df = _records(tmp_path / "people.csv").astype(str)
    df.loc[3, "wage"] = "-1"
    df.to_csv(tmp_path / "people.csv", index=False)
    assert main(["validate", _spec(tmp_path)]) == 2
    assert "negative" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    spec = _spec(tmp_path, ledger="{path: out/ledger.sqlite}")
    assert main(["validate", spec]) == 6
    assert "no ledger" in capsys.readouterr().err


def test_identity_plan_variance_grows_with_theta(tmp_path, capsys):
    spec = _spec(tmp_path, mechanism="Identity", threshold="{name: svt, s: 50, c: 1.5}")
    assert main(["plan", spec, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["thresholds"]
    assert rows[-1]["theta"] is None and rows[-1]["max_bias_per_record"] == 0
    rmse = [r["rmse_per_query"] for r in rows]
    assert all(a <= b * (1 + 1e-12) for a, b in itertools.pairwise(rmse))
    # Identity: variance_i = v sum_{j <= i} min(u_j, theta)^2, v the variance of the
    # discrete Laplace noise drawn: on a lattice of step h at scale b, v = h^2 2q/(1-q)^2
    # with q = exp(-h/b) (below the continuous 2 b^2)
    u = np.linspace(0, HIGH, HIGH // WIDTH + 1)[1:]
    for r in rows:
        h, b = r["lattice_step"], r["noise_scale"]
        q = math.exp(-h / b)
        v = h**2 * 2 * q / (1 - q) ** 2
        assert r["noise_variance"] == pytest.approx(v, rel=1e-9)
        assert v <= 2 * b**2
        t = u if r["theta"] is None else np.minimum(u, r["theta"])
        var = v * np.cumsum(t**2)
        assert r["rmse_per_query"] == pytest.approx(float(np.sqrt(var.mean())), rel=1e-9)
        assert r["noise_scale"] >= 1 / 0.9 - 1e-12


def test_a_by_column_may_have_any_attribute_name(tmp_path, capsys):
    """``by`` columns become the domain's attributes by name: ``attrs`` is one like any."""
    spec = _spec(tmp_path, by="{attrs: [F, M]}", mechanism="Identity")
    assert main(["plan", spec, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["thresholds"]


def test_sqm_spec_release(tmp_path, capsys):
    df = _records(tmp_path / "people.csv")
    spec = _spec(
        tmp_path, mechanism="SQM", workload="{name: prefix, every: 10}",
        threshold="{name: svt, r: 0.95}", privacy="{epsilon: 2, threshold_share: 0.5}",
    )  # fmt: skip
    assert main(["run", spec, "--json"]) == 0
    capsys.readouterr()
    root = zarr.open_group(str(tmp_path / "out" / "wages.zarr"), mode="r")
    info = root.attrs["dpdask"]
    th = info["threshold"]
    assert th["runs"] == 10 and Fraction(th["privacy"]["epsilon"]) == 1
    thetas = np.array([np.inf if t is None else t for t in th["theta"]])
    charges = Ledger(tmp_path / "out" / "ledger.sqlite").charges("wages-by-county")
    assert {c.measurement: Fraction(c.privacy.epsilon) for c in charges} == {
        "threshold": 1, "sums": 1}  # fmt: skip
    # the queries measured together: noise at most the paper's m s_i / eps
    b = info["mechanism"]["noise_scale"]
    assert b <= 10 / 1.0 * (1 + 1e-9)
    upper = root["query_upper"][:]
    s = np.minimum(upper, thetas)  # a prefix's sensitivity: its largest truncated value
    variance = root["variance"][:]
    np.testing.assert_allclose(variance, 2 * (s * b) ** 2, rtol=1e-9)
    answers = root["answers"][:]
    edges = np.linspace(0, HIGH, HIGH // WIDTH + 1)
    u = edges[1:]
    for g, county in enumerate(COUNTIES):
        w = df.loc[df.county == county, "wage"].to_numpy()
        x = np.bincount(np.clip(np.searchsorted(edges, w, side="left") - 1, 0, u.size - 1),
                        minlength=u.size)  # fmt: skip
        hi = np.arange(9, 100, 10)
        truth = np.array(
            [np.sum((x * np.minimum(u, t))[: h + 1]) for h, t in zip(hi, thetas, strict=True)]
        )
        assert np.all(np.abs(answers[g] - truth) <= 10 * np.sqrt(variance) + 1e-6)


def test_ranges_by_sex_release(tmp_path, capsys):
    df = _records_by_sex(tmp_path / "people.csv")
    spec = _spec(
        tmp_path, by="{sex: [F, M]}", mechanism="TaMM", threshold="{name: svt, r: 0.95}",
        workload="{name: range, ranges: [[0, 400], [400, 1000], [1000, 2000], [0, 2000]]}",
    )  # fmt: skip
    assert main(["run", spec, "--json"]) == 0
    capsys.readouterr()
    root = zarr.open_group(str(tmp_path / "out" / "wages.zarr"), mode="r")
    info = root.attrs["dpdask"]
    answers, variance = root["answers"][:], root["variance"][:]
    assert answers.shape == (4, 2, 4) and variance.shape == (2, 4)
    assert list(root["by_sex"][:]) == ["F", "M"] and info["by"] == {"sex": ["F", "M"]}
    np.testing.assert_allclose(root["query_lower"][:], [0, 400, 1000, 0])
    np.testing.assert_allclose(root["query_upper"][:], [400, 1000, 2000, 2000])
    assert info["mechanism"]["objective"] == "relative"
    theta = info["threshold"]["theta"]
    theta = np.inf if theta is None else theta
    edges = np.linspace(0, HIGH, HIGH // WIDTH + 1)
    u = edges[1:]
    per_record = root["bias_per_record"][:]
    bias = info["bias_bound"]
    for g, county in enumerate(COUNTIES):
        for s_, sex in enumerate(["F", "M"]):
            w = df.loc[(df.county == county) & (df.sex == sex), "wage"].to_numpy()
            j = np.clip(np.searchsorted(edges, w, side="left") - 1, 0, u.size - 1)
            for q, (lo, hi) in enumerate([(0, 400), (400, 1000), (1000, 2000), (0, 2000)]):
                inside = (u[j] > lo) & (u[j] <= hi)
                truth = np.minimum(u[j][inside], theta).sum()
                full = u[j][inside].sum()
                assert abs(answers[g, s_, q] - truth) <= 10 * np.sqrt(variance[s_, q]) + 1e-6
                assert truth <= full + 1e-9
                if bias["kind"] == "high_probability":
                    n = bias["truncated_records_fraction_of_N"] * len(df)
                    n += bias["truncated_records_additive"]
                    assert full - truth <= n * per_record[s_, q] + 1e-6


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"by": "{sex: [F, M]}"}, "no column"),
        ({"by": "{county: [a]}"}, "other than the geography"),
        ({"workload": "{name: range, ranges: [[0, 5000]]}"}, "workload.ranges[0]"),
        ({"workload": "{name: range, ranges: [[3, 7]]}"}, "holds no bin"),
        ({"strategy": "{name: hdmm, objective: max}"}, "strategy.objective"),
    ],
)
def test_bad_sum_specs_refused(tmp_path, capsys, kw, message):
    _records(tmp_path / "people.csv")
    assert main(["validate", _spec(tmp_path, **kw)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unlisted_category_refused_before_charging(tmp_path, capsys):
    df = _records_by_sex(tmp_path / "people.csv").astype(str)
    df.loc[7, "sex"] = "X"
    df.to_csv(tmp_path / "people.csv", index=False)
    assert main(["run", _spec(tmp_path, by="{sex: [F, M]}")]) == 2
    err = capsys.readouterr().err
    assert "not in by.sex" in err and "nothing was charged" in err
    assert not (tmp_path / "out" / "ledger.sqlite").exists()  # nothing left behind


def _pava(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic fit by the textbook pool-adjacent-violators loop (the oracle)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, wt in zip(y.tolist(), w.tolist(), strict=True):
        blocks.append([v, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(n, m) for m, _, n in blocks])


def test_isotonic_postprocessing_by_group(tmp_path, capsys):
    _records_by_sex(tmp_path / "people.csv")
    spec = _spec(tmp_path, by="{sex: [F, M]}", postprocess="isotonic", threshold="none",
                 privacy="{epsilon: 0.05}")  # fmt: skip
    assert main(["run", spec, "--json"]) == 0
    capsys.readouterr()
    root = zarr.open_group(str(tmp_path / "out" / "wages.zarr"), mode="r")
    answers, raw, variance = root["answers"][:], root["answers_raw"][:], root["variance"][:]
    assert answers.shape == raw.shape == (4, 2, 100) and variance.shape == (2, 100)
    assert root.attrs["dpdask"]["postprocess"]["method"] == "isotonic"
    assert np.all(np.diff(answers, axis=-1) >= -1e-9)
    assert np.any(np.diff(raw, axis=-1) < 0)  # at eps 0.05 the raw prefixes do decrease
    for g in range(4):
        for s_ in range(2):
            want = _pava(raw[g, s_], 1 / variance[s_])
            np.testing.assert_allclose(answers[g, s_], want, rtol=1e-9, atol=1e-6)


def test_isotonic_needs_a_prefix_workload(tmp_path, capsys):
    _records(tmp_path / "people.csv")
    spec = _spec(tmp_path, workload="total", postprocess="isotonic")
    assert main(["validate", spec]) == 2
    assert "isotonic needs a prefix workload" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# -- datasets: sum releases count against the dataset's lifetime budget ------------------
def _content_id(path: pathlib.Path) -> str:
    """The default dataset id of one file, computed here from its definition (name, NUL,
    bytes), independently of dpdask's hashing code."""
    import hashlib

    h = hashlib.sha256(path.name.encode() + b"\0" + path.read_bytes())
    return f"sha256-{h.hexdigest()[:16]}"


def _spy_reads(monkeypatch) -> list:
    import dpdask.sums.sum_release as rel

    reads: list = []
    real = rel.read_records
    monkeypatch.setattr(rel, "read_records", lambda *a, **k: reads.append(1) or real(*a, **k))
    return reads


def test_sum_releases_share_the_dataset_lifetime_budget(tmp_path, capsys, monkeypatch):
    _records(tmp_path / "people.csv")
    first = _spec(tmp_path, release="wages-a", privacy="{epsilon: 1, dataset: {epsilon: 1.5}}")
    assert main(["run", first, "--json"]) == 0
    capsys.readouterr()
    info = zarr.open_group(str(tmp_path / "out" / "wages.zarr"), mode="r").attrs["dpdask"]
    assert info["dataset"] == _content_id(tmp_path / "people.csv")
    ledger = Ledger(tmp_path / "out" / "ledger.sqlite")
    assert ledger.dataset_total(info["dataset"]) is not None
    entries = ledger.head().count

    # a second release of the same file, under another release id: 0.5 of 1.5 is left
    reads = _spy_reads(monkeypatch)
    second = _spec(tmp_path, "b.yaml", output="out/b.zarr", release="wages-b")
    assert main(["validate", second]) == 3
    assert "lifetime" in capsys.readouterr().err
    assert main(["run", second]) == 3
    assert "of its lifetime" in capsys.readouterr().err
    assert reads == []  # refused before the records were read
    assert Ledger(tmp_path / "out" / "ledger.sqlite").head().count == entries
    assert not (tmp_path / "out" / "b.zarr").exists()

    # renaming the file does not make it a new dataset: the id is its content (and name)
    # only when data.id is absent; a spec that names the same data.id is refused too
    third = _spec(
        tmp_path, "c.yaml", output="out/c.zarr", release="wages-c",
        data="{format: records, path: people.csv, geography_column: county, "
        f"value_column: wage, id: {info['dataset']}}}",
    )  # fmt: skip
    assert main(["run", third]) == 3
    assert "lifetime" in capsys.readouterr().err
    # a smaller release fits what is left
    fourth = _spec(tmp_path, "d.yaml", output="out/d.zarr", release="wages-d",
                   privacy="{epsilon: 0.5}")  # fmt: skip
    assert main(["run", fourth]) == 0
    left = Ledger(tmp_path / "out" / "ledger.sqlite").dataset_remaining(info["dataset"])
    assert left.epsilon == 0


def test_a_count_release_charges_the_same_dataset(tmp_path, capsys):
    """A count release's charges on the dataset (written through the ledger's API, as the
    count pipeline does) leave a sum release of the same file less room."""
    from dpdask.privacy import PureDP

    _records(tmp_path / "people.csv")
    ledger = Ledger(tmp_path / "out" / "ledger.sqlite", create=True)
    dataset = _content_id(tmp_path / "people.csv")
    ledger.set_dataset_total(dataset, PureDP(2))
    ledger.open_release("counts", PureDP(1.5), dataset)
    from dpdask.noise import new_key
    from dpdask.privacy import Charge

    key = new_key()
    ledger.charge(Charge("counts", "r1", "county", "m", "laplace", 1.0, 1.0, PureDP(1.5),
                         key.fingerprint()))  # fmt: skip
    spec = _spec(tmp_path, ledger="{path: out/ledger.sqlite}")
    assert main(["run", spec]) == 3
    assert "lifetime" in capsys.readouterr().err
    assert not (tmp_path / "out" / "wages.zarr").exists()


@pytest.mark.parametrize(
    ("privacy", "message"),
    [
        ("{epsilon: 1, dataset: {epsilon: 1, zcdp: 1}}", "exactly one"),
        ("{epsilon: 1, dataset: {epsilon: -1}}", "positive"),
        ("{epsilon: 1, dataset: {sigma: 1}}", "unknown key"),
    ],
)
def test_bad_dataset_budgets_are_refused(tmp_path, capsys, privacy, message):
    _records(tmp_path / "people.csv")
    assert main(["validate", _spec(tmp_path, privacy=privacy)]) == 2
    assert message in capsys.readouterr().err


def test_a_refused_sum_run_leaves_no_ledger_behind(tmp_path, capsys) -> None:
    """Records a run refuses (a geography outside the declared ones) are read before
    the ledger that ``ledger.create`` allows is born: nothing is left behind."""
    df = _records(tmp_path / "people.csv")
    df.loc[0, "county"] = "c99"  # outside the geographies
    df.to_csv(tmp_path / "people.csv", index=False)
    spec = _spec(tmp_path)
    assert main(["run", spec]) == 2
    assert "error" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_sum_validate_refuses_what_run_refuses_before_charging(tmp_path, capsys) -> None:
    from dpdask.publish import claim_output

    _records(tmp_path / "people.csv")
    small = _spec(tmp_path, "small.yaml", privacy="{epsilon: 1, dataset: {epsilon: 0.5}}")
    for verb in ("validate", "run"):
        assert main([verb, small]) == 2
        assert "privacy.dataset" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    spec = _spec(tmp_path)
    with claim_output(tmp_path / "out" / "wages.zarr"):  # another run publishing there
        for verb in ("validate", "run"):
            assert main([verb, spec]) == 5
            assert "publishing" in capsys.readouterr().err.lower()
