"""The ``dpdask`` command line: plan, run, validate and benchmark releases.

One module per group of verbs: :mod:`dpdask.cli._release` (``run``, ``validate``,
``plan``), :mod:`dpdask.cli._ledger` (``ledger``), :mod:`dpdask.cli._checks`
(``bench``, ``audit``, ``faults``), :mod:`dpdask.cli._export` (``export``,
``report``) and :mod:`dpdask.cli._schema` (``schema``); :func:`main` dispatches to
them. ``python -m dpdask.cli`` runs it too.

Why argparse, one parser per verb built when the verb runs (not click, not one tree of
subparsers): it is the standard library (no dependency for a tool that runs inside
scheduler and worker images), and a verb's parser is built only when that verb is used,
so ``dpdask bench NAME --help`` lists the options of the one benchmark it imports, and
``dpdask run`` imports no benchmark, no audit and no report.

Errors end the command with one line on standard error, never a traceback (``-v`` logs
a bug's), with the command that resumes a run when the run was charged; the exit status
says which kind of error it was (:mod:`dpdask.cli._exit`: 1 a failure of the system, 2
invalid input, 3 over budget, 4 already published, 5 an unsafe or locked output, 6 the
ledger refuses, 130 Ctrl-C), and with ``--json`` one object on standard output says it
too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from dpdask import __version__
from dpdask.cli._checks import cmd_audit, cmd_bench, cmd_faults
from dpdask.cli._common import QUIET, log
from dpdask.cli._exit import EXIT_CODES, epilog, exit_code, print_refusal, print_usage_refusal
from dpdask.cli._export import cmd_export, cmd_report
from dpdask.cli._ledger import cmd_ledger
from dpdask.cli._release import cmd_plan, cmd_run, cmd_validate
from dpdask.cli._schema import cmd_schema
from dpdask.errors import DPDaskError

__all__ = ["EXIT_CODES", "main"]

#: the verbs whose ``--json`` prints one object on an error too
_JSON_VERBS = frozenset({"run", "validate", "plan", "ledger", "export"})


COMMANDS = {
    "bench": (cmd_bench, "run a benchmark: dpdask bench NAME [--json] [options]"),
    "run": (cmd_run, "run a release spec: dpdask run SPEC [--run-id ID] [--json]"),
    "ledger": (
        cmd_ledger,
        "the privacy ledger: dpdask ledger init|show|verify|abandon|anchor|dataset|migrate PATH",
    ),
    "export": (
        cmd_export,
        "write a level of a release as a table: dpdask export OUT.zarr --level LEVEL "
        "--format parquet|csv [--out FILE] [--query LABEL ...] [--geography ID ...]",
    ),
    "report": (
        cmd_report,
        "write a release's HTML report: dpdask report OUT.zarr [--out FILE.html] [--truth STORE]",
    ),
    "schema": (
        cmd_schema,
        "print the JSON Schema of release specs (for editors and CI): dpdask schema",
    ),
    "validate": (cmd_validate, "check a spec and its data, spending nothing: dpdask validate SPEC"),
    "audit": (cmd_audit, "bound a release's epsilon from below: dpdask audit SPEC --trials N"),
    "faults": (
        cmd_faults,
        "kill workers and the client mid-release, then check: dpdask faults SPEC",
    ),
    "plan": (
        lambda a: cmd_plan(a),
        "plan a release before touching data: dpdask plan SPEC [--json] "
        "(or --workload NAME --epsilon E | --rho R)",
    ),
}


def _verbosity(argv: list[str]) -> tuple[list[str], int]:
    """Take ``-q/--quiet`` and ``-v/--verbose`` from anywhere in ``argv``."""
    quiet = sum(a in ("-q", "--quiet") for a in argv)
    verbose = sum(a in ("-v", "--verbose") for a in argv)
    rest = [a for a in argv if a not in ("-q", "--quiet", "-v", "--verbose")]
    level = logging.ERROR if quiet else logging.DEBUG if verbose > 1 else (
        logging.INFO if verbose else logging.WARNING
    )  # fmt: skip
    QUIET[0] = bool(quiet)
    return rest, level


def _logging(level: int) -> None:
    """Messages go to standard error through :mod:`logging` (``dpdask``'s and Dask's)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    # Dask's own warnings with -v, its chatter with -vv, its errors always
    dask_level = {logging.INFO: logging.WARNING, logging.DEBUG: logging.INFO}
    logging.getLogger("distributed").setLevel(dask_level.get(level, logging.ERROR))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpdask`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="dpdask",
        description="Differentially private release of linear counting queries on Dask.",
        epilog="\n".join(f"  {k:<10} {v[1]}" for k, v in COMMANDS.items())
        + "\n\n-q/--quiet (errors only) and -v/--verbose (more, twice for Dask's own) go "
        "anywhere on the line.\n\n" + epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpdask {__version__}")
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to do")
    if not argv or argv[0] in ("-h", "--help", "--version"):
        parser.parse_args(argv)
        return 0
    argv, level = _verbosity(argv)
    _logging(level)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        parser.parse_args([command])  # prints the error and exits 2
    as_json = command in _JSON_VERBS and "--json" in rest
    try:
        if command in ("run", "validate"):  # every model's run; before a cluster starts
            from dpdask.publish import check_interpreter

            check_interpreter()
        return COMMANDS[command][0](rest)
    except SystemExit as stop:  # argparse refused the command line (or printed --help)
        if as_json and stop.code not in (0, None):
            print_usage_refusal()
        raise
    except (KeyboardInterrupt, Exception) as exc:  # every error: one line, its own status
        if not _expected(exc):  # a bug: its traceback with -v
            log.info("dpdask %s: unexpected error", command, exc_info=exc)
        what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "error"
        line = _say(command, what, exc)
        if as_json:
            print_refusal(exc, line or what)
        return exit_code(exc)


def _expected(exc: BaseException) -> bool:
    """Whether ``exc`` is an error a command may end with (not a bug)."""
    return isinstance(exc, (DPDaskError, OSError, ValueError, TypeError, MemoryError,
                            KeyboardInterrupt))  # fmt: skip


def _say(command: str, what: str, exc: BaseException) -> str:
    """One line on standard error: the error, and the notes the run added to it (whether
    it was charged, and how to resume it); returns the message."""
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, DPDaskError):
        where = f" ({exc.filename})" if exc.filename else ""
        text = f"{exc.strerror}{where}"
    else:
        text = str(exc) if _expected(exc) else f"{type(exc).__name__}: {exc}"
    parts = [text, *getattr(exc, "__notes__", ())]
    line = "; ".join(" ".join(str(p).split()) for p in parts if str(p).strip())
    print(f"dpdask {command}: {what}" + (f": {line}" if line else ""), file=sys.stderr)
    return line
