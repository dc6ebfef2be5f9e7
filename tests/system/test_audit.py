"""The end-to-end privacy audit (dpdask.testing.audit, ``dpdask audit``)."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
import yaml
from scipy.stats import beta, binom

from dpdask.cli import main
from dpdask.pipeline.spec import parse_spec
from dpdask.privacy import ApproxDP, PureDP, zCDP, zcdp_epsilon
from dpdask.testing.audit import (
    DELTAS,
    audit_spec,
    clopper_pearson,
    clopper_pearson_lower,
    clopper_pearson_upper,
    control_budget,
    epsilon_lower_bound,
    rho_lower_bound,
    tail_counts,
)

PL94 = pathlib.Path(__file__).resolve().parents[2] / "examples" / "data" / "pl94_providence"


# -- Clopper-Pearson ----------------------------------------------------------------------------
@pytest.mark.parametrize("k,n,alpha", [(1, 10, 0.05), (7, 20, 0.01), (50, 100, 0.025), (3, 3, 0.1)])
def test_clopper_pearson_is_the_beta_quantile(k: int, n: int, alpha: float) -> None:
    assert clopper_pearson_lower(k, n, alpha) == pytest.approx(beta.ppf(alpha, k, n - k + 1))
    if k < n:
        upper = beta.ppf(1 - alpha, k + 1, n - k)
        assert clopper_pearson_upper(k, n, alpha) == pytest.approx(upper)


@pytest.mark.parametrize("n", [1, 5, 40, 1000])
def test_clopper_pearson_closed_forms_at_the_edges(n: int) -> None:
    alpha = 0.025
    # no success: the upper bound solves (1 - p)^n = alpha; all successes: p^n = alpha
    assert clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-12)
    assert clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-12)
    assert clopper_pearson_lower(0, n, alpha) == 0.0
    assert clopper_pearson_upper(n, n, alpha) == 1.0
    lo, hi = clopper_pearson(0, n, 0.95)
    assert (lo, hi) == (0.0, pytest.approx(1 - 0.025 ** (1 / n), rel=1e-12))


@pytest.mark.parametrize("p", [0.01, 0.3, 0.5, 0.93])
def test_clopper_pearson_covers_exactly(p: float) -> None:
    """Exact coverage (summing the binomial law): each side fails at most alpha."""
    n, alpha = 30, 0.05
    k = np.arange(n + 1)
    pmf = binom.pmf(k, n, p)
    above = sum(pmf[i] for i in k if clopper_pearson_lower(i, n, alpha) > p)
    below = sum(pmf[i] for i in k if clopper_pearson_upper(i, n, alpha) < p)
    assert above <= alpha + 1e-12 and below <= alpha + 1e-12


def test_clopper_pearson_refuses_bad_counts() -> None:
    with pytest.raises(ValueError, match="0 <= k <= n"):
        clopper_pearson_lower(5, 4, 0.05)
    with pytest.raises(ValueError, match="alpha"):
        clopper_pearson_upper(1, 4, 1.5)


# -- bounds from samples --------------------------------------------------------------------
def _gaussian_samples(rng: np.random.Generator, mu: float, n: int, sd: float = 1.0) -> tuple:
    return rng.normal(0.0, sd, n), rng.normal(mu, sd, n)


def test_bounds_stay_below_the_truth_for_a_gaussian_mechanism(rng) -> None:
    """A Gaussian mechanism with shift mu is (mu^2 / 2)-zCDP: no bound may exceed that."""
    mu = 1.0
    rho = mu**2 / 2
    for _ in range(20):
        t = tail_counts(*_gaussian_samples(rng, mu, 2000), shift=mu)
        for delta in DELTAS:
            assert epsilon_lower_bound(t, delta) <= zcdp_epsilon(rho, delta)
        assert 0.0 < rho_lower_bound(t) <= rho


def test_bounds_catch_a_mechanism_with_half_the_noise(rng) -> None:
    mu = math.sqrt(2.0)  # claimed rho = 1; half the noise is rho = 4
    z0, z1 = _gaussian_samples(rng, mu, 1000, sd=0.5)
    t = tail_counts(z0, z1, shift=mu)
    assert max(epsilon_lower_bound(t, d) - zcdp_epsilon(1.0, d) for d in DELTAS) > 0
    assert rho_lower_bound(t) > 1.0


def test_epsilon_bound_is_the_log_ratio_of_the_bounds() -> None:
    z0 = np.zeros(100)
    z1 = np.full(100, 10.0)  # every event separates the samples perfectly
    t = tail_counts(z0, z1, shift=10.0, m=3, confidence=0.95)
    lo, hi = clopper_pearson_lower(100, 100, t.alpha), clopper_pearson_upper(0, 100, t.alpha)
    assert t.alpha == pytest.approx(0.05 / 12)
    assert epsilon_lower_bound(t, 0.0) == pytest.approx(math.log(lo / hi))
    assert epsilon_lower_bound(t, 0.1) == pytest.approx(math.log((lo - 0.1) / hi))
    # Renyi of order 2 between Bernoullis, in closed form, bounds 2 rho from below
    d2 = math.log(lo**2 / hi + (1 - lo) ** 2 / (1 - hi))
    assert rho_lower_bound(t) >= d2 / 2


def test_no_signal_gives_zero() -> None:
    z = np.linspace(-3, 3, 200)
    t = tail_counts(z, z, shift=1.0)
    assert epsilon_lower_bound(t, 1e-6) == 0.0
    assert rho_lower_bound(t) == 0.0


def test_control_budget_halves_the_noise() -> None:
    assert control_budget(zCDP(1), "gaussian") == zCDP(4)
    assert control_budget(PureDP("0.5"), "laplace") == PureDP(1)
    claim = ApproxDP(1, "1e-6")
    ctrl = control_budget(claim, "gaussian")
    half = claim.gaussian_sigma(1.0) / 2
    assert ctrl.delta == claim.delta
    assert half * 0.999 < ctrl.gaussian_sigma(1.0) <= half


# -- the whole release path -----------------------------------------------------------------
def _spec_dict(tmp_path: pathlib.Path, levels: list[str]) -> dict:
    return {
        "release": "audit-ci",
        "data": {"format": "pl94", "path": str(PL94), "id": "ri-2018-e2e-providence"},
        "domain": "pl94",
        "levels": levels,
        "workload": "pl94",
        "privacy": {"zcdp": 1},
        "strategy": "hdmm",
        "reconstruct": "ls",
        "output": str(tmp_path / "out.zarr"),
        "ledger": {"path": str(tmp_path / "ledger.sqlite"), "create": True},
    }


def test_audit_pl94_release_and_positive_control(tmp_path) -> None:
    """The PL94 release of a block group and two of its blocks, rho = 1: the audit's
    bound stays below the claim, and the same release with half the noise is caught."""
    spec = parse_spec(_spec_dict(tmp_path, ["block_group", "block"]))
    result = audit_spec(spec, trials=600, batch=600, workdir=tmp_path)
    out = result.to_dict()
    assert out["lower_bound"] < out["claimed_epsilon"] < out["control_lower_bound"]
    assert out["claimed_epsilon"] == pytest.approx(zcdp_epsilon(1.0, out["delta"]))
    assert not result.flagged and result.control_flagged
    assert out["rho_lower_bound"] < 1.0 < out["control_rho_lower_bound"]
    assert out["trials"] == 600 and out["releases"] == 2
    assert out["trial_units"] == {
        "block_group": "440070001011",
        "block": ["440070001011000", "440070001011001"],
    }
    # the statistic behaves as the claim says: shift sqrt(2 rho), sd 1 (1/2 for the control)
    seen = out["observed"]
    assert seen["release"]["sd"] == pytest.approx(1.0, abs=0.1)
    assert seen["control"]["sd"] == pytest.approx(0.5, abs=0.05)
    assert seen["release"]["shift"] == pytest.approx(math.sqrt(2), abs=0.25)
    # nothing charged to the spec's ledger, nothing published at its output, nothing left
    assert not (tmp_path / "ledger.sqlite").exists()
    assert not (tmp_path / "out.zarr").exists()
    assert [p.name for p in tmp_path.iterdir()] == []
    json.dumps(out)


def test_cli_audit_prints_one_json_object(tmp_path, capsys) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec_dict(tmp_path, ["block"])))
    assert main(["audit", str(path), "--trials", "40", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("claimed_epsilon", "lower_bound", "control_lower_bound", "trials", "delta"):
        assert key in out
    assert out["trials"] == 40 and out["release"] == "audit-ci" and out["statistic"]
    assert out["lower_bound"] < out["claimed_epsilon"]
    assert not (tmp_path / "ledger.sqlite").exists()
