"""Fault injection at scale: releases killed at random points, resumed, compared bit for bit.

:func:`run_trials` runs a multi-level release spec many times through the command line
(``python -m dpdask.cli run SPEC --run-id R`` as a subprocess owning a real
:class:`distributed.LocalCluster` of worker processes), on the real key-file path (the
run makes its own key), and in each trial injects a fault drawn from a seeded
:class:`random.Random`:

``worker``
    a random worker process of the run's cluster is SIGKILLed; the run is expected to
    finish by itself (Dask recomputes the lost tasks), else it is resumed;
``client``
    the client process (the CLI, and with it the scheduler and the nannies) is
    SIGKILLed at a random moment, or right when its key file or its ``n``-th chunk
    marker appears;
``both``
    a worker, then the client, are killed in the first run, and a worker again in the
    run that resumes it.

Random moments are drawn over the window an uninterrupted calibration run shows: a
phase (startup, measuring from the key file to the last chunk marker, finishing), then
a delay within it, counted from the phase's first event as the faulty run observes it.

A run that did not finish is resumed with the same run id until it publishes. Every
trial is then checked:

* at the moment of the fault, either nothing was charged and nothing published, or
  every level was charged (all or nothing) and anything published is the complete
  release;
* once completed, the ledger verifies, holds exactly one charge entry per measurement
  (one per level) of the run, and the run is ``published`` at the output, bound to the
  key seen in its work folder; the work folder (and the key in it) is gone and nothing
  is left beside the output;
* the published arrays are bit for bit those of an uninterrupted reference: the same
  command on the same kind of cluster, for the same release and run id, in a ledger of
  its own, with a copy of the trial's key (read from the work folder while the run was
  alive) placed in the reference's work folder before it starts.

Every trial has its own folder (rewritten spec, output, ledger, logs, reference), so
the spec's own output and ledger are never touched. ``dpdask faults SPEC`` runs this.
"""

from __future__ import annotations

import collections
import math
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

__all__ = [
    "FAULT_KINDS",
    "compare_releases",
    "format_summary",
    "place_key",
    "run_trials",
    "trial_spec",
]

FAULT_KINDS = ("worker", "client", "both")

#: the cluster each CLI run owns: two single-threaded worker processes
TRIAL_CLUSTER = {"n_workers": 2, "threads_per_worker": 1, "processes": True}

_POLL = 0.005  # seconds between looks at the work folder
_SCAN = 0.1  # seconds between scans for worker processes
_RUN_TIMEOUT = 600.0  # seconds a single CLI run may take
_RESUMES = 3  # resumes tried before a trial is declared stuck
_COMPARED_ATTRS = ("release", "run_id", "budget", "domain", "levels", "charges", "reconstruct")


# -- building blocks (also used by tests) ----------------------------------------------------
def trial_spec(
    spec_path: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    *,
    reconstruct: str | None = None,
    cluster: Mapping[str, Any] | None = None,
    period: str | None = None,
) -> pathlib.Path:
    """Rewrite a release spec to publish and charge inside ``folder`` only.

    Parameters
    ----------
    spec_path : path-like
        The spec to rewrite (it is parsed first, so an invalid spec is refused here).
    folder : path-like
        Where the rewritten spec, its output and its ledger go (created if missing).
    reconstruct : str, optional
        Another estimator for the release (e.g. ``"admm-l1"``, slower, which widens the
        window in which a run can be killed); the spec's by default.
    cluster : mapping, optional
        :class:`distributed.LocalCluster` options for the run; :data:`TRIAL_CLUSTER` by
        default. A spec's scheduler address is always replaced: trials never run on a
        shared cluster.
    period : str, optional
        For a scheduled spec (``release: name-{period}``), the period (default: today's,
        as ``dpdask run``); the rewritten spec names the resolved release id.

    Returns
    -------
    pathlib.Path
        ``folder / "spec.yaml"``, whose output is ``folder / <the spec's output name>``
        and whose ledger is ``folder / "ledger.sqlite"`` (created by the first run).
    """
    from dpdask.pipeline.spec import load_spec

    spec = load_spec(spec_path) if period is None else load_spec(spec_path, period=period)
    raw = yaml.safe_load(pathlib.Path(spec_path).read_text())
    raw["release"] = spec.release  # a scheduled release's id, resolved once
    folder = pathlib.Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    data = dict(raw["data"])
    if spec.data.path is not None:
        data["path"] = str(spec.data.path)  # resolved against the original spec's folder
    raw["data"] = data
    raw["output"] = str(folder / spec.output.name)
    raw["ledger"] = {"path": str(folder / "ledger.sqlite"), "create": True}
    raw["cluster"] = dict(TRIAL_CLUSTER if cluster is None else cluster)
    if reconstruct is not None:
        raw["reconstruct"] = reconstruct
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def place_key(output: str | os.PathLike[str], run_id: str, raw: bytes) -> pathlib.Path:
    """Put a copy of a run's key in the new work folder of run ``run_id`` at ``output``,
    as a run keeps it (the folder 0700, the file 0600), so that a fresh run of that id
    draws the same noise.

    Parameters
    ----------
    output : path-like
        The output the run will publish (its work folder must not exist yet).
    run_id : str
        The run id.
    raw : bytes
        The key file's bytes.

    Returns
    -------
    pathlib.Path
        The key file written.
    """
    from dpdask.publish import work_dir

    work = work_dir(pathlib.Path(os.path.abspath(output)), run_id)
    work.parent.mkdir(parents=True, exist_ok=True)
    work.mkdir(mode=0o700)
    work.chmod(0o700)
    fd = os.open(work / "key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, raw)
    finally:
        os.close(fd)
    return work / "key"


def compare_releases(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> list[str]:
    """How two published releases differ: every array bit for bit, and the attributes
    that do not depend on when or where they were made.

    Parameters
    ----------
    a, b : path-like
        Two published zarr stores.

    Returns
    -------
    list of str
        One line per difference; empty if the releases are identical.
    """
    import zarr

    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    arrays_a = {n: m for n, m in ga.members(max_depth=None) if isinstance(m, zarr.Array)}
    arrays_b = {n: m for n, m in gb.members(max_depth=None) if isinstance(m, zarr.Array)}
    diffs: list[str] = []
    if set(arrays_a) != set(arrays_b):
        diffs.append(f"arrays differ: {sorted(set(arrays_a) ^ set(arrays_b))}")
    if not arrays_a:
        diffs.append("no arrays")
    for name in sorted(set(arrays_a) & set(arrays_b)):
        x, y = arrays_a[name][...], arrays_b[name][...]
        if x.shape != y.shape or x.dtype != y.dtype:
            diffs.append(f"{name}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
        elif x.dtype.kind in "biufcmM":
            if np.ascontiguousarray(x).tobytes() != np.ascontiguousarray(y).tobytes():
                n = int(np.count_nonzero(x.view(np.uint8) != y.view(np.uint8)))
                diffs.append(f"{name}: {n} bytes differ")
        elif not np.array_equal(x, y):
            diffs.append(f"{name}: values differ")
    attrs_a = dict(ga.attrs).get("dpdask", {})
    attrs_b = dict(gb.attrs).get("dpdask", {})
    for key in _COMPARED_ATTRS:
        if attrs_a.get(key) != attrs_b.get(key):
            diffs.append(f"attrs[dpdask][{key!r}] differ")
    return diffs


# -- one watched CLI run ---------------------------------------------------------------------
@dataclass
class _Plan:
    """What to kill in one run, and when (see :func:`_draw_kill`): a kill is a mapping
    ``{"anchor": "start" | "key" | n, "delay": seconds, "pick": fraction}``, due ``delay``
    seconds after the process started, its key file appeared or its ``n``-th chunk
    marker appeared; ``pick`` chooses the worker among those alive. The client is killed
    only after the worker (when both are planned)."""

    worker: Mapping[str, Any] | None = None
    client: Mapping[str, Any] | None = None


@dataclass
class _Observed:
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
        return psutil.Process(pid).children(recursive=True)
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
    from dpdask.noise._keys import KEY_BYTES

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


def _watched_run(
    spec: pathlib.Path, run_id: str, work: pathlib.Path, log: pathlib.Path, plan: _Plan
) -> _Observed:
    """Run the CLI on ``spec``, watching its work folder and workers, and kill as planned."""
    import psutil

    seen = _Observed()
    done = work / "done"
    t0 = time.monotonic()
    last_scan = -math.inf
    workers: list[Any] = []
    with log.open("w") as out:
        proc = subprocess.Popen(_cli(spec, run_id), stdout=out, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                now = time.monotonic() - t0
                if now > _RUN_TIMEOUT:
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


def _due(kill: Mapping[str, Any], seen: _Observed, now: float) -> bool:
    """Whether ``kill`` is due: its anchor event has happened, and its delay since."""
    anchor = kill["anchor"]
    if anchor == "start":
        at: float | None = 0.0
    elif anchor == "key" or anchor == 0:
        at = seen.key_at
    else:
        at = seen.markers_at[anchor - 1] if len(seen.markers_at) >= anchor else None
    return at is not None and now >= at + kill["delay"]


# -- the checks ------------------------------------------------------------------------------
def _ledger_state(path: pathlib.Path, release: str, run_id: str) -> dict[str, Any]:
    """The run's state, charges and charge entries in the ledger at ``path``."""
    from dpdask.privacy import Ledger

    if not path.exists():
        return {"exists": False, "run": None, "charges": [], "entries": 0}
    ledger = Ledger(path)
    ledger.verify()
    run = ledger.run(release, run_id)
    charges = [c for c in ledger.charges(release) if c.run_id == run_id]
    # the folded view keeps one charge per identity; the chain shows any written twice
    entries = [
        e
        for e in ledger._chain.read()
        if e.kind == "charge"
        and e.body.get("release") == release
        and e.body.get("run_id") == run_id
    ]
    return {"exists": True, "run": run, "charges": charges, "entries": len(entries)}


def _charges_ok(state: Mapping[str, Any], levels: Sequence[str]) -> str | None:
    """``None`` if the run holds exactly one charge per level, else what is wrong."""
    per = collections.Counter((c.level, c.measurement) for c in state["charges"])
    if state["entries"] != len(levels) or len(state["charges"]) != len(levels):
        return (
            f"{state['entries']} charge entries ({len(state['charges'])} distinct) for "
            f"{len(levels)} levels"
        )
    if sorted(lv for lv, _ in per) != sorted(levels) or any(v != 1 for v in per.values()):
        return f"charges per (level, measurement): {dict(per)}"
    return None


def _leftovers(output: pathlib.Path) -> list[str]:
    """Hidden siblings of ``output`` (work folders, partial stores) left behind."""
    return sorted(p.name for p in output.parent.glob(f".{output.name}*"))


def _last_line(log: pathlib.Path) -> str:
    """The last non-empty line of a log (the error a failed run ended with)."""
    try:
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


# -- the trials ------------------------------------------------------------------------------
def _calibrate(spec_path: pathlib.Path, folder: pathlib.Path) -> dict:
    """One uninterrupted run, to see when workers, the key, the markers and the end come."""
    from dpdask.pipeline.spec import load_spec
    from dpdask.publish import work_dir

    spec_file = trial_spec(spec_path, folder)
    spec = load_spec(spec_file)
    seen = _watched_run(
        spec_file, "calibration", work_dir(spec.output, "calibration"),
        folder / "run.log", _Plan(),
    )  # fmt: skip
    if seen.returncode != 0:
        raise RuntimeError(
            f"the uninterrupted calibration run failed (exit {seen.returncode}); see "
            f"{folder / 'run.log'}:\n{(folder / 'run.log').read_text()[-3000:]}"
        )
    if seen.key_at is None or seen.workers_at is None:
        raise RuntimeError("the calibration run was too quick to see its key and workers")
    return {
        "workers_at": seen.workers_at,
        "key_at": seen.key_at,
        "markers_at": seen.markers_at,
        "end": seen.seconds,
        "chunks": len(seen.markers_at),
    }


def _draw_kill(rng: random.Random, window: Mapping[str, Any]) -> dict[str, Any]:
    """A kill at a random moment of a random phase of the run, anchored on the phase's
    first event as the run observes it (so that a slower or faster run is still hit in
    that phase): ``startup`` (cluster up, strategy, data; nothing charged yet),
    ``measuring`` (from the key file to the last chunk marker) or ``finishing``
    (consistency, answers, publication)."""
    last = window["markers_at"][-1] if window["markers_at"] else window["key_at"]
    phase = rng.choice(("startup", "measuring", "finishing"))
    if phase == "startup":
        anchor, lo, hi = "start", window["workers_at"], window["key_at"]
    elif phase == "measuring":
        anchor, lo, hi = "key", 0.0, last - window["key_at"]
    else:
        anchor, lo, hi = window["chunks"], 0.0, window["end"] - last
    return {
        "phase": phase,
        "anchor": anchor,
        "delay": round(rng.uniform(lo, max(lo, hi)), 3),
        "pick": round(rng.random(), 3),
    }


def _draw_fault(rng: random.Random, kind: str, window: Mapping[str, Any]) -> dict[str, Any]:
    """The fault of one trial: a worker kill, a client kill (at a random moment, or
    right when the key file or the ``n``-th chunk marker appears), or both, plus a
    worker kill in the resumed run."""
    fault: dict[str, Any] = {"kind": kind}
    if kind in ("worker", "both"):
        fault["worker"] = _draw_kill(rng, window)
    if kind in ("client", "both"):
        if rng.random() < 0.5:
            fault["client"] = _draw_kill(rng, window)
        else:
            n = rng.randint(0, window["chunks"])
            fault["client"] = {
                "phase": "marker",
                "anchor": "key" if n == 0 else n,
                "delay": round(rng.uniform(0.0, 0.05), 3),
            }
    if kind == "both":
        fault["resume_worker"] = _draw_kill(rng, window)
    return fault


def _run_trial(
    trial: int,
    spec_path: pathlib.Path,
    folder: pathlib.Path,
    fault: Mapping[str, Any],
    seed: int,
) -> dict[str, Any]:
    """One trial: the faulty run, its resumes, the checks and the reference."""
    from dpdask.noise import SecretKey
    from dpdask.pipeline.spec import load_spec
    from dpdask.publish import work_dir

    run_id = f"fault-{seed}-{trial}"
    spec_file = trial_spec(spec_path, folder)
    spec = load_spec(spec_file)
    out, work = spec.output, work_dir(spec.output, run_id)
    levels = list(spec.levels or ())
    record: dict[str, Any] = {"trial": trial, "fault": dict(fault), "run_id": run_id}
    problems: list[str] = []
    notes: list[str] = []  # what is worth knowing but breaks no promise
    record["notes"] = notes

    first = _watched_run(
        spec_file, run_id, work, folder / "run-0.log",
        _Plan(worker=fault.get("worker"), client=fault.get("client")),
    )  # fmt: skip
    keys = [first.key] if first.key is not None else []
    record["first_run"] = {
        "exit": first.returncode,
        "seconds": first.seconds,
        "worker_killed": first.worker_killed,
        "client_killed": first.client_killed,
        "orphans": first.orphans,
    }
    if first.timed_out:
        problems.append(f"the first run took more than {_RUN_TIMEOUT} s")

    # the state the fault left: nothing charged and nothing published, or all charged
    state = _ledger_state(spec.ledger, spec.release, run_id)
    charged = bool(state["charges"]) or state["entries"] > 0 or state["run"] is not None
    published_now = out.exists()
    record["at_fault"] = {
        "charged": charged,
        "published": published_now,
        "run_state": state["run"].state if state["run"] is not None else None,
        "markers": first.client_killed["markers"] if first.client_killed else None,
    }
    if first.returncode != 0:
        if not charged:
            record["nothing_published"] = not published_now
            if published_now:
                problems.append("published without a charge")
        elif (why := _charges_ok(state, levels)) is not None:
            problems.append(f"after the fault, not all levels charged at once: {why}")
    if first.returncode != 0 and first.client_killed is None:
        # not a violation (the resume must still complete it), but worth knowing
        notes.append(
            f"the first run exited {first.returncode} without its client being killed "
            f"(worker killed: {first.worker_killed}): {_last_line(folder / 'run-0.log')}"
        )

    # resume until published (a run killed after publishing has nothing left to do)
    resumes: list[dict[str, Any]] = []
    last = first
    while last.returncode != 0 and len(resumes) < _RESUMES:
        state = _ledger_state(spec.ledger, spec.release, run_id)
        if state["run"] is not None and state["run"].state == "published":
            break
        i = len(resumes) + 1
        plan = _Plan(worker=fault.get("resume_worker") if i == 1 else None)
        last = _watched_run(spec_file, run_id, work, folder / f"run-{i}.log", plan)
        if last.key is not None:
            keys.append(last.key)
        resumes.append(
            {"exit": last.returncode, "seconds": last.seconds, "worker_killed": last.worker_killed}
        )
        if last.returncode != 0:  # a problem only if no resume completes the run
            notes.append(
                f"resume {i} exited {last.returncode} (worker killed: {last.worker_killed}): "
                f"{_last_line(folder / f'run-{i}.log')}"
            )
    record["resumes"] = resumes

    # the completed run
    state = _ledger_state(spec.ledger, spec.release, run_id)
    run = state["run"]
    completed = run is not None and run.state == "published" and out.exists()
    record["completed"] = completed
    if not completed:
        log = folder / f"run-{len(resumes)}.log"
        problems.append(
            f"not completed after {len(resumes)} resumes: run {run.state if run else None}, "
            f"output {'present' if out.exists() else 'absent'}; the last run's log ends: "
            f"...{log.read_text()[-1500:] if log.exists() else ''}"
        )
    else:
        if run.output != str(out):
            problems.append(f"the ledger has the run published at {run.output}, not {out}")
        if (why := _charges_ok(state, levels)) is not None:
            problems.append(f"charges: {why}")
        else:
            record["charges_ok"] = True
        if work.exists():
            problems.append(f"the work folder is left after publication: {sorted(work.iterdir())}")
        if rest := _leftovers(out):
            problems.append(f"left beside the output: {rest}")
        if len({bytes(k) for k in keys}) > 1:
            problems.append("the run's key file changed between runs")
        if not keys:
            problems.append("the run's key was never seen in its work folder")
        elif SecretKey(keys[0]).fingerprint() != run.key_fingerprint:
            problems.append("the key seen in the work folder is not the one the run is bound to")
        else:
            # the uninterrupted reference: the same command on the same kind of cluster,
            # in a ledger of its own, with the same ids and key
            ref_spec = trial_spec(spec_path, folder / "reference")
            ref = load_spec(ref_spec)
            place_key(ref.output, run_id, keys[0])
            ref_log = folder / "reference" / "run.log"
            ref_run = _watched_run(ref_spec, run_id, work_dir(ref.output, run_id), ref_log, _Plan())
            ref_state = _ledger_state(ref.ledger, ref.release, run_id)
            if ref_run.returncode != 0:
                tail = ref_log.read_text()[-1500:]
                problems.append(f"the reference run exited {ref_run.returncode}: ...{tail}")
            elif (
                ref_state["run"] is None or ref_state["run"].key_fingerprint != run.key_fingerprint
            ):
                problems.append("the reference ran with another key")
            else:
                diffs = compare_releases(ref.output, out)
                record["bit_identical"] = not diffs
                if diffs:
                    problems.append(f"differs from the uninterrupted reference: {diffs[:10]}")
    record["problems"] = problems
    return record


def run_trials(
    spec_path: str | os.PathLike[str],
    trials: int = 20,
    seed: int = 0,
    workdir: str | os.PathLike[str] | None = None,
    *,
    reconstruct: str | None = None,
    period: str | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """Kill workers and the client at random points of a release, resume, and check.

    Parameters
    ----------
    spec_path : path-like
        A release spec, preferably of several levels; its output and ledger are never
        touched (each trial rewrites them into its own folder, see :func:`trial_spec`).
    trials : int
        How many faulty runs (each with its own run, resumes and reference).
    seed : int
        Seeds the :class:`random.Random` that draws the faults.
    workdir : path-like, optional
        Where the trials' folders go; a temporary folder by default, removed at the end
        unless a trial failed (or ``keep``).
    reconstruct : str, optional
        Another estimator for the trials (``"admm-l1"`` widens the kill window).
    period : str, optional
        For a scheduled spec, the period (default: today's UTC date, resolved once).
    keep : bool
        Keep a temporary ``workdir`` even if every trial passed.

    Returns
    -------
    dict
        JSON-safe: ``trials``, ``faults`` (per kind), ``worker_kills`` and
        ``client_kills`` (faults actually delivered: a kill drawn after the run ended is
        not), ``charged_at_fault`` (trials whose run was charged when its first run
        stopped), ``nothing_published`` (trials whose first run stopped with nothing
        charged and nothing published; they are then resumed too), ``completed`` (trials
        that ended published), ``bit_identical`` (completed and equal to the reference),
        ``charges_ok`` (completed with one charge entry per level), ``failures`` (a dict
        per failed trial: ``trial``, ``fault``, ``problems``), ``window`` (the observed
        timings the faults were drawn over), ``details`` (per trial, with ``notes`` on
        runs that failed without breaking a promise), ``workdir`` (when kept) and
        ``seconds``.

    Raises
    ------
    ValueError
        If ``trials`` is not a positive integer.
    RuntimeError
        If the uninterrupted calibration run fails.
    """
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    t0 = time.monotonic()
    source = pathlib.Path(spec_path)
    temporary = workdir is None
    root = pathlib.Path(tempfile.mkdtemp(prefix="dpdask-faults-") if temporary else workdir)
    root = root.absolute()
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    # the spec resolved once (period, estimator, input path), then rewritten per trial
    spec_file = trial_spec(source, root / "spec", reconstruct=reconstruct, period=period)
    window = _calibrate(spec_file, root / "calibration")
    kinds = [FAULT_KINDS[i % len(FAULT_KINDS)] for i in range(trials)]
    rng.shuffle(kinds)
    details: list[dict[str, Any]] = []
    for trial, kind in enumerate(kinds):
        fault = _draw_fault(rng, kind, window)
        try:
            record = _run_trial(trial, spec_file, root / f"trial-{trial:02d}", fault, seed)
        except Exception as exc:  # reported as a failed trial, the others still run
            record = {"trial": trial, "fault": fault, "problems": [f"{type(exc).__name__}: {exc}"]}
        details.append(record)
    failures = [
        {"trial": r["trial"], "fault": r["fault"], "problems": r["problems"]}
        for r in details
        if r["problems"]
    ]
    summary: dict[str, Any] = {
        "spec": str(source),
        "reconstruct": reconstruct,
        "seed": seed,
        "trials": trials,
        "faults": dict(collections.Counter(kinds)),
        "worker_kills": sum(
            bool(r.get("first_run", {}).get("worker_killed"))
            + sum(bool(x.get("worker_killed")) for x in r.get("resumes", []))
            for r in details
        ),
        "client_kills": sum(bool(r.get("first_run", {}).get("client_killed")) for r in details),
        "charged_at_fault": sum(bool(r.get("at_fault", {}).get("charged")) for r in details),
        "completed": sum(bool(r.get("completed")) for r in details),
        "nothing_published": sum(bool(r.get("nothing_published")) for r in details),
        "bit_identical": sum(bool(r.get("bit_identical")) for r in details),
        "charges_ok": sum(bool(r.get("charges_ok")) for r in details),
        "failures": failures,
        "window": {k: _round(v) for k, v in window.items()},
        "details": details,
        "seconds": round(time.monotonic() - t0, 1),
    }
    if temporary and not failures and not keep:
        shutil.rmtree(root, ignore_errors=True)
    else:
        summary["workdir"] = str(root)
    return summary


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, list):
        return [_round(v) for v in value]
    return value


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few lines for the terminal (``dpdask faults`` without ``--json``)."""
    lines = [
        f"dpdask faults {summary['spec']}: {summary['trials']} trials in {summary['seconds']} s "
        f"(seed {summary['seed']}, faults {summary['faults']})",
        f"  delivered: {summary['worker_kills']} worker kills, {summary['client_kills']} client "
        f"kills; {summary['charged_at_fault']} charged when the fault struck",
        f"  completed {summary['completed']}, bit-identical {summary['bit_identical']}, "
        f"one charge per level {summary['charges_ok']}, nothing published at the fault "
        f"{summary['nothing_published']}",
    ]
    for f in summary["failures"]:
        lines.append(f"  FAILED trial {f['trial']} ({f['fault']}):")
        lines.extend(f"    {p}" for p in f["problems"])
    if not summary["failures"]:
        lines.append("  every trial passed")
    if "workdir" in summary:
        lines.append(f"  trial folders kept in {summary['workdir']}")
    return "\n".join(lines)
