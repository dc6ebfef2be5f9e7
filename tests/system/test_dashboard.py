"""The release dashboard: the plugin's counting, its routes and metrics, and the page
as a browser renders it during a real release (headless Chromium)."""

from __future__ import annotations

import json
import math
import pathlib
import re
import shutil
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pytest
import yaml

from dpdask.dashboard import (
    PLUGIN_NAME,
    TOPIC,
    DashboardPlugin,
    budget_text,
    dashboard_url,
    register,
    track,
)
from dpdask.dashboard._client import _after_charge
from dpdask.dashboard._page import json_safe
from tests import ROOT

TOK = "0123456789abcdef0123456789abcdef"
SCREENSHOT_COPY = pathlib.Path("/tmp/dpdask-dashboard.png")


def _plan(client: str = "c1", release: str = "r1", run_id: str = "run1") -> dict:
    """A release announcement as :func:`dpdask.dashboard.plan_event` makes it."""
    level = {"budget": {"type": "zCDP", "rho": "1/3"}, "mechanism": "gaussian"}
    return {
        "event": "plan",
        "client": client,
        "release": release,
        "run_id": run_id,
        "dataset": "ds",
        "budget": {"type": "zCDP", "rho": "1"},
        "levels": [
            {
                **level,
                "level": "state",
                "word": "state",
                "units": 1,
                "chunks": 1,
                "cells": 10,
                "rmse": 2.0,
                "tables": [{"name": "P1", "kind": "table", "queries": 3, "rmse": 1.5}],
            },
            {
                **level,
                "level": "block_group",
                "word": "block-group",
                "units": 6,
                "chunks": 3,
                "cells": 60,
                "rmse": 3.0,
                "tables": [],
            },
            {
                **level,
                "level": "block",
                "word": "block",
                "units": 20,
                "chunks": 4,
                "cells": 200,
                "rmse": 4.0,
                "tables": [{"name": "P1", "kind": "table", "queries": 3, "rmse": 2.5}],
            },
        ],
        "ledger_before": {
            "ledger": "/x/ledger.sqlite",
            "dataset": {
                "total": {"type": "zCDP", "rho": "4"},
                "spent": {"type": "zCDP", "rho": "0"},
                "remaining": {"type": "zCDP", "rho": "4"},
            },
            "release": None,
        },
        "ledger_after_charge": {
            "ledger": "/x/ledger.sqlite",
            "dataset": {
                "total": {"type": "zCDP", "rho": "4"},
                "spent": {"type": "zCDP", "rho": "1"},
                "remaining": {"type": "zCDP", "rho": "3"},
            },
            "release": {
                "budget": {"type": "zCDP", "rho": "1"},
                "spent": {"type": "zCDP", "rho": "1"},
                "remaining": {"type": "zCDP", "rho": "0"},
            },
        },
    }


def _keys() -> dict[str, list]:
    """Task keys of the plan's release, as Dask names them (some fused)."""
    return {
        "state": [f"measure-reconstruct-state-{TOK}"],  # one fused task, no index
        # Dask fused measure and reconstruct of each block group chunk
        "block_group": [
            (f"blocks-measure-block-group-reconstruct-block-group-{TOK}", k) for k in range(3)
        ],
        "block_measure": [(f"measure-block-{TOK}", k, 0) for k in range(4)],
        "block_reconstruct": [(f"reconstruct-block-{TOK}", k, 0, 0) for k in range(4)],
        "answers": [f"answer-block-store-map-{TOK}", f"answer-block-group-store-map-{TOK}"],
        "other": [(f"aggregate-block-group-{TOK}", 0), f"checkpoint-block-{TOK}", "x", 3],
    }


def _progress(snapshot: dict, level: str, stage: str) -> int:
    (lv,) = [lv for lv in snapshot["releases"][0]["levels"] if lv["level"] == level]
    return lv["progress"][stage]["chunks"]


# -- (a) counting from synthetic transitions --------------------------------------------
def test_plugin_counts_chunks_per_level_and_stage() -> None:
    plugin = DashboardPlugin()
    plugin.log_event(TOPIC, _plan())
    keys = _keys()
    every = [k for group in keys.values() for k in group]
    snap = plugin.snapshot()
    assert snap["releases"][0]["state"] == "planned"
    assert snap["releases"][0]["ledger"]["as_of"] == "before this run's charge"
    plugin.update_graph(None, client="c1", keys=set(), tasks=every, stimulus_id="s")
    rel = plugin.snapshot()["releases"][0]
    assert rel["state"] == "running"  # tasks are submitted after the charge
    assert rel["ledger"]["as_of"] == "after this run's charge"
    assert rel["ledger"]["release"]["spent_text"] == "zCDP ρ=1"
    assert rel["ledger"]["dataset"]["fraction_spent"] == pytest.approx(0.25)
    # "block" tasks are not counted for "block_group" and conversely
    planned = {lv["level"]: lv["progress"] for lv in rel["levels"]}
    assert planned["block"]["measured"]["tasks_planned"] == 4
    assert planned["block"]["reconstructed"]["tasks_planned"] == 4
    assert planned["block"]["published"]["tasks_planned"] == 1
    assert planned["block_group"]["measured"]["tasks_planned"] == 3
    assert planned["block_group"]["published"]["tasks_planned"] == 1
    assert planned["state"]["reconstructed"]["tasks_planned"] == 1

    def done(key):
        plugin.transition(key, "waiting", "processing", stimulus_id="s")
        plugin.transition(key, "processing", "memory", stimulus_id="s")

    for key in keys["block_measure"][:3] + keys["block_group"][:2] + keys["other"]:
        done(key)
    snap = plugin.snapshot()
    assert _progress(snap, "block", "measured") == 3
    assert _progress(snap, "block", "reconstructed") == 0
    assert _progress(snap, "block_group", "measured") == 2
    assert _progress(snap, "block_group", "reconstructed") == 2
    assert _progress(snap, "state", "measured") == 0
    # cells: two of three block-group chunks reconstructed
    assert snap["releases"][0]["cells_done"] == pytest.approx(40)
    assert snap["releases"][0]["cells_per_second"] > 0
    for key in keys["state"] + keys["block_reconstruct"] + keys["answers"]:
        done(key)
    done(keys["block_reconstruct"][0])  # a task computed again counts once
    plugin.update_graph(None, client="c1", keys=set(), tasks=every, stimulus_id="s2")
    snap = plugin.snapshot()
    assert _progress(snap, "state", "measured") == 1
    assert _progress(snap, "block", "reconstructed") == 4
    assert _progress(snap, "block", "published") == 4  # its one fused answer task is done
    assert _progress(snap, "block_group", "published") == 3
    assert snap["releases"][0]["levels"][0]["progress"]["measured"]["of"] == 1
    tables = {t["name"]: t for t in snap["releases"][0]["tables"]}
    assert tables["P1"]["rmse"] == {"state": 1.5, "block": 2.5}
    json.dumps(snap, allow_nan=False)


def test_plugin_attributes_tasks_by_client() -> None:
    plugin = DashboardPlugin()
    plugin.log_event(TOPIC, _plan(client="c1", release="r1"))
    plugin.log_event(TOPIC, _plan(client="c2", release="r2"))
    plugin.update_graph(None, client="c2", tasks=[f"measure-block-{TOK}"], stimulus_id="s")
    plugin.update_graph(None, client="c3", tasks=[f"measure-state-{TOK}"], stimulus_id="s")
    plugin.transition(f"measure-block-{TOK}", "processing", "memory", stimulus_id="s")
    plugin.transition(f"measure-state-{TOK}", "processing", "memory", stimulus_id="s")
    by_release = {r["release"]: r for r in plugin.snapshot()["releases"]}
    assert by_release["r2"]["state"] == "running"
    assert by_release["r1"]["state"] == "planned"
    block = by_release["r2"]["levels"][2]["progress"]["measured"]
    assert (block["tasks_done"], block["tasks_planned"]) == (1, 1)
    # an unknown client's tasks, with two releases running, are nobody's
    assert all(lv["progress"]["measured"]["tasks_planned"] == 0
               for lv in by_release["r1"]["levels"])  # fmt: skip
    assert by_release["r2"]["levels"][0]["progress"]["measured"]["tasks_planned"] == 0


def test_plugin_records_the_end_of_a_release() -> None:
    plugin = DashboardPlugin()
    plugin.log_event(TOPIC, _plan())
    plugin.log_event("other-topic", {"event": "finished", "release": "r1", "run_id": "run1"})
    assert plugin.snapshot()["releases"][0]["state"] == "planned"
    plugin.update_graph(None, client="c1", tasks=[f"measure-block-{TOK}"], stimulus_id="s")
    plugin.transition(f"measure-block-{TOK}", "processing", "erred", stimulus_id="s")
    report = {"level": "block", "chunk": 2, "method": "admm", "converged": False,
              "iterations": 500, "residual": 0.01, "tolerance": 1e-4}  # fmt: skip
    after = _plan()["ledger_after_charge"]
    plugin.log_event(
        TOPIC,
        {"event": "finished", "release": "r1", "run_id": "run1", "state": "published",
         "ledger": after, "ledger_as_of": "after publication", "not_converged": [report]},
    )  # fmt: skip
    rel = plugin.snapshot()["releases"][0]
    assert rel["state"] == "published" and rel["finished"] is not None
    assert rel["erred_tasks"] == 1
    assert rel["not_converged"] == [report]
    assert rel["ledger"]["as_of"] == "after publication"
    assert rel["ledger"]["release"]["remaining_text"] == "zCDP ρ=0"
    plugin.log_event(TOPIC, {"event": "finished", "release": "nope", "run_id": "x"})
    plugin.log_event(TOPIC, {**_plan(release="r2"), "client": None})
    plugin.log_event(
        TOPIC, {"event": "finished", "release": "r2", "run_id": "run1", "state": "failed",
                "error": "KeyboardInterrupt: "},
    )  # fmt: skip
    failed = plugin.snapshot()["releases"][0]
    assert (failed["release"], failed["state"]) == ("r2", "failed")
    assert failed["error"].startswith("KeyboardInterrupt")


class _Clock:
    """A wall clock the tests set (the plugin reads ``time.time()``)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def time(self) -> float:
        return self.now


def test_plugin_shows_a_run_from_its_start_with_an_eta(monkeypatch) -> None:
    import dpdask.dashboard._plugin as plugin_module

    clock = _Clock()
    monkeypatch.setattr(plugin_module, "time", clock)
    plugin = DashboardPlugin()
    ident = {"release": "r1", "run_id": "run1"}
    plugin.log_event(TOPIC, {"event": "run", **ident, "client": "c1", "dataset": "ds",
                             "step": "selecting strategy"})  # fmt: skip
    (rel,) = plugin.snapshot()["releases"]
    assert (rel["state"], rel["step"], rel["levels"]) == ("selecting", "selecting strategy", [])
    assert rel["announced"] == rel["updated"] == 1000.0 and rel["eta_seconds"] is None
    clock.now = 1030.0
    plugin.log_event(TOPIC, {"event": "step", **ident, "step": "reading data"})
    plugin.log_event(TOPIC, {"event": "step", "release": "r1", "run_id": "other", "step": "x"})
    clock.now = 1040.0
    plugin.log_event(TOPIC, _plan())  # the same run, now with its levels
    (rel,) = plugin.snapshot()["releases"]
    assert (rel["state"], rel["announced"], rel["dataset"]) == ("planned", 1000.0, "ds")
    assert [lv["level"] for lv in rel["levels"]] == ["state", "block_group", "block"]
    assert rel["elapsed"] == 40.0 and rel["updated"] == 1040.0
    keys = _keys()["block_reconstruct"]  # 4 chunks, one task each
    plugin.update_graph(None, client="c1", tasks=keys, stimulus_id="s")
    eta = {lv["level"]: lv["eta"] for lv in plugin.snapshot()["releases"][0]["levels"]}
    assert eta["block"] == {"started": None, "chunks_left": 4.0, "chunks_per_second": None,
                            "seconds": None}  # fmt: skip
    clock.now = 1100.0
    for key in keys:
        plugin.transition(key, "waiting", "processing", stimulus_id="s")
    clock.now = 1110.0
    plugin.transition(keys[0], "processing", "memory", stimulus_id="s")
    clock.now = 1120.0
    plugin.transition(keys[1], "processing", "memory", stimulus_id="s")
    (rel,) = plugin.snapshot()["releases"]
    block = {lv["level"]: lv for lv in rel["levels"]}["block"]["eta"]
    # 2 chunks in the 20 s since the level started: 0.1 chunk/s, 2 left: 20 s
    assert block["started"] == 1100.0 and block["chunks_left"] == 2.0
    assert block["chunks_per_second"] == pytest.approx(0.1)
    assert block["seconds"] == pytest.approx(20.0)
    assert rel["eta_seconds"] is None  # the other levels have not started
    clock.now = 1140.0  # nothing more done: the throughput falls, the ETA grows
    block = plugin.snapshot()["releases"][0]["levels"][2]["eta"]
    assert block["chunks_per_second"] == pytest.approx(0.05)
    assert block["seconds"] == pytest.approx(40.0)
    clock.now = 1150.0
    for key in keys[2:]:
        plugin.transition(key, "processing", "memory", stimulus_id="s")
    clock.now = 1200.0  # a finished level keeps its throughput
    block = plugin.snapshot()["releases"][0]["levels"][2]["eta"]
    assert block["seconds"] == 0.0 and block["chunks_per_second"] == pytest.approx(4 / 50)
    assert plugin.snapshot()["releases"][0]["updated"] == 1150.0


def test_plugin_counts_the_runs_failed_tasks_and_how_to_resume() -> None:
    plugin = DashboardPlugin()
    ident = {"release": "r1", "run_id": "run1"}
    plugin.log_event(TOPIC, _plan())
    ours = [f"measure-block-{TOK}", (f"aggregate-block-group-{TOK}", 0),
            f"answer-block-store-map-{TOK}", (f"checkpoint-block-{TOK}", 1)]  # fmt: skip
    theirs = [f"inc-{TOK}", ("x", 1)]
    plugin.update_graph(None, client="c1", tasks=ours + theirs, stimulus_id="s")
    plugin.update_graph(None, client="c2", tasks=[f"measure-state-{TOK}"], stimulus_id="s")
    for key in [ours[0], ours[1], ours[1], *theirs]:  # a task erred twice counts once
        plugin.transition(key, "processing", "erred", stimulus_id="s")
    plugin.transition(ours[2], "waiting", "erred", stimulus_id="s")  # a dependent: not
    assert plugin.snapshot()["releases"][0]["erred_tasks"] == 2
    resume = "dpdask run s.yaml --run-id run1 --period 2026-01"
    end = {"state": "failed", "error": "OSError: disk", "charged": True, "resume": resume}
    plugin.log_event(TOPIC, {"event": "finished", **ident, **end})
    rel = plugin.snapshot()["releases"][0]
    assert (rel["state"], rel["charged"], rel["step"]) == ("failed", True, None)
    assert rel["resume"] == resume and rel["error"] == "OSError: disk"
    for level in rel["levels"]:
        assert level["eta"]["seconds"] in (None, 0.0)


def test_run_tracker_reports_a_run_and_its_failure() -> None:
    from dpdask.dashboard import RunTracker

    client = _FakeClient()
    tracker = RunTracker(client, "rel", "one")
    tracker.start("ds", "dpdask run s.yaml --run-id one")
    tracker.step("reading data")
    tracker.failed(KeyError("boom"), "measuring")
    tracker.failed(OSError("again"), None)  # reported once
    events = [msg for topic, msg in client.events if topic == TOPIC]
    assert [m["event"] for m in events] == ["run", "step", "finished"]
    assert events[0] == {"event": "run", "release": "rel", "run_id": "one",
                         "client": "fake-client", "dataset": "ds",
                         "step": "selecting strategy"}  # fmt: skip
    assert events[2]["resume"] == "dpdask run s.yaml --run-id one"
    assert events[2]["charged"] is True and events[2]["error"] == "KeyError: 'boom'"
    for state, charged, resume in ((None, False, False), ("unknown", None, True),
                                   ("published", True, False)):  # fmt: skip
        client = _FakeClient()
        tracker = RunTracker(client, "rel", "one")
        tracker.start("ds", "dpdask run s.yaml --run-id one")
        tracker.failed(KeyboardInterrupt(), state)
        end = client.events[-1][1]
        assert end["charged"] is charged and ("resume" in end) is resume, state
        assert end["error"] == "KeyboardInterrupt"
    RunTracker(None, "rel", "one").failed(KeyError("x"))  # no client: nothing to tell


def test_plugin_keeps_the_newest_releases() -> None:
    plugin = DashboardPlugin()
    for i in range(60):
        plugin.log_event(TOPIC, _plan(client=f"c{i}", release=f"r{i}"))
        plugin.update_graph(None, client=f"c{i}", tasks=[(f"measure-block-{TOK}", i)])
    releases = plugin.snapshot()["releases"]
    assert len(releases) == 50
    assert releases[0]["release"] == "r59" and releases[-1]["release"] == "r10"
    assert len(plugin.keys) == 50 and len(plugin.by_client) == 50


def test_budget_helpers() -> None:
    from dpdask.privacy import zCDP

    assert budget_text({"type": "zCDP", "rho": "1/6"}) == "zCDP ρ=1/6 (≈0.1667)"
    assert budget_text({"type": "ApproxDP", "epsilon": "1", "delta": "1/1000000"}).startswith(
        "ApproxDP ε=1 δ=1/1000000"
    )
    assert budget_text(None) == "-"
    before = {"ledger": "l", "dataset": _plan()["ledger_before"]["dataset"], "release": None}
    after = _after_charge(before, zCDP(1))
    assert after["release"]["spent"] == {"type": "zCDP", "rho": "1"}
    assert after["release"]["remaining"] == {"type": "zCDP", "rho": "0"}
    assert after["dataset"]["remaining"] == {"type": "zCDP", "rho": "3"}
    assert _after_charge({"dataset": None, "release": None}, zCDP(1))["dataset"] is None
    assert _after_charge(None, zCDP(1)) is None
    assert json_safe({"a": [math.nan, 1.0, math.inf], "b": (1, "x")}) == {
        "a": [None, 1.0, None],
        "b": [1, "x"],
    }


def test_plugin_pickles_empty() -> None:
    import pickle

    plugin = DashboardPlugin()
    plugin.log_event(TOPIC, _plan())
    copy = pickle.loads(pickle.dumps(plugin))
    assert copy.releases == {} and copy.name == PLUGIN_NAME and copy.idempotent


# -- (b) routes and metrics on a real scheduler -----------------------------------------
def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _inc(x: int) -> int:
    return x + 1


@pytest.fixture
def cluster():
    """A local in-process cluster whose scheduler preloads dpdask.dashboard; its HTTP
    server on the loopback address."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False,
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"preload": ["dpdask.dashboard"]},
        ) as lc,
        Client(lc) as client,
    ):  # fmt: skip
        yield lc, client, f"http://127.0.0.1:{lc.scheduler.http_server.port}"


def test_preloaded_plugin_serves_json_page_and_metrics(cluster) -> None:
    lc, client, base = cluster
    plugin = lc.scheduler.plugins[PLUGIN_NAME]
    assert isinstance(plugin, DashboardPlugin)
    assert register(client)  # dpdask run registers it again: kept, not replaced
    assert lc.scheduler.plugins[PLUGIN_NAME] is plugin
    assert dashboard_url(client).endswith("/dpdask")
    assert json.loads(_get(base + "/dpdask/json"))["releases"] == []
    main = re.search(r'<main id="releases">(.*?)</main>', _get(base + "/dpdask"), re.S)
    assert main.group(1) == '<p class="none">No release running.</p>'  # 200: _get raises

    client.log_event(TOPIC, _plan(client=client.id))
    keys = [f"measure-block-{TOK}-{k}" for k in range(4)] + [f"reconstruct-block-{TOK}-0"]
    futures = [client.submit(_inc, i, key=key) for i, key in enumerate(keys)]
    assert client.gather(futures) == [1, 2, 3, 4, 5]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        data = json.loads(_get(base + "/dpdask/json"))
        block = data["releases"][0]["levels"][2]["progress"]
        if block["measured"]["chunks"] == 4:
            break
        time.sleep(0.1)
    assert block["measured"] == {"chunks": 4, "of": 4, "fraction": 1.0, "tasks_done": 4,
                                 "tasks_planned": 4}  # fmt: skip
    assert block["reconstructed"]["chunks"] == 4  # its only task is done
    assert data["releases"][0]["ledger"]["dataset"]["spent_text"] == "zCDP ρ=1"

    page = _get(base + "/dpdask")
    assert "<title>dpdask releases</title>" in page and "dpdask/json" in page
    assert "http" not in re.sub(r"https?://www\.w3\.org[^\"']*", "", page.split("<script>")[1])
    metrics = _get(base + "/metrics")
    for name in ("dpdask_chunks_planned", "dpdask_chunks_done_total", "dpdask_cells_per_second",
                 "dpdask_budget_spent", "dask_scheduler_workers"):  # fmt: skip
        assert name in metrics, name
    line = 'dpdask_chunks_done_total{level="block",release="r1",run_id="run1",stage="measured"}'
    assert f"{line} 4.0" in metrics
    assert 'dpdask_budget_spent{name="ds",parameter="rho",scope="dataset"} 1.0' in metrics
    # the Dask dashboard (bokeh) links to the page from its page bar
    assert 'href="dpdask"' in _get(base + "/status")


def test_track_reports_a_multi_chunk_release(cluster, tmp_path, rng) -> None:
    """A small release (the tract level in 4 chunks) run through ``track``: every chunk
    of every level is counted through each stage, from the real task stream."""
    from dpdask import Domain, Geography
    from dpdask.graph import release
    from dpdask.linalg import Identity, Kron, Prefix, Total, VStack
    from dpdask.noise import SecretKey
    from dpdask.privacy import Ledger, zCDP
    from dpdask.store import write_store
    from dpdask.strategy import Plan

    _lc, client, base = cluster
    domain = Domain(a=2, b=3)
    geo = Geography(
        levels=("state", "county", "tract"),
        ids=(("s",), ("c0", "c1", "c2"), tuple(f"t{i}" for i in range(7))),
        parents=(np.zeros(3, dtype=int), np.array([0, 0, 1, 2, 2, 2, 2])),
    )
    store = write_store(tmp_path / "in.zarr", rng.integers(0, 50, size=(7, 2, 3)), domain, geo)
    A = VStack([Kron([Identity(2), Identity(3)]), Kron([Total(2), Prefix(3)])])
    W = VStack([Kron([Identity(2), Total(3)]), Identity(6)], names=("margin", "cells"))
    plan = Plan(W, A, zCDP(2), domain=domain)
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    ledger.set_dataset_total("ds", zCDP(8))
    rel = release(
        plan, store, release_id="rel", run_id="one", ledger=ledger, dataset="ds",
        test_mode=True, key=SecretKey.for_testing(3), chunk_bytes=8 * 6 * 2,
    )  # fmt: skip
    chunks = {lv["level"]: lv["chunks"] for lv in rel.summary()["levels"]}
    assert chunks["tract"] > 1
    with track(client, rel, ledger):
        rel.to_zarr(tmp_path / "out.zarr", client=client)
    (snap,) = json.loads(_get(base + "/dpdask/json"))["releases"]
    assert snap["state"] == "published" and snap["dataset"] == "ds"
    for lv in snap["levels"]:
        for stage in ("measured", "reconstructed", "published"):
            p = lv["progress"][stage]
            assert (p["chunks"], p["of"]) == (chunks[lv["level"]],) * 2, (lv["level"], stage)
            assert p["tasks_planned"] > 0
        assert lv["rmse"] > 0
    assert snap["cells_done"] == snap["cells_total"] == (1 + 3 + 7) * 6
    assert snap["ledger"]["as_of"] == "after publication"
    assert snap["ledger"]["dataset"]["spent"] == {"type": "zCDP", "rho": "2"}
    assert snap["ledger"]["dataset"]["fraction_spent"] == pytest.approx(0.25)
    assert snap["ledger"]["release"]["remaining"] == {"type": "zCDP", "rho": "0"}
    assert [t["name"] for t in snap["tables"]] == ["margin", "cells"]


class _FakeClient:
    id = "fake-client"
    dashboard_link = "http://127.0.0.1:8787/status"

    def __init__(self, refuse: bool = False):
        self.refuse = refuse
        self.events: list = []

    def register_plugin(self, plugin) -> None:
        if self.refuse:
            raise OSError("no dpdask on the scheduler")

    def log_event(self, topic, msg) -> None:
        self.events.append((topic, msg))


class _FakeRelease:
    release_id, run_id, dataset = "rel", "one", None

    def summary(self) -> dict:
        return {"not_converged": [{"level": "tract", "chunk": 1}]}


def test_track_never_fails_a_release(monkeypatch, caplog) -> None:
    import dpdask.dashboard._client as client_module

    monkeypatch.setattr(client_module, "plan_event", lambda rel, *a, **k: {"event": "plan"})
    client = _FakeClient(refuse=True)
    with caplog.at_level("WARNING", logger="dpdask"), track(client, _FakeRelease()):
        pass
    assert "did not take the dpdask dashboard plugin" in caplog.text
    assert "release page at http://127.0.0.1:8787/dpdask" in caplog.text
    (plan, end) = [msg for topic, msg in client.events if topic == TOPIC]
    assert plan == {"event": "plan"}
    assert end["state"] == "published" and end["not_converged"] == [{"level": "tract", "chunk": 1}]

    client = _FakeClient()
    with pytest.raises(KeyError), track(client, _FakeRelease()):
        raise KeyError("boom")
    assert client.events[-1][1]["state"] == "failed"
    assert "KeyError" in client.events[-1][1]["error"]
    with track(None, _FakeRelease()):  # no client: the local threaded scheduler
        pass


# -- (c) the page in a browser, during a real release -----------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(*args: str) -> str:
    cmd = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
           "--virtual-time-budget=3000", *args]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


@pytest.fixture
def pl94_spec(tmp_path: pathlib.Path) -> pathlib.Path:
    raw = yaml.safe_load((ROOT / "pipelines" / "pl94-providence.yaml").read_text())
    raw["data"]["path"] = str(ROOT / "examples" / "data" / "pl94_providence")
    raw["output"] = str(tmp_path / "out" / "pl94.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    raw["privacy"]["dataset"] = {"zcdp": 4}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)")
def test_release_page_in_headless_chromium(pl94_spec, tmp_path, monkeypatch) -> None:
    from distributed import Client, LocalCluster

    import dpdask.graph as release_module
    from dpdask.pipeline.run import run_spec
    from dpdask.pipeline.spec import load_spec

    # hold the release (on the client: no worker thread waits) after measuring and
    # reconstructing every chunk and before publishing, so the browser sees it running
    gate = threading.Event()
    finish = release_module._finish.finish

    def held_finish(self, *args, **kwargs):
        gate.wait(120)
        return finish(self, *args, **kwargs)

    monkeypatch.setattr(release_module._finish, "finish", held_finish)
    spec = load_spec(pl94_spec)
    result: dict = {}
    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                     dashboard_address="127.0.0.1:0") as lc,
        Client(lc) as client,
    ):  # fmt: skip
        base = f"http://127.0.0.1:{lc.scheduler.http_server.port}"

        def run() -> None:
            try:
                result["summary"] = run_spec(spec, client=client, progress=False)
            except BaseException as exc:  # reported by the test below
                result["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 120
            rel = None
            while time.monotonic() < deadline and "error" not in result:
                if PLUGIN_NAME in lc.scheduler.plugins:
                    data = lc.scheduler.plugins[PLUGIN_NAME].snapshot()
                    if data["releases"]:
                        rel = data["releases"][0]
                        progress = [lv["progress"]["reconstructed"] for lv in rel["levels"]]
                        if progress and all(p["chunks"] == p["of"] for p in progress):
                            break  # every chunk measured and reconstructed
                time.sleep(0.2)
            assert "error" not in result, result.get("error")
            assert rel is not None and rel["state"] == "running"
            dom = _chromium("--dump-dom", f"{base}/dpdask")
            shot = tmp_path / "dpdask-dashboard.png"
            _chromium(f"--screenshot={shot}", "--window-size=1200,900", f"{base}/dpdask")
            # still running: the page was rendered during the release
            assert lc.scheduler.plugins[PLUGIN_NAME].snapshot()["releases"][0]["state"] == (
                "running"
            )
        finally:
            gate.set()
            thread.join(180)
        assert "error" not in result, result.get("error")
        final = json.loads(_get(f"{base}/dpdask/json"))["releases"][0]
        metrics = _get(f"{base}/metrics")

    text = re.sub(r"<[^>]+>", " ", dom)
    assert "Release pl94-providence" in text
    assert 'class="state state-running"' in dom
    for level in ("state", "county", "tract", "block_group", "block"):
        assert f'data-level="{level}"' in dom, level
    # progress: every level measured and reconstructed, nothing published yet
    rows = dict(re.findall(r'<tr class="level" data-level="(\w+)">(.*?)</tr>', dom))
    assert sorted(rows) == sorted(("state", "county", "tract", "block_group", "block"))
    for level, row in rows.items():
        cells = dict(re.findall(r'<td class="progress (\w+)">(.*?)</td>', row))
        figures = {s: re.sub(r"<[^>]+>", "", c).strip() for s, c in cells.items()}
        assert figures == {"measured": "1/1 chunks", "reconstructed": "1/1 chunks",
                           "published": "0/1 chunks"}, level  # fmt: skip
    # budget: the run's charge against the release's and the dataset's budgets
    assert "zCDP ρ=1" in text and "after this run's charge" in text
    assert "ri-2018-e2e-providence" in text and "25% spent" in text and "100% spent" in text
    assert "P1" in text and "votingage" in text  # predicted RMSE per table
    assert shot.stat().st_size > 10_000
    shutil.copyfile(shot, SCREENSHOT_COPY)

    assert final["state"] == "published"
    assert final["ledger"]["as_of"] == "after publication"
    stages = ("measured", "reconstructed", "published")
    assert all(
        lv["progress"][s]["chunks"] == lv["chunks"] for lv in final["levels"] for s in stages
    )
    assert 'dpdask_budget_spent{name="pl94-providence",parameter="rho",scope="release"} 1.0' in (
        metrics
    )


# -- (d) the dashboard of a cluster dpdask starts: loopback, no absolute paths ----------
def _bound(client) -> list[str]:
    return [s.getsockname()[0] for s in client.cluster.scheduler.http_server._sockets.values()]


def test_the_started_clusters_dashboard_listens_on_loopback_only() -> None:
    import socket

    from distributed.utils import get_ip

    from dpdask.pipeline.cluster import connect

    local = {"n_workers": 1, "threads_per_worker": 1, "processes": False}
    with connect(local) as client:
        port = client.cluster.scheduler.http_server.port
        assert _bound(client) == ["127.0.0.1"]
        assert client.dashboard_link == f"http://127.0.0.1:{port}/status"
        ip = get_ip()
        if not ip.startswith("127."):  # another interface: nothing listens there
            with pytest.raises(OSError):
                socket.create_connection((ip, port), timeout=5).close()
    # the spec or --dashboard-address may say otherwise (the flag wins)
    with connect({**local, "dashboard_address": "127.0.0.2:0"}) as client:
        assert _bound(client) == ["127.0.0.2"]
    with connect({**local, "dashboard_address": "127.0.0.2:0"}, dashboard_address=":0") as c:
        assert set(_bound(c)) <= {"0.0.0.0", "::"}
    with pytest.raises(ValueError, match="--dashboard-address"):
        with connect("tcp://127.0.0.1:1", dashboard_address=":0"):
            pass


def test_the_json_shows_paths_relative_to_the_spec(tmp_path) -> None:
    from dpdask.pipeline.cluster import connect
    from dpdask.pipeline.run import run_spec
    from dpdask.pipeline.spec import load_spec
    from tests.system.test_accounting import RECORDS, _write_spec

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    spec = load_spec(_write_spec(tmp_path))
    started: list = []
    with connect(spec.cluster) as client:
        run_spec(spec, client=client, run_id="J", progress=False,
                 on_start=lambda *a: started.append(a))  # fmt: skip
        port = client.cluster.scheduler.http_server.port
        text = _get(f"http://127.0.0.1:{port}/dpdask/json")
    assert started == [("J", f"http://127.0.0.1:{port}/status")]  # once the run existed
    (rel,) = json.loads(text)["releases"]
    assert rel["run_id"] == "J" and rel["state"] == "published"
    assert rel["ledger"]["path"] == "ledger/ledger.sqlite"  # relative to the spec's folder

    def strings(x):
        if isinstance(x, dict):
            for k, v in x.items():
                yield k
                yield from strings(v)
        elif isinstance(x, list):
            for v in x:
                yield from strings(v)
        elif isinstance(x, str):
            yield x

    assert str(tmp_path) not in text
    assert not [s for s in strings(json.loads(text)) if s.startswith("/")]


def test_run_passes_dashboard_address_to_the_cluster(tmp_path, monkeypatch) -> None:
    import dpdask.pipeline.cluster as cluster_module
    from dpdask.cli import main

    seen: dict = {}

    def fake_connect(cluster=None, **kw):
        seen.update(kw)
        raise ValueError("stop here")

    monkeypatch.setattr(cluster_module, "connect", fake_connect)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "release: r\ndata: {format: synthetic, geographies: 4}\ndomain: {a: 2}\n"
        "levels: [state, county]\nworkload: identity\nprivacy: {zcdp: 1}\n"
        "strategy: identity\noutput: out.zarr\n"
    )
    assert main(["run", str(spec), "--dashboard-address", ":8787", "--no-progress"]) == 2
    assert seen["dashboard_address"] == ":8787"


# -- (e) a run from its first second: selection, levels, ETA, state metrics, failure --
class _Chunks:
    """Chunk tasks of the ``county`` level as the tests below slow or break them (the
    wrappers are module functions: the in-process workers run them from the graph)."""

    free = 2  # reconstructions that go on at once; the others wait for ``go``
    passed = 0
    go = threading.Event()
    lock = threading.Lock()
    fail_chunk: int | None = None  # this chunk's reconstruction raises


def _gated(fn, level: str, block_info, *args):
    from dpdask.graph._blocks import _chunk_index

    if level == "county":
        if _Chunks.fail_chunk is not None and _chunk_index(block_info) == _Chunks.fail_chunk:
            raise RuntimeError("a worker lost its disk")
        with _Chunks.lock:
            _Chunks.passed += 1
            held = _Chunks.passed > _Chunks.free
        if held:
            _Chunks.go.wait(90)
        else:
            time.sleep(0.2)
    return fn(*args, block_info=block_info)


def _gated_estimate(x, plan, pinv, key, ctx, block_info=None):
    from dpdask.graph import _blocks

    return _gated(_blocks.estimate_block, ctx.level, block_info, x, plan, pinv, key, ctx)


def _gated_reconstruct(y, strategy, method, cell_shape, pinv=None, report_dir=None,
                       level="", noise_scale=None, block_info=None):  # fmt: skip
    from dpdask.graph import _blocks

    return _gated(_blocks.reconstruct_block, level, block_info, y, strategy, method,
                  cell_shape, pinv, report_dir, level, noise_scale)  # fmt: skip


def _small_spec(tmp_path: pathlib.Path) -> pathlib.Path:
    """40 counties in 2 states, 6 cells: the county level in 8 chunks (below)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "release: slow\ndata: {format: synthetic, geographies: 40, states: 2}\n"
        "domain: {a: 2, b: 3}\nlevels: [state, county]\nworkload: identity\n"
        "privacy: {zcdp: 1}\nstrategy: identity\noutput: out/slow.zarr\n"
        "ledger: {path: out/ledger.sqlite, create: true}\n"
    )
    return spec


@pytest.fixture
def slowed(monkeypatch):
    """Releases in chunks of 5 counties whose ``county`` reconstructions :class:`_Chunks`
    slows, holds or breaks; the strategy's selection held until ``select`` is set."""
    import dpdask.graph as release_module
    import dpdask.graph._graph as graph
    import dpdask.pipeline.run as run_module

    build = release_module.release
    monkeypatch.setattr(release_module, "release",
                        lambda *a, **k: build(*a, **{**k, "chunk_bytes": 8 * 6 * 5}))  # fmt: skip
    monkeypatch.setattr(graph, "estimate_block", _gated_estimate)
    monkeypatch.setattr(graph, "reconstruct_block", _gated_reconstruct)
    select = threading.Event()
    plan_spec = run_module.plan_spec

    def held_plan_spec(*a, **k):
        select.wait(90)
        return plan_spec(*a, **k)

    monkeypatch.setattr(run_module, "plan_spec", held_plan_spec)
    _Chunks.passed, _Chunks.fail_chunk = 0, None
    _Chunks.go.clear()
    yield select
    select.set()
    _Chunks.go.set()


@pytest.fixture
def loopback_cluster():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                     dashboard_address="127.0.0.1:0") as lc,
        Client(lc) as client,
    ):  # fmt: skip
        yield client, f"http://127.0.0.1:{lc.scheduler.http_server.port}"


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait(what, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s")


def _metric(metrics: str, name: str, **labels: str) -> float | None:
    """The value of ``name{labels}`` in a Prometheus text page (labels in any order)."""
    for line in metrics.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) == labels:
            return float(m.group(2))
    return None


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)")
def test_run_page_from_the_first_second_with_an_eta(tmp_path, slowed, loopback_cluster):
    from dpdask.pipeline.run import run_spec
    from dpdask.pipeline.spec import load_spec

    client, base = loopback_cluster
    spec = load_spec(_small_spec(tmp_path))
    result: dict = {}

    def run() -> None:
        try:
            result["summary"] = run_spec(spec, client=client, run_id="R", progress=False)
        except BaseException as exc:  # reported below
            result["error"] = exc

    assert _status(f"{base}/dpdask") == 404  # nothing registered the plugin yet
    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    try:
        _wait(lambda: _status(f"{base}/dpdask") == 200, timeout=5)
        runs = _wait(lambda: json.loads(_get(f"{base}/dpdask/json"))["releases"], timeout=5)
        assert time.monotonic() - started < 5
        assert (runs[0]["run_id"], runs[0]["state"]) == ("R", "selecting")
        assert runs[0]["step"] == "selecting strategy" and runs[0]["levels"] == []
        dom = _chromium("--dump-dom", f"{base}/dpdask")  # still selecting: it is held
        assert 'class="state state-selecting"' in dom and "selecting strategy" in dom
        shown = re.search(r'<main id="releases">(.*?)</main>', dom, re.S).group(1)
        assert "Release slow" in shown and "No release running" not in shown
        metrics = _get(f"{base}/metrics")
        assert _metric(metrics, "dpdask_release_state", release="slow", run_id="R",
                       state="selecting") == 1.0  # fmt: skip
        assert _metric(metrics, "dpdask_release_state", release="slow", run_id="R",
                       state="running") == 0.0  # fmt: skip

        slowed.set()  # the strategy is selected: the levels, then the chunks

        def county_eta():
            (rel,) = json.loads(_get(f"{base}/dpdask/json"))["releases"]
            lv = {lv["level"]: lv for lv in rel["levels"]}.get("county")
            return lv if lv and lv["eta"]["seconds"] else None

        county = _wait(county_eta)
        assert county["chunks"] == 8
        done = county["progress"]["reconstructed"]["chunks"]
        assert 1 <= done <= _Chunks.free
        # the ETA is the chunks left over the chunks done per second since the start
        eta = county["eta"]
        assert eta["chunks_left"] == pytest.approx(8 - done)
        assert eta["seconds"] == pytest.approx(eta["chunks_left"] / eta["chunks_per_second"])
        elapsed = time.time() - eta["started"]
        assert 0 < done / eta["chunks_per_second"] <= elapsed + 1e-6
        dom = _chromium("--dump-dom", f"{base}/dpdask")
        metrics = _get(f"{base}/metrics")
    finally:
        _Chunks.go.set()
        slowed.set()
        thread.join(120)
    assert "error" not in result, result.get("error")
    rows = dict(re.findall(r'<tr class="level" data-level="(\w+)">(.*?)</tr>', dom))
    shown = re.sub(r"<[^>]+>", "", re.search(r'<td class="eta nowrap">(.*?)</td>',
                                              rows["county"]).group(1))  # fmt: skip
    assert re.fullmatch(r"[\d.]+ (s|min) \([\d.]+ chunks/s\)", shown), shown
    assert 'class="state state-running"' in dom
    assert _metric(metrics, "dpdask_release_state", release="slow", run_id="R",
                   state="running") == 1.0  # fmt: skip
    assert _metric(metrics, "dpdask_failed_tasks_total", release="slow", run_id="R") == 0.0
    assert _metric(metrics, "dpdask_level_eta_seconds", release="slow", run_id="R",
                   level="county") > 0  # fmt: skip
    t0 = _metric(metrics, "dpdask_release_started_timestamp_seconds", release="slow",
                 run_id="R")  # fmt: skip
    t1 = _metric(metrics, "dpdask_release_updated_timestamp_seconds", release="slow",
                 run_id="R")  # fmt: skip
    assert t0 is not None and t1 is not None and t0 < t1 <= time.time()

    (final,) = json.loads(_get(f"{base}/dpdask/json"))["releases"]
    assert final["state"] == "published" and final["step"] is None
    assert [lv["eta"]["seconds"] for lv in final["levels"]] == [0.0, 0.0]
    metrics = _get(f"{base}/metrics")
    assert _metric(metrics, "dpdask_release_state", release="slow", run_id="R",
                   state="published") == 1.0  # fmt: skip


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install -y chromium)")
def test_a_failed_runs_page_shows_how_to_resume_it(tmp_path, slowed, loopback_cluster):
    from dpdask.pipeline.run import run_spec
    from dpdask.pipeline.spec import load_spec
    from dpdask.privacy import Ledger

    client, base = loopback_cluster
    slowed.set()
    _Chunks.go.set()
    _Chunks.fail_chunk = 3  # one county chunk's reconstruction fails, after the charge
    spec = load_spec(_small_spec(tmp_path))
    with pytest.raises(RuntimeError, match="lost its disk") as info:
        run_spec(spec, client=client, run_id="F", progress=False)
    assert "dpdask run" in "\n".join(info.value.__notes__)
    assert Ledger(tmp_path / "out" / "ledger.sqlite").run("slow", "F").state in (
        "open", "measuring",
    )  # fmt: skip
    text = _get(f"{base}/dpdask/json")
    (rel,) = json.loads(text)["releases"]
    assert rel["state"] == "failed" and rel["charged"] is True
    assert rel["error"] == "RuntimeError: a worker lost its disk"
    assert rel["resume"] == "dpdask run spec.yaml --run-id F"
    assert str(tmp_path) not in text  # the page shows no absolute path
    dom = _chromium("--dump-dom", f"{base}/dpdask")
    assert 'class="state state-failed"' in dom
    assert "error: RuntimeError: a worker lost its disk" in dom
    assert '<code class="resume">dpdask run spec.yaml --run-id F</code>' in dom
    assert '<td class="eta nowrap">stopped</td>' in dom  # the county level never finished
    metrics = _get(f"{base}/metrics")
    assert _metric(metrics, "dpdask_release_state", release="slow", run_id="F",
                   state="failed") == 1.0  # fmt: skip
    # the chunk's task, not the tasks that erred because they needed it
    assert _metric(metrics, "dpdask_failed_tasks_total", release="slow", run_id="F") == 1.0


def test_a_failure_report_never_replaces_the_runs_error(tmp_path) -> None:
    from dpdask.pipeline._outcome import failure_reported
    from dpdask.pipeline.spec import load_spec

    spec = load_spec(_small_spec(tmp_path))
    told: list = []

    def broken(exc, state):
        told.append((type(exc), state))
        raise OSError("the scheduler is gone")

    with pytest.raises(KeyError) as info, failure_reported(spec, "X", tmp_path / "w", broken):
        raise KeyError("the run's own error")
    assert told == [(KeyError, None)]  # no ledger yet: not charged
    assert info.value.__notes__ == ["run X was not charged; nothing was spent"]
