"""One trial: the faulty run, its resumes, the checks of every promise, and the
comparison with an uninterrupted reference."""

from __future__ import annotations

import collections
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from dpdask.testing.fault_injection._files import compare_releases, place_key, trial_spec
from dpdask.testing.fault_injection._watch import RUN_TIMEOUT, KillPlan, watched_run

__all__ = ["run_trial"]


_RESUMES = 3  # resumes tried before a trial is declared stuck


# -- the checks ------------------------------------------------------------------------------
def ledger_state(path: str | os.PathLike[str], release: str, run_id: str) -> dict[str, Any]:
    """The run's state, charges and charge entries in the ledger at ``path``."""
    from dpdask.privacy import Ledger

    path = pathlib.Path(path)
    if not path.exists():
        return {"exists": False, "run": None, "charges": [], "entries": 0}
    ledger = Ledger(path)
    ledger.verify()
    run = ledger.run(release, run_id)
    charges = [c for c in ledger.charges(release) if c.run_id == run_id]
    # the folded view keeps one charge per identity; the chain shows any written twice
    entries = [
        e
        for e in ledger.entries()
        if e.kind == "charge"
        and e.body.get("release") == release
        and e.body.get("run_id") == run_id
    ]
    return {"exists": True, "run": run, "charges": charges, "entries": len(entries)}


def charges_ok(state: Mapping[str, Any], levels: Sequence[str]) -> str | None:
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


def leftovers(output: pathlib.Path) -> list[str]:
    """Hidden siblings of ``output`` (work folders, partial stores) left behind."""
    return sorted(p.name for p in output.parent.glob(f".{output.name}*"))


def last_line(log: pathlib.Path) -> str:
    """The last non-empty line of a log (the error a failed run ended with)."""
    try:
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


def _clean_up_published(
    spec_file: pathlib.Path, run_id: str, work: pathlib.Path, folder: pathlib.Path,
    record: dict[str, Any], problems: list[str],
) -> None:  # fmt: skip
    """A run stopped after the ledger recorded its publication, before it removed its work
    folder (the key already deleted): the next command on the run id, as a user would
    retry it, must remove the folder and be refused as published."""
    if (work / "key").exists():
        problems.append("the run's key is still in its work folder after publication")
    log = folder / "run-again.log"
    again = watched_run(spec_file, run_id, work, log, KillPlan())
    record["published_retry"] = {"exit": again.returncode, "work_left": work.exists()}
    said = last_line(log)
    if (
        again.returncode == 0
        or f"run {run_id!r} of release" not in said
        or "is published" not in said
    ):
        problems.append(
            f"the published run's retry exited {again.returncode}, not refused as published: {said}"
        )


# -- the trial -------------------------------------------------------------------------------
def run_trial(
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

    first = watched_run(
        spec_file, run_id, work, folder / "run-0.log",
        KillPlan(worker=fault.get("worker"), client=fault.get("client")),
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
        problems.append(f"the first run took more than {RUN_TIMEOUT} s")

    # the state the fault left: nothing charged and nothing published, or all charged
    state = ledger_state(spec.ledger, spec.release, run_id)
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
        elif (why := charges_ok(state, levels)) is not None:
            problems.append(f"after the fault, not all levels charged at once: {why}")
    if first.returncode != 0 and first.client_killed is None:
        # not a violation (the resume must still complete it), but worth knowing
        notes.append(
            f"the first run exited {first.returncode} without its client being killed "
            f"(worker killed: {first.worker_killed}): {last_line(folder / 'run-0.log')}"
        )

    # resume until published (a run killed after publishing has nothing left to do)
    resumes: list[dict[str, Any]] = []
    last = first
    while last.returncode != 0 and len(resumes) < _RESUMES:
        state = ledger_state(spec.ledger, spec.release, run_id)
        if state["run"] is not None and state["run"].state == "published":
            if work.exists():  # stopped between the ledger's record and the clean-up
                _clean_up_published(spec_file, run_id, work, folder, record, problems)
            break
        i = len(resumes) + 1
        plan = KillPlan(worker=fault.get("resume_worker") if i == 1 else None)
        last = watched_run(spec_file, run_id, work, folder / f"run-{i}.log", plan)
        if last.key is not None:
            keys.append(last.key)
        resumes.append(
            {"exit": last.returncode, "seconds": last.seconds, "worker_killed": last.worker_killed}
        )
        if last.returncode != 0:  # a problem only if no resume completes the run
            notes.append(
                f"resume {i} exited {last.returncode} (worker killed: {last.worker_killed}): "
                f"{last_line(folder / f'run-{i}.log')}"
            )
    record["resumes"] = resumes

    # the completed run
    state = ledger_state(spec.ledger, spec.release, run_id)
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
        if (why := charges_ok(state, levels)) is not None:
            problems.append(f"charges: {why}")
        else:
            record["charges_ok"] = True
        if work.exists():
            problems.append(f"the work folder is left after publication: {sorted(work.iterdir())}")
        if rest := leftovers(out):
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
            ref_run = watched_run(
                ref_spec, run_id, work_dir(ref.output, run_id), ref_log, KillPlan()
            )
            ref_state = ledger_state(ref.ledger, ref.release, run_id)
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
