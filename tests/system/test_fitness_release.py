"""The fitness-for-use mechanism as a release plan, through ``dpdask.release``.

Oracles: dense matrices for the whitening identities (``B A^+ = F``, so least squares on
the whitened strategy releases ``L (B x + N(0, Sigma))``), the solver's own dense
mechanism (``diag(L Sigma L^T)``, ``sqrt(b_j^T Sigma^-1 b_j)``) recomputed here, the exact
counts of a small store with the noise off, and the empirical variance of many keyed
releases against the plan's targets (chi-square sampling error).
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
import zarr

import dpdask
from dpdask import Domain, Geography
from dpdask.graph import release
from dpdask.linalg import AllRange, Identity, Kron, Prefix, Total, VStack
from dpdask.noise import SecretKey
from dpdask.privacy import ApproxDP, PureDP, gaussian_delta, zCDP
from dpdask.store import write_store
from dpdask.strategy.fitness import FitnessPlan, solve, whitened_strategy

DOMAIN = Domain(a=2, b=3)
# a union of marginal, prefix and identity queries on 6 cells (solved densely)
UNION = VStack([Kron([Identity(2), Total(3)]), Kron([Total(2), Prefix(3)]), Identity(6)])
# a Kronecker product with factored targets (solved factor by factor)
PRODUCT = Kron([Prefix(2), AllRange(3)])
# a union of two products, solved part by part with the budget split between them
PARTS = VStack([Kron([Identity(2), Prefix(3)]), Kron([Total(2), AllRange(3)])])
PRODUCT_TARGETS = [np.array([1.0, 2.0]), np.array([1.0, 3.0, 2.0, 1.0, 4.0, 1.0])]


def dense_mechanism(sol) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B, L, Sigma)`` of a solution as dense matrices."""
    return sol.basis.dense(), sol.L.dense(), sol.Sigma.dense()


# -- the whitened strategy ------------------------------------------------------
@pytest.mark.parametrize(
    ("W", "targets", "basis"),
    [
        (AllRange(5), "random", np.triu(np.ones((5, 5)))),  # the paper's upper-triangular B
        (UNION, "random", None),
        (PRODUCT, PRODUCT_TARGETS, None),
    ],
    ids=["allrange-triu", "union-dense", "kron-factors"],
)
def test_whitened_strategy_releases_the_paper_mechanism(W, targets, basis, rng) -> None:
    """``A = F^-1 B``: ``A A^+ = I``, ``B A^+ = F``, column norms = privacy profile.

    Hence least squares on ``A x + e`` answers ``W`` as ``L (B x + F e)``, exactly the
    release ``L (B x + N(0, Sigma))`` of paper 000.
    """
    c = rng.uniform(0.5, 2.0, W.shape[0]) if isinstance(targets, str) else targets
    sol = solve(W, c, basis)
    A = whitened_strategy(sol)
    if isinstance(sol.Sigma, Kron):
        assert isinstance(A, Kron)
    Ad = A.dense()
    B, L, S = dense_mechanism(sol)
    F = sol.noise_factor().dense()
    np.testing.assert_allclose(F @ F.T, S, rtol=1e-9, atol=1e-12)
    Ap = np.linalg.pinv(Ad)
    r = B.shape[0]
    np.testing.assert_allclose(Ad @ Ap, np.eye(r), atol=1e-9)
    np.testing.assert_allclose(B @ Ap, F, atol=1e-9 * np.abs(F).max())
    profile = np.sqrt(np.einsum("ij,ij->j", B, np.linalg.solve(S, B)))
    np.testing.assert_allclose(A.column_norms(2), profile, rtol=1e-9)
    x, e = rng.integers(0, 20, W.shape[1]).astype(float), rng.standard_normal(r)
    np.testing.assert_allclose(
        W.dense() @ (Ap @ (Ad @ x + e)), L @ (B @ x + F @ e), atol=1e-8 * (1 + np.abs(x).sum())
    )


# -- the plan -----------------------------------------------------------------------
def test_select_problem_one(rng) -> None:
    """``privacy=None``: the least budget that meets every target, reported as spent."""
    c = rng.uniform(0.5, 2.0, UNION.shape[0])
    plan = dpdask.select(UNION, None, "fitness", targets=c, domain=DOMAIN)
    sol = solve(UNION, c)
    _, L, S = dense_mechanism(sol)
    assert isinstance(plan, FitnessPlan) and plan.template == "fitness"
    assert plan.privacy_cost == pytest.approx(sol.privacy_cost, rel=1e-8)
    np.testing.assert_allclose(plan.query_variances(), np.diag(L @ S @ L.T), rtol=1e-6)
    assert plan.max_ratio <= 1.0
    assert plan.max_ratio == pytest.approx(1.0, abs=1e-6)
    assert isinstance(plan.privacy, zCDP)
    assert float(plan.privacy.rho) == pytest.approx(sol.privacy_cost**2 / 2, rel=1e-8)
    assert plan.zcdp() <= plan.privacy * (1 + 1e-8)
    info = plan.summary(as_dict=True)
    ratios = [q["ratio"] for q in info["fitness"]["queries"]]
    np.testing.assert_allclose(ratios, plan.query_variances() / c)
    assert info["fitness"]["targets_met"]
    assert [p["max_ratio"] for p in info["parts"]] == pytest.approx(
        [max(ratios[0:2]), max(ratios[2:5]), max(ratios[5:])]
    )
    assert "privacy cost" in plan.summary()


@pytest.mark.parametrize("budget", [zCDP("0.3"), ApproxDP(1, "1e-6")], ids=["zcdp", "approx-dp"])
def test_select_problem_two(budget) -> None:
    """A budget and relative targets: all of the budget spent, every ratio scaled alike."""
    c = [np.array([1.0, 2.0]), np.array([1.0, 3.0, 2.0, 1.0, 4.0, 1.0])]
    plan = dpdask.select(PRODUCT, budget, "fitness", targets=c)
    sol = solve(PRODUCT, c)
    allowed = budget.max_privacy_cost()
    assert isinstance(plan.strategy, Kron)
    assert plan.privacy_cost <= allowed
    assert plan.privacy_cost == pytest.approx(allowed, rel=1e-9)
    np.testing.assert_allclose(plan.privacy_profile(), sol.privacy_profile() * allowed
                               / sol.privacy_cost, rtol=1e-8)  # fmt: skip
    # Theorem 3.1: Problem 1's solution rescaled; every ratio scales alike
    scale = sol.privacy_cost**2 / allowed**2
    np.testing.assert_allclose(plan.variance_ratios(), sol.variance_ratios() * scale, rtol=1e-6)
    assert plan.max_ratio == pytest.approx(sol.privacy_cost**2 / allowed**2, rel=1e-6)
    if isinstance(budget, zCDP):
        assert float(plan.zcdp().rho) == pytest.approx(float(budget.rho), rel=1e-8)
    else:
        spent = plan.approx_dp(1.0)
        assert spent.delta <= budget.delta * (1 + 1e-6)
        assert float(spent.delta) == pytest.approx(gaussian_delta(plan.privacy_cost, 1.0), rel=1e-6)


def test_select_union_by_parts() -> None:
    """Parts measured independently: stacked whitened parts, block reconstruction."""
    plan = dpdask.select(PARTS, zCDP(1), "fitness", method="union")
    sol = solve(PARTS, 1.0, method="union").for_budget(zCDP(1))
    assert isinstance(plan.strategy, VStack) and plan.groups == [[0], [1]]
    assert plan.summary(as_dict=True)["error_is_upper_bound"]
    np.testing.assert_allclose(plan.privacy_profile(), sol.privacy_profile(), rtol=1e-8)
    parts = [p.workload.dense() for p in sol.parts]
    dense = [L @ S @ L.T for L, S in ((p.L.dense(), p.Sigma.dense()) for p in sol.parts)]
    assert [w.shape[0] for w in parts] == [6, 6]
    np.testing.assert_allclose(
        plan.query_variances(), np.concatenate([np.diag(v) for v in dense]), rtol=1e-6
    )


def test_select_refuses_pure_dp() -> None:
    with pytest.raises(ValueError, match="Gaussian"):
        dpdask.select(Prefix(4), PureDP(1), "fitness")


def test_plan_save_load_round_trip(tmp_path: pathlib.Path) -> None:
    c = [np.array([1.0, 2.0]), np.array([1.0, 3.0, 2.0, 1.0, 4.0, 1.0])]
    plan = dpdask.select(PRODUCT, zCDP(1), "fitness", targets=c)
    plan.save(tmp_path / "p.npz")
    back = dpdask.Plan.load(tmp_path / "p.npz")
    assert isinstance(back, FitnessPlan)
    assert back.noise_scale == plan.noise_scale and back.privacy == plan.privacy
    np.testing.assert_array_equal(back.targets, plan.targets)
    np.testing.assert_allclose(back.query_variances(), plan.query_variances(), rtol=1e-12)
    assert back.privacy_cost == plan.privacy_cost
    assert back.summary(as_dict=True)["fitness"] == plan.summary(as_dict=True)["fitness"]


# -- through dpdask.release ------------------------------------------------------------
def _store(tmp_path: pathlib.Path, rng: np.random.Generator, tracts: int):
    counties = max(1, tracts // 10)
    geo = Geography(
        levels=("state", "county", "tract"),
        ids=(("s",), tuple(f"c{i}" for i in range(counties)),
             tuple(f"t{i}" for i in range(tracts))),
        parents=(np.zeros(counties, dtype=int), np.arange(tracts) * counties // tracts),
    )  # fmt: skip
    counts = rng.integers(0, 50, size=(tracts, *DOMAIN.shape))
    return write_store(tmp_path / "in.zarr", counts, DOMAIN, geo, geo_chunk=64), counts


def _truth(counts: np.ndarray, st) -> dict[str, np.ndarray]:
    geo = st.geography
    out = {}
    for lv in geo.levels:
        idx = geo.ancestor_index(lv) if lv != geo.levels[-1] else np.arange(counts.shape[0])
        t = np.zeros((geo.n_units(lv), *counts.shape[1:]))
        np.add.at(t, idx, counts)
        out[lv] = t.reshape(len(t), -1)
    return out


@pytest.mark.parametrize(
    ("W", "method"),
    [(UNION, "auto"), (PRODUCT, "auto"), (PARTS, "union")],
    ids=["union-dense", "kron-factors", "union-by-parts"],
)
def test_release_exact_without_noise(W, method, tmp_path, rng) -> None:
    st, counts = _store(tmp_path, rng, tracts=7)
    plan = dpdask.select(W, zCDP(1), "fitness", domain=DOMAIN, method=method)
    out = release(plan, st, test_mode=True, noise=False).to_zarr(tmp_path / "out.zarr")
    g = zarr.open_group(str(out), mode="r")
    Wd = W.dense()
    for lv, t in _truth(counts, st).items():
        np.testing.assert_allclose(g[lv]["answers"][:], t @ Wd.T, atol=1e-8)


@pytest.mark.slow
def test_release_variances_meet_targets(tmp_path, rng) -> None:
    """Empirical per-query variances of keyed releases against the targets.

    Problem 1 with unequal targets, the finest level alone (no consistency step across
    levels, which would only lower the variances): each query's variance should be its
    planned one (the optimum meets the binding targets with
    equality; no variance may exceed its target). Over ``n`` independent errors the mean
    of ``err^2 / target`` has relative standard deviation ``sqrt(2 / n)``.
    """
    c = rng.uniform(1.0, 4.0, UNION.shape[0])
    plan = dpdask.select(UNION, None, "fitness", targets=c, domain=DOMAIN)
    expected = plan.variance_ratios()
    st, counts = _store(tmp_path, rng, tracts=150)
    t = _truth(counts, st)["tract"]
    Wd = UNION.dense()
    errors = []
    for seed in range(8):
        r = release(plan, st, levels=["tract"], release_id="fit", run_id=f"r{seed}",
                    test_mode=True, key=SecretKey.for_testing(100 + seed))  # fmt: skip
        g = zarr.open_group(str(r.to_zarr(tmp_path / f"o{seed}.zarr")), mode="r")["tract"]
        var = g["variance"][:]
        # the published variances are of the noise drawn: the plan's, scaled by what the
        # lattice draws (at least the nominal noise, within its 0.1% slack here)
        level = r.summary()["levels"][0]
        drawn = level["noise_variance"] / level["nominal_noise_scale"] ** 2
        assert 1 <= drawn < 1.002
        np.testing.assert_allclose(var, np.broadcast_to(plan.query_variances() * drawn, var.shape))
        errors.append(g["answers"][:] - t @ Wd.T)
    err = np.concatenate(errors)
    n = err.shape[0]
    got = (err**2).mean(axis=0) / c
    # every query: within 4.5 standard deviations of its planned ratio (<= 1)
    assert np.all(expected <= 1 + 1e-9)
    np.testing.assert_array_less(np.abs(got / expected - 1), 4.5 * math.sqrt(2 / n))
    # the answers are correlated as planned: empirical covariance against
    # sigma_g^2 L Sigma L^T, entry by entry within 4.5 standard deviations
    sol = solve(UNION, c)
    _, L, S = dense_mechanism(sol)
    cov = plan.noise_scale**2 * (L @ S @ L.T)
    emp = err.T @ err / n
    sd = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / n)
    np.testing.assert_array_less(np.abs(emp - cov), 4.5 * sd)
