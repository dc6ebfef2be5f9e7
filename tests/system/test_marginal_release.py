"""Marginal releases from records (strategy: residual): the CLI end to end, consistency
of the published tables, and realised errors against the published variances."""

from __future__ import annotations

import itertools
import json
import pathlib

import numpy as np
import pandas as pd
import pytest

import dpdask
from dpdask.cli import main
from dpdask.datasets import geography_ids, wide_records, with_geography
from dpdask.domain import Domain, Geography
from dpdask.graph import charge_marginals, levels_of, write_marginals
from dpdask.measure.residual import marginal_counts, residual_charge
from dpdask.noise import SecretKey, new_key
from dpdask.privacy import Ledger, zCDP
from dpdask.strategy.residual import MarginalWorkload, plan_residual

UNITS = 6


def _records(tmp_path: pathlib.Path, n: int = 4000, d: int = 6):
    df, sizes = wide_records(n, d=d, seed=5)
    df = with_geography(df, UNITS, seed=6)
    path = tmp_path / "records.csv"
    df.to_csv(path, index=False)
    ids = geography_ids(UNITS)
    uni = pd.DataFrame({"region": [f"r{int(g[1:]) // 3}" for g in ids], "geo": ids})
    uni.to_csv(tmp_path / "universe.csv", index=False)
    return df, sizes


def _spec(tmp_path: pathlib.Path, sizes: dict[str, int], workload: str) -> pathlib.Path:
    text = f"""
release: wide-test
data:
  format: records
  path: records.csv
  geography_column: geo
  geographies: universe.csv
domain: {json.dumps(sizes)}
levels: [region, geo]
workload: {workload}
privacy: {{zcdp: 2}}
strategy: residual
output: out/wide.zarr
ledger: {{path: out/ledger.sqlite, create: true}}
"""
    path = tmp_path / "wide.yaml"
    path.write_text(text)
    return path


def _truth(df: pd.DataFrame, sizes: dict[str, int], ids: list[str], S: list[str]) -> np.ndarray:
    unit = pd.Categorical(df["geo"], categories=ids).codes
    table = np.column_stack([unit, df[S].to_numpy()])
    return marginal_counts(table, (len(ids), *(sizes[a] for a in S)), range(len(S) + 1))


def test_cli_release_is_consistent_and_charged(tmp_path):
    _df, sizes = _records(tmp_path)
    spec = _spec(tmp_path, sizes, "{marginals: {k: 3}}")
    code = main(["run", str(spec)])
    assert code == 0
    out = tmp_path / "out" / "wide.zarr"
    tree = dpdask.open_release(out)
    names = list(sizes)
    geo = tree["geo/marginals"]
    assert len(geo.children) == len(list(itertools.combinations(names, 3)))
    # every pair of 3-way tables agrees on their shared 2-way marginal, exactly
    for a, b in itertools.combinations(list(geo.children), 2):
        A, B = a.split("-"), b.split("-")
        shared = [x for x in A if x in B]
        if len(shared) < 2:
            continue
        ea = geo[a].dataset.estimate.sum([x for x in A if x not in shared])
        eb = geo[b].dataset.estimate.sum([x for x in B if x not in shared])
        np.testing.assert_allclose(ea.transpose(*eb.dims).values, eb.values, atol=1e-8)
    ds = geo[f"{names[0]}-{names[1]}-{names[2]}"].dataset
    assert ds.estimate.dims == ("geography", *names[:3])
    np.testing.assert_allclose(ds.moe90, 1.645 * np.sqrt(ds.variance))
    assert ds.variance.dims == ("geography",)
    # fitted jointly: a region's tables are the sums of its units' (universe: 3 per region)
    assert tree.attrs["levels_fitted_jointly"]
    region = tree["region/marginals"][f"{names[0]}-{names[1]}-{names[2]}"].dataset
    parent = np.repeat(np.arange(2), 3)
    sums = np.stack([ds.estimate.values[parent == p].sum(axis=0) for p in range(2)])
    np.testing.assert_allclose(region.estimate.values, sums, atol=1e-8)
    assert np.all(region.variance.values < 3 * ds.variance.values[0])
    ledger = Ledger(tmp_path / "out" / "ledger.sqlite")
    run = ledger.runs("wide-test")[0]
    assert run.state == "published"
    assert ledger.spent("wide-test").rho == pytest.approx(2)
    # a second run of the same release is refused: the budget is spent
    assert main(["run", str(spec), "--overwrite"]) != 0


def test_realised_errors_match_published_variances(tmp_path):
    df, sizes = _records(tmp_path, n=6000, d=5)
    domain = Domain(sizes)
    ids = geography_ids(UNITS)
    geo = Geography.flat(ids, "geo")
    sets = [*list(itertools.combinations(range(5), 2)), (0, 1, 2)]
    W = MarginalWorkload(domain.shape, sets)
    plan = plan_residual(W, zCDP(1), domain=domain)
    finest = pd.Categorical(df["geo"], categories=ids).codes.astype(np.int64)
    codes = df[list(sizes)].to_numpy()
    lvls = levels_of(geo, ["geo"], {"geo": plan}, finest, codes)
    key = SecretKey.for_testing(11)
    charges = [residual_charge(plan, "wide", "run1", "geo", "strategy", key.fingerprint())]
    out = tmp_path / "final.zarr"
    write_marginals(out, lvls, domain, sets, key, charges, "wide", "run1", None,
                    {"release": "wide"}, test_mode=True)  # fmt: skip
    import xarray as xr

    z2 = []
    names = list(sizes)
    for S in sets:
        attrs = [names[i] for i in S]
        ds = xr.open_zarr(out, group=f"geo/marginals/{'-'.join(attrs)}")
        err = ds.estimate.values - _truth(df, sizes, ids, attrs)
        var = ds.variance.values.reshape((-1,) + (1,) * len(attrs))
        z2.append((err**2 / var).ravel())
    msz = float(np.concatenate(z2).mean())
    assert 0.8 <= msz <= 1.25, msz


def test_a_ledger_charge_is_made_once_for_all_chunks(tmp_path):
    _df, sizes = _records(tmp_path, n=500, d=3)
    domain = Domain(sizes)
    plan = plan_residual(MarginalWorkload(domain.shape, [(0, 1), (2,)]), zCDP(1), domain=domain)
    geo = Geography.flat(geography_ids(UNITS), "geo")
    lvls = levels_of(geo, ["geo"], {"geo": plan}, np.zeros(0, np.int64), np.zeros((0, 3), np.int64))
    ledger = Ledger(tmp_path / "l.sqlite", create=True)
    key = new_key()
    charge_marginals(ledger, lvls, "wide", "run1", key, zCDP(1), None)
    charge_marginals(ledger, lvls, "wide", "run1", key, zCDP(1), None)  # a retry adds nothing
    assert ledger.spent("wide").rho == pytest.approx(1)


def test_records_outside_the_universe_are_refused_before_any_charge(tmp_path, capsys):
    df, sizes = _records(tmp_path, n=300, d=3)
    df.loc[5, "geo"] = "elsewhere"
    df.to_csv(tmp_path / "records.csv", index=False)
    spec = _spec(tmp_path, sizes, "{marginals: [[a00, a01], {attributes: [a02], weight: 2}]}")
    assert main(["run", str(spec)]) == 2
    assert "outside the declared universe" in capsys.readouterr().err
    assert not (tmp_path / "out" / "wide.zarr").exists()
    ledger_path = tmp_path / "out" / "ledger.sqlite"
    assert not ledger_path.exists() or not Ledger(ledger_path).runs("wide-test")


def test_a_residual_spec_needs_records(tmp_path, capsys):
    _df, sizes = _records(tmp_path, n=100, d=3)
    spec = _spec(tmp_path, sizes, "{marginals: {k: 2}}")
    text = spec.read_text().replace("format: records", "format: synthetic")
    text = text.replace("  geography_column: geo\n  geographies: universe.csv\n", "")
    spec.write_text(text.replace("  path: records.csv\n", ""))
    assert main(["run", str(spec)]) == 2
    assert "format: records" in capsys.readouterr().err
    assert not (tmp_path / "out" / "wide.zarr").exists()


def test_a_stopped_run_resumes_with_its_key_and_is_charged_once(tmp_path, monkeypatch):
    import dpdask.graph as release_pkg

    _df, sizes = _records(tmp_path, n=800, d=3)
    spec = _spec(tmp_path, sizes, "{marginals: {k: 2}}")
    real = release_pkg.write_marginals

    def crash(*args, **kwargs):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(release_pkg, "write_marginals", crash)
    assert main(["run", str(spec), "--run-id", "r1"]) == 1
    ledger = Ledger(tmp_path / "out" / "ledger.sqlite")
    assert ledger.spent("wide-test").rho == pytest.approx(2)  # charged before the crash
    assert not (tmp_path / "out" / "wide.zarr").exists()
    monkeypatch.setattr(release_pkg, "write_marginals", real)
    assert main(["run", str(spec), "--run-id", "r1"]) == 0
    ledger = Ledger(tmp_path / "out" / "ledger.sqlite")
    assert ledger.spent("wide-test").rho == pytest.approx(2)  # not charged again
    assert ledger.run("wide-test", "r1").state == "published"


def test_thirty_attributes_all_two_way_marginals(tmp_path):
    df, sizes = wide_records(3000, d=30, seed=8)
    domain = Domain(sizes)
    ids = geography_ids(3)
    df = with_geography(df, 3, seed=9)
    geo = Geography.flat(ids, "geo")
    sets = list(itertools.combinations(range(30), 2))
    plan = plan_residual(MarginalWorkload(domain.shape, sets), zCDP(4), domain=domain)
    finest = pd.Categorical(df["geo"], categories=ids).codes.astype(np.int64)
    lvls = levels_of(geo, ["geo"], {"geo": plan}, finest, df[list(sizes)].to_numpy())
    key = SecretKey.for_testing(12)
    charges = [residual_charge(plan, "wide", "run1", "geo", "strategy", key.fingerprint())]
    out = tmp_path / "final.zarr"
    write_marginals(out, lvls, domain, sets, key, charges, "wide", "run1", None,
                    {"release": "wide"}, test_mode=True)  # fmt: skip
    import zarr

    names = list(sizes)
    root = zarr.open_group(str(out), mode="r")  # once: the store holds 435 marginals
    z2 = []
    for S in sets[:: len(sets) // 40]:
        attrs = [names[i] for i in S]
        group = root[f"geo/marginals/{'-'.join(attrs)}"]
        err = group["estimate"][:] - _truth(df, sizes, ids, attrs)
        z2.append((err**2 / group["variance"][:][:, None, None]).ravel())
    assert 0.7 <= float(np.concatenate(z2).mean()) <= 1.4
