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
import os
import pathlib
import random
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from dpdask.errors import ArgumentError
from dpdask.testing.fault_injection._draw import FAULT_KINDS, draw_fault, timing_run
from dpdask.testing.fault_injection._files import (
    TRIAL_CLUSTER,
    compare_releases,
    place_key,
    trial_spec,
)
from dpdask.testing.fault_injection._trial import run_trial

__all__ = [
    "FAULT_KINDS",
    "TRIAL_CLUSTER",
    "compare_releases",
    "format_summary",
    "place_key",
    "run_trials",
    "trial_spec",
]


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
        raise ArgumentError(f"trials must be a positive integer, got {trials!r}")
    t0 = time.monotonic()
    source = pathlib.Path(spec_path)
    temporary = workdir is None
    root = pathlib.Path(tempfile.mkdtemp(prefix="dpdask-faults-") if workdir is None else workdir)
    root = root.absolute()
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    # the spec resolved once (period, estimator, input path), then rewritten per trial
    spec_file = trial_spec(source, root / "spec", reconstruct=reconstruct, period=period)
    window = timing_run(spec_file, root / "calibration")
    kinds = [FAULT_KINDS[i % len(FAULT_KINDS)] for i in range(trials)]
    rng.shuffle(kinds)
    details: list[dict[str, Any]] = []
    for trial, kind in enumerate(kinds):
        fault = draw_fault(rng, kind, window)
        try:
            record = run_trial(trial, spec_file, root / f"trial-{trial:02d}", fault, seed)
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
