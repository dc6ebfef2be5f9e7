"""``dpdask report``: the release's self-contained HTML page and the numbers it shows."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest
import yaml

from dpdask.cli import main
from dpdask.errors import DataError
from dpdask.publish import pl94_tables
from dpdask.report import default_output, report_data, write_report
from dpdask.store import read_pl94, write_store
from dpdask.workloads import pl94

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "pl94_providence"
LEVELS = ["state", "county", "tract", "block_group", "block"]


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> dict[str, pathlib.Path]:
    """A published PL94 release of Providence County, its ledger and a truth store."""
    tmp = tmp_path_factory.mktemp("report")
    raw = yaml.safe_load((ROOT / "pipelines" / "pl94-providence.yaml").read_text())
    raw["data"]["path"] = str(DATA)
    raw["output"] = str(tmp / "out" / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp / "out" / "ledger.sqlite"), "create": True}
    raw["cluster"] = {"n_workers": 1, "threads_per_worker": 2, "processes": False}
    spec = tmp / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["run", str(spec), "--no-progress", "-q"]) == 0
    counts, domain, geography = read_pl94(DATA)
    write_store(tmp / "truth.zarr", counts, domain, geography, source="test truth")
    return {"out": tmp / "out" / "pl94.zarr", "truth": tmp / "truth.zarr", "tmp": tmp}


def _embedded(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="dpdask-report-data">(.*?)</script>',
                  html, re.S)  # fmt: skip
    assert m is not None
    return json.loads(m.group(1).replace("<\\/", "</"))


def _assert_self_contained(html: str) -> None:
    assert "<link" not in html.lower()
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I)
    assert not re.search(r"url\(", html)  # no stylesheet fetches
    srcs = re.findall(r'\bsrc\s*=\s*"([^"]*)"', html)
    hrefs = re.findall(r'\bhref\s*=\s*"([^"]*)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert all(h.startswith("#") for h in hrefs)
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*(https?:)?//', html, re.I)


def test_report_without_truth(release) -> None:
    path = write_report(release["out"])
    assert path == default_output(release["out"]) == release["out"].with_name("pl94.report.html")
    html = path.read_text()
    _assert_self_contained(html)
    for lv in LEVELS:
        assert f"<td>{lv}</td>" in html
    for table in ("P1", "P2", "P3", "P4", "race-single", "identity"):
        assert f"<td>{table}" in html
    for section in ("summary", "plan", "budget", "predicted", "realised", "convergence"):
        assert f'<section id="{section}">' in html
    assert "No truth given" in html and "Every chunk converged." in html
    data = _embedded(html)
    assert data["realised"] is None and data["levels"] == LEVELS
    led = data["ledger"]
    assert led["reachable"] and led["verifies"] and led["same_ledger"] and led["head_in_chain"]
    assert led["release"]["spent"] == {"type": "zCDP", "rho": "1"}
    shares = [lv["budget_share"] for lv in data["plan"]["levels"]]
    np.testing.assert_allclose(shares, [1 / 6] * 4 + [1 / 3])
    # predicted RMSE per table: the published variances, averaged over units and queries
    import zarr

    g = zarr.open_group(str(release["out"]), mode="r")
    for row in data["tables"]:
        lab = "workload_query" if row["kind"] == "part" else "table_query"
        var = "variance" if row["kind"] == "part" else "table_variance"
        labels = np.array(g[f"{row['level']}/{lab}"][:].tolist())
        pick = np.array([s.rsplit("_", 1)[0] == row["table"] for s in labels])
        v = np.asarray(g[f"{row['level']}/{var}"][:])[:, pick]
        assert row["queries"] == pick.sum()
        np.testing.assert_allclose(row["rmse"], np.sqrt(v.mean()), rtol=1e-12)
        np.testing.assert_allclose(row["sd_max"], np.sqrt(v.mean(axis=0)).max(), rtol=1e-12)


def test_realised_error_matches_a_dense_computation(release) -> None:
    out = release["tmp"] / "with-truth.html"
    assert write_report(release["out"], out, truth=release["truth"]) == out
    html = out.read_text()
    _assert_self_contained(html)
    assert html.count("data:image/png;base64,") == 3  # budget, predicted, realised
    data = _embedded(html)
    realised = {lv["level"]: lv for lv in data["realised"]["levels"]}
    assert list(realised) == LEVELS

    import dpdask

    counts, domain, geography = read_pl94(DATA)
    W = pl94(domain).dense()
    t_labels, _, Q = pl94_tables(domain)
    Q = Q.dense()
    tree = dpdask.open_release(release["out"])
    flat = counts.reshape(counts.shape[0], -1).astype(float)
    for lv in LEVELS:
        ds = tree[lv].dataset
        anc = geography.ancestor_index(lv)
        ids = list(geography.ids[geography.level_index(lv)])
        truth = np.zeros((len(ids), flat.shape[1]))
        np.add.at(truth, anc, flat)
        order = [ids.index(u) for u in np.asarray(ds["ids"].values).tolist()]
        truth = truth[order]
        rows = {r["table"]: r for r in realised[lv]["tables"]}
        for answers, true, labels in (
            (ds["answers"].values, truth @ W.T, np.asarray(ds["workload_query"].values).tolist()),
            (ds["table_answers"].values, truth @ Q.T, t_labels),
        ):
            tables = np.array([s.rsplit("_", 1)[0] for s in labels])
            for t in dict.fromkeys(tables.tolist()):
                err = answers[:, tables == t] - true[:, tables == t]
                np.testing.assert_allclose(
                    rows[t]["realised_rmse"], np.sqrt((err**2).mean()), rtol=1e-10
                )
                np.testing.assert_allclose(rows[t]["max_abs_error"], np.abs(err).max(), rtol=1e-10)
        est = ds["estimate"].values.reshape(len(ids), -1)
        np.testing.assert_allclose(
            realised[lv]["cells_rmse"], np.sqrt(((est - truth) ** 2).mean()), rtol=1e-10
        )
        # the shown figures are in the page too
        assert f"{rows['P1']['realised_rmse']:.4g}" in html
    # errors as predicted: about 90% of the block answers within their 90% margin
    inside = [r["within_moe90"] for r in realised["block"]["tables"] if r["queries"] > 50]
    assert all(0.85 < x < 0.95 for x in inside)


def test_cli_report(release, capsys) -> None:
    html = release["tmp"] / "cli" / "report.html"
    argv = ["report", str(release["out"]), "--out", str(html), "--truth", str(release["truth"])]
    assert main(argv) == 0
    assert str(html) in capsys.readouterr().out
    assert _embedded(html.read_text())["realised"] is not None
    assert main(["report", str(release["truth"])]) == 2  # a data store is not a release
    assert "not a dpdask release" in capsys.readouterr().err
    assert main(["report", str(release["tmp"] / "missing.zarr")]) == 2


def test_unreachable_ledger_and_mismatched_truth(release, tmp_path) -> None:
    data = report_data(release["out"], ledger=tmp_path / "gone.sqlite")
    assert not data["ledger"]["reachable"] and "no ledger at" in data["ledger"]["error"]
    html = write_report(release["out"], tmp_path / "r.html", ledger=tmp_path / "gone.sqlite")
    assert "no ledger at" in html.read_text()
    assert data["ledger"]["recorded"]["head"]  # what the release recorded is still shown
    from dpdask.domain import Domain, Geography

    geo = Geography.from_geoids(["11", "12"], {"s": 1, "c": 2})
    write_store(tmp_path / "small.zarr", np.ones((2, 2), dtype=np.int64), Domain(a=2), geo)
    with pytest.raises(DataError, match="domain"):
        report_data(release["out"], truth=tmp_path / "small.zarr")


def test_page_renders_in_chromium(release, tmp_path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium")
    page = write_report(release["out"], tmp_path / "r.html", truth=release["truth"])
    png = tmp_path / "r.png"
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
         "--window-size=1200,1600", page.resolve().as_uri()],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    if not png.exists():
        pytest.skip("chromium could not take a screenshot here")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


# -- every named workload ----------------------------------------------------------------
def _named_release(tmp: pathlib.Path, name: str, domain, **options) -> dict:
    """A small release of the named workload ``name`` on ``domain`` (a dense oracle plan),
    and the truth store it was measured from."""
    from dpdask.domain import Geography
    from dpdask.graph import release as run_release
    from dpdask.linalg import Identity
    from dpdask.noise import SecretKey
    from dpdask.privacy import Ledger, zCDP
    from dpdask.workloads.named import named
    from tests.helpers import DensePlan

    geo = Geography(
        levels=("state", "county", "tract"),
        ids=(("44",), ("44001", "44007"), tuple(f"44007{i:06d}" for i in range(5))),
        parents=(np.zeros(2, dtype=int), np.array([0, 0, 1, 1, 1])),
    )
    counts = np.random.default_rng(3).integers(0, 40, size=(5, *domain.shape))
    truth = write_store(tmp / "truth.zarr", counts, domain, geo, geo_chunk=2)
    W = named(name, domain, **options)
    A = Identity(domain.size)
    budget = zCDP(1)
    plan = DensePlan(A, W, domain, "gaussian", budget.gaussian_sigma(A.sensitivity(2)), budget)
    r = run_release(
        plan, truth, release_id=name, ledger=Ledger.init(tmp / "ledger.sqlite"),
        key=SecretKey.for_testing(11), test_mode=True,
    )  # fmt: skip
    return {"out": r.to_zarr(tmp / f"{name}.zarr"), "truth": tmp / "truth.zarr",
            "counts": counts, "geo": geo, "W": W}  # fmt: skip


def _dense_truth(case: dict, level: str) -> np.ndarray:
    geo, counts = case["geo"], case["counts"]
    flat = counts.reshape(counts.shape[0], -1).astype(float)
    out = np.zeros((len(geo.ids[geo.level_index(level)]), flat.shape[1]))
    np.add.at(out, geo.ancestor_index(level), flat)
    return out


def _ri2010_domain():
    from dpdask.workloads.ri2010 import ri2010_domain

    return ri2010_domain()


@pytest.mark.parametrize(
    "name, domain",
    [("ri2010", None), ("marginals", "small"), ("identity", "small")],
)
def test_truth_is_compared_for_every_named_workload(tmp_path, name, domain) -> None:
    import zarr

    from dpdask.domain import Domain

    dom = _ri2010_domain() if domain is None else Domain(votingage=2, hisp=2, b=3)
    case = _named_release(tmp_path, name, dom)
    data = report_data(case["out"], truth=case["truth"])
    assert data["levels"] == ["state", "county", "tract"]  # coarsest first
    real = data["realised"]
    assert all(w == {"release": name, "other": None} for w in real["workloads"].values())
    W = case["W"].dense()
    root = zarr.open_group(str(case["out"]), mode="r")
    for lv in real["levels"]:
        g = root[lv["level"]]
        labels = [str(s) for s in np.asarray(g["workload_query"][:]).tolist()]
        err = np.asarray(g["answers"][:]) - _dense_truth(case, lv["level"]) @ W.T
        tables = np.array([s.rsplit("_", 1)[0] for s in labels])
        rows = {r["table"]: r for r in lv["tables"]}
        assert set(rows) == set(tables.tolist()) and rows
        for t, r in rows.items():
            e = err[:, tables == t]
            np.testing.assert_allclose(r["realised_rmse"], np.sqrt((e**2).mean()), rtol=1e-10)
            np.testing.assert_allclose(r["max_abs_error"], np.abs(e).max(), rtol=1e-10)
            assert r["predicted_rmse"] > 0 and 0 <= r["within_moe90"] <= 1
    # naming it gives the same comparison
    named_data = report_data(case["out"], truth=case["truth"], workload=name)
    assert named_data["realised"]["levels"] == real["levels"]


def test_report_workload_option_answers_another_workload_from_the_estimates(
    tmp_path, capsys
) -> None:
    import zarr

    from dpdask.domain import Domain

    case = _named_release(tmp_path, "marginals", Domain(votingage=2, hisp=2, b=3))
    html = tmp_path / "r.html"
    argv = ["report", str(case["out"]), "--truth", str(case["truth"]), "--out", str(html)]
    assert main([*argv, "--workload", "identity"]) == 0
    data = _embedded(html.read_text())
    root = zarr.open_group(str(case["out"]), mode="r")
    for lv in data["realised"]["levels"]:
        assert data["realised"]["workloads"][lv["level"]] == {
            "release": "marginals",
            "other": "identity",
        }
        derived = [r for r in lv["tables"] if r["kind"] == "derived"]
        assert [r["table"] for r in derived] == ["query"]  # identity: one part
        est = np.asarray(root[lv["level"]]["estimate"][:]).reshape(lv["units"], -1)
        e = est - _dense_truth(case, lv["level"])
        np.testing.assert_allclose(derived[0]["realised_rmse"], np.sqrt((e**2).mean()), rtol=1e-10)
        assert derived[0]["predicted_rmse"] is None and derived[0]["within_moe90"] is None
        # the release's own tables are still compared through their published answers
        assert {r["table"] for r in lv["tables"] if r["kind"] == "part"} == {
            "votingage",
            "hisp",
            "b",
        }
    page = html.read_text()
    assert "(from the estimates)" in page
    assert (
        'Compared: the release\'s workload, rebuilt as <span class="mono">marginals</span>; '
        '<span class="mono">identity</span> answered from the published estimates.'
    ) in page
    # without a truth there is nothing to compare: the report says so
    alone = report_data(case["out"], workload="identity")
    assert alone["realised"] is None and any("--truth STORE" in n for n in alone["notes"])
    # an unknown workload, or one that does not fit the domain: a one-line error
    assert main([*argv, "--workload", "nonesuch"]) == 2
    assert "unknown workload 'nonesuch'" in capsys.readouterr().err
    assert main([*argv, "--workload", "pl94"]) == 2
    assert "workload 'pl94' on the release's domain" in capsys.readouterr().err


def test_workload_with_options_is_named_in_yaml(tmp_path, capsys) -> None:
    from dpdask.domain import Domain

    case = _named_release(tmp_path, "marginals", Domain(votingage=2, hisp=2, b=3), k=2)
    # not a named workload with its default options: the cells only, and a note saying so
    data = report_data(case["out"], truth=case["truth"])
    assert all(not lv["tables"] for lv in data["realised"]["levels"])
    assert any("--workload NAME" in n for n in data["notes"])
    html = tmp_path / "r.html"
    argv = ["report", str(case["out"]), "--truth", str(case["truth"]), "--out", str(html)]
    assert main([*argv, "--workload", "{name: marginals, k: 2}"]) == 0
    real = _embedded(html.read_text())["realised"]
    assert real["workloads"]["tract"] == {"release": "marginals (k=2)", "other": None}
    W = case["W"].dense()
    import zarr

    g = zarr.open_group(str(case["out"]), mode="r")["tract"]
    err = np.asarray(g["answers"][:]) - _dense_truth(case, "tract") @ W.T
    tract = next(lv for lv in real["levels"] if lv["level"] == "tract")
    assert sum(r["queries"] for r in tract["tables"]) == W.shape[0]
    total_sse = sum(
        r["realised_rmse"] ** 2 * r["queries"] * tract["units"] for r in tract["tables"]
    )
    np.testing.assert_allclose(total_sse, (err**2).sum(), rtol=1e-9)
    assert main([*argv, "--workload", "{k: 2}"]) == 2
    assert "needs a name" in capsys.readouterr().err
