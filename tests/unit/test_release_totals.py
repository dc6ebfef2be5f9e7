"""The largest top-level total of a sparse store, from its entries' counts and offsets.

Oracle: the dense store's rows summed by top-level unit with numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpdask import Domain, Geography
from dpdask.graph._run import _largest_range_total
from dpdask.store import write_store


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1 << 24])
def test_largest_range_total_is_the_dense_sum(tmp_path, rng, step):
    n_top, per = 4, 5
    parents = np.repeat(np.arange(n_top), per)
    geo = Geography(
        levels=("s", "b"),
        ids=(tuple(f"s{i}" for i in range(n_top)), tuple(f"s{p}b{i:02d}" for i, p in
             enumerate(parents))),
        parents=(parents,),
    )  # fmt: skip
    dom = Domain(a=3, b=4)
    x = rng.integers(0, 6, size=(n_top * per, 3, 4)) * (rng.random((n_top * per, 3, 4)) < 0.3)
    x[:per] = 0  # a top unit with no one, at the start
    x[-2:] = 0  # and empty units at the end
    st = write_store(tmp_path / "s.zarr", x, dom, geo, layout="sparse")
    want = int(np.bincount(parents, weights=x.reshape(x.shape[0], -1).sum(axis=1)).max())
    assert _largest_range_total(st.counts, parents, step=step) == want
