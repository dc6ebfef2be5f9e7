"""Workers drop a finished task's spec (:mod:`dpdask.graph._worker_specs`).

Oracle: the worker's own task states, read on the worker, with and without the plugin
(without it, distributed keeps every finished task's spec: the memory that stalled the
national run); and the same task asked for again after being forgotten, and a release on
the cluster against the same release computed without one.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

distributed = pytest.importorskip("distributed")

from dpdask.graph._caches import forget_specs  # noqa: E402


def _double(x: np.ndarray) -> np.ndarray:
    return 2 * x


def _states(dask_worker=None) -> dict[str, tuple[str, bool]]:
    """Each task the worker knows: its state and whether it still holds its spec."""
    return {
        str(k): (ts.state, ts.run_spec is not None) for k, ts in dask_worker.state.tasks.items()
    }


@pytest.fixture
def client():
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.mark.parametrize("plugin", [True, False])
def test_finished_tasks_keep_no_spec(client, plugin) -> None:
    if plugin:
        forget_specs(client)
        forget_specs(client)  # idempotent: one plugin per worker
    a = client.submit(np.arange, 1000, key="ones-a")
    b = client.submit(_double, a, key="double-b")
    assert int(b.result().sum()) == 999 * 1000
    (states,) = client.run(_states).values()
    done = {k: held for k, (state, held) in states.items() if state in ("memory", "released")}
    assert set(done) >= {"ones-a", "double-b"}
    assert not any(done.values()) if plugin else all(done.values())


def test_a_forgotten_task_asked_for_again_runs(client) -> None:
    forget_specs(client)
    a = client.submit(np.arange, 10, key="again-a")
    assert int(a.result().sum()) == 45
    del a
    client.run(lambda: None)  # a round trip: the release has reached the worker
    b = client.submit(np.arange, 10, key="again-a")
    assert int(b.result().sum()) == 45


def test_a_release_on_the_cluster_is_the_release_without_it(client, tmp_path) -> None:
    """A top-down integer release (multi-pass tasks, sweeps, many chunks) computed on the
    cluster, whose workers drop the specs, publishes what the same release publishes
    computed in this process."""
    from dpdask import Geography
    from dpdask.graph import release
    from dpdask.noise import SecretKey
    from dpdask.store import write_store
    from tests.helpers import DOMAIN, make_plan

    rng = np.random.default_rng(2)
    counts = rng.integers(0, 5, size=(12, 2, 3))
    geo = Geography(
        levels=("state", "county"),
        ids=(("s0", "s1"), tuple(f"c{i}" for i in range(12))),
        parents=(np.repeat([0, 1], 6),),
    )
    store = write_store(tmp_path / "in.zarr", counts, DOMAIN, geo, geo_chunk=3)
    out = {}
    for name, c in (("cluster", client), ("local", None)):
        rel = release(
            make_plan(), store, release_id="specs", run_id="one", test_mode=True,
            key=SecretKey.for_testing(3), reconstruct="topdown", integer=True, simulate=0,
            unbiased_limit=0,
        )  # fmt: skip
        g = zarr.open_group(str(rel.to_zarr(tmp_path / f"{name}.zarr", client=c)), mode="r")
        out[name] = [np.asarray(g[f"{lv}/estimate"][:]) for lv in geo.levels]
    for x, y in zip(out["cluster"], out["local"], strict=True):
        np.testing.assert_array_equal(x, y)
