"""Top-down releases with the spine option (``spine=True``; issue 33), whole releases.

A one-county state whose tracts hold 1, 2 and 3 blocks: the county is a spine level
(not measured, its budget moved to the state) and the first block is its tract's only
child. Oracles, none of them the release compared with itself:

* the records: a spine unit holds its parent's records, so its estimate is its parent's,
  exactly; with noise off every level is the truth;
* the closed form of the state's noise once the county's budget is added to it:
  ``draw_variance("discrete_gaussian", Delta / sqrt(2 rho))``, ``Delta`` the strategy's
  dense column norm and ``rho`` the two levels' shares of the budget;
* the ledger: the charges add up to the release's budget with and without the spine,
  and no charge names the county.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import zarr

from dpdask.graph import release
from dpdask.noise import SecretKey, draw_variance
from dpdask.privacy import Ledger, zCDP
from dpdask.store import write_store
from dpdask.strategy import Plan
from tests.unit.test_spine import DOMAIN, GEO, LEVELS, A, W

SPLIT = {"state": 1, "county": 1, "tract": 1, "block": 2}
BUDGET = zCDP(1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("spine")
    counts = np.random.default_rng(5).integers(0, 40, size=(6, *DOMAIN.shape))
    store = write_store(d / "in.zarr", counts, DOMAIN, GEO)
    X = counts.reshape(6, -1).astype(float)
    tract = np.zeros((3, X.shape[1]))
    np.add.at(tract, GEO.parents[2], X)
    truth = {"block": X, "tract": tract, "county": tract.sum(0, keepdims=True)}
    truth["state"] = truth["county"]
    return {"dir": d, "store": store, "truth": truth}


def _run(data, name, *, spine=True, integer=False, noise=True, ledger=None):
    rel = release(
        Plan(W, A, BUDGET, domain=DOMAIN), data["store"], budget_split=SPLIT,
        reconstruct="topdown", spine=spine, integer=integer, noise=noise, release_id=name,
        run_id="r1", key=SecretKey.for_testing(7), test_mode=True, ledger=ledger, simulate=1,
    )  # fmt: skip
    out = rel.to_zarr(data["dir"] / f"{name}.zarr")
    root = zarr.open_group(str(out), mode="r")
    est = {lv: np.asarray(root[lv]["estimate"][:], dtype=float).reshape(-1, 6) for lv in LEVELS}
    return rel, est, root


@pytest.mark.parametrize("integer", [False, True])
def test_spine_units_equal_their_parents_exactly(data, integer):
    _, est, root = _run(data, f"eq{int(integer)}", integer=integer)
    np.testing.assert_array_equal(est["county"], est["state"])
    np.testing.assert_array_equal(est["block"][0], est["tract"][0])
    sums = np.zeros_like(est["tract"])
    np.add.at(sums, GEO.parents[2], est["block"])
    np.testing.assert_allclose(sums, est["tract"], rtol=0, atol=1e-9)
    assert (est["block"] >= 0).all() and est["state"].sum() > 0
    # the county was never measured: no unbiased answers of its own, and why
    assert "unbiased" not in root["county"]
    assert "spine" in root["county"].attrs["unbiased"]
    # the only block of t0 has no measurement either: NaN, and said so
    ub = root["block"]["unbiased"]
    answers = ub["estimate"][:]
    assert np.isnan(answers[0]).all() and np.isfinite(answers[1:]).all()
    assert "1 units that are their parent's only child" in ub.attrs["spine"]


@pytest.mark.parametrize("integer", [False, True])
def test_without_noise_the_truth_is_returned(data, integer):
    _, est, _ = _run(data, f"exact{int(integer)}", integer=integer, noise=False)
    tol = 0.0 if integer else 1e-6 * data["truth"]["state"].sum()
    for lv in LEVELS:
        np.testing.assert_allclose(est[lv], data["truth"][lv], rtol=0, atol=tol)


def test_the_moved_budget_is_charged_where_it_is_spent(data):
    ledger = Ledger.init(data["dir"] / "ledger.sqlite")
    spine, _, root = _run(data, "charged", ledger=ledger)
    plain, _, _ = _run(data, "plain", spine=False, ledger=ledger)
    by_level = {
        name: {c.level: c.privacy for c in ledger.charges(name)} for name in ("charged", "plain")
    }
    assert set(by_level["charged"]) == {"state", "tract", "block"}  # the county: no charge
    assert set(by_level["plain"]) == set(LEVELS)
    for name in by_level:
        assert sum(by_level[name].values(), start=BUDGET.zero()) == BUDGET
        assert ledger.spent(name) == BUDGET
    assert by_level["charged"]["state"] == by_level["plain"]["state"] + by_level["plain"]["county"]
    # the state's noise: the closed form at rho = (1 + 1) / 5 of the budget
    dense = A.dense()
    delta = float(np.sqrt((dense**2).sum(axis=0)).max())
    rho = float(BUDGET.rho * Fraction(2, 5))
    expected = draw_variance("discrete_gaussian", delta / math.sqrt(2 * rho))
    rows = {row["level"]: row for row in spine.summary()["levels"]}
    assert rows["state"]["noise_variance"] == pytest.approx(expected, rel=1e-9)
    plain_state = next(r for r in plain.summary()["levels"] if r["level"] == "state")
    assert plain_state["noise_variance"] > 1.9 * rows["state"]["noise_variance"]
    # the release says what it did, per level
    attrs = root.attrs["dpdask"]
    assert attrs["spine"] is True
    levels = {row["level"]: row for row in attrs["levels"]}
    assert levels["county"]["spine"]["budget_moved_to"] == "state"
    assert levels["county"]["budget"]["rho"] == "0"
    assert levels["state"]["spine"]["budget_received_from"] == ["county"]
    assert levels["block"]["spine"]["units_reusing_parent"] == 1
    assert {c["level"] for c in attrs["charges"]} == {"state", "tract", "block"}
