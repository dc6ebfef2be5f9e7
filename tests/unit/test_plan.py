"""Plan: the noise contract, error figures, summary, and the save/load format."""

from __future__ import annotations

import json
import math
import zipfile
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings

from dpdask import Domain, Plan, select
from dpdask.errors import BudgetTypeError, DPDaskError, PlanError
from dpdask.linalg import (
    AllRange,
    Dense,
    Diagonal,
    Identity,
    Kron,
    Ones,
    Prefix,
    Product,
    RangeQueries,
    Scaled,
    Sparse,
    Sum,
    Total,
    Transpose,
    VStack,
    from_dict,
    to_dict,
)
from dpdask.privacy import ApproxDP, PureDP, calibrate, zCDP
from dpdask.strategy import PIdentity, WeightedMarginals
from dpdask.testing.strategies import operators


def _union_workload() -> VStack:
    return VStack(
        [
            Kron([Prefix(4), Ones(3), Identity(2)]),
            Kron([Identity(4), AllRange(3), Ones(2)]),
            Kron([Ones(4), Ones(3), Identity(2)]),
        ],
        weights=[1.0, 2.0, 1.0],
        names=["p", "r", "i"],
    )


def _dense_error(W: np.ndarray, A: np.ndarray) -> float:
    return float(np.linalg.norm(W @ np.linalg.pinv(A), "fro") ** 2)


@pytest.mark.parametrize(
    ("privacy", "mechanism"),
    [(PureDP("0.5"), "laplace"), (zCDP("0.3"), "gaussian"), (ApproxDP(1, "1e-6"), "gaussian")],
)
def test_noise_contract(privacy, mechanism: str, rng: np.random.Generator) -> None:
    W = _union_workload()
    A = Kron([PIdentity(rng.random((1, 4))), PIdentity(rng.random((1, 3))), Identity(2)])
    plan = Plan(W, A, privacy)
    assert plan.mechanism == mechanism
    Ad = A.dense()
    if mechanism == "laplace":
        sens = np.abs(Ad).sum(axis=0).max()
        assert plan.noise_scale == pytest.approx(sens / 0.5)
        var = 2 * plan.noise_scale**2
    else:
        sens = np.sqrt((Ad**2).sum(axis=0).max())
        assert plan.noise_scale == pytest.approx(privacy.gaussian_sigma(sens))
        var = plan.noise_scale**2
    assert plan.expected_error() == pytest.approx(var * _dense_error(W.dense(), Ad), rel=1e-9)
    Wd = W.dense()
    v = var * np.einsum("ij,jk,ik->i", Wd, np.linalg.pinv(Ad.T @ Ad), Wd)
    np.testing.assert_allclose(plan.query_variances(), v, rtol=1e-8)


def test_plan_rejects_bad_inputs(rng: np.random.Generator) -> None:
    W = Prefix(5)
    with pytest.raises(TypeError, match="budget"):
        Plan(W, Identity(5), 1.0)
    with pytest.raises(ValueError, match="columns"):
        Plan(W, Identity(6), PureDP(1))
    with pytest.raises(ValueError, match="sensitivity"):
        Plan(W, Dense(np.zeros((2, 5))), PureDP(1))
    with pytest.raises(ValueError, match="cells"):
        Plan(W, Identity(5), PureDP(1), domain=Domain(a=2, b=3))
    with pytest.raises(ValueError, match="zero epsilon"):
        Plan(W, Identity(5), PureDP(0))


def test_summary(rng: np.random.Generator) -> None:
    W = _union_workload()
    plan = select(W, PureDP(1), restarts=1, domain=Domain(a=4, b=3, c=2))
    d = plan.summary(as_dict=True)
    json.dumps(d)  # JSON-safe
    assert d["queries"] == W.shape[0]
    assert d["expected_total_squared_error"] == pytest.approx(plan.expected_error())
    assert sum(p["squared_error"] for p in d["parts"]) == pytest.approx(plan.expected_error())
    assert [p["part"] for p in d["parts"]] == ["p", "r", "i"]
    assert d["identity_total_squared_error"] == pytest.approx(
        2 * _dense_error(W.dense(), np.eye(24))
    )
    text = plan.summary()
    assert "expected total squared error" in text and "RMSE" in text
    for part in ("p", "r", "i"):
        assert any(line.startswith(part + " ") for line in text.splitlines())


def _plans(rng: np.random.Generator) -> list[Plan]:
    dom = Domain(a=4, b=3, c=2)
    W = _union_workload()
    K1 = Kron([PIdentity(rng.random((1, 4))), Ones(3), Identity(2)])
    K2 = Kron([Identity(4), PIdentity(rng.random((2, 3))), PIdentity(rng.random((1, 2)))])
    theta = rng.random(8)
    theta[-1] = 0.5
    return [
        select(Prefix(32), PureDP(1), restarts=1),
        select(Prefix(16), zCDP("0.5"), "hierarchical", branching=2),
        select(AllRange(8), PureDP(1), "wavelet"),
        Plan(W, VStack([K1, K2], weights=[0.3, 0.7]), PureDP(2), domain=dom),
        Plan(W, VStack([K1, K2], weights=[0.3, 0.7]), PureDP(2), groups=[[0, 2], [1]]),
        Plan(W, WeightedMarginals((4, 3, 2), theta, ["a", "b", "c"]), zCDP(1), domain=dom),
    ]


def test_save_load_round_trip(tmp_path, rng: np.random.Generator) -> None:
    for k, plan in enumerate(_plans(rng)):
        path = tmp_path / f"plan{k}.npz"
        plan.save(path)
        back = Plan.load(path)
        assert type(back.strategy) is type(plan.strategy)
        np.testing.assert_array_equal(back.strategy.dense(), plan.strategy.dense())
        np.testing.assert_array_equal(back.workload.dense(), plan.workload.dense())
        assert back.noise_scale == plan.noise_scale
        assert back.mechanism == plan.mechanism
        assert back.privacy == plan.privacy
        assert back.domain == plan.domain
        assert back.groups == plan.groups
        assert back.template == plan.template
        assert back.expected_error() == pytest.approx(plan.expected_error(), rel=1e-12)
        np.testing.assert_allclose(back.query_variances(), plan.query_variances(), rtol=1e-12)


def test_load_refuses_tampered_noise(tmp_path, rng: np.random.Generator) -> None:
    plan = select(Prefix(16), PureDP(1), restarts=1)
    path = tmp_path / "plan.npz"
    plan.save(path)
    with np.load(path) as z:
        entries = {k: z[k] for k in z.files}
    doc = json.loads(str(entries["plan.json"]))
    doc["noise_scale"] = doc["noise_scale"] / 2  # half the noise the budget requires
    entries["plan.json"] = np.array(json.dumps(doc))
    bad = tmp_path / "bad.npz"
    np.savez(bad, **entries)
    with pytest.raises(ValueError, match="does not match"):
        Plan.load(bad)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(ValueError, match="not a dpdask plan"):
        Plan.load(other)


def test_plan_file_needs_no_pickle(tmp_path, rng: np.random.Generator) -> None:
    path = tmp_path / "plan.npz"
    _plans(rng)[3].save(path)
    with zipfile.ZipFile(path) as zf:
        for name in zf.namelist():
            assert name.endswith(".npy")
    with np.load(path, allow_pickle=False) as z:
        assert all(z[k].dtype != object for k in z.files)


_ALL_CLASSES = [
    Identity(3),
    Ones(3, 2),
    Prefix(4),
    AllRange(4),
    RangeQueries(5, [0, 2], [3, 4]),
    Diagonal([1.0, -2.0, 3.0]),
    Dense(np.arange(6.0).reshape(2, 3)),
    Sparse(np.eye(3)[:2]),
    Kron([Prefix(2), Identity(3)]),
    VStack([Identity(3), Ones(3)], weights=[1.0, 2.5], names=["x", "y"]),
    Product(Prefix(3), Identity(3)),
    Scaled(Prefix(3), -1.5),
    Sum([Prefix(3), Identity(3)]),
    Transpose(Dense(np.arange(6.0).reshape(3, 2))),
    PIdentity(np.ones((1, 3))),
    WeightedMarginals((2, 3), [0.1, 0.0, 0.4, 0.5]),
]


@pytest.mark.parametrize("op", _ALL_CLASSES, ids=lambda o: type(o).__name__)
@pytest.mark.parametrize("inline", [True, False])
def test_serialize_every_operator_class(op, inline: bool) -> None:
    arrays = None if inline else {}
    d = to_dict(op, arrays)
    if inline:
        d = json.loads(json.dumps(d))
    back = from_dict(d, arrays)
    assert type(back) is type(op)
    np.testing.assert_array_equal(back.dense(), op.dense())


@settings(max_examples=40, deadline=None)
@given(operators())
def test_serialize_round_trip_property(op) -> None:
    back = from_dict(json.loads(json.dumps(to_dict(op))))
    np.testing.assert_array_equal(back.dense(), op.dense())


def test_deserialize_refuses_foreign_modules() -> None:
    with pytest.raises(ValueError, match="refusing"):
        from_dict({"type": "Evil", "module": "os"})
    with pytest.raises(ValueError, match="unknown operator type"):
        from_dict({"type": "Nope"})


def test_svd_bound_and_identity_in_plan() -> None:
    plan = select(Prefix(64), zCDP("0.5"), restarts=1)
    s = np.linalg.svd(Prefix(64).dense(), compute_uv=False).sum()
    assert plan.svd_bound() == pytest.approx(s * s / 64 * zCDP("0.5").gaussian_sigma(1.0) ** 2)
    assert plan.expected_error() >= plan.svd_bound()
    assert plan.identity_error() == pytest.approx(
        zCDP("0.5").gaussian_sigma(1.0) ** 2 * math.fsum(range(1, 65))
    )


# -- one calibration ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("budget", "mechanism", "scale"),
    [
        (PureDP(Fraction(1, 2)), "laplace", 2 / 0.5),  # L1 sensitivity 2 (two rows)
        (
            zCDP(Fraction(1, 2)),
            "gaussian",
            math.sqrt(2) / 1.0,
        ),  # L2 sqrt 2, sigma = D / sqrt(2 rho)
    ],
)
def test_calibrate_is_the_closed_form(budget, mechanism, scale) -> None:
    A = VStack([Identity(4), Identity(4)])  # every column: two ones
    cal = calibrate(budget, A)
    assert (cal.mechanism, cal.norm) == (mechanism, 1 if mechanism == "laplace" else 2)
    assert cal.scale == pytest.approx(scale, rel=1e-12)
    assert cal.variance == pytest.approx(2 * scale**2 if mechanism == "laplace" else scale**2)


def test_plan_at_another_budget_is_a_fresh_plan_there() -> None:
    W, A = Prefix(8), VStack([Identity(8), Total(8)])
    plan = Plan(W, A, zCDP(1))
    for rho in (Fraction(1, 4), Fraction(3)):
        moved, fresh = plan.at(zCDP(rho)), Plan(W, A, zCDP(rho))
        assert moved.noise_scale == fresh.noise_scale
        np.testing.assert_allclose(moved.query_variances(), fresh.query_variances(), rtol=1e-12)
        assert plan.privacy == zCDP(1)  # the original is untouched
    with pytest.raises(PlanError, match="laplace"):
        plan.at(PureDP(1))  # a Gaussian plan's strategy is not sized for Laplace noise


def test_level_plans_measure_a_gram_root_and_describe_the_noise_drawn() -> None:
    """``Plan.at`` measures a root of the Gram (same least squares, fewer rows), shared by
    the levels of one base plan; ``realise`` makes every figure that of the noise drawn.
    Oracle: dense ``W (A^T A)^+ W^T`` times the noise variance."""
    # 13 rows > 6 columns, non-integer entries (measured on a lattice either way)
    W, A = Prefix(6), VStack([Identity(6), Prefix(6), Total(6)], weights=[1.0, 0.7, 0.3])
    plan = Plan(W, A, zCDP(1))
    a, b = plan.at(zCDP("1/4")), plan.at(zCDP("3/4"))
    assert a.strategy.shape[0] <= 6 and a.strategy is b.strategy  # formed once
    Ad, Wd = A.dense(), W.dense()
    np.testing.assert_allclose(a.strategy.gram().dense(), Ad.T @ Ad, atol=1e-10)
    unit = np.einsum("ij,jk,ik->i", Wd, np.linalg.pinv(Ad.T @ Ad), Wd)
    for level, rho in ((a, 0.25), (b, 0.75)):
        sigma = np.sqrt((Ad**2).sum(0)).max() / np.sqrt(2 * rho)  # Delta_2 / sqrt(2 rho)
        assert level.noise_scale == pytest.approx(sigma, rel=1e-12)
        assert level.base is plan and level.drawn is None
        np.testing.assert_allclose(level.query_variances(), sigma**2 * unit, rtol=1e-9)

    class Drawn:  # what the measure step draws (a lattice's larger scale)
        noise_scale, variance = 1.5 * a.noise_scale, 2.25 * a.noise_scale**2 + 0.1

    drawn = a.realise(Drawn())
    assert a.drawn is None and drawn.drawn is not None  # a new plan; a is unchanged
    assert (drawn.drawn_scale, drawn.row_variance) == (Drawn.noise_scale, Drawn.variance)
    assert drawn.noise_scale == a.noise_scale  # the measurement starts from the calibration
    np.testing.assert_allclose(drawn.query_variances(), Drawn.variance * unit, rtol=1e-9)
    assert plan.privacy == zCDP(1) and plan.strategy is A and plan.drawn is None


def test_level_plans_keep_a_strategy_a_root_would_measure_noisier() -> None:
    """An integer strategy is measured exactly on integer counts; its Gram root would
    need a lattice (more noise), so ``Plan.at`` keeps it. Oracle: the lattice of each."""
    from dpdask.linalg import gram_root
    from dpdask.measure import lattice

    W, A = Prefix(6), VStack([Identity(6), Prefix(6), Total(6)])  # integer entries
    level = Plan(W, A, zCDP(1)).at(zCDP("1/2"))
    assert level.strategy is A
    exact = lattice(level, np.int64)
    assert exact.exact and exact.k == 0
    root = Plan(W, gram_root(A), zCDP(1)).at(zCDP("1/2"))
    assert lattice(root, np.int64).noise_scale > exact.noise_scale


def test_tda2020_level_plan_draws_close_to_the_bureaus_noise() -> None:
    """The Bureau's strategy (2,603 rows on 2,016 cells) is measured as it is, not as a
    dense root whose evaluation error forces a coarse lattice: the drawn variance of
    the county total is within 6% of the closed form 1 / (2 rho l q)."""
    from dpdask import census
    from dpdask.measure import lattice
    from dpdask.strategy.tda2020 import (
        PERSONS_RHO_ADD_REMOVE,
        level_budget,
        tda2020_plan,
        tda2020_variances,
    )
    from dpdask.workloads.pl94_full import pl94_full

    budget = level_budget(zCDP(PERSONS_RHO_ADD_REMOVE), "county")
    plan = tda2020_plan(pl94_full(), budget, level="county", domain=census.pl94_full_domain())
    level = plan.at(budget)
    drawn = level.realise(lattice(level, np.int64)).query_variances()[0]
    closed = tda2020_variances(zCDP(PERSONS_RHO_ADD_REMOVE), "county")["total"]
    assert closed <= drawn <= 1.06 * closed


def test_a_non_budget_is_a_type_error_and_a_dpdask_error() -> None:
    with pytest.raises(BudgetTypeError) as info:
        calibrate(0.5, Identity(3))  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError) and isinstance(info.value, DPDaskError)
