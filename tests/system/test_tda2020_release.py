"""The Bureau's 2020 strategy released through ``dpdask.release`` on synthetic blocks."""

from __future__ import annotations

import numpy as np
import zarr

from dpdask import Geography, census
from dpdask.datasets import synthetic_pl94_blocks
from dpdask.graph import release
from dpdask.privacy import zCDP
from dpdask.store import write_store
from dpdask.strategy import select
from dpdask.strategy.tda2020 import PERSONS_RHO_ADD_REMOVE, level_budget
from dpdask.workloads import pl94_full


def test_tda2020_release_without_noise_is_exact(tmp_path) -> None:
    blocks = synthetic_pl94_blocks(12, 3000, seed=2)
    ids = np.array([f"{i:03d}" for i in range(12)])
    geo = Geography(levels=("county",), ids=(ids,), parents=())
    st = write_store(tmp_path / "in.zarr", blocks.counts, census.pl94_full_domain(), geo)
    W = pl94_full()
    budget = level_budget(zCDP(PERSONS_RHO_ADD_REMOVE), "county")
    plan = select(W, budget, "tda-2020", level="county")
    out = release(plan, st, test_mode=True, noise=False).to_zarr(tmp_path / "out.zarr")
    g = zarr.open_group(str(out), mode="r")["county"]
    truth = blocks.counts.reshape(12, -1) @ W.dense().T
    np.testing.assert_allclose(g["answers"][:], truth, atol=1e-6)
    # the published variance of the county total is the Bureau's 4.70 (sd 2.17)
    var = np.asarray(g["variance"][...]).reshape(-1)
    assert abs(np.sqrt(var[0]) - 2.17) < 0.005
