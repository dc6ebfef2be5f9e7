"""How a ``dpdask`` command ends: its exit status, and the one object ``--json`` prints.

The one table of exit statuses (:data:`EXIT_CODES`) and the one map from an error to
its kind (:func:`kind_of`), so that a scheduler can tell the outcomes apart without
reading the message:

====  ===========  =====================================================================
code  kind         when
====  ===========  =====================================================================
0     ok           published (``run``), valid (``validate``), planned (``plan``), done
1     failure      the system failed: a full disk, the ledger's storage or server, an
                   unreachable scheduler, an unexpected error; retrying may succeed
2     invalid      the spec, the data, an option or a file named is invalid or missing
3     budget       refused: the charge would exceed the release's or dataset's budget
4     published    refused: already published (the output holds a release, or the run id
                   is published or abandoned) or the run's state forbids it
5     output       refused: the output is unsafe to write, or locked by another run
6     ledger       refused: the ledger is missing, tampered with, or denies this role
130   interrupted  Ctrl-C (as shells report SIGINT)
====  ===========  =====================================================================
"""

from __future__ import annotations

import json
import sys
from typing import Any

from dpdask.errors import (
    BudgetExceededError,
    ClusterUnreachableError,
    ConvergenceError,
    DPDaskError,
    LedgerConflictError,
    LedgerMissingError,
    LedgerPermissionError,
    LedgerServerError,
    LedgerStorageError,
    LedgerTamperedError,
    OutputError,
    StoreExistsError,
)

__all__ = [
    "EXIT_CODES",
    "epilog",
    "exit_code",
    "kind_of",
    "print_refusal",
    "print_usage_refusal",
    "refusal",
]

#: kind -> (exit status, what it means); the README's table says the same
EXIT_CODES: dict[str, tuple[int, str]] = {
    "ok": (0, "published, valid, planned or done"),
    "failure": (1, "the system failed (disk, ledger storage or server, scheduler, a bug)"),
    "invalid": (2, "invalid or missing spec, data, option or file"),
    "budget": (3, "refused: over the release's or the dataset's budget"),
    "published": (4, "refused: already published, or the run id's state forbids it"),
    "output": (5, "refused: the output is unsafe to write, or locked by another run"),
    "ledger": (6, "refused: the ledger is missing, tampered with, or denies this role"),
    "interrupted": (130, "interrupted (Ctrl-C)"),
}

#: the most specific class first: the first match names the kind
_KINDS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (KeyboardInterrupt, "interrupted"),
    (
        (
            LedgerStorageError,
            LedgerServerError,
            ClusterUnreachableError,
            ConvergenceError,
            MemoryError,
        ),
        "failure",
    ),
    (BudgetExceededError, "budget"),
    ((StoreExistsError, LedgerConflictError), "published"),
    (OutputError, "output"),
    ((LedgerMissingError, LedgerTamperedError, LedgerPermissionError), "ledger"),
    ((DPDaskError, ValueError, TypeError, FileNotFoundError, PermissionError), "invalid"),
)


def kind_of(exc: BaseException) -> str:
    """The kind of outcome ``exc`` ends a command with (a key of :data:`EXIT_CODES`)."""
    for classes, kind in _KINDS:
        if isinstance(exc, classes):
            return kind
    return "failure"  # OSError (a full disk, a read-only file system) and the unexpected


def exit_code(exc: BaseException) -> int:
    """The exit status of a command that ended with ``exc``."""
    return EXIT_CODES[kind_of(exc)][0]


def refusal(exc: BaseException, message: str) -> dict[str, Any]:
    """The object ``--json`` prints when a command ends with ``exc``."""
    kind = kind_of(exc)
    return {
        "ok": False,
        "error": type(exc).__name__,
        "kind": kind,
        "message": message,
        "exit_code": EXIT_CODES[kind][0],
    }


def print_refusal(exc: BaseException, message: str) -> None:
    """Print :func:`refusal` as one line of JSON on standard output."""
    print(json.dumps(refusal(exc, message)), file=sys.stdout, flush=True)


def print_usage_refusal() -> None:
    """Print the object of a command line argparse refused (it said why on standard
    error, and exits 2: invalid)."""
    obj = {
        "ok": False,
        "error": "UsageError",
        "kind": "invalid",
        "message": "the command line is invalid (standard error says why)",
        "exit_code": EXIT_CODES["invalid"][0],
    }
    print(json.dumps(obj), file=sys.stdout, flush=True)


def epilog() -> str:
    """The exit statuses, for ``dpdask --help``."""
    rows = [f"  {code:>3}  {kind:<12} {what}" for kind, (code, what) in EXIT_CODES.items()]
    return 'exit status (and --json\'s "kind" on an error):\n' + "\n".join(rows)
