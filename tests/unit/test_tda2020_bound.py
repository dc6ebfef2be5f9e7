"""The lower bound on the budget of matching the Bureau's variances (tda2020_bound)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpdask.errors import ArgumentError
from dpdask.privacy import zCDP
from dpdask.strategy.tda2020 import (
    PERSONS_RHO_ADD_REMOVE,
    QUERY_SHARES,
    fitness_plan,
    tda2020_strategy,
)
from dpdask.strategy.tda2020_bound import (
    _sqrt_trace,
    budget_ratio_bound,
    cost_bound,
    group_gram_blocks,
)
from dpdask.workloads.pl94_full import PL94_FULL_GROUPS, pl94_full, pl94_full_group


@pytest.fixture(scope="module")
def grams() -> list[np.ndarray]:
    out = []
    for g in PL94_FULL_GROUPS:
        W = np.asarray(pl94_full_group(g).dense(), dtype=float)
        out.append(W.T @ W)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocks_trace_root_matches_dense(grams: list[np.ndarray], seed: int) -> None:
    """tr(G^(1/2)) and its gradient from the 8 x 8 blocks equal a dense eigh of G."""
    lam = np.random.default_rng(seed).random(len(PL94_FULL_GROUPS))
    lam[seed] = 0.0  # a group left out
    blocks, mult = group_gram_blocks()
    value, grad = _sqrt_trace(lam, blocks, mult)
    G = sum(w * M for w, M in zip(lam, grams, strict=True))
    ev, vec = np.linalg.eigh(G)
    ev = np.clip(ev, 0, None)
    assert value == pytest.approx(np.sqrt(ev).sum(), rel=1e-9)
    keep = ev > 1e-9 * ev.max()
    root_inv = (vec[:, keep] / np.sqrt(ev[keep])) @ vec[:, keep].T
    dense_grad = [0.5 * float(np.sum(root_inv * M)) for M in grams]
    np.testing.assert_allclose(grad, dense_grad, rtol=1e-7)


def test_detailed_alone_is_its_closed_form() -> None:
    """Every cell at variance c needs cost >= 1 / c (trace bound, tight for c I)."""
    assert cost_bound({"detailed": 0.25}).cost == pytest.approx(4.0, rel=1e-9)
    assert cost_bound({"total": 2.0}).cost == pytest.approx(0.5, rel=1e-6)


def test_bound_holds_for_the_bureaus_own_mechanism() -> None:
    """tda-2020 meets its own targets at cost 2 rho_l: the bound may not exceed it."""
    for level in ("state", "tract", "block"):
        A, _ = tda2020_strategy(level)
        M = np.asarray(A.gram().dense(), dtype=float)
        cost = float(np.diag(M).max())  # unit noise: sigma^2 = 1 / cost for rho_l = 1/2
        assert cost == pytest.approx(1.0)
        targets = {g: 1 / float(QUERY_SHARES[level][g]) for g in QUERY_SHARES[level]
                   if QUERY_SHARES[level][g] > 0}  # fmt: skip
        assert cost_bound(targets).cost <= cost * (1 + 1e-9)


@pytest.mark.parametrize("level", ["county", "block"])
def test_fitness_plan_reaches_the_bound(level: str) -> None:
    """The fitness plan's certified ratio is at least the bound, and within 0.5% of it."""
    ratio = fitness_plan(pl94_full(), None, level=level).info["budget_ratio"]
    bound = budget_ratio_bound(level)
    assert bound <= ratio * (1 + 1e-6)
    assert ratio <= bound * 1.005
    shares = QUERY_SHARES[level]
    assert bound >= max(float(shares["total"]), float(shares["detailed"])) - 1e-9


def test_ratio_does_not_depend_on_rho() -> None:
    a = budget_ratio_bound("tract")
    b = budget_ratio_bound("tract", zCDP(Fraction(PERSONS_RHO_ADD_REMOVE) * 3))
    assert a == pytest.approx(b, rel=1e-6)


@pytest.mark.parametrize(
    ("targets", "match"),
    [({"detailed": 0.0}, "positive"), ({"nope": 1.0}, "unknown"),
     ({"total": float("nan")}, "positive")],
)  # fmt: skip
def test_bad_targets(targets: dict[str, float], match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        cost_bound(targets)
