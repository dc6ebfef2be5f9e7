"""Measurements on the lattice: no float noise on any release path, no impossible outputs.

* The lattice: float data or a non-integer strategy is measured as
  ``2**-k (round(A x 2**k) + Z)`` with integer ``Z``; the sensitivity and the noise
  scale are enlarged for the rounding and still fit the plan's privacy.
* The floating-point attack (Mironov 2012): on the float path a large fraction of
  raw ``x + Lap(b)`` outputs are impossible under the neighbour ``x + 1``; on the
  lattice every output is a grid point, and the integer noise has full support on
  the grid, so every output is possible under both neighbours.
* No production path calls a float sampler: the float samplers are replaced by ones
  that raise (the ``no_float`` fixture), and the measure step runs with a real key and
  ledger (whole releases: ``tests/system/test_lattice_release.py``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from dpdask import Domain
from dpdask.linalg import (
    Dense,
    Identity,
    Kron,
    LinearQuery,
    Prefix,
    Total,
    VStack,
    evaluation_error,
)
from dpdask.measure import lattice, measure
from dpdask.noise import KeyedRNG, MeasurementId, new_key
from dpdask.privacy import ApproxDP, Ledger, PureDP, check_calibration, zCDP
from tests.helpers import DensePlan as Plan

DOMAIN = Domain(a=2, b=3)
INTEGRAL = VStack([Kron([Identity(2), Identity(3)]), Kron([Total(2), Prefix(3)])])
FRACTIONAL = Kron([Dense(np.array([[1.0, 0.5], [0.25, 1.0]])), Prefix(3)])


def _plan(A: LinearQuery, mechanism: str = "gaussian", privacy=None) -> Plan:
    W = VStack([Kron([Identity(2), Total(3)]), Identity(6)])
    if mechanism == "laplace":
        privacy = privacy or PureDP(1)
        scale = privacy.laplace_scale(A.sensitivity(1))
    else:
        privacy = privacy or zCDP(1)
        scale = privacy.gaussian_sigma(A.sensitivity(2))
    return Plan(A, W, DOMAIN, mechanism, scale, privacy)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
@pytest.mark.parametrize(
    "A, dtype",
    [(FRACTIONAL, np.int64), (INTEGRAL, np.float64), (FRACTIONAL, np.float32)],
    ids=["fractional-strategy", "float-data", "both"],
)
def test_lattice_calibration_fits_the_plan(mechanism, A, dtype):
    plan = _plan(A, mechanism)
    spec = lattice(plan, dtype)
    p = 1 if mechanism == "laplace" else 2
    d = A.sensitivity(p)
    m = A.shape[0]
    c = 2 * m if p == 1 else 2 * math.sqrt(m)
    assert not spec.exact and spec.k > 0
    assert spec.mechanism == "discrete_" + mechanism
    assert spec.sensitivity >= d + c * 2.0**-spec.k  # the rounding is accounted
    assert spec.sensitivity <= d * (1 + 2 / 1024)  # and small
    assert spec.noise_scale / spec.sensitivity >= plan.noise_scale / d
    assert spec.grid_scale == Fraction(spec.noise_scale) * 2**spec.k
    check_calibration(spec.mechanism, spec.sensitivity, spec.noise_scale, plan.privacy)


def test_integral_measurements_stay_exact():
    spec = lattice(_plan(INTEGRAL), np.int32)
    assert spec.exact and spec.k == 0 and spec.noise_scale == _plan(INTEGRAL).noise_scale


def test_approx_budgets_raise_the_discrete_sigma_until_it_fits():
    approx = ApproxDP(1, "1e-6")
    plan = _plan(FRACTIONAL, privacy=approx)
    spec = lattice(plan, np.int64)
    check_calibration("discrete_gaussian", spec.sensitivity, spec.noise_scale, approx)
    with pytest.raises(ValueError):  # at the float Gaussian's sigma the CKS bound does not fit
        check_calibration("discrete_gaussian", spec.sensitivity, plan.noise_scale, approx)


def _measure(plan, x, key, chunk=0):
    ident = MeasurementId("r", "county", chunk, "A")
    return measure(plan, x, key, ident, None, run_id="run", test_mode=True)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_no_impossible_output_on_the_lattice(mechanism):
    """Neighbours x and x + e_j: every published output is a grid point, and the integer
    noise has full support on the grid, so it has positive probability under both."""
    plan = _plan(FRACTIONAL, mechanism)
    spec = lattice(plan, np.float64)
    h = 2.0**-spec.k
    key = new_key()
    x = np.zeros((2000, 2, 3))
    x1 = x.copy()
    x1[:, 1, 0] += 1.0
    for data in (x, x1):
        y = _measure(plan, data, key)
        grid = y / h
        assert np.array_equal(grid, np.round(grid))  # multiples of 2**-k, exactly
        # the noise each neighbour would need is an integer: possible under both
        for other in (x, x1):
            answers = np.rint(np.asarray(plan.strategy.apply(other.reshape(2000, 6))) / h)
            need = grid - answers
            assert np.array_equal(need, np.round(need)) and np.isfinite(need).all()
    # full support: the weights exp(-|z| / t) and exp(-z**2 / (2 s**2)) never vanish, and
    # the sampler reaches far values (beyond the table, by exact resolution) when asked
    tab = _table_for(spec)
    assert tab.table.size > 0 and int(tab.table[-1]) == 2**63 - 1
    far = tab._resolve(np.random.Generator(np.random.Philox(1)), 2**63 - 1, tab.table.size)
    assert far >= tab.table.size


def _table_for(spec):
    from dpdask.noise import _table

    family = "gauss" if spec.mechanism == "discrete_gaussian" else "laplace"
    s, c = _table.block_parameter(family, spec.grid_scale)
    param = (s / c) ** 2 if family == "gauss" else s / c
    return _table.magnitude_table(family, param, c > 1)


def test_float_path_has_impossible_outputs():
    """The attack the lattice defeats: raw x + Lap(b) in doubles, x = 0 against x' = 1."""
    b = 1.0
    z = KeyedRNG.for_testing(1, "attack").laplace(b, 100_000, unsafe_float=True)
    out = 0.0 + z
    # under x' = 1 the output needs noise out - 1, which must give back out when added
    impossible = (out - 1.0) + 1.0 != out
    assert impossible.mean() > 0.05


# -- no float sampler on the measure path ---------------------------------------------
@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_float_data_measured_with_a_real_key_and_ledger(tmp_path, no_float, mechanism):
    """Float counts cannot enter a release store (it holds integers); the measure step,
    the production entry point, measures them on the lattice with no float sampler."""
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    ledger.open_release("r", zCDP(1) if mechanism == "gaussian" else PureDP(1))
    plan = _plan(INTEGRAL, mechanism)
    x = np.random.default_rng(2).random((5, 2, 3)) * 40
    y = measure(plan, x, new_key(), ("r", "county", 0, "A"), ledger, run_id="run")
    k = lattice(plan, x.dtype).k
    assert y.dtype == np.float64 and np.array_equal(np.ldexp(y, k), np.round(np.ldexp(y, k)))


# -- the floating-point evaluation of A x (dpdask.linalg.evaluation_error) ---------
def test_grid_step_covers_the_evaluation_error():
    """The grid step is at least twice the worst evaluation error at ``max_total``."""
    plan = _plan(FRACTIONAL)
    e = evaluation_error(FRACTIONAL)
    for max_total in (1, 2**33, 2**50):
        spec = lattice(plan, np.int64, max_total=max_total)
        assert 2.0**-spec.k >= 2 * e * max_total
        check_calibration(spec.mechanism, spec.sensitivity, spec.noise_scale, plan.privacy)
    # a huge bound coarsens the grid, and the extra rounding is accounted in D'
    fine, coarse = lattice(plan, np.int64, max_total=1), lattice(plan, np.int64, max_total=2**50)
    assert coarse.k < fine.k
    c = 2 * math.sqrt(FRACTIONAL.shape[0])
    assert coarse.sensitivity >= FRACTIONAL.sensitivity(2) + c * 2.0**-coarse.k


def test_total_above_max_total_is_refused_before_any_charge(tmp_path):
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    ledger.open_release("r", zCDP(1))
    plan = _plan(FRACTIONAL)
    x = np.full((2, 2, 3), 100, dtype=np.int64)  # totals 600
    with pytest.raises(ValueError, match="max_total"):
        measure(plan, x, new_key(), ("r", "county", 0, "A"), ledger, run_id="run", max_total=599)
    assert ledger.charges("r") == []
    y = measure(plan, x, new_key(), ("r", "county", 0, "A"), ledger, run_id="run", max_total=600)
    assert y.shape == (2, FRACTIONAL.shape[0]) and len(ledger.charges("r")) == 1


def test_strategies_of_every_selector_have_an_evaluation_bound():
    """Every strategy the plan step can return can be put on a lattice."""
    from dpdask.linalg import AllRange
    from dpdask.strategy import PIdentity
    from dpdask.strategy.baselines import hierarchical

    candidates = [PIdentity(np.ones((2, 8)), norm=1), hierarchical(16, 2), AllRange(6)]
    for A in candidates:
        assert 0 <= evaluation_error(A) < 1e-12
