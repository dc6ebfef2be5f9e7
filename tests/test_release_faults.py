"""A worker killed in the middle of a release on a real local cluster."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
import zarr

from dpdask.dataflow.release import release
from dpdask.noise import SecretKey
from dpdask.privacy import Ledger
from dpdask.testing.faults import SlowOperator

from .test_release import make_plan, store  # noqa: F401  (fixture)

distributed = pytest.importorskip("distributed")


@pytest.mark.slow
def test_killed_worker_gives_bit_identical_output(store, tmp_path) -> None:  # noqa: F811
    st, _ = store
    base = make_plan()
    slow = make_plan(strategy=SlowOperator(base.strategy, delay=0.4))
    key = SecretKey.for_testing(5)
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    common = dict(release_id="fault", ledger=ledger, test_mode=True, key=key, chunk_bytes=8 * 6)

    ref = release(slow, st, run_id="ref", **common).to_zarr(tmp_path / "ref.zarr")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        victim = max(pids.values())
        killed = threading.Event()

        def kill_when_busy() -> None:
            deadline = time.time() + 60
            while time.time() < deadline:
                processing = client.processing()
                if any(
                    any("measure" in str(k) or "reconstruct" in str(k) for k in ks)
                    for ks in processing.values()
                ):
                    time.sleep(0.3)
                    os.kill(victim, signal.SIGKILL)
                    killed.set()
                    return
                time.sleep(0.05)

        t = threading.Thread(target=kill_when_busy)
        t.start()
        out = release(slow, st, run_id="ref", **common).to_zarr(
            tmp_path / "out.zarr", client=client
        )
        t.join()
    assert killed.is_set(), "the worker was never killed: the test did not exercise a fault"
    a, b = zarr.open_group(str(ref), mode="r"), zarr.open_group(str(out), mode="r")
    for lv in st.geography.levels:
        for name in ("estimate", "answers", "variance"):
            np.testing.assert_array_equal(a[lv][name][:], b[lv][name][:])
    charges = ledger.charges("fault")
    assert len(charges) == len(st.geography.levels)  # one per level, whatever was retried
