"""The Bureau's 2020 strategy as a plan, fitness against it, HDMM weights, neighbours."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpdask import census
from dpdask.domain import Domain
from dpdask.errors import PlanError
from dpdask.linalg import Identity, Ones, VStack
from dpdask.privacy import ApproxDP, PureDP, zCDP
from dpdask.privacy.neighbours import ADD_REMOVE, CHANGE_ONE, as_neighbours, convert
from dpdask.strategy import select
from dpdask.strategy.fitness import solve, solve_symmetric
from dpdask.strategy.tda2020 import (
    LEVEL_SHARES,
    LEVELS,
    QUERY_SHARES,
    level_budget,
    tda2020_strategy,
)
from dpdask.strategy.weights import weighted_workload
from dpdask.workloads import PL94_FULL_GROUPS, marginal, pl94_full

# the facts sheet (../shared/design/tda-2020.md)
RHO_CHANGE_ONE = Fraction(542, 339) ** 2
RHO = RHO_CHANGE_ONE / 2
FACT_SD = {("county", "total"): 2.17, ("tract", "total"): 2.47,
           ("block_group", "total"): 1.75, ("block", "detailed"): 3.18}  # fmt: skip


def test_shares_sum_to_one():
    assert sum(LEVEL_SHARES.values()) == 1
    for lv in LEVELS:
        assert sum(QUERY_SHARES[lv].values()) == 1, lv
    assert QUERY_SHARES["us"]["total"] == 0


def test_budget_in_both_relations():
    assert round(float(RHO_CHANGE_ONE), 4) == 2.5562
    assert convert(zCDP(RHO_CHANGE_ONE), "change-one", None) == zCDP(RHO)
    assert convert(zCDP(RHO), ADD_REMOVE, CHANGE_ONE) == zCDP(RHO_CHANGE_ONE)
    assert convert(PureDP(1), ADD_REMOVE, CHANGE_ONE) == PureDP(2)
    assert convert(zCDP(1), None, "change-one", nonnegative_gram=False) == zCDP(4)
    assert as_neighbours(None) is ADD_REMOVE
    with pytest.raises(PlanError):
        convert(ApproxDP(1, "1e-6"), ADD_REMOVE, CHANGE_ONE)
    with pytest.raises(PlanError, match="neighbours"):
        as_neighbours("swap")


@pytest.mark.parametrize("level", LEVELS)
def test_variances_equal_the_closed_form(level):
    W = pl94_full()
    plan = select(W, level_budget(zCDP(RHO), level), "tda-2020", level=level)
    assert plan.sensitivity == pytest.approx(1.0, abs=1e-12)
    v = plan.query_variances()
    start = 0
    for g, part in zip(PL94_FULL_GROUPS, W.parts, strict=True):
        stop = start + part.shape[0]
        q = QUERY_SHARES[level][g]
        if q > 0:
            closed = 1 / (2 * float(RHO) * float(LEVEL_SHARES[level]) * float(q))
            np.testing.assert_allclose(v[start:stop], closed, rtol=1e-9, err_msg=g)
        start = stop
    for (lv, g), sd in FACT_SD.items():
        if lv == level:
            i = PL94_FULL_GROUPS.index(g)
            assert math.sqrt(v[sum(p.shape[0] for p in W.parts[:i])]) == pytest.approx(
                sd, abs=0.006
            )


def test_stacked_strategy_dense():
    A, groups = tda2020_strategy("county")
    M = A.dense()
    assert np.allclose(np.linalg.norm(M, axis=0), 1.0)  # sensitivity sqrt(sum q) = 1
    G = M.T @ M
    assert G.min() >= 0  # counting queries: change-one rho is at most 2x add/remove
    change = (np.diag(G)[:, None] + np.diag(G)[None, :] - 2 * G).max()
    assert change <= 2 + 1e-12
    assert groups == [[j] for j in range(11)]
    _, us = tda2020_strategy("us")
    assert us[-1] == [0, 10]  # the US answers its total from the detailed cells


def test_unknown_level_and_wrong_workload():
    with pytest.raises(PlanError, match="level"):
        select(pl94_full(), zCDP(1), "tda-2020", level="planet")
    with pytest.raises(PlanError, match="pl94-full"):
        select(marginal(census.pl94_full_domain(), ["hhgq"]), zCDP(1), "tda-2020", level="state")
    with pytest.raises(PlanError, match="Gaussian"):
        select(pl94_full(), PureDP(1), "tda-2020", level="state")


def test_symmetric_solver_matches_dense_smii():
    dom = Domain(a=3, b=2, c=3)
    W = VStack(
        [marginal(dom, a) for a in ([], ["a"], ["b", "c"], list(dom.attrs))],
        names=["t", "a", "bc", "abc"],
    )
    c = np.concatenate([np.full(1, 0.5), np.full(3, 2.0), np.full(6, 3.0), np.full(18, 6.0)])
    sym = solve_symmetric(W, c, [[[0], [1, 2]], [[0, 1]], [[0, 1, 2]]], maxiter=300)
    dense = solve(W, c, method="dense")
    assert sym.max_ratio <= 1 + 1e-9
    assert sym.privacy_cost == pytest.approx(dense.privacy_cost, rel=2e-3)
    # the dense inverse covariance gives the same variances, by a dense computation
    Sigma = np.linalg.inv(sym.inverse_dense())
    Wd = W.dense()
    assert np.all(np.einsum("ij,jk,ik->i", Wd, Sigma, Wd) <= c * (1 + 1e-6))
    assert math.sqrt(np.diag(sym.inverse_dense()).max()) == pytest.approx(sym.privacy_cost)


def test_fitness_beats_tda2020_at_the_block():
    W = pl94_full()
    plan = select(W, None, "fitness", targets="tda-2020", level="block", maxiter=20)
    base = level_budget(zCDP(RHO), "block")
    assert plan.info["budget_ratio"] < 1
    assert float(plan.zcdp().rho) < float(base.rho)
    # every target met: the plan's dense error analysis (not the solver's algebra)
    v = plan.query_variances()
    start = 0
    for g, part in zip(PL94_FULL_GROUPS, W.parts, strict=True):
        stop = start + part.shape[0]
        closed = 1 / (2 * float(base.rho) * float(QUERY_SHARES["block"][g]))
        assert v[start:stop].max() <= closed * (1 + 1e-6), g
        start = stop


def test_hdmm_weights():
    dom = Domain(a=4, b=3)
    W = VStack([Ones(12), marginal(dom, ["a"]), Identity(12)], names=["total", "a", "cells"])
    scaled = weighted_workload(W, {"total": 9})
    np.testing.assert_allclose(scaled.weights, [3, 1, 1])
    plain = select(W, zCDP(1), "hdmm", domain=dom, restarts=1)
    heavy = select(W, zCDP(1), "hdmm", domain=dom, restarts=1, weights={"total": 1000})
    assert heavy.query_variances()[0] < plain.query_variances()[0]
    assert heavy.workload is W and heavy.info["weights"] == {"total": 1000.0}
    with pytest.raises(PlanError, match="query groups"):
        select(W, zCDP(1), "hdmm", domain=dom, weights={"nope": 2})
    with pytest.raises(PlanError, match="positive"):
        select(W, zCDP(1), "hdmm", domain=dom, weights={"total": -1})
    with pytest.raises(PlanError, match="hdmm"):
        select(W, zCDP(1), "identity", domain=dom, weights={"total": 2})
    preset = select(pl94_full(), zCDP(1), "hdmm", weights="pl94", restarts=1)
    assert preset.info["weights"]["total"] > preset.info["weights"]["votingage"]


def test_plan_states_both_relations():
    from dpdask.linalg import Dense

    plan = select(pl94_full(), level_budget(zCDP(RHO), "county"), "tda-2020", level="county")
    nb = plan.summary(as_dict=True)["neighbours"]
    assert nb["gram_nonnegative"] is True
    assert Fraction(nb["change-one"]["rho"]) == 2 * Fraction(nb["add-remove"]["rho"])
    assert "change-one-record" in plan.summary()
    # a strategy with a negative Gram entry gets the bound for any strategy (4x)
    W = Dense(np.array([[1.0, -1.0], [0.0, 1.0]]))
    other = select(W, zCDP(1), "workload")
    assert Fraction(other.summary(as_dict=True)["neighbours"]["change-one"]["rho"]) == 4


def test_shipped_spec_spends_the_bureaus_level_budgets():
    import pathlib

    from dpdask.pipeline import load_spec

    root = pathlib.Path(__file__).resolve().parents[2]
    spec = load_spec(root / "pipelines" / "tda2020-synthetic.yaml")
    budgets = spec.level_budgets(spec.levels)
    for lv, b in budgets.items():
        bureau = float(RHO) * float(LEVEL_SHARES[lv])
        assert float(b.rho) == pytest.approx(bureau, rel=1e-6), lv
        assert spec.level_strategy(lv) == ("tda-2020", {"level": lv})
