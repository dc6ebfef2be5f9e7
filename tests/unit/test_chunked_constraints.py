"""Constraints built a chunk of units at a time (issue 33, large states): every chunk a
task builds from its part equals the dense constraints' rows (``ReleaseConstraints.at``,
and the dense hierarchy completion of ``level_constraints``: the oracles), and the part
a task is sent holds its units' attributes, not their bounds."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

from dpdask.errors import ArgumentError, ArgumentTypeError, DataError, ShapeError
from dpdask.graph import ChunkedConstraints
from dpdask.graph._chunked import chunk_constraints, constraint_counts
from dpdask.graph._multipass import level_constraints
from dpdask.pipeline import parse_spec
from dpdask.pipeline.invariants import checked_constraints, release_constraints
from dpdask.reconstruct.topdown import Constraints
from dpdask.store import synthetic_blocks_store
from tests import ROOT

LEVELS = ("state", "county", "tract", "block_group", "block")


def _raw(store, **constraints) -> dict:
    return {
        "release": "chunks",
        "data": {"format": "store", "path": str(store)},
        "domain": "pl94-full",
        "levels": list(LEVELS),
        "workload": "pl94-full",
        "privacy": {"zcdp": 1},
        "reconstruct": {"method": "topdown", "integer": True},
        "invariants": {"state": ["total"], "block": ["housing_units", "gq_facilities"]},
        "constraints": {
            "empty_units": True,
            "nursing_minors": True,
            "gq_bounds": {"capacity": 50},
            **constraints,
        },
        "output": "out.zarr",
        "ledger": "ledger.sqlite",
    }


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    path = tmp_path_factory.mktemp("chunked") / "store"
    return synthetic_blocks_store(path, 400, 6_000, seed=3, scheduler="sync")


@pytest.fixture(scope="module")
def rc(blocks):
    cells = [{"level": "block_group", "mask": {"votingage": [0]}, "lower": 1}]
    spec = parse_spec(_raw(blocks.path, cells=cells), base=ROOT)
    out = checked_constraints(spec, blocks, LEVELS)
    assert out is not None
    return out


def _same(a: Constraints, b: Constraints) -> None:
    assert a.units == b.units and a.labels == b.labels
    for name in ("lower", "upper", "queries", "lo", "hi"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def _chunks(k: int) -> list[np.ndarray]:
    """Uneven chunks covering ``0 .. k - 1`` (a one-unit chunk among them)."""
    cuts = sorted({min(c, k) for c in (0, 1, k // 3, k // 3 + 7, (2 * k) // 3, k)})
    return [np.arange(a, b) for a, b in itertools.pairwise(cuts) if b > a]


def test_each_chunk_equals_the_dense_rows(rc):
    lazy = rc.lazy()
    assert all(isinstance(c, ChunkedConstraints) for c in lazy.values())
    for lv in LEVELS:
        dense = rc.at(lv)  # the oracle: every unit's bounds at once
        c = lazy[lv]
        assert (c.k, c.n) == (dense.k, dense.n) and c.labels == dense.labels
        for rows in _chunks(c.k):
            want = dense.take(rows)
            _same(c.take(rows), want)
            _same(c.part(rows).take(), want)  # what a task builds on its worker
            task = chunk_constraints(c, rows)  # (build, part): run by Dask in the task
            _same(task[0](*task[1:]), want)


def test_the_levels_are_complete_up_the_hierarchy(rc):
    """Each level's chunks equal the dense path's bounds, which meets every level's with
    the sum of its children's (``level_constraints`` on dense constraints)."""
    parents = list(rc.parents)
    units = [rc.units[lv] for lv in LEVELS]
    n = rc.level("block").n
    completed = level_constraints({lv: rc.at(lv) for lv in LEVELS}, LEVELS, units, parents, n)
    kept = level_constraints(rc.lazy(), LEVELS, units, parents, n)
    assert completed is not None and kept is not None
    for lv in LEVELS:
        want = completed[lv]
        assert isinstance(want, Constraints) and not isinstance(kept[lv], Constraints)
        for rows in _chunks(want.k):
            got = kept[lv].take(rows)
            w = want.take(rows)
            for name in ("lower", "upper", "lo", "hi"):
                np.testing.assert_array_equal(getattr(got, name), getattr(w, name), err_msg=name)
        assert constraint_counts(kept[lv]) == constraint_counts(want)
    assert constraint_counts(kept["block"])["structural_zeros"] > 0  # empty blocks


def test_a_part_holds_attributes_not_bounds(rc):
    c = rc.level("block")
    rows = np.arange(100, 300)
    part = c.part(rows)
    assert part.source is None and part.k == rows.size
    dense = c.take(rows)
    assert len(pickle.dumps(part)) < (dense.lower.nbytes + dense.upper.nbytes) / 20
    with pytest.raises(ArgumentError, match="a part cannot check the levels"):
        part.check()


def test_the_units_private_totals_travel_only_where_published(rc):
    """The state's total is an invariant (published); no other level's units' totals
    (the data's, private) are in its constraints, which every chunk's task carries."""
    for lv, c in rc.lazy().items():
        assert "total" not in c.attrs, lv
        assert ("total" in c.values) is (lv == "state"), lv
        part = c.part(np.arange(min(3, c.k)))
        assert "total" not in part.attrs and part.values.keys() == c.values.keys()


@pytest.mark.parametrize("level", ["block", "tract"])
def test_a_pickled_part_builds_the_same_constraints(rc, level):
    """A part travels pickled inside its chunk's tasks, its 0/1 query rows a bit each:
    what the worker builds from it equals the dense rows (the oracle)."""
    c = rc.level(level)
    rows = np.arange(min(5, c.k), c.k)
    part = c.part(rows)
    sent = pickle.dumps(part)
    assert len(sent) < len(pickle.dumps(part.queries))  # rows were 8 bytes an entry
    got = pickle.loads(sent)
    assert got.queries.dtype == part.queries.dtype
    _same(got.take(), rc.at(level).take(rows))


def test_chunked_constraints_are_refused_when_incomplete(rc):
    lazy = rc.lazy()
    units = [rc.units[lv] for lv in LEVELS]
    parents, n = list(rc.parents), rc.level("block").n
    with pytest.raises(ArgumentError, match=r"give every released level's \(missing \['tract'\]"):
        level_constraints(
            {k: v for k, v in lazy.items() if k != "tract"}, LEVELS, units, parents, n
        )
    mixed = {**lazy, "state": rc.at("state")}
    with pytest.raises(ArgumentTypeError, match=r"dense at \['state'\]"):
        level_constraints(mixed, LEVELS, units, parents, n)
    with pytest.raises(ArgumentTypeError, match=r"constraints\['tract'\] must be a Constraints"):
        level_constraints({**lazy, "tract": "bounds"}, LEVELS, units, parents, n)
    swapped = {**lazy, "tract": lazy["county"]}
    with pytest.raises(ShapeError, match=r"constraints\['tract'\] holds 1 units"):
        level_constraints(swapped, LEVELS, units, parents, n)


def test_conflicting_constraints_are_found_by_chunks(blocks):
    """Every person of every block group under 18: yet blocks with people of voting age
    must then hold none; the state's exact total cannot be met."""
    nobody = [{"level": "block_group", "mask": {"votingage": [0, 1]}, "upper": 0}]
    spec = parse_spec(_raw(blocks.path, cells=nobody), base=ROOT)
    rc = release_constraints(spec, blocks, LEVELS)  # unchecked: the release checks it
    lazy = rc.lazy()
    units = [rc.units[lv] for lv in LEVELS]
    with pytest.raises(DataError, match=r"^state 99: total must be in \["):
        level_constraints(lazy, LEVELS, units, list(rc.parents), lazy["block"].n)
