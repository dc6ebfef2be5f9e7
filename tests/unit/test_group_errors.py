"""Per level and query group: measured and reconstructed (tree GLS) standard deviations.

Oracles: the stacked least-squares problem over every unit of a small tree with the
sum constraints (dense, null-space), ``sigma^2 W (A^T A)^-1 W^T`` computed with numpy,
and the Bureau's closed form ``1 / (2 rho l q)``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.linalg

from dpdask.errors import ArgumentError, PlanError
from dpdask.linalg import Dense, Identity, Kron, Ones, Total, VStack
from dpdask.measure import lattice
from dpdask.privacy import PureDP, zCDP
from dpdask.strategy import Plan
from dpdask.strategy.group_errors import (
    group_errors,
    measured_group_variances,
    tda2020_level_plans,
    tree_information,
)
from dpdask.strategy.tda2020 import (
    LEVEL_SHARES,
    LEVELS,
    PERSONS_RHO_ADD_REMOVE,
    QUERY_SHARES,
    tda2020_groups,
)
from dpdask.workloads.pl94_full import PL94_FULL_GROUPS


# -- the oracle: the stacked GLS over every unit, with the sum constraints -----------------
def _tree(fanouts: tuple[int, ...]) -> list[list[int]]:
    """Units per level (``fanouts[0]`` roots) and each unit's parent (-1 at the top)."""
    parents: list[list[int]] = [[-1] * fanouts[0]]
    for f in fanouts[1:]:
        parents.append([p for p in range(len(parents[-1])) for _ in range(f)])
    return parents


def _stacked_covariances(
    strategies: list[np.ndarray], row_vars: list[float], fanouts: tuple[int, ...]
) -> list[np.ndarray]:
    """Covariance of the GLS estimate of the first unit of each level, from one dense
    problem: unknowns every unit's histogram, rows every unit's measurement, subject to
    ``x_parent = sum x_children`` (solved on the constraints' null space)."""
    n = strategies[0].shape[1]
    parents = _tree(fanouts)
    offset = np.cumsum([0] + [len(p) for p in parents])
    z = int(offset[-1]) * n
    blocks, cons = [], []
    for lv, par in enumerate(parents):
        A = strategies[lv] / math.sqrt(row_vars[lv])
        for u in range(len(par)):
            B = np.zeros((A.shape[0], z))
            col = (offset[lv] + u) * n
            B[:, col : col + n] = A
            blocks.append(B)
        if lv:  # x_p - sum_children x_c = 0
            for p in range(len(parents[lv - 1])):
                C = np.zeros((n, z))
                col = (offset[lv - 1] + p) * n
                C[:, col : col + n] = np.eye(n)
                for u, q in enumerate(par):
                    if q == p:
                        col = (offset[lv] + u) * n
                        C[:, col : col + n] -= np.eye(n)
                cons.append(C)
    B = np.vstack(blocks)
    N = scipy.linalg.null_space(np.vstack(cons)) if cons else np.eye(z)
    cov = N @ np.linalg.pinv(N.T @ B.T @ B @ N) @ N.T
    return [cov[o * n : (o + 1) * n, o * n : (o + 1) * n] for o in offset[:-1]]


def _random_strategies(rng: np.random.Generator, n: int, levels: int, deficient: bool):
    """Random full-rank strategies; with ``deficient`` the levels above the finest
    measure fewer rows than cells (their information matrices are singular)."""
    out = []
    for lv in range(levels):
        rows = n + 2
        if deficient and lv < levels - 1:
            rows = 1 if lv == 0 else n // 2
        out.append(rng.normal(size=(rows, n)))
    return out


@pytest.mark.parametrize(
    "fanouts",
    [(1, 2, 3), (2, 3, 2), (1, 3), (1, 1, 2), (2, 2, 2, 2), (1, 3, 1)],
    ids=lambda f: "x".join(map(str, f)),
)
@pytest.mark.parametrize("n", [6, 9])
@pytest.mark.parametrize("deficient", [False, True])
def test_tree_gls_equals_the_stacked_dense_gls(fanouts, n, deficient) -> None:
    rng = np.random.default_rng(hash((fanouts, n, deficient)) % 2**32)
    As = _random_strategies(rng, n, len(fanouts), deficient)
    row_vars = list(rng.uniform(0.3, 3.0, size=len(fanouts)))
    infos = [A.T @ A / v for A, v in zip(As, row_vars, strict=True)]
    totals = tree_information(infos, [None, *fanouts[1:]])
    expected = _stacked_covariances(As, row_vars, fanouts)
    for lv, (T, C) in enumerate(zip(totals, expected, strict=True)):
        got = scipy.linalg.pinvh(T)
        scale = np.abs(C).max()
        np.testing.assert_allclose(got, C, atol=1e-8 * scale, rtol=0, err_msg=f"level {lv}")


def test_tree_information_refuses_a_missing_fanout() -> None:
    M = np.eye(3)
    with pytest.raises(ArgumentError, match="fan-out"):
        tree_information([M, M], [None, None])
    with pytest.raises(ArgumentError, match="fan-out"):
        tree_information([M, M], [None, 0.5])
    with pytest.raises(ArgumentError, match="fan-outs"):
        tree_information([M, M], [None])


# -- group figures against dense computations ------------------------------------------
def _small_workload() -> VStack:
    """Three named groups on a 2 x 3 domain: the total, the first attribute, every cell."""
    return VStack(
        [Total(6), Kron([Identity(2), Ones(3)]), Identity(6)],
        names=["total", "a", "cells"],
    )


def _dense_group_sd(W: np.ndarray, cov: np.ndarray, rows: list[slice]) -> list[float]:
    v = np.diag(W @ cov @ W.T)
    return [math.sqrt(v[r].mean()) for r in rows]


_ROWS = [slice(0, 1), slice(1, 3), slice(3, 9)]


def test_one_level_group_sd_equals_dense_least_squares() -> None:
    rng = np.random.default_rng(5)
    A = rng.normal(size=(8, 6))
    W = _small_workload()
    rho = Fraction(3, 4)
    plan = Plan(W, Dense(A), zCDP(rho))
    # Gaussian noise: sigma^2 = (largest column L2 norm)^2 / (2 rho), per measured row
    sigma2 = float(np.linalg.norm(A, axis=0).max() ** 2 / (2 * float(rho)))
    expected = _dense_group_sd(W.dense(), sigma2 * np.linalg.inv(A.T @ A), _ROWS)
    (level,) = group_errors({"only": plan})
    assert level.note is None and level.fanout is None
    assert [g.group for g in level.groups] == ["total", "a", "cells"]
    assert [g.queries for g in level.groups] == [1, 2, 6]
    for g, want in zip(level.groups, expected, strict=True):
        assert g.sd_measured == pytest.approx(want, rel=1e-9)
        assert g.sd_reconstructed == pytest.approx(want, rel=1e-9)  # one level: its own LS


def test_two_level_group_sd_equals_the_stacked_dense_gls() -> None:
    rng = np.random.default_rng(11)
    W = _small_workload()
    As = [rng.normal(size=(3, 6)), rng.normal(size=(7, 6))]  # the top is rank-deficient
    top_identity = np.vstack([As[0], np.eye(6)])  # so that the top plan answers W itself
    As[0] = top_identity
    budgets = [zCDP(Fraction(1, 2)), zCDP(Fraction(3, 2))]
    plans = {lv: Plan(W, Dense(A), b) for lv, A, b in zip(("p", "c"), As, budgets, strict=True)}
    row_vars = [
        float(np.linalg.norm(A, axis=0).max() ** 2 / (2 * float(b.rho)))
        for A, b in zip(As, budgets, strict=True)
    ]
    covs = _stacked_covariances(As, row_vars, (1, 3))
    levels = group_errors(plans, {"c": 3.0})
    Wd = W.dense()
    for le, A, v, C in zip(levels, As, row_vars, covs, strict=True):
        assert le.note is None
        measured = _dense_group_sd(Wd, v * np.linalg.inv(A.T @ A), _ROWS)
        recon = _dense_group_sd(Wd, C, _ROWS)
        for g, m, r in zip(le.groups, measured, recon, strict=True):
            assert g.sd_measured == pytest.approx(m, rel=1e-9)
            assert g.sd_reconstructed == pytest.approx(r, rel=1e-7)
            assert g.sd_reconstructed <= g.sd_measured * (1 + 1e-9)  # GLS uses more
    assert levels[1].fanout == 3.0


@pytest.mark.parametrize("fanout", [1, 2])
def test_an_unmeasured_level_adds_no_information(fanout) -> None:
    """A spine level (``unmeasured``): its plan is its receiver's, but it measures
    nothing. The oracle is the stacked dense GLS of the tree whose child has no rows:
    the parent's reconstructed sd is then its own measured sd, and with one child the
    child's is the parent's (the same estimate)."""
    rng = np.random.default_rng(17)
    W = _small_workload()
    A = np.vstack([rng.normal(size=(4, 6)), np.eye(6)])
    plan = Plan(W, Dense(A), zCDP(Fraction(1, 2)))
    v = float(np.linalg.norm(A, axis=0).max() ** 2 / 1.0)  # sigma^2 at rho = 1/2
    covs = _stacked_covariances([A, np.zeros((0, 6))], [v, 1.0], (1, fanout))
    top, child = group_errors({"p": plan, "c": plan}, {"c": float(fanout)}, unmeasured={"c"})
    Wd = W.dense()
    own = _dense_group_sd(Wd, v * np.linalg.inv(A.T @ A), _ROWS)
    for g, m in zip(top.groups, own, strict=True):
        assert g.sd_measured == pytest.approx(m, rel=1e-9)
        assert g.sd_reconstructed == pytest.approx(m, rel=1e-7)
    assert all(g.sd_measured is None for g in child.groups)
    if fanout == 1:  # the child's estimate is determined: the parent's
        recon = _dense_group_sd(Wd, covs[1], _ROWS)
        for g, r, m in zip(child.groups, recon, own, strict=True):
            assert g.sd_reconstructed == pytest.approx(r, rel=1e-7)
            assert g.sd_reconstructed == pytest.approx(m, rel=1e-7)
    measured_twice = group_errors({"p": plan, "c": plan}, {"c": float(fanout)})
    assert measured_twice[0].groups[0].sd_reconstructed < top.groups[0].sd_reconstructed


def test_reconstructed_is_missing_with_a_reason() -> None:
    W = _small_workload()
    plans = {"p": Plan(W, Identity(6), zCDP(1)), "c": Plan(W, Identity(6), zCDP(1))}
    levels = group_errors(plans)  # no fan-out
    assert all(g.sd_reconstructed is None for le in levels for g in le.groups)
    assert all("fan-out" in (le.note or "") for le in levels)
    assert all(g.sd_measured is not None for le in levels for g in le.groups)
    big = Plan(Identity(5000), Identity(5000), zCDP(1))
    (le,) = group_errors({"x": big})
    assert "5,000 cells" in (le.note or "") and le.groups[0].sd_reconstructed is None
    # Identity measured with sigma^2 = 1 / (2 rho) = 1/2 per cell
    assert le.groups[0].sd_measured == pytest.approx(math.sqrt(0.5), rel=1e-12)


# -- the Bureau's strategy: the closed form 1 / (2 rho l q) -------------------------------
def _closed_form(rho: Fraction, level: str, group: str) -> float:
    """The variance of a measured answer; the US ``total`` is the sum of the 2,016
    detailed cells, each measured with its own noise."""
    share = LEVEL_SHARES[level]
    if group not in tda2020_groups(level):
        return 2016 / float(2 * rho * share * QUERY_SHARES[level]["detailed"])
    return 1 / float(2 * rho * share * QUERY_SHARES[level][group])


def test_tda2020_measured_sd_is_the_closed_form_at_every_level() -> None:
    rho = Fraction(PERSONS_RHO_ADD_REMOVE)
    plans = tda2020_level_plans(zCDP(rho), LEVELS)  # all six levels: the persons budget
    for lv, plan in plans.items():
        got = measured_group_variances(plan)
        assert list(got) == list(PL94_FULL_GROUPS)
        for g, (_q, var) in got.items():
            assert var == pytest.approx(_closed_form(rho, lv, g), rel=1e-9), (lv, g)
    # the facts sheet's computed total-population sd (county, tract, block group)
    sd = {lv: math.sqrt(measured_group_variances(plans[lv])["total"][1]) for lv in plans}
    assert [round(sd[lv], 2) for lv in ("county", "tract", "block_group")] == [2.17, 2.47, 1.75]


def test_tda2020_spends_the_same_total_in_the_bureaus_proportions() -> None:
    # two levels at 1887 / 4099 of the persons budget: the persons budget is recovered
    persons = Fraction(PERSONS_RHO_ADD_REMOVE)
    total = persons * (LEVEL_SHARES["state"] + LEVEL_SHARES["county"])
    plans = tda2020_level_plans(zCDP(total), ["state", "county"])
    assert sum(Fraction(p.privacy.rho) for p in plans.values()) == total
    for lv, plan in plans.items():
        assert Fraction(plan.privacy.rho) == persons * LEVEL_SHARES[lv]
        for g, (_q, var) in measured_group_variances(plan).items():
            assert var == pytest.approx(_closed_form(persons, lv, g), rel=1e-9)


def test_tda2020_at_the_noise_drawn_is_the_closed_form_times_the_lattice_inflation() -> None:
    """As a release measures it (the Gram root on a lattice of step ``h = 2**-k``), every
    variance is the closed form times one factor per level: ``(s' / s)^2`` with ``s'`` the
    scale drawn, which the lattice bounds by ``(1 + 2 sqrt(m) h / D)^2`` (``D = 1`` the
    sensitivity, ``m`` rows; module notes of :mod:`dpdask.measure`), up to the float
    padding of ``D`` (``2**-24``) and the rounding up of ``s'``. The discrete Gaussian's
    variance differs from its scale squared by a relative ``~ 4 pi^2 s^2 exp(-2 pi^2 s^2)``
    (``s`` in grid steps, here above 100): nothing at double precision."""
    rho = Fraction(PERSONS_RHO_ADD_REMOVE)
    plans = tda2020_level_plans(zCDP(rho * LEVEL_SHARES["county"]), ["county"])
    level = plans["county"].at(plans["county"].privacy)
    lat = lattice(level, np.int64)
    drawn = level.realise(lat)
    factor = (lat.noise_scale / level.noise_scale) ** 2
    m = level.strategy.shape[0]
    assert 1 <= factor <= (1 + 2 * math.sqrt(m) * 2.0**-lat.k + 2.0**-20) ** 2
    for g, (_q, var) in measured_group_variances(drawn).items():
        assert var == pytest.approx(factor * _closed_form(rho, "county", g), rel=1e-9), g


def test_tda2020_level_plans_refuse_what_the_bureau_has_not() -> None:
    with pytest.raises(PlanError, match="levels"):
        tda2020_level_plans(zCDP(1), ["county", "district"])
    with pytest.raises(PlanError, match="zCDP"):
        tda2020_level_plans(PureDP(1), ["county"])  # type: ignore[arg-type]
