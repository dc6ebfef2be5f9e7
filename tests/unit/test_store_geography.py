"""Geography hierarchies from GEOID prefixes and parent tables, checked against string prefixes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from dask.base import tokenize
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdask import Geography

LEVELS = {"state": 1, "county": 3, "tract": 5}

geoids = st.lists(st.text("0123", min_size=5, max_size=5), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(geoids)
def test_from_geoids_matches_prefixes(ids):
    g = Geography.from_geoids(ids, LEVELS)
    finest = sorted(set(ids))
    assert g.levels == tuple(LEVELS)
    assert list(g.ids[-1]) == finest
    for level, width in LEVELS.items():
        # oracle: the set of prefixes, and each unit's own prefix
        assert list(g.ids[g.level_index(level)]) == sorted({u[:width] for u in finest})
        anc = g.ancestor_index(level)
        assert [g.ids[g.level_index(level)][a] for a in anc] == [u[:width] for u in finest]


@settings(max_examples=40, deadline=None)
@given(geoids)
def test_children_are_contiguous_and_ancestors_compose(ids):
    g = Geography.from_geoids(ids, LEVELS)
    for p in g.parents:
        assert (np.diff(p) >= 0).all()
    np.testing.assert_array_equal(
        g.ancestor_index("state", of="county")[g.ancestor_index("county")],
        g.ancestor_index("state"),
    )
    assert g.truncate("county").ids == g.ids[:2]


@settings(max_examples=40, deadline=None)
@given(geoids)
def test_parent_table_agrees_with_prefixes(ids):
    finest = sorted(set(ids))
    table = pd.DataFrame({lv: [u[:w] for u in finest] for lv, w in LEVELS.items()})
    shuffled = table.sample(frac=1.0, random_state=3)
    assert Geography.from_table(shuffled) == Geography.from_geoids(ids, LEVELS)
    as_dict = {k: list(v) for k, v in shuffled.items()}
    assert Geography.from_table(as_dict, levels=["state", "tract"]) == Geography.from_geoids(
        ids, {"state": 1, "tract": 5}
    )


def test_equality_hash_and_token():
    a = Geography.from_geoids(["10001", "10002", "20001"], LEVELS)
    b = Geography.from_geoids(["20001", "10002", "10001"], LEVELS)
    c = Geography.from_geoids(["10001", "10002", "20002"], LEVELS)
    assert a == b and hash(a) == hash(b) and tokenize(a) == tokenize(b)
    assert a != c and tokenize(a) != tokenize(c)
    assert repr(a) == "Geography(state=2, county=2, tract=3)"


@pytest.mark.parametrize(
    ("ids", "levels", "message"),
    [
        (["10001", "1002"], LEVELS, "'1002' has 4 characters"),
        (["10001"], {"state": 3, "county": 3}, "must increase"),
        (["10001"], {"state": 0, "tract": 5}, "positive integer"),
        ([], LEVELS, "no geography ids"),
        (["10001"], {"bad name": 5}, "not a valid identifier"),
    ],
)
def test_from_geoids_errors(ids, levels, message):
    with pytest.raises(ValueError, match=message):
        Geography.from_geoids(ids, levels)


def test_from_table_errors():
    with pytest.raises(ValueError, match="'11' has two parents at level 'state': '1' and '2'"):
        Geography.from_table({"state": ["1", "2"], "county": ["11", "11"], "tract": ["a", "b"]})
    with pytest.raises(ValueError, match="'11' appears in more than one row"):
        Geography.from_table({"state": ["1", "1"], "county": ["11", "11"]})
    with pytest.raises(ValueError, match="has no column 'tract'"):
        Geography.from_table({"state": ["1"]}, levels=["state", "tract"])


def test_ancestor_index_refuses_finer_level():
    g = Geography.from_geoids(["10001"], LEVELS)
    with pytest.raises(ValueError, match="finer than"):
        g.ancestor_index("tract", of="county")
