"""``strategy: tda-2020`` on the 252-cell pl94 domain: the Bureau's groups without hhgq.

Oracle: the strategy built densely here with numpy (Kronecker products of ones and
identities, scaled by the square roots of the renormalised shares) and the
least-squares variances ``sigma^2 W (A^T A)^-1 W^T`` with ``sigma^2 = 1 / (2 rho)``
(sensitivity 1, closed form) computed from it.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpdask import census
from dpdask.errors import PlanError
from dpdask.privacy import PureDP, zCDP
from dpdask.strategy import select
from dpdask.strategy.tda2020 import (
    LEVELS,
    PL94_GROUPS,
    QUERY_SHARES,
    level_budget,
    pl94_shares,
    tda2020_plan,
)
from dpdask.workloads import pl94
from dpdask.workloads.products import product

SIZES = {"votingage": 2, "hispanic": 2, "cenrace": 63}


def _dense_group(name: str) -> np.ndarray:
    factors = [
        np.eye(n) if attr in name.split("*") else np.ones((1, n)) for attr, n in SIZES.items()
    ]
    out = factors[0]
    for f in factors[1:]:
        out = np.kron(out, f)
    return out


@pytest.mark.parametrize("level", LEVELS)
def test_shares_are_the_bureaus_renormalised(level):
    shares, bureau = pl94_shares(level), QUERY_SHARES[level]
    assert sum(shares.values()) == 1
    kept = sum(bureau.values()) - bureau["hhinstlevels"] - bureau["hhgq"]
    for group, parts in PL94_GROUPS.items():
        expected = sum((bureau[p] for p in parts), Fraction(0)) / kept
        assert shares.get(group, Fraction(0)) == expected, group
    assert ("total" in shares) == (level != "us")


@pytest.mark.parametrize("level", ["state", "county", "block"])
def test_plan_variances_match_the_dense_oracle(level):
    domain = census.pl94_domain()
    W = pl94(domain)
    budget = level_budget(zCDP(Fraction(12781127905, 10**10)), level)
    plan = select(W, budget, "tda-2020", domain=domain, level=level)
    assert plan.template == "tda-2020"
    shares = pl94_shares(level)
    A = np.vstack([np.sqrt(float(q)) * _dense_group(g) for g, q in shares.items()])
    assert np.allclose(np.linalg.norm(A, axis=0), 1.0)  # every cell: sensitivity 1
    sigma2 = 1 / (2 * float(budget.rho))
    Wd = W.dense()
    oracle = sigma2 * np.einsum("ij,jk,ik->i", Wd, np.linalg.inv(A.T @ A), Wd)
    np.testing.assert_allclose(plan.query_variances(), oracle, rtol=1e-8)
    # the total is estimated at least as well as its own measurement, 1 / (2 rho l q')
    total = select(product(domain), budget, "tda-2020", domain=domain, level=level)
    ones = np.ones(domain.size)
    np.testing.assert_allclose(
        total.query_variances(), [sigma2 * ones @ np.linalg.solve(A.T @ A, ones)], rtol=1e-8
    )
    assert total.query_variances()[0] <= sigma2 / float(shares["total"]) * (1 + 1e-9)


def test_pure_dp_and_bad_workloads_are_refused():
    domain = census.pl94_domain()
    with pytest.raises(PlanError, match="Gaussian"):
        tda2020_plan(pl94(domain), PureDP(1), level="county", domain=domain)
    with pytest.raises(PlanError, match="unknown level"):
        tda2020_plan(pl94(domain), zCDP(1), level="nation", domain=domain)
