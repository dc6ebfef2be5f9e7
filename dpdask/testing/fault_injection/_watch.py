"""One watched CLI run: ``dpdask run`` as a subprocess, its work folder and worker
processes watched, and a worker or the client killed when planned."""

from __future__ import annotations

import math
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RUN_TIMEOUT", "KillPlan", "Observed", "watched_run"]


_POLL = 0.005  # seconds between looks at the work folder
_SCAN = 0.1  # seconds between scans for worker processes
RUN_TIMEOUT = 600.0  # seconds a single CLI run may take


@dataclass
class KillPlan:
    """What to kill in one run, and when (see :func:`_draw_kill`): a kill is a mapping
    ``{"anchor": "start" | "key" | n, "delay": seconds, "pick": fraction}``, due ``delay``
    seconds after the process started, its key file appeared or its ``n``-th chunk
    marker appeared; ``pick`` chooses the worker among those alive. The client is killed
    only after the worker (when both are planned)."""

    worker: Mapping[str, Any] | None = None
    client: Mapping[str, Any] | None = None


@dataclass
class Observed:
    """What the watcher saw during one run."""

    returncode: int | None = None
    seconds: float = 0.0
    workers_at: float | None = None
    key_at: float | None = None
    markers_at: list[float] = field(default_factory=list)
    key: bytes | None = None
    worker_killed: dict[str, Any] | None = None
    client_killed: dict[str, Any] | None = None
    orphans: int = 0  # processes of the killed client still alive after 10 s
    timed_out: bool = False


def _cli(spec: pathlib.Path, run_id: str) -> list[str]:
    return [sys.executable, "-m", "dpdask.cli", "run", str(spec), "--run-id", run_id,
            "--no-progress", "--json"]  # fmt: skip


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        children: list[Any] = psutil.Process(pid).children(recursive=True)
        return children
    except psutil.Error:
        return []


def _workers(procs: Sequence[Any]) -> list[Any]:
    """The Dask worker processes (spawned by the nannies) among ``procs``, by pid."""
    import psutil

    found = []
    for p in procs:
        try:
            if any("spawn_main" in part for part in p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return sorted(found, key=lambda p: p.pid)


def _read_key(path: pathlib.Path) -> bytes | None:
    from dpdask.noise import KEY_BYTES

    try:
        raw = path.read_bytes()
    except OSError:
        return None
    return raw if len(raw) == KEY_BYTES else None  # a key file still being written


def _count(folder: pathlib.Path) -> int:
    try:
        return sum(1 for _ in folder.iterdir())
    except OSError:
        return 0


def watched_run(
    spec: pathlib.Path, run_id: str, work: pathlib.Path, log: pathlib.Path, plan: KillPlan
) -> Observed:
    """Run the CLI on ``spec``, watching its work folder and workers, and kill as planned."""
    import psutil

    seen = Observed()
    done = work / "done"
    t0 = time.monotonic()
    last_scan = -math.inf
    workers: list[Any] = []
    with log.open("w") as out:
        proc = subprocess.Popen(_cli(spec, run_id), stdout=out, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                now = time.monotonic() - t0
                if now > RUN_TIMEOUT:
                    seen.timed_out = True
                    break
                if seen.key is None:
                    seen.key = _read_key(work / "key")
                    if seen.key is not None:
                        seen.key_at = now
                n = _count(done)
                while len(seen.markers_at) < n:
                    seen.markers_at.append(now)
                if now - last_scan >= _SCAN:
                    last_scan = now
                    workers = _workers(_descendants(proc.pid))
                    if workers and seen.workers_at is None:
                        seen.workers_at = now
                if (
                    plan.worker is not None
                    and seen.worker_killed is None
                    and workers
                    and _due(plan.worker, seen, now)
                ):
                    pick = plan.worker.get("pick", 0.0)
                    victim = workers[min(int(pick * len(workers)), len(workers) - 1)]
                    try:
                        victim.kill()  # psutil refuses a pid reused by another process
                    except psutil.Error:
                        workers = []  # gone already (restarting); try again on the next scan
                    else:
                        seen.worker_killed = {
                            "at": round(now, 3),
                            "markers": n,
                            "key_seen": seen.key is not None,
                        }
                if (
                    plan.client is not None
                    and (plan.worker is None or seen.worker_killed is not None)
                    and _due(plan.client, seen, now)
                ):
                    family = _descendants(proc.pid)
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    seen.client_killed = {
                        "at": round(now, 3),
                        "markers": n,
                        "key_seen": seen.key is not None,
                    }
                    _, alive = psutil.wait_procs(family, timeout=10)
                    seen.orphans = len(alive)
                    for p in alive:  # processes of the killed client, by pid
                        try:
                            p.kill()
                        except psutil.Error:
                            pass
                    psutil.wait_procs(alive, timeout=10)
                    break
                time.sleep(_POLL)
        finally:
            if proc.poll() is None:
                family = _descendants(proc.pid)
                proc.kill()
                proc.wait()
                for p in family:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
    seen.returncode = proc.returncode
    seen.seconds = round(time.monotonic() - t0, 3)
    if seen.key is None:  # a run too quick for the poll: the key may still be there
        seen.key = _read_key(work / "key")
    return seen


def _due(kill: Mapping[str, Any], seen: Observed, now: float) -> bool:
    """Whether ``kill`` is due: its anchor event has happened, and its delay since."""
    anchor = kill["anchor"]
    if anchor == "start":
        at: float | None = 0.0
    elif anchor == "key" or anchor == 0:
        at = seen.key_at
    else:
        at = seen.markers_at[anchor - 1] if len(seen.markers_at) >= anchor else None
    return at is not None and now >= at + kill["delay"]
