"""Public per-unit attributes of a data store: written, checked, read back, summed."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from dpdask import Domain, Geography
from dpdask.errors import DataError
from dpdask.store import open_store, write_sparse_store, write_store

GEOIDS = ["01001", "01002", "01103", "02204", "02205", "02206"]
LEVELS = {"state": 2, "county": 3, "block": 5}


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    geo = Geography.from_geoids(GEOIDS, LEVELS)
    counts = rng.integers(0, 3, (len(GEOIDS), 2, 3))
    attrs = {
        "housing_units": rng.integers(0, 9, len(GEOIDS)),
        "gq_population": rng.integers(0, 5, (len(GEOIDS), 8)),
    }
    return geo, Domain(a=2, b=3), counts, attrs


def _prefix_sums(values: np.ndarray, ids: list[str], width: int) -> dict[str, np.ndarray]:
    """Oracle: sums over units grouped by their GEOID prefix (no Geography involved)."""
    out: dict[str, np.ndarray] = {}
    for uid, v in zip(ids, values, strict=True):
        out[uid[:width]] = out.get(uid[:width], 0) + v
    return out


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_round_trip_and_sums_at_every_level(tmp_path, layout):
    geo, dom, counts, attrs = _inputs()
    store = write_store(tmp_path / "s", counts, dom, geo, layout=layout, unit_attributes=attrs)
    again = open_store(tmp_path / "s")
    assert again.layout == layout
    assert again.unit_attribute_names == ("gq_population", "housing_units")
    order = [GEOIDS.index(u) for u in store.geography.ids[-1]]
    for name, values in attrs.items():
        got = again.unit_attribute(name)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, values[order])
        for level, width in LEVELS.items():
            oracle = _prefix_sums(values, GEOIDS, width)
            summed = again.unit_attribute(name, level)
            ids = again.geography.ids[again.geography.level_index(level)]
            np.testing.assert_array_equal(summed, np.stack([oracle[u] for u in ids]))


def test_sparse_writer_takes_attributes(tmp_path):
    geo, dom, _, attrs = _inputs(1)
    store = write_sparse_store(
        tmp_path / "s", [0, 5], [1, 2], [4, 1], dom, geo, unit_attributes=attrs
    )
    np.testing.assert_array_equal(store.unit_attribute("housing_units"), attrs["housing_units"])


def test_missing_attribute_names_the_available_ones(tmp_path):
    geo, dom, counts, attrs = _inputs()
    store = write_store(tmp_path / "s", counts, dom, geo, unit_attributes=attrs)
    with pytest.raises(DataError, match=r"no unit attribute 'gq_facilities'.*gq_population"):
        store.unit_attribute("gq_facilities")
    bare = write_store(tmp_path / "b", counts, dom, geo)
    assert bare.unit_attribute_names == ()
    with pytest.raises(DataError, match="has: none"):
        bare.unit_attribute("housing_units")


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("housing_units", np.array([1.0, 2, 3, 4, 5, 6]), "dtype float64"),
        ("housing_units", np.array([1.0, np.nan, 3, 4, 5, 6]), "NaN at unit 1"),
        ("housing_units", np.array([1, 2, 3, -1, 5, 6]), "negative at unit 3"),
        ("housing_units", np.arange(5), "first axis must be the 6"),
        ("gq_population", np.zeros((6, 7), int), r"must be \(6, 8\)"),
        ("occupied_units", np.zeros((6, 2), int), r"must be \(6,\)"),
        ("Bad-Name", np.zeros(6, int), "lower-case"),
        ("anything", np.array(["a"] * 6), "must hold integers"),
    ],
)
def test_bad_attributes_are_refused_before_writing(tmp_path, name, values, message):
    geo, dom, counts, _ = _inputs()
    for layout in ("dense", "sparse"):
        with pytest.raises(DataError, match=message):
            write_store(
                tmp_path / layout, counts, dom, geo, layout=layout, unit_attributes={name: values}
            )
        assert not (tmp_path / layout).exists()


def test_a_listed_attribute_without_its_array_is_refused_on_opening(tmp_path):
    geo, dom, counts, attrs = _inputs()
    write_store(tmp_path / "s", counts, dom, geo, unit_attributes=attrs)
    group = zarr.open_group(str(tmp_path / "s"), mode="r+", zarr_format=3)
    meta = dict(group.attrs["dpdask"])
    meta["unit_attributes"] = [*meta["unit_attributes"], "occupied_units"]
    group.attrs["dpdask"] = meta
    with pytest.raises(DataError, match="lists unit attribute 'occupied_units'"):
        open_store(tmp_path / "s")
