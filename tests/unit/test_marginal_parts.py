"""Pure parts of the marginal release: residual rows from records against the dense
strategy, the closed-form charge, the lattice, refusals, and the spec's workload forms."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from dpdask.datasets import wide_records
from dpdask.errors import LedgerConflictError, NoiseKeyError, SpecError
from dpdask.measure import stream_key
from dpdask.measure.residual import (
    measure_records,
    residual_block,
    residual_charge,
    residual_evaluation_error,
    residual_lattice,
    strategy_rows,
)
from dpdask.noise import SecretKey
from dpdask.pipeline._spec_plan import STRATEGIES, workloads
from dpdask.privacy import zCDP
from dpdask.strategy.residual import (
    MarginalWorkload,
    helmert,
    helmert_integer,
    helmert_scales,
    helmert_transpose,
    plan_residual,
)

SIZES = (2, 3, 4)


def _plan(sets=((0, 1), (1, 2), (0,))):
    return plan_residual(MarginalWorkload(SIZES, [list(s) for s in sets]), zCDP(1))


def _records(rng, n=200, units=3):
    codes = np.column_stack([rng.integers(0, s, n) for s in SIZES])
    return rng.integers(0, units, n), codes


def test_rows_from_records_equal_the_dense_strategy_on_the_data_vector(rng):
    plan = _plan()
    units, codes = _records(rng)
    A = plan.strategy.dense()
    x = np.zeros((3, int(np.prod(SIZES))))
    np.add.at(x, (units, np.ravel_multi_index(tuple(codes.T), SIZES)), 1)
    got = residual_block(plan, units, codes, 3)
    assert got.shape == (3, A.shape[0]) == (3, strategy_rows(plan))
    np.testing.assert_allclose(got, x @ A.T, atol=1e-9)


def test_closed_form_sensitivity_is_the_dense_column_norm():
    plan = _plan()
    A = plan.strategy.dense()
    dense = float(np.sqrt((A**2).sum(axis=0)).max())
    charge = residual_charge(plan, "r", "run", "geo", "strategy", None)
    assert charge.sensitivity == pytest.approx(dense, rel=1e-12)


def test_lattice_step_covers_the_evaluation_error(rng):
    plan = _plan()
    lat = residual_lattice(plan, max_total=10_000)
    units, codes = _records(rng, n=10_000, units=1)
    exact = residual_block(plan, units, codes, 1)
    dense = np.zeros(int(np.prod(SIZES)))
    np.add.at(dense, np.ravel_multi_index(tuple(codes.T), SIZES), 1)
    err = np.abs(exact[0] - plan.strategy.dense() @ dense).max()
    assert err <= residual_evaluation_error(plan) * 10_000 <= 2.0 ** -(lat.k + 1)
    assert lat.sensitivity >= plan.sensitivity and lat.noise_scale >= plan.noise_scale
    assert lat.noise_scale / lat.sensitivity >= plan.noise_scale / plan.sensitivity * (1 - 1e-12)


def test_measure_refuses_test_keys_and_other_charges(rng):
    plan = _plan()
    units, codes = _records(rng)
    key = SecretKey.for_testing(1)
    ident = ("r", "geo", 0, "strategy")
    receipt = residual_charge(plan, "r", "run", "geo", "strategy", key.fingerprint())
    with pytest.raises(NoiseKeyError):
        measure_records(plan, units, codes, 3, key, ident, receipt, "run")
    other = residual_charge(plan, "r", "run", "county", "strategy", key.fingerprint())
    with pytest.raises(LedgerConflictError):
        measure_records(plan, units, codes, 3, key, ident, other, "run", test_mode=True)
    sk = stream_key(key, ("r", "geo", 1, "strategy"), "run")
    with pytest.raises(NoiseKeyError):
        measure_records(plan, units, codes, 3, sk, ident, receipt, "run", test_mode=True)
    a = measure_records(plan, units, codes, 3, key, ident, receipt, "run", test_mode=True)
    sk0 = stream_key(key, ident, "run")
    b = measure_records(plan, units, codes, 3, sk0, ident, receipt, "run", test_mode=True)
    np.testing.assert_array_equal(a, b)  # the stream key draws the same noise


def test_spec_workload_forms():
    assert "residual" in STRATEGIES
    assert workloads({"marginals": {"k": 3}}, None) == {"name": "marginals", "k": 3}
    w = workloads({"marginals": {"k": 2, "attributes": ["a", "b", "c"]}}, None)
    assert w["sets"] == [list(c) for c in itertools.combinations("abc", 2)]
    w = workloads({"marginals": [["a", "b"], {"attributes": ["c"], "weight": 2}]}, None)
    assert w == {"name": "marginal-sets", "sets": [["a", "b"], ["c"]], "weights": [1.0, 2.0]}
    for bad in ({"marginals": {"k": -1}}, {"marginals": []}, {"marginals": [["a", "a"]]},
                {"marginals": [{"attributes": ["a"], "weight": 0}]},
                {"marginals": {"k": 2, "j": 1}}):  # fmt: skip
        with pytest.raises(SpecError, match=r"workload\.marginals"):
            workloads(bad, None)


def test_wide_records_have_the_declared_sizes():
    df, sizes = wide_records(2000, d=30, seed=3)
    assert df.shape == (2000, 30) and len(sizes) == 30
    for col, n in sizes.items():
        assert df[col].min() >= 0 and df[col].max() < n


def test_joint_level_fit_matches_the_two_level_closed_form():
    from dpdask.graph._marginal_levels import level_fit

    # two parents with 3 and 2 children; parent noise variance 4, children 1
    maps = [np.array([0, 0, 0, 1, 1]), np.arange(5)]
    M, d, slices = level_fit(maps, [4.0, 1.0])
    r = 4.0
    for p, m in ((0, 3), (1, 2)):
        assert d[slices[0]][p] == pytest.approx(r * m / (r + m))  # V_P m / (r + m)
    kids = d[slices[1]]
    np.testing.assert_allclose(kids, [1 - 1 / (r + 3)] * 3 + [1 - 1 / (r + 2)] * 2)
    rng = np.random.default_rng(0)
    y = rng.normal(size=(7, 4))
    x = M @ y
    np.testing.assert_allclose(x[0], x[2:5].sum(axis=0), atol=1e-12)  # parents = sums
    np.testing.assert_allclose(x[1], x[5:7].sum(axis=0), atol=1e-12)
    w = 1 / (r + 3)  # the closed form of a child's fit
    np.testing.assert_allclose(x[2], y[2] + w * (y[0] - y[2:5].sum(axis=0)), atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100])
def test_helmert_in_linear_time_equals_the_dense_basis(rng, n):
    H = helmert(n)
    x = rng.integers(-50, 50, size=(4, n, 3))
    B = helmert_integer(x, 1)  # exact integers: the rows before their scales
    assert B.dtype == np.int64
    np.testing.assert_allclose(
        B * helmert_scales(n)[None, :, None], np.einsum("kj,ajb->akb", H, x), rtol=1e-13, atol=1e-12
    )
    z = rng.normal(size=(4, n - 1, 3))
    np.testing.assert_allclose(
        helmert_transpose(z, 1), np.einsum("kj,akb->ajb", H, z), rtol=1e-12, atol=1e-12
    )


def test_wide_residual_rows_are_within_the_bound_of_the_exact_product(rng):
    """The rows of a 3-way residual over attributes of 100, 37 and 2 values against the
    exact rational product of the plan's stored doubles (the bound the lattice uses)."""
    sizes = (100, 37, 2)
    plan = plan_residual(MarginalWorkload(sizes, [[0, 1, 2]]), zCDP(1))
    n = 12
    codes = np.column_stack([rng.integers(0, s, n) for s in sizes])
    got = residual_block(plan, np.zeros(n, np.int64), codes, 1)[0]
    sets = plan.marginals.residual_sets()
    at = sum(math.prod(s - 1 for s in (sizes[i] for i in A)) for A in sets[: sets.index((0, 1, 2))])
    root = Fraction(math.sqrt(plan.precision[sets.index((0, 1, 2))]))
    Hs = [[[Fraction(float(v)) for v in row] for row in helmert(s).T] for s in sizes]  # by code
    exact = np.zeros((99, 36, 1), dtype=object)
    exact[...] = Fraction(0)
    for c in codes:
        cols = [Hs[i][c[i]] for i in range(3)]
        exact += np.multiply.outer(
            np.multiply.outer(np.array(cols[0], dtype=object), np.array(cols[1], dtype=object)),
            np.array(cols[2], dtype=object),
        )
    rows = got[at : at + 99 * 36]
    err = max(
        abs(Fraction(float(g)) - root * e) for g, e in zip(rows, exact.reshape(-1), strict=True)
    )
    bound = Fraction(residual_evaluation_error(plan)) * n
    assert 0 < float(np.abs(rows).max()) and err <= bound
