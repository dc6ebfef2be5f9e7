"""The spine option with the multi-pass top-down and constraints (issue 33).

The one-county state of :mod:`tests.unit.test_spine`: the county is a spine level (not
measured, its budget moved to the state), block ``b0`` is its tract's only child. The
public constraints: the state's total (an invariant), an empty block ``b3`` and, in the
spine unit ``b0``, two structural zeros. Oracles, none of them the release compared with
itself:

* the records: a spine unit holds its parent's records, so its estimate is its parent's
  exactly, and with noise off every level is the truth;
* the constraints' own check (:meth:`Constraints.satisfied`) on the output;
* a second algorithm: without a level whose budget moves and with passes that use no
  level below, the release without the spine fits the lone block as a family of one
  (a constrained fit and rounding), from the same noise: it must give what the spine's
  copy gives, at every level;
* the measurements drawn: a recorder in place of the measure step sees every level but
  the county, in the fits and in the sweep of the levels' totals.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import zarr

import dpdask.graph._blocks as blocks
from dpdask.graph import release
from dpdask.noise import SecretKey
from dpdask.privacy import Ledger, zCDP
from dpdask.reconstruct.topdown import Constraints
from dpdask.store import write_store
from dpdask.strategy import Plan
from tests.unit.test_spine import DOMAIN, GEO, LEVELS, A, W

SPLIT = {"state": 1, "county": 1, "tract": 1, "block": 2}
N = DOMAIN.size
ZEROS = [1, 4]  # b0's structural zeros


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("spine-multipass")
    counts = np.random.default_rng(8).integers(0, 40, size=(6, N))
    counts[0, ZEROS] = 0
    counts[3] = 0  # the empty block
    store = write_store(d / "in.zarr", counts.reshape(6, *DOMAIN.shape), DOMAIN, GEO)
    X = counts.astype(float)
    tract = np.zeros((3, N))
    np.add.at(tract, GEO.parents[2], X)
    truth = {"block": X, "tract": tract, "county": tract.sum(0, keepdims=True)}
    truth["state"] = truth["county"]
    upper = np.full((6, N), np.inf)
    upper[0, ZEROS] = 0
    upper[3] = 0
    block = Constraints(np.zeros((6, N)), upper, np.zeros((0, N)), np.zeros((6, 0)),
                        np.zeros((6, 0)), tuple(GEO.ids[3]), ())  # fmt: skip
    total = X.sum()
    state = Constraints.none(1, N, ["s"]).with_queries(
        np.ones((1, N)), [[total]], [[total]], ["total"]
    )
    return {"dir": d, "store": store, "truth": truth, "cons": {"state": state, "block": block}}


def _run(data, name, *, levels=LEVELS, spine=True, integer=True, noise=True, ledger=None,
         passes="default", simulate=0, release_id=None):  # fmt: skip
    cons = data["cons"]
    rel = release(
        Plan(W, A, zCDP(1), domain=DOMAIN), data["store"], levels=levels,
        budget_split={lv: SPLIT[lv] for lv in levels}, reconstruct="topdown", spine=spine,
        integer=integer, noise=noise, passes=passes, constraints=cons,
        release_id=release_id or name,
        run_id="r1", key=SecretKey.for_testing(9), test_mode=True, ledger=ledger,
        simulate=simulate,
    )  # fmt: skip
    out = rel.to_zarr(data["dir"] / f"{name}.zarr")
    root = zarr.open_group(str(out), mode="r")
    est = {lv: np.asarray(root[lv]["estimate"][:], dtype=float).reshape(-1, N) for lv in levels}
    return rel, est


def _check_constraints(data, est):
    total = data["truth"]["state"].sum()
    for lv in LEVELS:
        assert est[lv].sum() == pytest.approx(total, rel=0, abs=1e-6)  # the invariant
        assert (est[lv] >= -1e-9).all()
    assert data["cons"]["block"].satisfied(est["block"], atol=1e-6).all()
    assert np.abs(est["block"][3]).max() <= 1e-9 and np.abs(est["block"][0, ZEROS]).max() <= 1e-9
    for i in range(1, len(LEVELS)):
        sums = np.zeros_like(est[LEVELS[i - 1]])
        np.add.at(sums, GEO.parents[i - 1], est[LEVELS[i]])
        np.testing.assert_allclose(sums, est[LEVELS[i - 1]], rtol=0, atol=1e-6)


@pytest.mark.parametrize("integer", [True, False])
def test_spine_units_are_their_parents_within_the_constraints(data, integer):
    ledger = Ledger.init(data["dir"] / f"ledger{int(integer)}.sqlite")
    _, est = _run(data, f"mp{int(integer)}", integer=integer, ledger=ledger, simulate=1)
    np.testing.assert_array_equal(est["county"], est["state"])
    np.testing.assert_array_equal(est["block"][0], est["tract"][0])
    _check_constraints(data, est)
    if integer:
        assert all(np.array_equal(e, np.round(e)) for e in est.values())
        assert est["state"].sum() == data["truth"]["state"].sum()
    charges = {c.level for c in ledger.charges(f"mp{int(integer)}")}
    assert charges == {"state", "tract", "block"}  # the county: no charge
    assert ledger.spent(f"mp{int(integer)}") == zCDP(1)


@pytest.mark.parametrize("integer", [True, False])
def test_without_noise_the_truth_is_returned(data, integer):
    _, est = _run(data, f"exact{int(integer)}", integer=integer, noise=False)
    tol = 0.0 if integer else 1e-6 * data["truth"]["state"].sum()
    for lv in LEVELS:
        np.testing.assert_allclose(est[lv], data["truth"][lv], rtol=0, atol=tol)


@pytest.mark.parametrize("integer", [True, False])
def test_the_copy_is_what_a_fit_of_the_family_of_one_gives(data, integer):
    """No budget moves without the county; passes without ``below`` make the other units'
    fits independent of the lone block's own measurement: from the same noise (the same
    release and run ids and key), the spine's copy and the plain release's constrained
    fit of the family of one must agree everywhere."""
    levels = ("state", "tract", "block")
    kw = {"levels": levels, "integer": integer, "passes": ["part1"], "release_id": "same"}
    _, spine = _run(data, f"copy{int(integer)}", **kw)
    _, plain = _run(data, f"fit{int(integer)}", spine=False, **kw)
    for lv in levels:
        if integer:
            np.testing.assert_array_equal(spine[lv], plain[lv])
        else:
            np.testing.assert_allclose(spine[lv], plain[lv], rtol=0, atol=1e-6)


def test_a_spine_level_is_never_measured(data, monkeypatch):
    """Neither the fits nor the sweep of the levels' totals draw the county's noise."""
    seen: Counter[str] = Counter()
    measure = blocks.measure_block

    def recorded(x, plan, key, ctx, info):
        seen[ctx.level] += 1
        return measure(x, plan, key, ctx, info)

    import dpdask.graph._multipass as multipass
    import dpdask.graph._spine as spine
    import dpdask.graph._subtree as subtree

    for module in (blocks, multipass, spine, subtree):
        monkeypatch.setattr(module, "measure_block", recorded)
    _, est = _run(data, "recorded")
    assert seen["county"] == 0
    # the sweep and the fit each measure the tract and the block once; the top, the fit
    assert seen == {"state": 1, "tract": 2, "block": 2}
    np.testing.assert_array_equal(est["county"], est["state"])
