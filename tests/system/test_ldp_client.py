"""Client randomizer, simulator, server-side aggregation, and the local plan."""

from __future__ import annotations

import json
import math
import pathlib
import runpy
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import dpdask
from dpdask.errors import ArgumentTypeError, BudgetTypeError, DataError, PlanError
from dpdask.ldp import LocalStrategy, aggregate, count_responses, randomize, simulate_counts
from dpdask.ldp import client as ldp_client
from dpdask.ldp.baselines import hadamard, randomized_response
from dpdask.ldp.local_plan import LdpPlan, select_local
from dpdask.linalg import Identity, Prefix
from dpdask.noise import SecretKey
from dpdask.privacy import PureDP, zCDP

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "ldp"


@pytest.fixture
def strategy() -> LocalStrategy:
    return hadamard(5, 1.0)  # 8 outputs, 5 types


# -- client ------------------------------------------------------------------------------
def test_client_follows_the_strategy(strategy):
    doc = ldp_client.load(strategy.to_json())
    ldp_client.verify(doc)
    u = 2
    draws = np.array([ldp_client.respond(u, doc) for _ in range(8000)])
    observed = np.bincount(draws, minlength=strategy.shape[0])
    expected = np.asarray(strategy.Q)[:, u] * draws.size
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_client_uses_the_system_csprng(strategy, monkeypatch):
    calls = []

    def fake(k):
        calls.append(k)
        return 0

    monkeypatch.setattr(ldp_client.secrets, "randbelow", fake)
    doc = ldp_client.load(strategy.to_json())
    first = int(np.flatnonzero(strategy.counts[:, 1])[0])
    assert ldp_client.respond(1, doc) == first
    assert calls == [strategy.denominator]


@pytest.mark.parametrize("record", [-1, 5, True, 1.0, "2"])
def test_client_rejects_bad_records(strategy, record):
    doc = ldp_client.load(strategy.to_json())
    with pytest.raises(DataError):
        ldp_client.respond(record, doc)


def test_client_fails_closed_on_tampered_files(strategy):
    doc = json.loads(strategy.to_json())
    doc["columns"][0][0] += 1  # column no longer sums to the denominator
    with pytest.raises(PlanError, match="sum"):
        ldp_client.load(json.dumps(doc))
    doc = json.loads(strategy.to_json())
    with pytest.raises(PlanError, match="LDP"):
        ldp_client.verify(doc, "0.5")  # a smaller promise than the strategy keeps
    doc["format"] = "other"
    with pytest.raises(PlanError, match="strategy file"):
        ldp_client.load(json.dumps(doc))


def test_example_client_is_the_library_client():
    assert (EXAMPLES / "client.py").read_text() == pathlib.Path(ldp_client.__file__).read_text()


def test_client_copied_alone_refuses_with_plain_value_errors(strategy, monkeypatch):
    """On a device without dpdask the copy still fails closed, with ``ValueError``."""
    from dpdask.errors import DPDaskError

    doc = json.loads(strategy.to_json())
    doc["format"] = "other"
    monkeypatch.setitem(sys.modules, "dpdask.errors", None)  # import fails as without dpdask
    alone = runpy.run_path(str(EXAMPLES / "client.py"))
    with pytest.raises(ValueError, match="strategy file") as refused:
        alone["load"](json.dumps(doc))
    assert not isinstance(refused.value, DPDaskError)
    with pytest.raises(ValueError, match="type index") as refused:
        alone["respond"]("2", json.loads(strategy.to_json()))
    assert not isinstance(refused.value, DPDaskError)


def test_example_strategy_file_is_valid_and_runs(capsys):
    path = EXAMPLES / "strategy.json"
    S = LocalStrategy.from_json(path.read_text())
    mod = runpy.run_path(str(EXAMPLES / "client.py"))
    assert mod["main"]([str(path), "3"]) == 0
    out = int(capsys.readouterr().out)
    assert 0 <= out < S.shape[0]
    assert mod["main"]([str(path), "3", "--epsilon", str(S.epsilon)]) == 0


# -- simulator ---------------------------------------------------------------------------
def test_randomize_follows_the_strategy(strategy, rng):
    types = np.repeat(np.arange(5), 20000)
    r = randomize(strategy, types, rng)
    assert r.dtype == np.int64 and r.min() >= 0 and r.max() < 8
    for u in range(5):
        obs = np.bincount(r[types == u], minlength=8)
        assert stats.chisquare(obs, np.asarray(strategy.Q)[:, u] * 20000).pvalue > 1e-4


def test_randomize_with_a_key_is_reproducible(strategy):
    key = SecretKey.for_testing(3)
    types = np.arange(5).repeat(10)
    a = randomize(strategy, types, key)
    b = randomize(strategy, types, key)
    c = randomize(strategy, types, key, identity=("other",))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


@pytest.mark.parametrize("types", [[0, 5], [-1], [0.5]])
def test_randomize_validates_types(strategy, rng, types):
    with pytest.raises((ValueError, TypeError)):
        randomize(strategy, np.array(types), rng)


def test_randomize_refuses_numpy_global_state(strategy):
    with pytest.raises(ArgumentTypeError):
        randomize(strategy, np.zeros(3, dtype=int), 7)


def test_per_person_simulation_matches_variance(rng):
    """Monte Carlo over the per-person simulator: total variance = N x person variance."""
    S = randomized_response(4, 1.0)
    W = Identity(4)
    V = S.reconstruction(W)
    N, reps = 200, 2000
    types = np.zeros(N, dtype=int)
    r = randomize(S, np.tile(types, reps), rng).reshape(reps, N)
    Y = np.stack([np.bincount(row, minlength=4) for row in r])
    total = (Y @ V.T).var(axis=0, ddof=1).sum()
    e = math.e
    assert total == pytest.approx(N * 3 * (2 + 2 * e) / (e - 1) ** 2, rel=0.08)


# -- aggregation -------------------------------------------------------------------------
@pytest.fixture
def responses(strategy, rng):
    x = rng.integers(0, 400, size=(3, 5))
    rows = []
    for g, xg in zip(["b", "a", "c"], x, strict=True):
        types = np.repeat(np.arange(5), xg)
        rows.append(pd.DataFrame({"response": randomize(strategy, types, rng), "geography": g}))
    return pd.concat(rows, ignore_index=True).sample(frac=1, random_state=0), x


@pytest.mark.parametrize("fmt", ["parquet", "csv", "pandas"])
def test_aggregate_counts_and_reconstructs(strategy, responses, tmp_path, fmt):
    df, x = responses
    if fmt == "parquet":
        src = tmp_path / "r.parquet"
        df.to_parquet(src, index=False)
    elif fmt == "csv":
        src = tmp_path / "r.csv"
        df.to_csv(src, index=False)
    else:
        src = df
    W = Prefix(5)
    est = aggregate(src, strategy, W)
    assert list(est.geographies) == ["a", "b", "c"]
    order = [1, 0, 2]  # rows of x are b, a, c
    np.testing.assert_array_equal(est.people, x[order].sum(axis=1))
    for i, g in enumerate(est.geographies):
        y = np.bincount(df.loc[df.geography == g, "response"], minlength=8)
        np.testing.assert_array_equal(est.counts[i], y)
        np.testing.assert_allclose(est.answers()[i], strategy.reconstruction(W) @ y, rtol=1e-9)


def test_aggregate_partitions_merge(strategy, responses):
    import dask.dataframe as dd

    df, _ = responses
    one = count_responses(df, 8)
    many = count_responses(dd.from_pandas(df, npartitions=7), 8)
    assert list(one[0]) == list(many[0])
    np.testing.assert_array_equal(one[1], many[1])


@pytest.mark.parametrize(
    "bad, match",
    [([0, 8], "out of range"), ([0, -1], "out of range"), ([0, 1.5], "integer")],
)
def test_aggregate_rejects_bad_responses(strategy, bad, match):
    df = pd.DataFrame({"response": bad, "geography": [1, 1]})
    with pytest.raises(DataError, match=match):
        aggregate(df, strategy, Prefix(5))


def test_aggregate_rejects_missing_values(strategy):
    df = pd.DataFrame({"response": [0, None], "geography": [1, 1]})
    with pytest.raises(DataError, match="missing"):
        count_responses(df, 8)
    df = pd.DataFrame({"response": [0, 1], "geography": [1, None]})
    with pytest.raises(DataError, match="missing"):
        count_responses(df, 8)


def test_aggregate_wnnls_is_nonnegative_and_closer(rng):
    S = hadamard(16, 0.5)
    W = Prefix(16)
    x = np.zeros(16, dtype=np.int64)
    x[:3] = 40  # sparse data: the unbiased estimate goes negative
    errs = []
    for _ in range(5):
        types = np.repeat(np.arange(16), x)
        df = pd.DataFrame({"response": randomize(S, types, rng), "geography": 0})
        est = aggregate(df, S, W, wnnls=True)
        assert (est.x_nonnegative >= -1e-9).all()
        truth = W @ x.astype(float)
        errs.append(
            (
                np.sum((est.answers()[0] - truth) ** 2),
                np.sum((est.answers(nonnegative=True)[0] - truth) ** 2),
            )
        )
    ls, nn = np.array(errs).sum(axis=0)
    assert nn < ls


def test_simulate_counts_matches_randomize_in_mean(strategy, rng):
    x = np.array([100, 0, 50, 10, 0])
    Y = simulate_counts(strategy, np.tile(x, (400, 1)), rng)
    np.testing.assert_allclose(Y.mean(axis=0), np.asarray(strategy.Q) @ x, rtol=0.05, atol=2)


# -- plan and select ---------------------------------------------------------------------
def test_select_local_returns_a_plan():
    W = Prefix(16)
    plan = select_local(W, PureDP(1), iters=30, polish=20)
    assert isinstance(plan, LdpPlan)
    s = plan.summary(as_dict=True)
    assert set(s["baselines"]) >= {"randomized_response", "hadamard", "hierarchical"}
    for v in s["baselines"].values():
        assert v["ratio_to_chosen"] >= 1 - 1e-9
    assert s["worst_variance_per_person"] >= s["lower_bound_per_person"]
    assert plan.sample_complexity() == pytest.approx(plan.worst_variance / (16 * 0.01))
    assert "local model" in plan.summary()


def test_select_local_needs_pure_dp():
    with pytest.raises(BudgetTypeError):
        select_local(Prefix(4), zCDP(1))
    with pytest.raises(TypeError):
        dpdask.select(Prefix(4), zCDP(1), model="local")
    with pytest.raises(ValueError, match="model"):
        dpdask.select(Prefix(4), PureDP(1), model="federated")


def test_dpdask_select_plans_the_local_model():
    """Issue 22: ``dpdask.select(W, PureDP(eps), model="local")`` returns the local plan,
    the same as :func:`select_local` with the same options (central stays the default)."""
    W = Prefix(16)
    kw = {"iters": 30, "polish": 20, "seed": 5}
    plan = dpdask.select(W, PureDP(1), model="local", **kw)
    assert isinstance(plan, LdpPlan) and plan.model == "local"
    assert np.array_equal(plan.strategy.counts, select_local(W, PureDP(1), **kw).strategy.counts)
    s = plan.summary(as_dict=True)
    assert s["worst_variance_per_person"] == pytest.approx(plan.strategy.worst_variance(W))
    assert s["sample_complexity"] == pytest.approx(plan.worst_variance / (16 * 0.01))
    assert set(s["baselines"]) >= {"randomized_response", "hadamard", "hierarchical", "fourier"}
    assert all(v["ratio_to_chosen"] >= 1 - 1e-9 for v in s["baselines"].values())
    assert not isinstance(dpdask.select(W, PureDP(1), restarts=1), LdpPlan)  # central default


def test_plan_writes_the_client_file(tmp_path):
    plan = select_local(Identity(4), PureDP(2), iters=10, polish=0)
    path = tmp_path / "s.json"
    plan.save_strategy(path)
    doc = ldp_client.load(path.read_text())
    ldp_client.verify(doc, "2")
    assert ldp_client.respond(0, doc) in range(plan.strategy.shape[0])


# -- specs -------------------------------------------------------------------------------
def test_local_spec_plan_then_run(tmp_path, rng):
    import shutil

    from dpdask.ldp.local_spec import plan_spec, run_spec

    spec = tmp_path / "spec.yaml"
    shutil.copy(EXAMPLES / "spec.yaml", spec)
    plan = plan_spec(spec)
    S = LocalStrategy.from_json((tmp_path / "strategy.json").read_text())
    assert np.array_equal(S.counts, plan.strategy.counts)
    types = rng.integers(0, 8, size=3000)
    geo = rng.integers(0, 4, size=3000)
    pd.DataFrame({"response": randomize(S, types, rng), "geography": geo}).to_parquet(
        tmp_path / "responses.parquet", index=False
    )
    out = run_spec(spec)
    assert out["people"] == 3000 and out["geographies"] == 4
    est = pd.read_csv(tmp_path / "estimates.csv")
    assert list(est.columns[:2]) == ["geography", "people"] and len(est) == 4
    assert (est.filter(like="q").to_numpy() >= -1e-6).all()  # WNNLS answers


def test_local_spec_is_strict(tmp_path):
    from dpdask.ldp.local_spec import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "model: local\nworkload: prefix\nprivacy: {epsilon: 1}\nstrategy_file: s\nx: 1\n"
    )
    with pytest.raises(ValueError, match="unknown"):
        load_spec(spec)
    spec.write_text("model: central\n")
    with pytest.raises(ValueError, match="local"):
        load_spec(spec)


def test_aggregate_wnnls_matches_scipy_nnls(rng):
    """Appendix A: the non-negative estimate minimises ||W (x - x_hat)||^2 over x >= 0,
    checked against SciPy's active-set NNLS per geography (an independent solver)."""
    from scipy.optimize import nnls

    S = hadamard(16, 0.5)
    W = Prefix(16)
    Wd = W.dense()
    x = np.zeros(16, dtype=np.int64)
    x[:3], x[10] = 40, 25
    types = np.repeat(np.arange(16), x)
    df = pd.DataFrame(
        {"response": randomize(S, types, rng), "geography": rng.integers(0, 3, types.size)}
    )
    est = aggregate(df, S, W, wnnls=True)
    assert (est.x < 0).any()  # the case WNNLS is for
    for xh, xn in zip(est.x, est.x_nonnegative, strict=True):
        assert (xn >= -1e-9).all()
        ref = nnls(Wd, Wd @ xh)[0]

        def loss(z, xh=xh):
            return float(np.sum((Wd @ (z - xh)) ** 2))

        assert loss(xn) == pytest.approx(loss(ref), rel=1e-4)
