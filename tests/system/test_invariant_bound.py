"""A published top-level total bounds the lattice (:mod:`dpdask.graph._bound`).

Oracles: the lattice of :func:`dpdask.measure.lattice` computed directly at a bound (the
release's summary must report its noise scale), the plan's nominal scale (the slack rule
keeps the drawn scale within 0.1% of it when the grid may be fine), the data's own state
total, and the ledger (a refusal charges nothing).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from dpdask import Geography, census
from dpdask.errors import DataError
from dpdask.graph import release
from dpdask.graph._bound import MAX_TOP_UNITS, release_bound
from dpdask.linalg import Dense, Identity
from dpdask.measure import DEFAULT_MAX_TOTAL, lattice
from dpdask.noise import KeyFile, SecretKey
from dpdask.privacy import Ledger, zCDP
from dpdask.reconstruct.topdown import Constraints
from dpdask.store import write_store
from dpdask.strategy import Plan

N_COUNTIES = 4


def _state(total: float | None, k: int = 1, n: int = 3) -> Constraints:
    """``k`` top units on ``n`` cells, each unit's total fixed at ``total`` (None: free)."""
    bound = np.full((k, 1), np.inf if total is None else float(total))
    lo = np.full((k, 1), -np.inf if total is None else float(total))
    return Constraints(
        np.zeros((k, n)), np.full((k, n), np.inf), np.ones((1, n)), lo, bound,
        tuple(f"s{i}" for i in range(k)), ("total",),
    )  # fmt: skip


@pytest.fixture(scope="module")
def dense_release(tmp_path_factory):
    """A 252-cell store (one state, four counties) and a plan with a dense orthogonal
    strategy: its floating-point evaluation error makes the default bound's grid coarse."""
    d = tmp_path_factory.mktemp("bound")
    domain = census.pl94_domain()
    n = domain.size
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 3, size=(N_COUNTIES, *domain.shape))
    geo = Geography(
        levels=("state", "county"),
        ids=(("s",), tuple(f"c{i}" for i in range(N_COUNTIES))),
        parents=(np.zeros(N_COUNTIES, dtype=int),),
    )
    store = write_store(d / "in.zarr", counts, domain, geo)
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    plan = Plan(Identity(n), Dense(Q), zCDP(Fraction(1, 2)))
    return {"store": store, "plan": plan, "total": int(counts.sum()), "n": n, "dir": d}


def _release(case, constraints=None, **kw):
    plans = {"state": case["plan"], "county": case["plan"]}
    return release(
        plans, case["store"], reconstruct="topdown", release_id="bound", simulate=0,
        unbiased_limit=0, constraints=constraints, **kw,
    )  # fmt: skip


def _scales(rel) -> list[float]:
    return [row["noise_scale"] for row in rel.summary()["levels"]]


def test_an_exact_state_total_bounds_the_lattice(dense_release):
    """With the state's total published exactly, the release sizes its lattice for that
    total: the noise drawn is the lattice's at that bound, within 0.2% of the plan's
    nominal scale, and below the default bound's (coarser grid, more noise)."""
    case = dense_release
    total, plan = case["total"], case["plan"]
    kw = {"test_mode": True, "key": SecretKey.for_testing(1), "run_id": "b"}
    bounded = _release(case, {"state": _state(total, n=case["n"])}, **kw)
    default = _release(case, None, **kw)
    assert bounded.summary()["max_total"] == total
    assert default.summary()["max_total"] == DEFAULT_MAX_TOTAL
    at_total = lattice(plan, np.int64, total).noise_scale
    at_default = lattice(plan, np.int64, DEFAULT_MAX_TOTAL).noise_scale
    assert _scales(bounded) == pytest.approx([at_total, at_total], rel=1e-12)
    assert _scales(default) == pytest.approx([at_default, at_default], rel=1e-12)
    assert at_total <= plan.noise_scale * 1.002
    assert at_default > at_total * 1.005  # the default's coarser grid adds noise here
    # a bound the caller states wins over the invariant's
    stated = _release(case, {"state": _state(total, n=case["n"])}, max_total=10**7, **kw)
    assert stated.summary()["max_total"] == 10**7


def test_a_state_total_below_the_data_is_refused_before_any_charge(dense_release, tmp_path):
    """Constraints that publish a state total below the data's give a bound the data
    exceeds: the release refuses before the ledger is charged, naming the bound."""
    case = dense_release
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    key = KeyFile.create(tmp_path / "release.key")  # the real key-file path
    rel = _release(
        case, {"state": _state(case["total"] - 1, n=case["n"])}, ledger=ledger, key=key,
        run_id="low",
    )  # fmt: skip
    assert rel.summary()["max_total"] == case["total"] - 1
    with pytest.raises(DataError, match="max_total"):
        rel.to_zarr(tmp_path / "out.zarr")
    assert ledger.charges("bound") == []
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize(
    ("constraints", "expected"),
    [
        ({"state": _state(1234.2, k=3)}, 1235),  # the largest, rounded up
        ({"state": _state(None, k=2)}, DEFAULT_MAX_TOTAL),  # totals not published
        ({"county": _state(50.0)}, DEFAULT_MAX_TOTAL),  # not the top level's
        ({"state": _state(0.0)}, 1),  # an empty state
        ({"state": _state(50.0, k=MAX_TOP_UNITS + 1)}, DEFAULT_MAX_TOTAL),  # too many units
        (None, DEFAULT_MAX_TOTAL),
        ("not constraints", DEFAULT_MAX_TOTAL),  # refused later by the release's checks
    ],
)
def test_release_bound_from_the_constraints(constraints, expected):
    assert release_bound(None, constraints, "state") == expected


def test_release_bound_from_equal_cell_bounds_and_mixed_units():
    """A unit whose every cell bound is equal has its total fixed too; one unit without a
    published total leaves the default."""
    n = 3
    fixed = Constraints(
        np.full((2, n), 2.0), np.full((2, n), 2.0), np.zeros((0, n)), np.zeros((2, 0)),
        np.zeros((2, 0)), ("a", "b"), (),
    )  # fmt: skip
    assert release_bound(None, {"state": fixed}, "state") == 6
    upper = np.full((2, n), 2.0)
    upper[1, 0] = 3.0
    mixed = Constraints(
        np.full((2, n), 2.0), upper, np.zeros((0, n)), np.zeros((2, 0)), np.zeros((2, 0)),
        ("a", "b"), (),
    )  # fmt: skip
    assert release_bound(None, {"state": mixed}, "state") == DEFAULT_MAX_TOTAL
    assert release_bound(77, {"state": fixed}, "state") == 77
