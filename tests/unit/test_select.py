"""dpdask.select: templates, baselines, Dask tasks, SF1, scale, CLI and bench."""

from __future__ import annotations

import itertools
import json
import re
import tracemalloc

import dask
import numpy as np
import pytest

from dpdask import Domain, census, select
from dpdask.cli import main
from dpdask.errors import BudgetTypeError, PlanError
from dpdask.linalg import AllRange, Identity, Kron, Ones, Prefix, VStack
from dpdask.privacy import PureDP, zCDP
from dpdask.strategy import PIdentity, optimize, squared_error
from dpdask.strategy._terms import kron_terms
from dpdask.strategy.hdmm import _tasks
from dpdask.workloads import sf1_persons

KEY = re.compile(r"^optimize(-[a-z]+)+-[0-9a-f]{32}$")


def _stand_in() -> tuple[VStack, Domain]:
    """A small union of Kronecker products shaped like the Census tables."""
    dom = Domain(sex=2, race=5, rel=4, age=12)
    W = VStack(
        [
            Kron([Identity(2), Ones(5), Ones(4), AllRange(12)]),
            Kron([Ones(2), Identity(5), Ones(4), Ones(12)]),
            Kron([Identity(2), Identity(5), Ones(4), Prefix(12)]),
            Kron([Ones(2), Ones(5), Identity(4), Ones(12)]),
            Kron([Identity(2), Ones(5), Identity(4), Prefix(12)]),
        ]
    )
    return W, dom


def _dense_error(W: np.ndarray, A: np.ndarray) -> float:
    return float(np.linalg.norm(W @ np.linalg.pinv(A), "fro") ** 2)


def test_hdmm_on_a_union_picks_the_best_template() -> None:
    W, dom = _stand_in()
    plan = select(W, PureDP(1), domain=dom, restarts=2)
    losses = plan.info["templates"]
    assert set(losses) == {"kron", "union", "marginals", "identity"}
    assert plan.template == "hdmm-" + min(losses, key=losses.get)
    # the plan's error is the dense matrix mechanism formula (2 b^2 ||W A^+||_F^2)
    A = plan.strategy.dense()
    b = plan.noise_scale
    assert plan.noise_scale == pytest.approx(np.abs(A).sum(axis=0).max())
    assert plan.expected_error() == pytest.approx(2 * b * b * _dense_error(W.dense(), A), rel=1e-8)
    assert plan.expected_error() < 0.8 * plan.identity_error()


def test_templates_are_consistent_with_the_analytics() -> None:
    W, dom = _stand_in()
    terms = kron_terms(W, dom.shape)
    for cand in optimize(terms, 1, restarts=2, names=dom.attrs):
        A = cand.strategy
        err = A.sensitivity(1) ** 2 * _dense_error(W.dense(), A.dense())
        assert cand.loss == pytest.approx(err, rel=1e-5), cand.name


def test_selection_is_deterministic_and_seeded() -> None:
    W, dom = _stand_in()
    a = select(W, PureDP(1), domain=dom, restarts=2, seed=5, templates=["kron"])
    b = select(W, PureDP(1), domain=dom, restarts=2, seed=5, templates=["kron"])
    np.testing.assert_array_equal(a.strategy.dense(), b.strategy.dense())


@pytest.mark.parametrize("name", ["identity", "workload", "hierarchical", "hb", "wavelet"])
def test_baselines(name: str) -> None:
    plan = select(Prefix(16), PureDP(1), name)
    assert plan.template == name
    A = plan.strategy.dense()
    b = np.abs(A).sum(axis=0).max()
    assert plan.expected_error() == pytest.approx(2 * b * b * _dense_error(Prefix(16).dense(), A))
    hdmm = select(Prefix(16), PureDP(1), restarts=2)
    assert hdmm.expected_error() <= plan.expected_error() * 1.001


def test_convex_baseline_is_gaussian_only() -> None:
    W = AllRange(8)
    plan = select(W, zCDP(1), "convex")
    hdmm = select(W, zCDP(1), restarts=2)
    assert plan.expected_error() <= hdmm.expected_error() * (1 + 1e-6)  # CA is the optimum
    with pytest.raises(PlanError, match="Gaussian"):
        select(W, PureDP(1), "convex")
    with pytest.raises(PlanError, match="unknown strategy"):
        select(W, PureDP(1), "bogus")


@pytest.mark.parametrize("strategy", ["hdmm", "identity", "tda-2020"])
def test_only_fitness_plans_without_a_budget(strategy: str) -> None:
    # privacy=None asks fitness-for-use for the least budget; any other strategy
    # spends a budget, and refuses None as not a budget (a TypeError)
    with pytest.raises(BudgetTypeError, match="needs a privacy budget"):
        select(Prefix(8), None, strategy)


def test_select_plans_a_dense_matrix_workload() -> None:
    # an ndarray workload is a Dense operator: HDMM plans it as it plans Identity(4)
    # (it used to fail on the array's missing Gram); the identity's error, 2 b^2 per
    # cell with b = 1, bounds the optimum
    plan = select(np.eye(4), PureDP(1), restarts=1)
    assert plan.workload.shape == (4, 4)
    assert plan.expected_error() <= 8.0 * (1 + 1e-9)
    assert plan.expected_error() == pytest.approx(
        select(Identity(4), PureDP(1), restarts=1).expected_error(), rel=1e-9
    )


def test_task_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = _tasks.run_tasks

    def spy(tasks, client=None, inline=False):
        seen.extend(t.key for t in tasks)
        return real(tasks, client, inline=inline)

    monkeypatch.setattr("dpdask.strategy.hdmm._pieces.run_tasks", spy)
    monkeypatch.setattr("dpdask.strategy.hdmm._hdmm.INLINE_MAX_CELLS", 0)  # keys: the Dask path
    dom = Domain(age=12, sex2=2, race=5)
    select(Kron([Prefix(12), Identity(2), AllRange(5)]), PureDP(1), domain=dom, restarts=2)
    assert seen and all(KEY.match(k) for k in seen)
    assert {k.rsplit("-", 1)[0] for k in seen} == {"optimize-factor-age", "optimize-factor-race"}
    seen.clear()
    W, dom = _stand_in()
    select(W, PureDP(1), domain=dom, restarts=2, templates=["kron", "marginals", "union"])
    prefixes = {k.rsplit("-", 1)[0] for k in seen}
    assert {"optimize-restart-kron", "optimize-restart-marginals"} <= prefixes
    assert any(p.startswith("optimize-part-") for p in prefixes)
    assert all(KEY.match(k) for k in seen)


def test_sync_scheduler_runs_in_process() -> None:
    with dask.config.set(scheduler="sync"):
        plan = select(Prefix(32), PureDP(1), restarts=2)
    assert isinstance(plan.strategy, PIdentity)


def test_sf1_identity_ratio() -> None:
    """SF1 persons on the CPH domain (pure DP): Identity's RMSE over HDMM's is at least 12."""
    dom = census.cph_domain()
    plan = select(sf1_persons(dom), PureDP(1), domain=dom, restarts=3)
    ratio = np.sqrt(plan.identity_error() / plan.expected_error())
    assert ratio >= 12.0
    assert plan.groups is None  # exact least-squares error, not a block bound


def test_analytics_never_densify() -> None:
    """OPT_+ on SF1 and a Kron strategy on all 3-way marginals over 240,000 cells."""
    dom = census.cph_domain()
    plan = select(sf1_persons(dom), PureDP(1), domain=dom, restarts=1, templates=["union"])
    sizes = (75, 16, 5, 2, 20)
    marg = VStack(
        [
            Kron([Identity(n) if i in c else Ones(n) for i, n in enumerate(sizes)])
            for c in itertools.combinations(range(5), 3)
        ]
    )
    kron = select(
        marg, PureDP(1), domain=Domain(a=75, b=16, c=5, d=2, e=20), restarts=1, templates=["kron"]
    )
    with dask.config.set({"dpdask.linalg.max-dense-elements": 1_000_000}):
        tracemalloc.start()
        e1, v1 = plan.expected_error(), plan.query_variances()
        e2, v2 = kron.expected_error(), kron.query_variances()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert v1.size == 4327 and v2.size == marg.shape[0]
    assert e1 == pytest.approx(v1.sum(), rel=1e-9)
    assert e2 == pytest.approx(v2.sum(), rel=1e-9)
    assert peak < 300e6  # N x N would be 240,000^2 or 492,660^2 doubles


def test_cli_plan_json(capsys: pytest.CaptureFixture) -> None:
    rc = main(
        ["plan", "--workload", "prefix", "--n", "32", "--epsilon", "1", "--json", "--restarts", "1"]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mechanism"] == "laplace" and d["queries"] == 32
    assert d["expected_total_squared_error"] < d["identity_total_squared_error"]
    rc = main(
        ["plan", "--workload", "prefix", "--n", "32", "--rho", "1/2", "--strategy", "identity"]
    )
    assert rc == 0
    assert "gaussian" in capsys.readouterr().out
    args = ["plan", "--workload", "prefix", "--n", "8", "--epsilon", "1", "--strategy", "bogus"]
    assert main(args) == 2


def test_bench_select_smoke() -> None:
    import argparse

    from dpdask_benchmarks import select as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = bench.run(parser.parse_args(["--cases", "opt0", "--opt0-sizes", "64", "--repeats", "1"]))
    row = out["opt0"][0]
    assert row["identity_rmse_ratio"] > 1.0
    assert row["error_over_p256_reference"] is None  # the reference is at n = 4096 only
    json.dumps(out)


def test_optimised_strategy_has_unit_sensitivity() -> None:
    W, dom = _stand_in()
    for norm, privacy in ((1, PureDP(1)), (2, zCDP(1))):
        plan = select(W, privacy, domain=dom, restarts=1)
        assert plan.strategy.sensitivity(norm) == pytest.approx(1.0)
        assert squared_error(W, plan.strategy) > 0
