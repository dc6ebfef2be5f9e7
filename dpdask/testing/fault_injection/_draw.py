"""The faults: when an uninterrupted run reaches each phase (calibration), and the
seeded draw of what to kill, and when, in each trial."""

from __future__ import annotations

import pathlib
import random
from collections.abc import Mapping
from typing import Any

from dpdask.testing.fault_injection._files import trial_spec
from dpdask.testing.fault_injection._watch import KillPlan, watched_run

__all__ = ["FAULT_KINDS", "draw_fault", "timing_run"]


FAULT_KINDS = ("worker", "client", "both")


def timing_run(spec_path: pathlib.Path, folder: pathlib.Path) -> dict[str, Any]:
    """One uninterrupted run, to see when workers, the key, the markers and the end come."""
    from dpdask.pipeline.spec import load_spec
    from dpdask.publish import work_dir

    spec_file = trial_spec(spec_path, folder)
    spec = load_spec(spec_file)
    seen = watched_run(
        spec_file, "calibration", work_dir(spec.output, "calibration"),
        folder / "run.log", KillPlan(),
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


def draw_fault(rng: random.Random, kind: str, window: Mapping[str, Any]) -> dict[str, Any]:
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
