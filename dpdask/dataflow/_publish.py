"""Atomic publication of a directory: build it under a temporary name, rename into place.

A store is either absent or complete at its final path: whatever writes it works in
a hidden sibling directory, and only a build that finishes without error is renamed
to the final name. A failed build removes its temporary directory and leaves an
earlier store at the final path untouched.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["StoreExistsError", "check_target", "move_into_place", "publishing"]


class StoreExistsError(FileExistsError, ValueError):
    """The output path exists and replacing it was not asked for."""


def check_target(path: str | os.PathLike, overwrite: bool = False) -> pathlib.Path:
    """Refuse early if ``path`` exists (unless ``overwrite``); return it as a Path.

    Raises
    ------
    StoreExistsError
        If ``path`` exists and ``overwrite`` is false.
    """
    path = pathlib.Path(path)
    if path.exists() and not overwrite:
        raise StoreExistsError(
            f"{path} already exists; it is left untouched (pass overwrite=True to replace it)"
        )
    return path


def _sibling(path: pathlib.Path, tag: str) -> pathlib.Path:
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}-{time.time_ns()}")


def move_into_place(tmp: pathlib.Path, path: pathlib.Path, overwrite: bool = False) -> None:
    """Rename the complete directory ``tmp`` to ``path``; an earlier ``path`` (replaced
    only with ``overwrite``) is moved aside first and removed after.

    Raises
    ------
    StoreExistsError
        If ``path`` exists and ``overwrite`` is false.
    """
    check_target(path, overwrite)
    if path.exists():
        old = _sibling(path, "replaced")
        os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)


@contextmanager
def publishing(path: str | os.PathLike, overwrite: bool = False) -> Iterator[pathlib.Path]:
    """Yield a temporary directory that becomes ``path`` when the block ends without error.

    Parameters
    ----------
    path : str or path-like
        Final location (a local directory).
    overwrite : bool
        Replace an existing ``path``; the old one is removed only after the new
        one has been renamed into place.

    Raises
    ------
    StoreExistsError
        If ``path`` exists and ``overwrite`` is false (checked before and after
        the build).
    """
    path = check_target(path, overwrite).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, "partial")
    try:
        yield tmp
        move_into_place(tmp, path, overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
