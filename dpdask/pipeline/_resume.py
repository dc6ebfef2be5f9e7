"""Resuming a run: only with its own key, on the same data, with the same spec and to the
same output, as the ledger records them."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from dpdask.noise import KeyFile
from dpdask.pipeline._spec_plan import passes_statement
from dpdask.pipeline.spec import ReleaseSpec
from dpdask.privacy import Run, RunBinding, RunStateError, check_binding
from dpdask.privacy.neighbours import ADD_REMOVE
from dpdask.store import SourcePrint, fingerprint_path

__all__ = ["check_run_key", "check_same_run", "run_binding", "spec_print"]


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
    (release, data format and options with the content of a geography universe file,
    domain, levels, workloads, budgets, strategy, reconstruction); not the output, ledger
    or cluster."""
    options = dict(spec.data.options)
    if isinstance(options.get("geographies"), str):  # a universe file: what it says counts
        options["geographies"] = fingerprint_path(options["geographies"]).content
    fields = {
        "release": spec.release,
        "data": {"format": spec.data.format, "options": options, "id": spec.data.id},
        "domain": spec.domain.to_dict(),
        "levels": spec.levels,
        "workload": spec.workload,
        "privacy": spec.privacy.to_dict(),
        "split": {lv: str(share) for lv, share in (spec.split or {}).items()},
        "dataset": None if spec.dataset_budget is None else spec.dataset_budget.to_dict(),
        "strategy": [spec.strategy, spec.strategy_options, spec.strategy_levels],
        "reconstruct": [spec.reconstruct, spec.integer],
    }
    if spec.neighbours != ADD_REMOVE:  # absent otherwise: earlier runs keep their hash
        fields["neighbours"] = spec.neighbours.name
    if spec.spine:  # likewise (a spine level's budget moves: other charges)
        fields["spine"] = "on"
    if spec.invariants:  # likewise: a spec without them hashes as before
        fields["invariants"] = spec.invariants.statement()
    if spec.passes is not None:  # likewise
        fields["passes"] = passes_statement(spec)
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def run_binding(spec: ReleaseSpec, output: pathlib.Path, source: SourcePrint) -> RunBinding:
    """What the ledger binds a run of ``spec`` to: the content hash of its input, the
    spec's hash (:func:`spec_print`), its resolved output path, the relation its budget
    is stated in, the invariants and constraints and the passes it states."""
    return RunBinding(
        source.content, spec_print(spec), os.path.realpath(output), spec.neighbours.name,
        spec.invariants.statement(), passes_statement(spec),
    )  # fmt: skip


def check_same_run(run: Run, binding: RunBinding) -> None:
    """A resumed run must read the same data with the same spec it started with, and
    publish where it was going to: its noise is fixed, and the same noise on changed
    data would reveal the change, while a changed workload, strategy or reconstruction
    would publish measurements made for one plan as those of another. The ledger's
    record decides; the work folder (untrusted storage for the key and checkpoints)
    has no say."""
    check_binding(run, binding)
