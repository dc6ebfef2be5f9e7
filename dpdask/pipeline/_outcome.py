"""What a run checks before it may charge, and what it says and leaves when it fails.

``run`` and ``validate`` both refuse, before anything is charged or written, a Python
that cannot publish (``python -O``) and a dataset lifetime budget smaller than the
release's (:func:`check_before_charging`). ``run`` holds the output's claim
(:func:`claimed`) from its first check to its end; ``validate`` (:func:`validating`)
also refuses an output claimed now, and checks the cluster's transport as ``dpdask
run`` checks it before connecting (:func:`check_cluster`).

A run that fails once it has started (:func:`failure_reported`) says truthfully where
it stands, in a note on its exception (the command line prints it on the error's
line): charged (and how to resume it), or nothing charged, in which case the work
folder it created is removed again.
"""

from __future__ import annotations

import logging
import pathlib
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dpdask.errors import SpecError
from dpdask.pipeline.invariants import check_estimator
from dpdask.pipeline.spec import ReleaseSpec
from dpdask.privacy import Ledger, check_lifetime_covers, ledger_exists
from dpdask.publish import check_interpreter, check_unclaimed, claim_output, remove_work

log = logging.getLogger("dpdask")

__all__ = [
    "check_before_charging",
    "check_cluster",
    "claimed",
    "failure_reported",
    "resume_command",
    "validating",
]


def check_before_charging(spec: ReleaseSpec) -> None:
    """Refuse what no ledger can accept, before a ledger is opened or created.

    Raises
    ------
    InterpreterError
        Under ``python -O``.
    SpecError
        If ``privacy.dataset`` (the dataset's lifetime budget) is smaller than the
        release's budget, or of another kind; naming ``reconstruct`` for invariants or
        constraints its method does not honour
        (:func:`dpdask.pipeline.invariants.check_estimator`).
    """
    check_interpreter()
    check_lifetime_covers(spec.release, spec.privacy, spec.dataset_budget)
    check_estimator(spec)  # invariants only with an estimator that honours them


def check_cluster(spec: ReleaseSpec, scheduler: str | None = None) -> None:
    """Resolve the cluster as ``dpdask run`` does, without connecting, and refuse what
    it would refuse (a remote scheduler over plain TCP, TLS settings without ``tls://``).

    Raises
    ------
    SpecError
        Naming ``cluster`` (the message says where an address came from).
    """
    from dpdask.pipeline.cluster import choose_cluster

    try:
        choose_cluster(spec.cluster, scheduler=scheduler)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"cluster: {exc}") from None


def validating(spec: ReleaseSpec) -> None:
    """The checks ``run`` makes before charging that ``validate`` makes outside its
    preflight: :func:`check_before_charging`, :func:`check_cluster`, and the output
    not claimed by a run now (:func:`dpdask.publish.check_unclaimed`)."""
    check_before_charging(spec)
    check_cluster(spec)
    check_unclaimed(spec.output)


@contextmanager
def claimed(spec: ReleaseSpec) -> Iterator[pathlib.Path]:
    """Hold the claim on the spec's output (for a scheduled spec, its period's output;
    :func:`dpdask.publish.claim_output`): a racing run is refused before it charges."""
    with claim_output(spec.output) as lock:
        yield lock


def resume_command(spec: ReleaseSpec, run_id: str, *, spec_path: str | None = None) -> str:
    """The command that resumes run ``run_id`` of ``spec`` (naming the spec
    ``spec_path``, by default its file)."""
    words = ["dpdask", "run", spec_path or str(spec.source or "SPEC"), "--run-id", run_id]
    if spec.period is not None:
        words += ["--period", spec.period]
    return shlex.join(words)


@contextmanager
def failure_reported(
    spec: ReleaseSpec, run_id: str, work: pathlib.Path,
    on_failure: Callable[[BaseException, str | None], None] | None = None,
) -> Iterator[None]:  # fmt: skip
    """Note on any exception leaving the block whether run ``run_id`` was charged:
    charged and not finished, how to resume it; not charged, that nothing was, after
    removing the work folder if this block's run created it. ``on_failure(exc, state)``
    is then told too (the dashboard): the run's state in the ledger (``open`` or
    ``measuring``: resumable), None if it was not charged, ``unknown`` if unread."""
    fresh = not work.exists()
    try:
        yield
    except BaseException as exc:
        state = _note(exc, spec, run_id, work, fresh)
        if on_failure is not None:
            try:
                on_failure(exc, state)
            except Exception:  # the run's error is what is raised, never the report's
                log.warning("could not report run %s's failure", run_id, exc_info=True)
        raise


def _note(
    exc: BaseException, spec: ReleaseSpec, run_id: str, work: pathlib.Path, fresh: bool
) -> str | None:
    try:
        run = Ledger(spec.ledger).run(spec.release, run_id) if ledger_exists(spec.ledger) else None
    except Exception as again:  # the ledger cannot be read now: say so, guess nothing
        exc.add_note(
            f"whether run {run_id} was charged is unknown ({type(again).__name__}); "
            "see `dpdask ledger show`"
        )
        return "unknown"
    if run is None:
        if fresh and work.exists():
            remove_work(work)
        exc.add_note(f"run {run_id} was not charged; nothing was spent")
        return None
    if run.state in ("open", "measuring"):
        exc.add_note(
            f"run {run_id} is charged; resume it (same noise, no new charge) with "
            f"`{resume_command(spec, run_id)}`"
        )
    return run.state
