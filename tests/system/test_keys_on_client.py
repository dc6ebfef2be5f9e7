"""Keys stay on the client: release tasks hold only their own chunk's stream key.

Oracles: a recursive walk of every value of the release graph (tuples, lists, dicts,
object arrays and Dask ``Task``/``DataNode`` objects) and the pickled bytes of each
value (which contain a key's raw bytes if any part of the value holds the key), and
the noise regenerated from the master key with ``KeyedRNG(master, identity)``.
"""

from __future__ import annotations

import os
import pathlib
import pickle
from collections.abc import Iterator
from typing import Any
from unittest import mock

import cloudpickle
import dask
import dask.array as da
import numpy as np
import pytest
from dask._task_spec import DataNode, Task

from dpdask.graph import _plans, release
from dpdask.graph._blocks import ChunkContext, estimate_block, measure_block
from dpdask.graph._graph import estimates, level_data
from dpdask.graph._state import RunState
from dpdask.graph._topdown import topdown_graph
from dpdask.measure import lattice, noise_mechanism, stream_identity, stream_key
from dpdask.noise import KeyedRNG, MeasurementId, SecretKey, StreamKey, new_key
from dpdask.privacy import Ledger
from dpdask.publish import work_dir
from dpdask.testing.fault_injection import place_key
from tests.helpers import make_plan

distributed = pytest.importorskip("distributed")


def _walk(obj: Any, seen: set[int] | None = None) -> Iterator[Any]:
    """``obj`` and everything it holds, through containers and Dask task objects."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    if isinstance(obj, tuple | list | set | frozenset):
        children: Any = list(obj)
    elif isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, np.ndarray) and obj.dtype == object:
        children = list(obj.flat)
    elif isinstance(obj, Task):
        children = [obj.func, obj.args, obj.kwargs]
    elif isinstance(obj, DataNode):
        children = [obj.value]
    else:
        children = []
    for child in children:
        yield from _walk(child, seen)


def _graph_values(arr: da.Array) -> list[Any]:
    return list(dict(arr.__dask_graph__()).values())


def _stream_keys(arr: da.Array) -> dict[tuple, StreamKey]:
    """The stream keys of the graph, by the key of the graph value that holds them."""
    out = {}
    for k, v in dict(arr.__dask_graph__()).items():
        for item in _walk(v):
            if isinstance(item, StreamKey):
                out[k] = item
    return out


def _level_estimates(r, key: SecretKey, tmp_path: pathlib.Path) -> list[tuple[Any, da.Array]]:
    data = level_data(r)
    run = RunState(tmp_path, key=key)
    return [
        (L, estimates(r, run, L, x, str(tmp_path))) for L, x in zip(r.released, data, strict=True)
    ]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "general"])
@pytest.mark.parametrize("test_key", [False, True], ids=["secret", "test-only"])
def test_no_task_holds_the_secret_key(store, tmp_path, monkeypatch, fused, test_key):
    st, _ = store
    if not fused:
        monkeypatch.setattr(_plans, "fused", lambda plan, method: False)
    master = SecretKey.for_testing(4) if test_key else new_key()
    r = release(
        make_plan(),
        st,
        release_id="rel",
        run_id="one",
        key=master,
        test_mode=test_key,
        chunk_bytes=8 * 6 * 2,
    )
    raw = bytes(master)
    n_keys = 0
    for L, est in _level_estimates(r, master, tmp_path):
        assert any(name.startswith("streamkey-") for name in est.dask.layers)
        for value in _graph_values(est):
            for item in _walk(value):
                assert not isinstance(item, SecretKey), f"a task of {L.name} holds the secret key"
                assert not (isinstance(item, bytes | bytearray) and raw in item)
            # nothing reachable through pickling holds the key's bytes either
            assert raw not in cloudpickle.dumps(value)
        keys = _stream_keys(est)
        assert len(keys) == len(L.chunks)
        for sk in keys.values():
            assert sk.fingerprint() == master.fingerprint() and sk.test_only == test_key
            assert raw not in pickle.dumps(sk)
        n_keys += len(keys)
    assert n_keys == sum(len(L.chunks) for L in r.released) > len(r.released)


def _measure_layer(est: da.Array, x: da.Array, m: int) -> da.Array:
    (name,) = [n for n in est.dask.layers if n.startswith("measure-")]
    return da.Array(est.dask, name, chunks=(x.chunks[0], (m,)), dtype=np.float64)


def test_each_chunk_draws_its_own_stream_bit_for_bit(store, tmp_path, monkeypatch):
    """The general path's measurements are ``A x + KeyedRNG(master, identity of chunk k)``
    for every chunk ``k``: the key blocks are paired with the right data blocks."""
    st, _ = store
    monkeypatch.setattr(_plans, "fused", lambda plan, method: False)
    master = SecretKey.for_testing(11)
    plan = make_plan()
    r = release(
        plan, st, release_id="rel", run_id="one", key=master, test_mode=True, chunk_bytes=8 * 6 * 2
    )
    data = level_data(r)
    for (L, est), x in zip(_level_estimates(r, master, tmp_path), data, strict=True):
        A = L.plan.strategy  # what the level measures (may differ from the plan's)
        y = _measure_layer(est, x, A.shape[0])
        got, counts = dask.compute(y, x, scheduler="sync")
        spec = lattice(L.plan, counts.dtype)
        assert spec.mechanism == noise_mechanism(L.plan, counts.dtype)
        h = 2.0**-spec.k
        start = 0
        for k, g in enumerate(L.chunks):
            block = counts[start : start + g]
            ident = stream_identity(MeasurementId("rel", L.name, k, "strategy"), "one")
            rng = KeyedRNG(master, ident)
            noise = rng.sample(spec.mechanism, spec.grid_scale, (g, A.shape[0]))
            exact = np.asarray(A.apply(block), dtype=np.float64)
            grid = np.rint(exact / h).astype(np.int64)
            # bit for bit: the answers on the grid plus the master key's stream of chunk k
            np.testing.assert_array_equal(got[start : start + g], (grid + noise) * h)
            # and the answers are A x (dense oracle), to within half a grid step
            dense = block.reshape(g, -1) @ A.dense().T
            np.testing.assert_allclose(got[start : start + g] - noise * h, dense, atol=h)
            start += g


def test_a_chunk_key_refuses_another_chunks_stream(store, tmp_path):
    st, counts = store
    master = SecretKey.for_testing(5)
    plan = make_plan()
    r = release(
        plan, st, release_id="rel", run_id="one", key=master, test_mode=True, chunk_bytes=8 * 6 * 2
    )
    L, est = _level_estimates(r, master, tmp_path)[-1]
    keys = sorted(_stream_keys(est).items(), key=lambda kv: kv[0])
    sk0 = keys[0][1]
    ident = [stream_identity(MeasurementId("rel", L.name, k, "strategy"), "one") for k in (0, 1)]
    assert sk0.is_for(ident[0]) and not sk0.is_for(ident[1])
    np.testing.assert_array_equal(
        KeyedRNG(sk0, ident[0]).discrete_gaussian(1.0, 5),
        KeyedRNG(master, ident[0]).discrete_gaussian(1.0, 5),
    )
    with pytest.raises(ValueError, match="another identity"):
        KeyedRNG(sk0, ident[1])
    # a block task given chunk 0's key for chunk 1's data refuses it
    x = counts[:2]
    ctx = ChunkContext("rel", L.name, "one", None, noise=True, test_mode=True)
    args = (L.plan, np.array([[[sk0]]], dtype=object), ctx)
    info1 = {0: {"chunk-location": (1, 0, 0)}}
    for block_fn, extra in (
        (measure_block, ()),
        (estimate_block, (_plans.structured_inverse(L.plan),)),
    ):
        fn_args = (args[0], *extra, *args[1:])
        with pytest.raises(ValueError, match="another measurement or run"):
            block_fn(x, *fn_args, block_info=info1)
        block_fn(x, *fn_args, block_info={0: {"chunk-location": (0, 0, 0)}})  # its own chunk
    # and the master key is refused by block tasks altogether
    with pytest.raises(TypeError, match="never the secret key"):
        measure_block(x, L.plan, master, ctx)
    # stream keys are made only from the master key
    with pytest.raises(TypeError):
        stream_key(sk0, MeasurementId("rel", L.name, 1, "strategy"), "one")


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "general"])
def test_a_misplaced_chunk_key_fails_the_task(store, tmp_path, monkeypatch, fused):
    """Swap two chunks' key blocks in the graph: the tasks refuse to draw noise."""
    st, _ = store
    if not fused:
        monkeypatch.setattr(_plans, "fused", lambda plan, method: False)
    master = SecretKey.for_testing(6)
    r = release(
        make_plan(), st, release_id="rel", run_id="one", key=master, test_mode=True,
        chunk_bytes=8 * 6 * 2,
    )  # fmt: skip
    L, est = _level_estimates(r, master, tmp_path)[-1]
    assert len(L.chunks) >= 2
    dsk = dict(est.__dask_graph__())
    (kname,) = [n for n in est.dask.layers if n.startswith("streamkey-")]
    a, b = (kname, 0, 0, 0), (kname, 1, 0, 0)
    dsk[a], dsk[b] = dsk[b], dsk[a]
    swapped = da.Array(dsk, est.name, chunks=est.chunks, dtype=est.dtype)
    with pytest.raises(ValueError, match="another measurement or run"):
        swapped.compute(scheduler="sync")
    est.compute(scheduler="sync")  # unswapped, it runs


def test_the_key_file_is_overwritten_before_it_is_unlinked(store, tmp_path):
    """On publication the run's key file is overwritten in place (a second name for the
    same file, a hard link, reads only zeros afterwards), then removed with the work
    folder: the real key-file path, a run stopped after it was charged, then resumed."""
    st, _ = store
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    out = tmp_path / "out.zarr"
    run = dict(release_id="rel", run_id="k1", ledger=ledger)
    with (
        mock.patch("dpdask.graph._finish.finish", side_effect=KeyboardInterrupt),
        pytest.raises(KeyboardInterrupt),
    ):
        release(make_plan(), st, **run).to_zarr(out)
    key_path = work_dir(out, "k1") / "key"
    key = key_path.read_bytes()
    assert len(key) == 32 and key != bytes(32)
    fingerprint = SecretKey(key).fingerprint()
    assert ledger.run("rel", "k1").key_fingerprint == fingerprint
    twin = tmp_path / "twin"
    os.link(key_path, twin)  # the same inode under another name
    release(make_plan(), st, **run).to_zarr(out)  # resumed with the same key: published
    assert ledger.run("rel", "k1").state == "published"
    assert not work_dir(out, "k1").exists()
    assert twin.read_bytes() == bytes(32)


class _RunSpecs(distributed.diagnostics.plugin.SchedulerPlugin):
    """Keeps what the scheduler receives: every task's run spec, pickled, and how many
    ``SecretKey`` objects the run specs hold."""

    name = "dpdask-test-run-specs"

    def __init__(self) -> None:
        self.pickled: list[bytes] = []
        self.secret_keys = 0

    def update_graph(self, scheduler: Any, *, tasks: list, **kwargs: Any) -> None:
        for k in tasks:
            ts = scheduler.tasks.get(k)
            if ts is None or ts.run_spec is None:
                continue
            self.secret_keys += sum(isinstance(v, SecretKey) for v in _walk(ts.run_spec))
            self.pickled.append(cloudpickle.dumps(ts.run_spec))


@pytest.mark.slow
def test_a_real_cluster_never_receives_the_master_key(store, tmp_path):
    """A release on a LocalCluster of worker processes (the graph crosses TCP to the
    scheduler): no task the scheduler receives holds the master key or its bytes. The
    real key-file path, with the key placed in the run's work folder so the test knows it;
    a task given the key's bytes on purpose shows the check would see them."""
    st, _ = store
    key = new_key()
    raw = bytes(key)
    out = tmp_path / "out.zarr"
    place_key(out, "c1", raw)
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    plugin = _RunSpecs()
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        assert cluster.scheduler_address.startswith("tcp://")
        cluster.scheduler.add_plugin(plugin)
        r = release(make_plan(), st, release_id="rel", run_id="c1", ledger=ledger,
                    chunk_bytes=8 * 6 * 2)  # fmt: skip
        assert r.to_zarr(out, client=client) == out
        n_release = len(plugin.pickled)
        assert client.submit(len, raw).result() == 32  # the positive control
    run = ledger.run("rel", "c1")
    assert run is not None and run.state == "published"
    assert run.key_fingerprint == key.fingerprint()
    assert n_release > sum(len(L.chunks) for L in r.released)  # the release ran there
    assert plugin.secret_keys == 0
    assert not any(raw in blob for blob in plugin.pickled[:n_release])
    assert any(raw in blob for blob in plugin.pickled[n_release:])


@pytest.mark.parametrize("test_key", [False, True], ids=["secret", "test-only"])
def test_no_topdown_task_holds_the_secret_key(store, tmp_path, test_key):
    """The top-down graph (measure and fit in one task per chunk of families) carries
    each chunk's own stream key, never the release's."""
    st, _ = store
    master = SecretKey.for_testing(4) if test_key else new_key()
    r = release(
        make_plan(), st, release_id="rel", run_id="one", key=master, test_mode=test_key,
        reconstruct="topdown", chunk_bytes=8 * 6 * 2,
    )  # fmt: skip
    raw = bytes(master)
    _, todo = topdown_graph(r, RunState(tmp_path / "work", key=master))
    values = list(dict(todo.__dask_graph__()).values())
    found = {}
    for value in values:
        for item in _walk(value):
            assert not isinstance(item, SecretKey), "a top-down task holds the secret key"
            assert not (isinstance(item, bytes | bytearray) and raw in item)
            if isinstance(item, StreamKey):
                found[id(item)] = item
        assert raw not in cloudpickle.dumps(value)
    assert len(found) == sum(len(L.chunks) for L in r.released) > len(r.released)
    for sk in found.values():
        assert sk.fingerprint() == master.fingerprint() and sk.test_only == test_key
