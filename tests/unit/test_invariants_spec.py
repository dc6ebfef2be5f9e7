"""``invariants:`` and ``constraints:`` of a release spec: strict parsing, the schema, and
the per-level constraints built from a store's public attributes.

Oracles: the Census builders of :mod:`dpdask.reconstruct.topdown`
(:func:`pl94_full_constraints`, :func:`pl94_constraints`, written separately from the
spec's builder), :meth:`Constraints.aggregate` for the levels above the block, and masks
and bounds written out by hand on tiny domains.
"""

from __future__ import annotations

import copy
import pathlib

import numpy as np
import pytest
import yaml

from dpdask.census import pl94_domain, pl94_full_domain
from dpdask.domain import Domain, Geography
from dpdask.errors import ArgumentError, DataError, SpecError
from dpdask.pipeline import parse_spec
from dpdask.pipeline.invariants import (
    HONOURED_BY,
    check_estimator,
    release_constraints,
    unit_totals,
)
from dpdask.privacy import RunBinding
from dpdask.reconstruct.topdown import Constraints, pl94_constraints, pl94_full_constraints
from dpdask.specs import release_spec_schema, schema_problems
from dpdask.store import write_store

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = ROOT / "pipelines" / "pl94-providence-invariants.yaml"
GEO = Geography.from_geoids(
    ["1101", "1102", "1201", "1202", "1203"], {"state": 1, "tract": 2, "block": 4}
)


def _raw(**changes) -> dict:
    raw = yaml.safe_load(SPEC.read_text())
    raw["data"] = {"format": "synthetic-blocks", "blocks": 5, "persons": 10}
    raw["domain"] = "pl94-full"
    raw["levels"] = ["state", "tract", "block"]
    raw["privacy"] = {"zcdp": 1}
    raw["invariants"] = {"state": ["total"], "block": ["housing_units", "gq_facilities"]}
    raw["constraints"] = {
        "empty_units": True,
        "nursing_minors": True,
        "gq_bounds": {"capacity": 40},
        "cells": [{"level": "block", "mask": {"hhgq": [3], "votingage": [0]}, "upper": 0}],
    }
    raw.update(changes)
    return raw


def test_a_full_spec_parses_and_states_itself() -> None:
    spec = parse_spec(_raw(), base=ROOT)
    inv = spec.invariants
    assert inv.names("block") == ("housing_units", "gq_facilities") and inv.names("tract") == ()
    st = inv.statement()
    assert st["invariants"] == {"state": ["total"], "block": ["housing_units", "gq_facilities"]}
    assert st["constraints"]["empty_units"] == {"facilities": "gq_facilities"}
    assert st["constraints"]["gq_bounds"] == {"capacity": 40}
    assert st["constraints"]["cells"] == [
        {"level": "block", "mask": {"hhgq": [3], "votingage": [0]}, "upper": 0}
    ]
    assert st["attributes"] == ["gq_facilities", "housing_units"]
    assert not parse_spec(_raw(invariants=None, constraints=None), base=ROOT).invariants


def _drop(key):
    return lambda r: r.pop(key)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: r.update(invariants={"county": ["total"]}), "invariants"),
        (lambda r: r.update(invariants={"state": ["people"]}), "invariants.state"),
        (lambda r: r.update(invariants={"state": []}), "invariants.state"),
        (lambda r: r.update(invariants={"state": ["total", "total"]}), "invariants.state"),
        (lambda r: r.update(invariants=["total"]), "invariants"),
        (lambda r: r["constraints"].update(colour=True), "constraints"),
        (lambda r: r["constraints"].update(nursing_minors="yes"), "constraints.nursing_minors"),
        (
            lambda r: r["constraints"].update(empty_units={"facilities": "beds"}),
            "constraints.empty_units.facilities",
        ),
        (lambda r: r["constraints"].update(gq_bounds={"cap": 3}), "constraints.gq_bounds"),
        (
            lambda r: r["constraints"].update(gq_bounds={"capacity": -1}),
            "constraints.gq_bounds.capacity",
        ),
        (
            lambda r: r["constraints"].update(gq_bounds={"capacity": "gq_beds"}),
            "constraints.gq_bounds.capacity",  # synthetic blocks carry no gq_beds
        ),
        (lambda r: r["constraints"].update(cells=[{"level": "block"}]), "constraints.cells[0]"),
        (
            lambda r: r["constraints"].update(
                cells=[{"level": "county", "mask": {"hhgq": [3]}, "upper": 0}]
            ),
            "constraints.cells[0].level",
        ),
        (
            lambda r: r["constraints"].update(
                cells=[{"level": "block", "mask": {"hhgq": [8]}, "upper": 0}]
            ),
            "constraints.cells[0].mask.hhgq",
        ),
        (
            lambda r: r["constraints"].update(
                cells=[{"level": "block", "mask": {"age": [1]}, "upper": 0}]
            ),
            "constraints.cells[0].mask",
        ),
        (
            lambda r: r["constraints"].update(
                cells=[{"level": "block", "mask": {"hhgq": [1]}, "lower": 3, "upper": 2}]
            ),
            "constraints.cells[0]",
        ),
        (
            lambda r: r["constraints"].update(
                cells=[{"level": "block", "mask": {"hhgq": [1]}, "upper": 2, "top": 1}]
            ),
            "constraints.cells[0]",
        ),
    ],
)
def test_bad_invariants_fail_naming_the_field(change, field) -> None:
    raw = _raw()
    change(raw)
    with pytest.raises(SpecError, match=rf"^{field.replace('[', '.').replace(']', '.')}"):
        parse_spec(raw, base=ROOT)


def _pl94(**changes) -> dict:
    raw = yaml.safe_load(SPEC.read_text())
    raw.update(changes)
    return raw


@pytest.mark.parametrize(
    ("change", "field"),
    [
        # the pl94 domain has no hhgq axis
        ({"constraints": {"nursing_minors": True}}, "constraints.nursing_minors"),
        ({"constraints": {"gq_bounds": True}}, "constraints.gq_bounds"),
        ({"invariants": {"block": ["gq_population"]}}, "invariants.block"),
        # a P.L. 94 file counts no facilities
        ({"invariants": {"block": ["gq_facilities"]}}, "invariants.block"),
        ({"constraints": {"empty_units": True}}, "constraints.empty_units"),
    ],
)
def test_constraints_the_data_or_domain_cannot_hold_are_refused(change, field) -> None:
    with pytest.raises(SpecError, match=rf"^{field}"):
        parse_spec(_pl94(**change), base=ROOT)
    raw = _pl94(**change)
    raw["data"] = {"format": "ri2010", "path": "x.csv"}
    with pytest.raises(SpecError):  # an RI 2010 file carries no attribute at all
        parse_spec(raw, base=ROOT)


def test_the_schema_takes_good_invariants_and_names_bad_ones() -> None:
    schema = release_spec_schema()
    assert list(schema_problems(_raw(), schema)) == []
    for bad, field in [
        (_raw(invariants={"state": ["people"]}), "invariants"),
        (_raw(constraints={"empty": True}), "constraints"),
        (_raw(constraints={"cells": [{"level": "block", "mask": {}, "top": 1}]}), "cells"),
        (_raw(constraints={"gq_bounds": {"capacity": -2}}), "gq_bounds"),
    ]:
        problems = list(schema_problems(bad, schema))
        assert problems and any(field in p for p in problems), problems


# -- the builder ----------------------------------------------------------------------------
HU = np.array([0, 3, 0, 5, 0])
FAC = np.zeros((5, 8), dtype=np.int64)
FAC[2, 3] = 1  # block 1201: a nursing home, no housing unit
FAC[3, 5] = 2  # block 1202: housing units and two dormitories
CAP = FAC * 30


def _store(tmp_path, domain: Domain, counts=None, **attrs):
    if counts is None:
        counts = np.zeros((5, *domain.shape), dtype=np.int64)
    return write_store(tmp_path / "s", counts, domain, GEO, unit_attributes=attrs)


def _full_counts() -> np.ndarray:
    """Persons consistent with HU and FAC: household persons where there are housing
    units, adults in the nursing home, residents in the dormitories."""
    c = np.zeros((5, *pl94_full_domain().shape), dtype=np.int64)
    c[1, 0, 1, 0, 0] = 4
    c[2, 3, 1, 0, 0] = 2
    c[3, 0, 0, 1, 5] = 3
    c[3, 5, 1, 0, 0] = 6
    return c


def _spec(raw: dict):
    return parse_spec(raw, base=ROOT)


def _on_store(raw: dict, tmp_path, name: str = "s") -> dict:
    """``raw`` reading the store written at ``tmp_path / name``."""
    return {**raw, "data": {"format": "store", "path": str(tmp_path / name)},
            "privacy": {"zcdp": 1}, "levels": ["state", "tract", "block"]}  # fmt: skip


def _same(a: Constraints, b: Constraints) -> None:
    for name in ("lower", "upper", "queries", "lo", "hi"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        np.testing.assert_array_equal(
            np.nan_to_num(x, posinf=1e300), np.nan_to_num(y, posinf=1e300)
        )


def test_full_domain_blocks_match_the_census_builder(tmp_path) -> None:
    raw = _raw(constraints={"empty_units": True, "nursing_minors": True,
                            "gq_bounds": {"capacity": "gq_capacity"}})  # fmt: skip
    spec = _spec(_on_store(raw, tmp_path))
    store = _store(tmp_path, pl94_full_domain(), _full_counts(),
                   housing_units=HU, gq_facilities=FAC, gq_capacity=CAP)  # fmt: skip
    rc = release_constraints(spec, store, ("state", "tract", "block"))
    want = pl94_full_constraints(HU, FAC, capacity=CAP)
    got = rc.at("block")
    assert got.labels == want.labels
    _same(got, want)
    assert got.units == tuple(f"block {u}" for u in GEO.ids[2])
    # a tract's bounds are its blocks' summed; the state's total is its invariant
    tract = rc.at("tract")
    agg = want.aggregate(GEO.ancestor_index("tract"))
    np.testing.assert_array_equal(tract.upper, agg.upper)
    np.testing.assert_array_equal(tract.lo[:, 1:], agg.lo[:, 1:])
    np.testing.assert_array_equal(tract.hi[:, 1:], agg.hi[:, 1:])
    state = rc.at("state")
    assert state.lo[0, 0] == state.hi[0, 0] == 15  # 4 + 2 + 3 + 6 persons
    assert np.isinf(tract.hi[:, 0]).all() and np.isinf(got.hi[:, 0]).all()
    assert rc.exact["state"] == ("total", "housing_units", "gq_facilities")
    assert rc.exact["block"] == ("housing_units", "gq_facilities")
    np.testing.assert_array_equal(rc.values["tract"]["housing_units"], [3, 5])
    rc.check()  # the persons are consistent with their constraints
    assert rc.at("block", slice(1, 3)).units == ("block 1102", "block 1201")


def test_pl94_domain_matches_the_census_builder(tmp_path) -> None:
    dom = pl94_domain()
    counts = np.zeros((5, *dom.shape), dtype=np.int64)
    counts[1, 1, 0, 0] = 2
    counts[3, 0, 1, 7] = 1
    gq = np.zeros((5, 8), dtype=np.int64)
    gq[2, 3] = 2  # block 1201: no housing unit, two persons in a nursing facility
    gq[3, 0] = 1  # block 1202: one household person
    facilities = gq.copy()
    facilities[:, 0] = 0  # a facility of each type whose population is positive
    raw = _pl94(invariants={"block": ["total"]},
                constraints={"empty_units": {"facilities": "gq_population"}})  # fmt: skip
    store = _store(tmp_path, dom, counts, housing_units=HU, gq_population=gq)
    rc = release_constraints(_spec(_on_store(raw, tmp_path)), store, ("state", "tract", "block"))
    totals = counts.reshape(5, -1).sum(axis=1)
    _same(rc.at("block"), pl94_constraints(HU, facilities, totals=totals))
    assert (rc.at("block").upper.max(axis=1) == 0).tolist() == [True, False, False, False, True]
    np.testing.assert_array_equal(unit_totals(store, rows_per_block=2), totals)
    assert rc.at("state").lo[0, 0] == 3 and rc.exact["tract"] == ("total",)
    rc.check()


def test_cell_masks_by_hand(tmp_path) -> None:
    dom = Domain(a=2, b=3)
    raw = _pl94(domain={"a": 2, "b": 3}, levels=["state", "tract", "block"], invariants=None,
                constraints={"cells": [{"level": "block", "mask": {"a": [1], "b": [0, 2]},
                                        "upper": 0},
                                       {"level": "tract", "mask": {"b": 1}, "lower": 1,
                                        "upper": 4}]})  # fmt: skip
    raw = _on_store(raw, tmp_path)
    counts = np.zeros((5, 2, 3), dtype=np.int64)
    counts[:, 0, 1] = 1  # one person in b=1 per block: tracts hold 2 and 3
    rc = release_constraints(_spec(raw), _store(tmp_path, dom, counts), ("state", "tract", "block"))
    assert rc.labels == ("total", "cells[0]", "cells[1]")
    np.testing.assert_array_equal(rc.queries[1], [0, 0, 0, 1, 0, 1])  # cells (1,0), (1,2)
    np.testing.assert_array_equal(rc.queries[2], [0, 1, 0, 0, 1, 0])
    block = rc.at("block")
    assert (block.upper[:, [3, 5]] == 0).all() and np.isinf(block.upper[:, [0, 1, 2, 4]]).all()
    assert (block.hi[:, 1] == 0).all() and np.isinf(block.hi[:, 2]).all()  # cells[1]: tracts
    tract = rc.at("tract")
    np.testing.assert_array_equal(tract.lo[:, 2], [1, 1])
    np.testing.assert_array_equal(tract.hi[:, 2], [4, 4])
    state = rc.at("state")  # two tracts under the state: the bounds summed
    assert (state.lo[0, 2], state.hi[0, 2]) == (2, 8)
    rc.check()
    # tracts (so the state) needing persons in b=1 where no block may hold one
    raw["constraints"]["cells"].append({"level": "block", "mask": {"b": [1]}, "upper": 0})
    rc = release_constraints(_spec(raw), rc_store(tmp_path, dom), ("state", "tract", "block"))
    with pytest.raises(DataError, match=r"^state 1: cells\[1\] must be in \[2, 8\]"):
        rc.check()


def rc_store(tmp_path, dom):
    return write_store(tmp_path / "t", np.zeros((5, *dom.shape), dtype=np.int64), dom, GEO)


def test_infeasible_invariants_name_the_unit(tmp_path) -> None:
    """The state's total cannot sit in blocks that may hold nobody."""
    dom = pl94_full_domain()
    counts = _full_counts()
    store = _store(tmp_path, dom, counts, housing_units=np.zeros(5, dtype=np.int64),
                   gq_facilities=np.zeros((5, 8), dtype=np.int64))  # fmt: skip
    raw = _raw(constraints={"empty_units": True})
    rc = release_constraints(_spec(raw), store, ("state", "tract", "block"))
    with pytest.raises(DataError, match=r"^state 1: total must be in \[15, 15\].*every cell"):
        rc.check()
    # block totals below their facilities
    store = write_store(tmp_path / "f", counts, dom, GEO, unit_attributes={
        "housing_units": HU, "gq_facilities": FAC * 3})  # fmt: skip
    raw = _raw(invariants={"block": ["total"]}, constraints={"gq_bounds": True})
    rc = release_constraints(_spec(raw), store, ("state", "tract", "block"))
    with pytest.raises(DataError, match=r"^block 1201: total is at most 2 but nursing"):
        rc.check(cells_per_block=dom.size)  # one family at a time: found all the same


def test_the_data_must_carry_the_attributes(tmp_path) -> None:
    store = _store(tmp_path, pl94_full_domain(), housing_units=HU)
    with pytest.raises(SpecError, match=r"^invariants.block: the data carries no .*gq_facilities"):
        release_constraints(_spec(_raw()), store, ("state", "tract", "block"))
    raw = _raw(invariants={"county": ["total"]}, constraints=None, levels=None)
    with pytest.raises(SpecError, match=r"^invariants: 'county' is not a released level"):
        release_constraints(_spec(raw), store, ("state", "tract", "block"))


def test_only_the_top_down_fit_honours_them() -> None:
    assert HONOURED_BY == frozenset({"topdown"})
    check_estimator(_spec(_raw()))  # the shipped spec's reconstruct: topdown
    for method in ("ls", "nnls"):
        with pytest.raises(SpecError, match=rf"^reconstruct: '{method}' does not honour"):
            check_estimator(_spec(_raw(reconstruct=method)))
    check_estimator(_spec(_raw(invariants=None, constraints=None)))  # nothing to honour
    marginal = _spec(_raw(strategy="residual", workload={"marginals": {"k": 1}}))
    with pytest.raises(SpecError, match=r"^invariants: a marginal \(residual\) release"):
        check_estimator(marginal)


def test_the_run_binding_records_them_only_when_stated() -> None:
    old = {"source": "a" * 64, "spec": "b" * 64, "output": "/out/x.zarr"}
    assert RunBinding.from_dict(copy.deepcopy(old)).to_dict() == old  # earlier entries
    st = _spec(_raw()).invariants.statement()
    b = RunBinding.from_dict({**old, "invariants": st})
    assert b.to_dict() == {**old, "invariants": st} and b.invariants == st
    for bad in ({}, {"exact": 1, "levels": []}, {"invariants": ["total"]}, "state: total"):
        with pytest.raises(ArgumentError, match="run binding invariants"):
            RunBinding(old["source"], old["spec"], old["output"], invariants=bad)  # type: ignore[arg-type]


def test_the_spec_hash_changes_with_them_and_not_without() -> None:
    from dpdask.pipeline._resume import spec_print

    plain = _raw(invariants=None, constraints=None)
    stated = _spec(_raw())
    assert spec_print(_spec(plain)) != spec_print(stated)
    raw = _raw(invariants=None, constraints=None)
    raw.pop("invariants")
    raw.pop("constraints")
    assert spec_print(_spec(raw)) == spec_print(_spec(plain))
