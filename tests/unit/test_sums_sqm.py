"""SQM in a release: the queries measured together at their joint sensitivity (<= m)."""

from __future__ import annotations

import numpy as np
import pytest

from dpdask import Domain
from dpdask.measure import lattice
from dpdask.privacy import PureDP
from dpdask.sums import NumericBins, SumWorkload, sum_mechanism


@pytest.mark.parametrize("by", [(), ("sex",)])
def test_sqm_plan_rows_and_noise(by):
    bins = NumericBins.uniform(0, 200, 20)
    dom = Domain(sex=2, wage=20) if by else Domain(wage=20)
    sums = SumWorkload(dom, "wage", bins.values, bins.prefixes(4), by=list(by))
    m = sums.shape[0]
    thetas = np.resize([35.0, np.inf, 90.0, 150.0, 60.0], m)
    sqm = sum_mechanism("SQM", sums, thetas, PureDP("0.5"))
    W = sums.counting.dense()
    Q = W * np.minimum(sums.weights[None, :], thetas[:, None])  # row i truncated at theta_i
    s = np.abs(Q).max(axis=1)
    np.testing.assert_allclose(sqm.sensitivities, s)
    np.testing.assert_allclose(sqm.noise_scales, m * s / 0.5)  # the paper's scales
    plan = sqm.plan()
    M = plan.strategy.dense()
    np.testing.assert_allclose(np.abs(M).max(axis=1), 1.0)  # every row: unit sensitivity
    joint = np.abs(M).sum(axis=0).max()
    assert joint <= m + 1e-12
    assert plan.noise_scale == pytest.approx(joint / 0.5)
    # answers = s_i times the measurements; exact on noise-free measurements
    x = np.arange(sums.shape[1], dtype=float) % 7
    np.testing.assert_allclose(sqm.answer(M @ x), Q @ x, rtol=1e-12)
    np.testing.assert_allclose(sqm.answer(np.stack([M @ x, M @ x])), np.stack([Q @ x] * 2))
    # the published variance at the lattice's scale is at most the paper's
    lat = lattice(plan, np.int64)
    assert np.all(sqm.variances_at(lat.variance) <= sqm.query_variances() * (1 + 1e-6))
    b = float(lat.noise_scale)  # continuous Laplace at the lattice's scale: 2 (s_i b)^2
    np.testing.assert_allclose(sqm.variances_at(2 * b**2), 2 * (s * b) ** 2)
