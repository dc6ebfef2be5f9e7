"""Gaussian OPT_0 by the convex program, and the in-process path of small problems."""

from __future__ import annotations

import pytest

from dpdask import Domain, select
from dpdask.linalg import AllRange, Identity, Kron, Prefix
from dpdask.privacy import PureDP, zCDP
from dpdask.strategy import opt_0
from dpdask.strategy._gram import Gram
from dpdask.strategy.convex import ca_solve
from dpdask.strategy.hdmm import _hdmm, _pieces, _tasks
from dpdask.strategy.hdmm._optimize import CONVEX_TOL

GAP = 1e-3  # within 0.1% of the optimum


@pytest.mark.parametrize("W", [Prefix(64), AllRange(64), Prefix(100)])
def test_gaussian_opt0_within_gap_of_the_convex_optimum(W) -> None:
    plan = select(W, zCDP("0.5"), restarts=1)
    loss = plan.sensitivity**2 * plan.analysis.total()  # an independent evaluation
    opt = ca_solve(W, tol=1e-9)  # certified: lower_bound <= every strategy's loss
    assert opt.converged
    assert opt.lower_bound * (1 - 1e-9) <= loss <= opt.lower_bound * (1 + GAP)
    assert plan.strategy.sensitivity(2) == pytest.approx(1.0)
    assert plan.svd_bound() <= loss * (1 + 1e-9)  # the SVD bound is a lower bound
    # no worse than the p-Identity optimiser with p = n, up to the convex solver's gap
    _, f, _ = opt_0(Gram.of(W), W.shape[1], norm=2, seed=0)
    assert loss <= f * (1 + CONVEX_TOL)


def test_gaussian_kron_factors_are_convex_optima() -> None:
    W = Kron([Prefix(24), AllRange(12)])
    plan = select(W, zCDP(1), restarts=2)
    loss = plan.sensitivity**2 * plan.analysis.total()
    # a single term: the optimum of the product template is the product of the factors' optima
    lower = (
        ca_solve(Prefix(24), tol=1e-9).lower_bound * ca_solve(AllRange(12), tol=1e-9).lower_bound
    )
    assert lower * (1 - 1e-9) <= loss <= lower * (1 + GAP)


def test_pure_dp_opt0_is_unchanged() -> None:
    plan = select(Prefix(64), PureDP(1), restarts=2)
    assert plan.info.get("solver") is None and plan.info["p"] >= 1
    assert plan.expected_error() < select(Prefix(64), PureDP(1), "hb").expected_error()


def test_small_problems_run_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real, real_scheduler = _tasks.run_tasks, _tasks._scheduler

    def spy(tasks, client=None, inline=False):
        calls.append(inline)
        return real(tasks, client, inline=inline)

    def no_scheduler(client):
        raise AssertionError("a small problem reached a Dask scheduler")

    monkeypatch.setattr(_pieces, "run_tasks", spy)
    monkeypatch.setattr(_tasks, "_scheduler", no_scheduler)
    dom = Domain(age=12, sex=2, race=5)
    W = Kron([Prefix(12), Identity(2), AllRange(5)])
    inline = select(W, PureDP(1), domain=dom, restarts=2, client=object())
    assert calls and all(calls)
    assert inline.info["in_process"] is True
    monkeypatch.setattr(_tasks, "_scheduler", real_scheduler)
    monkeypatch.setattr(_hdmm, "INLINE_MAX_CELLS", 0)
    calls.clear()
    graph = select(W, PureDP(1), domain=dom, restarts=2)
    assert calls and not any(calls)
    assert graph.expected_error() == pytest.approx(inline.expected_error(), rel=1e-9)
