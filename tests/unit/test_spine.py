"""The spine option's pure parts (:mod:`dpdask.graph._spine`; issue 33).

Oracles: the spine units of a hierarchy written out by hand; the closed form of the
noise variance once a level's budget moves (Gaussian ``sigma^2 = Delta^2 / (2 rho)``,
Laplace ``2 (Delta / epsilon)^2``, ``Delta`` the strategy's dense column norm), through
:func:`dpdask.noise.draw_variance`; a copied parent row read off the dense parent.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import sparse

from dpdask import Geography
from dpdask.errors import ArgumentError, DataError
from dpdask.graph import level_plans, spine_levels
from dpdask.graph._spine import discarded, spine_block, spine_option
from dpdask.linalg import Identity, Kron, Prefix, Total, VStack
from dpdask.noise import draw_variance
from dpdask.pipeline.spec import SpecError, parse_spec
from dpdask.privacy import PureDP, zCDP
from dpdask.reconstruct.topdown import Constraints
from dpdask.strategy import Plan
from tests.helpers import DOMAIN

LEVELS = ("state", "county", "tract", "block")
# a one-county state; tract t0 has a single block, t1 two, t2 three
GEO = Geography(
    levels=LEVELS,
    ids=(("s",), ("c",), ("t0", "t1", "t2"), tuple(f"b{i}" for i in range(6))),
    parents=(np.zeros(1, int), np.zeros(3, int), np.array([0, 1, 1, 2, 2, 2])),
)
A = VStack([Kron([Identity(2), Identity(3)]), Kron([Total(2), Prefix(3)])])
W = VStack([Kron([Identity(2), Total(3)]), Identity(6)])


def test_spine_units_and_moves_from_the_geography():
    sp = spine_levels(GEO, LEVELS)
    got = {s.level: (s.units, s.reusing, s.measured, s.budget_to) for s in sp.levels}
    assert got == {
        "state": (1, 0, True, None),
        "county": (1, 1, False, "state"),
        "tract": (3, 0, True, None),
        "block": (6, 1, True, None),
    }
    assert sp.levels[0].budget_from == ("county",)
    assert sp.moves == {"county": "state"}
    np.testing.assert_array_equal(sp.masks[3], [True, False, False, False, False, False])
    assert sp.summary("block")["share_reusing_parent"] == pytest.approx(1 / 6)
    # without the county, the tracts are three children of the state: nothing moves
    skip = spine_levels(GEO, ("state", "tract", "block"))
    assert skip.moves == {} and [s.reusing for s in skip.levels] == [0, 0, 1]


def test_a_chain_of_spine_levels_moves_to_the_nearest_measured_level():
    geo = Geography(
        levels=("nation", "state", "county", "tract"),
        ids=(("n",), ("s",), ("c",), ("t0", "t1")),
        parents=(np.zeros(1, int), np.zeros(1, int), np.zeros(2, int)),
    )
    sp = spine_levels(geo, geo.levels)
    assert sp.moves == {"state": "nation", "county": "nation"}
    assert sp.levels[0].budget_from == ("state", "county")


@pytest.mark.parametrize(
    ("budget", "law", "closed_form"),
    [
        # sigma^2 = Delta^2 / (2 rho); Laplace b = Delta_1 / epsilon, variance 2 b^2
        (zCDP(1), "gaussian", lambda d, b: d**2 / (2 * b)),
        (PureDP(1), "laplace", lambda d, b: 2 * (d / b) ** 2),
    ],
)
def test_a_moved_budget_shrinks_the_receivers_noise_by_the_closed_form(budget, law, closed_form):
    plan = Plan(W, A, budget, domain=DOMAIN)
    dense = A.dense()
    delta = (
        float(np.sqrt((dense**2).sum(axis=0)).max())
        if law == "gaussian"
        else float(np.abs(dense).sum(axis=0).max())
    )
    split = {"state": 1, "county": 1, "tract": 1, "block": 2}
    plain = level_plans(plan, LEVELS, split)
    moved = level_plans(plan, LEVELS, split, moves=spine_levels(GEO, LEVELS).moves)
    share = {lv: Fraction(s, 5) for lv, s in split.items()}
    amount = budget.rho if law == "gaussian" else budget.epsilon
    got = float(amount * (share["state"] + share["county"]))
    assert moved["state"].mechanism == law
    assert moved["state"].row_variance == pytest.approx(closed_form(delta, got), rel=1e-9)
    assert moved["state"].row_variance == pytest.approx(
        draw_variance(law, moved["state"].noise_scale), rel=1e-12
    )
    ratio = moved["state"].row_variance / plain["state"].row_variance
    expected = 1 / 2 if law == "gaussian" else 1 / 4  # twice the budget
    assert ratio == pytest.approx(expected, rel=1e-9)
    # the county is its receiver's plan; the measured levels' budgets sum to the total
    assert moved["county"] is moved["state"]
    spent = moved["state"].privacy + moved["tract"].privacy + moved["block"].privacy
    assert spent == budget
    assert moved["tract"].row_variance == plain["tract"].row_variance
    assert math.isclose(moved["block"].row_variance, plain["block"].row_variance)


def test_a_spine_level_copies_its_parents_rows():
    parent = np.array([[0.0, 2.5, 0, 0, 1, 0], [3, 0, 0, 0, 0, 7], [0, 0, 4, 0, 0, 0]])
    blocks = [sparse.COO.from_numpy(parent[:2]), sparse.COO.from_numpy(parent[2:])]
    got = spine_block(blocks, [0, 2], np.array([1, 2]), 6)
    np.testing.assert_array_equal(got.todense(), parent[1:])
    assert got.nnz == 3  # the parent's entries only
    # with constraints (a multi-pass release's): met, the copy; broken, an error naming
    # the unit, never a published row
    ok = Constraints.none(2, 6, ["c1", "c2"])
    copied = spine_block(blocks, [0, 2], np.array([1, 2]), 6, ok, "county")
    np.testing.assert_array_equal(copied.todense(), parent[1:])
    upper = np.full((2, 6), np.inf)
    upper[1, 2] = 3.0  # the second unit's parent holds 4 there
    capped = Constraints(np.zeros((2, 6)), upper, np.zeros((0, 6)), np.zeros((2, 0)),
                         np.zeros((2, 0)), ("c1", "c2"), ())  # fmt: skip
    with pytest.raises(DataError, match="county parent 2"):
        spine_block(blocks, [0, 2], np.array([1, 2]), 6, capped, "county")


def test_discarded_rows_are_nan_before_any_use():
    y = np.arange(12, dtype=np.int64).reshape(3, 4)

    def measure(x, plan, key, ctx, info):
        return y

    out = discarded(None, None, None, None, None, measure=measure, rows=np.array([1]))
    assert np.isnan(out[1]).all()
    np.testing.assert_array_equal(out[[0, 2]], y[[0, 2]])
    assert not np.isnan(y.astype(float)).any()  # the measurement it wraps is unchanged


def test_what_the_spine_does_not_go_with_is_refused():
    with pytest.raises(ArgumentError, match="reconstruct='topdown'"):
        spine_option(True, "ls", False, GEO, LEVELS)
    with pytest.raises(ArgumentError, match=r"\['county'\].*a plan per level"):
        spine_option(True, "topdown", True, GEO, LEVELS)
    with pytest.raises(ArgumentError, match="true or false"):
        spine_option("yes", "topdown", False, GEO, LEVELS)  # type: ignore[arg-type]
    assert spine_option(False, "ls", True, GEO, LEVELS) is None
    # a plan per level is fine where no budget moves
    assert spine_option(True, "topdown", True, GEO, ("state", "tract")) is not None


GOOD = {
    "release": "demo",
    "data": {"format": "synthetic", "geographies": 10},
    "domain": {"sex": 2, "age": 5},
    "levels": ["state", "county"],
    "workload": {"name": "marginals", "k": 1},
    "privacy": {"zcdp": 1},
    "reconstruct": {"method": "topdown", "spine": True},
    "output": "out/demo.zarr",
}


def test_the_spec_reads_spine_and_names_the_field(tmp_path):
    assert parse_spec(GOOD, tmp_path).spine is True
    assert parse_spec({**GOOD, "reconstruct": "topdown"}, tmp_path).spine is False
    bad = [
        ({"method": "topdown", "spine": "yes"}, "reconstruct.spine: must be true or false"),
        ({"method": "nnls", "spine": True}, "reconstruct.spine: .* needs method: topdown"),
    ]
    for rec, message in bad:
        with pytest.raises(SpecError, match=message):
            parse_spec({**GOOD, "reconstruct": rec}, tmp_path)
    per_level = {"levels": {"state": {"name": "marginals", "k": 1}, "county": "identity"}}
    with pytest.raises(SpecError, match=r"reconstruct\.spine: not with .* per level"):
        parse_spec({**GOOD, "workload": per_level}, tmp_path)
    # the multi-pass top-down (passes, invariants) keeps the spine
    passes = {"method": "topdown", "spine": True, "passes": "default"}
    assert parse_spec({**GOOD, "reconstruct": passes}, tmp_path).spine is True
    assert parse_spec({**GOOD, "invariants": {"state": ["total"]}}, tmp_path).spine is True
