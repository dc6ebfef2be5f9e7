"""Releases killed in the middle, on the real key-file path (no test keys).

A worker process SIGKILLed while it measures, and the client process (``dpdask run``)
SIGKILLed and then resumed with the same run id, both publish bit for bit what an
uninterrupted run with the same key publishes, and the ledger holds exactly one charge
per measurement (one per level). The uninterrupted reference is a run of the same
release id and run id in a ledger of its own (a published run id is refused in its own
ledger), given the interrupted run's key by placing a copy of the key file in the
reference's work folder before it starts.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import yaml
import zarr

from dpdask.graph import release
from dpdask.noise import SecretKey
from dpdask.privacy import Ledger
from dpdask.publish import work_dir
from dpdask.testing.fault_injection import place_key
from dpdask.testing.faults import SlowOperator
from tests.helpers import make_plan

distributed = pytest.importorskip("distributed")

ROOT = pathlib.Path(__file__).resolve().parents[2]
PL94 = ROOT / "examples" / "data" / "pl94_providence"
PL94_LEVELS = ("state", "county", "tract", "block_group", "block")


def _assert_same_release(a: pathlib.Path, b: pathlib.Path, levels) -> None:
    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    for lv in levels:
        for name in ("estimate", "answers", "variance"):
            x, y = ga[lv][name][:], gb[lv][name][:]
            assert x.shape == y.shape and x.dtype == y.dtype
            np.testing.assert_array_equal(x, y, err_msg=f"{lv}/{name}")


def _wait(predicate, timeout: float, what: str, interval: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# -- a worker killed --------------------------------------------------------------------------
@pytest.mark.slow
def test_killed_worker_real_key_is_bit_identical_and_charged_once(store, tmp_path) -> None:
    st, _ = store
    levels = st.geography.levels
    # one geography per chunk (11 chunks), each measured for at least 0.4 s
    plan = make_plan(strategy=SlowOperator(make_plan().strategy, delay=0.4))
    common = dict(release_id="fault", run_id="w1", chunk_bytes=8 * 6)
    n_chunks = sum(st.geography.n_units(lv) for lv in levels)
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    out = tmp_path / "out.zarr"
    work = work_dir(out, "w1")
    seen: dict = {}

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        pids = client.run(os.getpid)
        assert os.getpid() not in pids.values()  # real worker processes

        def kill_a_measuring_worker() -> None:
            try:
                # the key is created (and the run charged) before any task is submitted
                _wait(lambda: (work / "key").exists(), 60, "the run's key file")
                seen["key"] = (work / "key").read_bytes()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    for addr, ks in client.processing().items():
                        busy = [k for k in ks if "measure" in str(k) or "reconstruct" in str(k)]
                        if busy and addr in pids:
                            time.sleep(0.1)  # well inside a task of >= 0.4 s
                            os.kill(pids[addr], signal.SIGKILL)
                            seen["killed"] = (addr, busy)
                            seen["done_at_kill"] = len(list((work / "done").iterdir()))
                            seen["published_at_kill"] = out.exists()
                            return
                    time.sleep(0.02)
            except BaseException as exc:  # reported by the test, not lost in the thread
                seen["error"] = exc

        t = threading.Thread(target=kill_a_measuring_worker, daemon=True)
        t.start()
        published = release(plan, st, ledger=ledger, **common).to_zarr(out, client=client)
        t.join(timeout=10)

    assert "error" not in seen, seen.get("error")
    assert "killed" in seen, "no worker was killed: the test did not exercise a fault"
    assert seen["done_at_kill"] < n_chunks and not seen["published_at_kill"], seen
    assert published == out and out.exists()
    # one charge per level, whatever was recomputed; the run is published, its key gone
    assert len(ledger.charges("fault")) == len(levels)
    run = ledger.run("fault", "w1")
    assert run is not None and run.state == "published"
    assert run.key_fingerprint == SecretKey(seen["key"]).fingerprint()
    assert not work.exists()

    # the uninterrupted reference: its own ledger, the same ids, plan, chunking and key
    ref_ledger = Ledger.init(tmp_path / "ref-ledger.sqlite")
    ref = tmp_path / "ref.zarr"
    place_key(ref, "w1", seen["key"])
    release(plan, st, ledger=ref_ledger, **common).to_zarr(ref)  # local threads
    assert ref_ledger.run("fault", "w1").key_fingerprint == run.key_fingerprint
    assert len(ref_ledger.charges("fault")) == len(levels)
    assert not work_dir(ref, "w1").exists()
    _assert_same_release(ref, out, levels)


# -- the client killed, then resumed ----------------------------------------------------------
def _pl94_spec(tmp: pathlib.Path, name: str) -> pathlib.Path:
    """PL94 Providence at every level through the CLI, in one process (a local cluster of
    one in-process worker thread: killing the client kills everything). ADMM (L1) makes
    every level's checkpoint take a while (about 6 s between the first and the last), so
    the kill reliably lands while chunks are still to be measured."""
    raw = {
        "release": "pl94-fault",
        "data": {"format": "pl94", "path": str(PL94)},
        "domain": "pl94",
        "levels": list(PL94_LEVELS),
        "workload": "pl94",
        "privacy": {"zcdp": 1, "split": {"state": 1, "county": 1, "tract": 1,
                                         "block_group": 1, "block": 2}},
        "strategy": "identity",
        "reconstruct": "admm-l1",
        "output": str(tmp / name / "pl94.zarr"),
        "ledger": {"path": str(tmp / name / "ledger.sqlite"), "create": True},
        "cluster": {"n_workers": 1, "threads_per_worker": 1, "processes": False},
    }  # fmt: skip
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _cli(spec: pathlib.Path, run_id: str) -> list[str]:
    return [sys.executable, "-m", "dpdask.cli", "run", str(spec), "--run-id", run_id,
            "--no-progress", "--json"]  # fmt: skip


def _run_cli(spec: pathlib.Path, run_id: str, log: pathlib.Path) -> None:
    with log.open("w") as f:
        code = subprocess.run(
            _cli(spec, run_id), stdout=f, stderr=subprocess.STDOUT, timeout=120
        ).returncode
    assert code == 0, log.read_text()[-3000:]


@pytest.mark.slow
def test_killed_client_resumes_bit_identical_and_charged_once(tmp_path) -> None:
    spec = _pl94_spec(tmp_path, "main")
    out = tmp_path / "main" / "pl94.zarr"
    work = work_dir(out, "R")
    done = work / "done"
    ledger_path = tmp_path / "main" / "ledger.sqlite"

    log = tmp_path / "killed.log"
    with log.open("w") as f:
        proc = subprocess.Popen(_cli(spec, "R"), stdout=f, stderr=subprocess.STDOUT)
        try:
            # a marker means the run is charged and measuring; the key is in its work folder
            _wait(
                lambda: proc.poll() is not None or (done.is_dir() and any(done.iterdir())),
                90,
                "a first checkpointed chunk",
            )
            assert proc.poll() is None, (
                "the run ended before it could be killed\n" + (log.read_text()[-3000:])
            )
            key = (work / "key").read_bytes()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            done_at_kill = sorted(p.name for p in done.iterdir())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # killed mid-measurement: charged, some chunks still to draw, nothing published
    assert 1 <= len(done_at_kill) < len(PL94_LEVELS), done_at_kill
    assert not out.exists()
    ledger = Ledger(ledger_path)
    run = ledger.run("pl94-fault", "R")
    assert run is not None and run.state in ("open", "measuring")
    assert run.key_fingerprint == SecretKey(key).fingerprint()
    assert len(ledger.charges("pl94-fault")) == len(PL94_LEVELS)
    assert (work / "key").read_bytes() == key

    # resumed with the same run id: the same key, the finished chunks skipped, no new charge
    _run_cli(spec, "R", tmp_path / "resumed.log")
    ledger = Ledger(ledger_path)
    assert len(ledger.charges("pl94-fault")) == len(PL94_LEVELS)
    run = ledger.run("pl94-fault", "R")
    assert run is not None and run.state == "published"
    assert run.output == str(out)
    assert not work.exists()

    # the uninterrupted reference: a fresh ledger, another output, the same run id and key
    ref_spec = _pl94_spec(tmp_path, "ref")
    ref = tmp_path / "ref" / "pl94.zarr"
    place_key(ref, "R", key)
    _run_cli(ref_spec, "R", tmp_path / "ref.log")
    ref_ledger = Ledger(tmp_path / "ref" / "ledger.sqlite")
    assert ref_ledger.run("pl94-fault", "R").key_fingerprint == run.key_fingerprint
    assert len(ref_ledger.charges("pl94-fault")) == len(PL94_LEVELS)
    assert not work_dir(ref, "R").exists()
    _assert_same_release(ref, out, PL94_LEVELS)
