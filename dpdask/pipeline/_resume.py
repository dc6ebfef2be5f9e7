"""Resuming a run: only with its own key, on the same data and the same spec."""

from __future__ import annotations

import hashlib
import json
import pathlib

from dpdask.dataflow import SourcePrint, private_dir
from dpdask.noise import KeyFile
from dpdask.pipeline.spec import ReleaseSpec
from dpdask.privacy import Run, RunStateError

__all__ = ["check_run_key", "check_same_run", "spec_print"]


def check_run_key(run: Run, work: pathlib.Path) -> None:
    """A charged run resumes only with its own key, still in its work folder."""
    key_path = work / "key"
    if not key_path.exists():
        raise RunStateError(
            f"run {run.run_id!r} of release {run.release!r} was charged but its key is gone "
            f"(no {key_path}); its noise cannot be reproduced. Abandon it (`dpdask ledger "
            "abandon`) and start a new run id, which is charged again"
        )
    if KeyFile(key_path).load().fingerprint() != run.key_fingerprint:
        raise RunStateError(
            f"the key in {key_path} is another key than the one run {run.run_id!r} is bound to; "
            "its noise can only be drawn with that key"
        )


def spec_print(spec: ReleaseSpec) -> str:
    """A hash of everything in a spec that decides what a run measures and publishes
    (release, data format and options, domain, levels, workloads, budgets, strategy,
    reconstruction); not the output, ledger or cluster."""
    fields = {
        "release": spec.release,
        "data": {"format": spec.data.format, "options": spec.data.options, "id": spec.data.id},
        "domain": spec.domain.to_dict(),
        "levels": spec.levels,
        "workload": spec.workload,
        "privacy": spec.privacy.to_dict(),
        "split": {lv: str(share) for lv, share in (spec.split or {}).items()},
        "dataset": None if spec.dataset_budget is None else spec.dataset_budget.to_dict(),
        "strategy": [spec.strategy, spec.strategy_options, spec.strategy_levels],
        "reconstruct": [spec.reconstruct, spec.integer],
    }
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def check_same_run(
    spec: ReleaseSpec, work: pathlib.Path, run_id: str, source: SourcePrint, *, record: bool
) -> None:
    """A resumed run must read the same data with the same spec it started with: its
    noise is fixed, and the same noise on changed data would reveal the change, while a
    changed workload, strategy or reconstruction would publish measurements made for one
    plan as those of another. ``record``: write what a new run starts with."""
    path = work / "source.json"
    if path.exists():
        started = json.loads(path.read_text())
        if started["content"] != source.content:
            raise RunStateError(
                f"the input changed since run {run_id!r} started; resuming would add "
                "its noise to other data. Abandon it (`dpdask ledger abandon`) and start a new "
                "run id (a new charge)"
            )
        if started.get("spec", spec_print(spec)) != spec_print(spec):
            raise RunStateError(
                f"the spec changed since run {run_id!r} started (its data options, "
                "domain, levels, workload, budget, strategy or reconstruction); resuming would "
                "publish what it measured for one plan as another's. Restore the spec, or "
                "abandon the run (`dpdask ledger abandon`) and start a new run id (a new charge)"
            )
    elif record:
        private_dir(work)
        path.write_text(json.dumps({"content": source.content, "spec": spec_print(spec)}))
