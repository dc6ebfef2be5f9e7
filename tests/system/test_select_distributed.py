"""HDMM's selection on a Dask cluster: the same plans as in process.

Each test starts an in-process ``LocalCluster``; the task machinery itself (drivers,
BLAS limits, task keys) is tested without one in ``tests/unit/test_strategy_tasks.py``
and ``tests/unit/test_select.py``, whose workloads these tests reuse.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpdask import select
from dpdask.privacy import PureDP
from dpdask.strategy.hdmm import _pieces, _tasks
from tests.unit.test_select import _stand_in
from tests.unit.test_strategy_tasks import _chain, _union


def test_drive_all_on_a_distributed_client_matches_lockstep() -> None:
    distributed = pytest.importorskip("distributed")
    spec = [("a", 3, 4), ("b", 1, 6), ("c", 4, 1), ("d", 0, 2)]
    local = _pieces.drive_all([_chain(*s) for s in spec], None, inline=True)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        assert _tasks.distributed_client(client) is client
        remote = _pieces.drive_all([_chain(*s) for s in spec], client, priorities=[0, 0, 1, 0])
        # the active client as Dask's default scheduler is found without being passed
        assert _tasks.distributed_client(None) is client
        default = _pieces.drive_all([_chain(*s) for s in spec], None)
    assert remote == local == default
    assert _tasks.distributed_client(None) is None


def test_distributed_select_matches_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every template, through drive_all on a client: the in-process candidates, loss for loss."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr("dpdask.strategy.hdmm._hdmm.INLINE_MAX_CELLS", 0)  # through the scheduler
    W, dom = _union()
    local = select(W, PureDP(1), domain=dom, restarts=3)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        remote = select(W, PureDP(1), domain=dom, restarts=3, client=client)
    assert remote.template == local.template
    assert set(remote.info["templates"]) == set(local.info["templates"])
    for name, loss in local.info["templates"].items():
        assert remote.info["templates"][name] == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(remote.strategy.dense(), local.strategy.dense(), rtol=1e-12)


def test_distributed_client_gives_the_same_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr("dpdask.strategy.hdmm._hdmm.INLINE_MAX_CELLS", 0)  # through the client
    W, dom = _stand_in()
    local = select(W, PureDP(1), domain=dom, restarts=2, templates=["kron", "union"])
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        remote = select(
            W, PureDP(1), domain=dom, restarts=2, templates=["kron", "union"], client=client
        )
    np.testing.assert_allclose(remote.strategy.dense(), local.strategy.dense(), rtol=1e-12)
