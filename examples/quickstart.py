"""Plan and run a small release from Python: synthetic county data, SF1-like marginals.

Run with ``python examples/quickstart.py``; it writes to ``out/quickstart.zarr``.
"""

from __future__ import annotations

import pathlib
import shutil
import time

import numpy as np
import zarr

from dpdask import Domain
from dpdask.graph import release
from dpdask.pipeline.cluster import connect
from dpdask.pipeline.run import synthetic_geography
from dpdask.privacy import Ledger, zCDP
from dpdask.store import write_store
from dpdask.strategy import select
from dpdask.workloads import marginals


def main() -> None:
    out = pathlib.Path("out")
    out.mkdir(exist_ok=True)
    for stale in ("quickstart-input.zarr",):
        path = out / stale
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()

    # 1. data: 40 counties in 2 states, a small person domain (test data, seeded)
    domain = Domain(sex=2, agegroup=10, race=6)
    geography = synthetic_geography(40, 2)
    rng = np.random.default_rng(0)
    counts = rng.poisson(20, size=(40, *domain.shape))
    store = write_store(out / "quickstart-input.zarr", counts, domain, geography)

    # 2. select: the strategy for all 2-way marginals, before touching data
    workload = marginals(domain, 2)
    plan = select(workload, zCDP(1), domain=domain)
    print(plan.summary())

    # 3. measure and reconstruct on a local cluster; the ledger is charged first
    with connect() as client:
        print("dashboard:", client.dashboard_link)
        rel = release(
            plan,
            store,
            levels=("state", "county"),
            budget_split={"state": 1, "county": 3},
            # every run of this script is a new release, charged to the same ledger
            # (created on the first run; never deleted: it is the record of what was spent)
            release_id=f"quickstart-{time.strftime('%Y%m%dT%H%M%S')}",
            ledger=Ledger(out / "quickstart-ledger.sqlite", create=True),
        )
        # replaces the previous run's release (only a dpdask release is ever replaced)
        path = rel.to_zarr(out / "quickstart.zarr", client=client, progress=True, overwrite=True)

    # 4. read the published answers: children add up to parents exactly
    g = zarr.open_group(str(path), mode="r")
    county, state = g["county/answers"][:], g["state/answers"][:]
    parent = g["county/parent"][:]
    sums = np.zeros_like(state)
    np.add.at(sums, parent, county)
    print("max |state - sum of counties| =", float(np.abs(sums - state).max()))
    print("RMSE of county answers:", float(np.sqrt(g["county/variance"][:].mean())))


if __name__ == "__main__":
    main()
