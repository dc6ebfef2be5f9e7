"""Kronecker workloads solved factor by factor, unions by budget split: dense checks.

The factorisation claims (module docstring of ``dpdask.strategy.fitness._product``):
the product mechanism's covariance, profile and variances are the Kronecker products
of the factors', and its cost equals the joint optimum. Checked against dense
matrices and against SM-II run on the whole product (``method="dense"``).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from dask.callbacks import Callback
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpdask import Domain
from dpdask import workloads as wl
from dpdask.linalg import AllRange, Dense, Identity, Kron, Ones, Prefix, VStack
from dpdask.strategy.fitness import solve
from dpdask.strategy.fitness._product import factor_targets
from tests.helpers import dense_profile


def check_product(sol, W: Kron) -> None:
    """The Kronecker mechanism against dense matrices of the whole product."""
    Wd = W.dense()
    B, L, S = sol.basis.dense(), sol.L.dense(), sol.Sigma.dense()
    np.testing.assert_allclose(L @ B, Wd, atol=1e-9 * np.abs(Wd).max())
    np.testing.assert_allclose(sol.query_variances(), np.diag(L @ S @ L.T), rtol=1e-9)
    profile = dense_profile(B, S)
    np.testing.assert_allclose(sol.privacy_profile(), profile, rtol=1e-9)
    assert sol.privacy_cost == pytest.approx(profile.max(), rel=1e-12)
    F = sol.noise_factor().dense()
    np.testing.assert_allclose(F @ F.T, S, atol=1e-10 * np.abs(S).max())


_FACTORS = [
    lambda n: Prefix(n),
    lambda n: AllRange(n),
    lambda n: Identity(n),
    lambda n: Ones(n),
    lambda n: Dense(np.tri(n + 1, n)),  # prefixes with an empty first row
]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.integers(0, len(_FACTORS) - 1), min_size=2, max_size=3),
    sizes=st.lists(st.integers(2, 4), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_kron_by_factors_equals_joint(kinds: list[int], sizes: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    factors = [_FACTORS[k](n) for k, n in zip(kinds, sizes, strict=False)]
    W = Kron(factors)
    targets = [rng.uniform(0.5, 3.0, f.shape[0]) for f in factors]
    sol = solve(W, targets)
    check_product(sol, W)
    assert sol.max_ratio == pytest.approx(1.0, rel=1e-9)
    flat = targets[0]
    for t in targets[1:]:
        flat = np.kron(flat, t)
    joint = solve(W, flat, method="dense")
    # the same optimum: each is within its certified gap of the other's lower bound
    assert sol.privacy_cost**2 <= joint.privacy_cost**2 * (1 + 3e-4)
    assert joint.privacy_cost**2 <= sol.privacy_cost**2 * (1 + 3e-4)
    assert sol.lower_bound <= joint.privacy_cost**2 * (1 + 1e-9)


def test_flat_factorable_targets_are_split(rng: np.random.Generator) -> None:
    W = Kron([Prefix(3), AllRange(3)])
    c1, c2 = rng.uniform(1, 2, 3), rng.uniform(1, 2, 6)
    split = factor_targets(np.kron(c1, c2), W.out_shape)
    assert split is not None
    np.testing.assert_allclose(np.kron(*split), np.kron(c1, c2))
    noisy = np.kron(c1, c2)
    noisy[0] *= 1.5
    assert factor_targets(noisy, W.out_shape) is None
    assert type(solve(W, np.kron(c1, c2))).__name__ == "KronFitnessSolution"
    assert type(solve(W, noisy)).__name__ == "FitnessSolution"


def test_factor_tasks_are_named_and_shared() -> None:
    """One Dask task per distinct factor problem, keyed ``optimize-factor-<name>-<token>``."""
    keys: list[str] = []

    class Spy(Callback):
        def _pretask(self, key, dsk, state) -> None:
            keys.append(key if isinstance(key, str) else key[0])

    W = Kron([Prefix(5), Identity(3), Prefix(5)])
    with Spy():
        sol = solve(W, [1.0, np.ones(3), 1.0], names=["age", "sex", "years"])
    assert len(sol.factors) == 3
    prefixes = sorted(k.rsplit("-", 1)[0] for k in keys)
    assert prefixes == ["optimize-factor-age", "optimize-factor-sex"]  # Prefix(5) solved once
    assert sol.factors[0] is sol.factors[2]


def test_census_scale_product(cph_domain: Domain) -> None:
    """A product over the 492,660-cell CPH domain: solved per attribute in well under a second."""
    W = wl.product(cph_domain, {"sex": Identity(2), "age": Prefix(115)})
    sol = solve(W, 1.0, names=list(cph_domain.attrs))
    assert type(sol).__name__ == "KronFitnessSolution"
    assert sol.privacy_profile().shape == (cph_domain.size,)
    assert sol.max_ratio == pytest.approx(1.0, rel=1e-9)
    totals = [f for f in sol.factors if f.workload.shape[0] == 1]
    assert len(totals) == 3
    # the same product on a small age axis, checked densely
    small = Kron([Identity(2), Ones(2), Prefix(6)])
    check_product(solve(small, 1.0), small)


def test_union_by_budget_split(rng: np.random.Generator) -> None:
    """Each part meets its targets; the squared profile is the sum of the parts'."""
    dom = Domain(a=2, b=3, c=2)
    W = VStack(
        [wl.product(dom, {"a": Identity(2), "b": Prefix(3)}), wl.marginal(dom, ["b", "c"])],
        weights=[1.0, 2.0],
    )
    c = rng.uniform(1.0, 2.0, W.shape[0])
    c[:6] = np.kron(rng.uniform(1, 2, 2), rng.uniform(1, 2, 3))  # the first part's factor
    sol = solve(W, c, method="union")
    assert sol.query_variances().max() <= (c * (1 + 1e-9)).max()
    np.testing.assert_allclose(sol.variance_ratios().max(), 1.0, rtol=1e-9)
    np.testing.assert_allclose(
        sol.query_variances(), np.concatenate([p.query_variances() for p in sol.parts])
    )
    B = sol.basis.dense()
    S = sla.block_diag(*[p.Sigma.dense() for p in sol.parts])
    np.testing.assert_allclose(sol.Sigma.dense(), S)
    np.testing.assert_allclose(sol.privacy_profile(), dense_profile(B, S), rtol=1e-9)
    np.testing.assert_allclose(sol.L.dense() @ B, W.dense(), atol=1e-9)
    # approximate: between the certified lower bound and the sum of the parts' costs
    joint = solve(W, c, method="dense")
    assert sol.lower_bound <= joint.privacy_cost**2 <= sol.privacy_cost**2 * (1 + 1e-6)
    assert sol.privacy_cost**2 <= sum(p.privacy_cost**2 for p in sol.parts) * (1 + 1e-9)
    np.testing.assert_allclose(sol.part_budget_shares().sum(), 1.0)


def test_method_errors() -> None:
    with pytest.raises(ValueError, match="Kron"):
        solve(Prefix(4), 1.0, method="factor")
    with pytest.raises(ValueError, match="Kronecker product"):
        solve(Kron([Prefix(2), Prefix(3)]), np.arange(1.0, 7.0), method="factor")
    with pytest.raises(ValueError, match="VStack"):
        solve(Prefix(4), 1.0, method="union")
    with pytest.raises(ValueError, match="too many"):
        solve(Prefix(5000), 1.0)
