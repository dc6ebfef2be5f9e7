"""Claiming an output before anything is charged: this Python can publish, and no other
run is publishing to the same place.

A run claims its output (:func:`claim_output`) before its first ledger write and holds
the claim until it has published or failed:

* under ``python -O`` publication fails inside the array library (an upstream
  defect), after the release was charged, so such a Python is refused at the start
  (:func:`check_interpreter`);
* two runs racing for one output would both be charged and measured in full, the loser
  refused only at the final move into place; an exclusive lock on a file beside the
  output, ``.<output name>.lock`` (mode 0600, an OS lock that ends with its process),
  lets only one of them start. The lock file is removed when the claim ends; a lock
  file left by a killed process is harmless (the lock itself ended with the process).
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from dpdask.errors import InterpreterError, OutputLockedError

__all__ = ["check_interpreter", "check_unclaimed", "claim_output", "lock_path"]

_ATTEMPTS = 8  # a lock file replaced while we opened it: open it again
_PATIENCE = 6  # tries, 50 ms apart, before a held lock refuses the run


def check_interpreter() -> None:
    """Refuse a Python that cannot publish a release (``python -O``), before any charge.

    Raises
    ------
    InterpreterError
        Under ``python -O`` or ``-OO`` (``PYTHONOPTIMIZE``).
    """
    if sys.flags.optimize:
        raise InterpreterError(
            "python -O (or PYTHONOPTIMIZE) is refused: publishing a release fails under it "
            "after the budget is spent; run without -O (nothing was charged)"
        )


def lock_path(output: str | os.PathLike[str]) -> pathlib.Path:
    """The lock file of the output ``output``: ``.<name>.lock`` beside it."""
    out = pathlib.Path(os.path.abspath(output))
    return out.with_name(f".{out.name}.lock")


def _refuse(output: pathlib.Path, lock: pathlib.Path) -> OutputLockedError:
    return OutputLockedError(
        f"another run is publishing to {output} now (it holds {lock}); wait for it to end "
        "(nothing was charged)"
    )


def _make_parents(folder: pathlib.Path) -> list[pathlib.Path]:
    """Create ``folder`` and its missing parents; the ones created, deepest first."""
    made = []
    while not folder.exists():
        made.append(folder)
        folder = folder.parent
    for f in reversed(made):
        try:
            f.mkdir(mode=0o777)
        except FileExistsError:
            pass
    return made


def check_unclaimed(output: str | os.PathLike[str]) -> None:
    """Refuse, creating nothing, if a run holds the claim on ``output`` now.

    Raises
    ------
    OutputLockedError
    """
    out = pathlib.Path(os.path.abspath(output))
    lock = lock_path(out)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (or not a plain one): nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _refuse(out, lock) from None
    finally:
        os.close(fd)


def _lock_soon(fd: int) -> bool:
    """Lock ``fd`` exclusively, trying for a moment: :func:`check_unclaimed` holds a
    shared lock for an instant, which must not refuse a run."""
    for attempt in range(_PATIENCE):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if attempt + 1 < _PATIENCE:
                time.sleep(0.05)
    return False


@contextmanager
def claim_output(output: str | os.PathLike[str]) -> Iterator[pathlib.Path]:
    """Hold the exclusive claim on publishing to ``output`` (module notes).

    Checks the interpreter, then locks ``.<name>.lock`` beside ``output`` (creating the
    output's missing parent folders, removed again if they are still empty at the end).

    Yields
    ------
    pathlib.Path
        The lock file.

    Raises
    ------
    InterpreterError
        Under ``python -O``.
    OutputLockedError
        If another run holds the claim (it is refused at once, never waits).
    """
    check_interpreter()
    out = pathlib.Path(os.path.abspath(output))
    lock = lock_path(out)
    made = _make_parents(lock.parent)
    fd = -1
    try:
        for _ in range(_ATTEMPTS):
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            if not _lock_soon(fd):
                os.close(fd)
                fd = -1
                raise _refuse(out, lock)
            # the holder before us may have removed the file between our open and our
            # lock: then we hold a lock on a file nobody else can see; open it again
            try:
                same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
            fd = -1
        else:  # pragma: no cover - a lock file replaced again and again
            raise _refuse(out, lock)
        yield lock
    finally:
        if fd >= 0:
            try:
                os.unlink(lock)  # while still locked: nobody holds a lock on a removed file
            except OSError:
                pass
            os.close(fd)
        for folder in made:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty: the release (or something else) is there
                break
