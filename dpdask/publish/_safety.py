"""Atomic publication of a directory: build it under a temporary name, rename into place.

A store is either absent or complete at its final path: whatever writes it works in
a hidden sibling directory, and only a build that finishes without error is renamed
to the final name. A failed build removes its temporary directory and leaves an
earlier store at the final path untouched.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from dpdask.errors import StoreExistsError, UnsafeOutputError

__all__ = [
    "StoreExistsError",
    "UnsafeOutputError",
    "check_output",
    "check_target",
    "move_into_place",
    "publishing",
    "release_attributes",
]

RELEASE_FORMAT = "dpdask-release"


def release_attributes(path: str | os.PathLike) -> dict | None:
    """The ``dpdask`` attributes of the release published at ``path``, or ``None`` if
    ``path`` is not a dpdask release (missing, a file, another store, unreadable)."""
    meta = pathlib.Path(path) / "zarr.json"
    try:
        attrs = json.loads(meta.read_text()).get("attributes", {}).get("dpdask")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(attrs, dict) and attrs.get("format") == RELEASE_FORMAT:
        return attrs
    return None


def _overlaps(a: pathlib.Path, b: pathlib.Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def check_output(
    path: str | os.PathLike,
    overwrite: bool = False,
    protected: Iterable[tuple[str, str | os.PathLike | None]] = (),
) -> pathlib.Path:
    """Refuse an output path that is unsafe to publish to, before anything is charged.

    Parameters
    ----------
    path : str or path-like
        Where the release will be published.
    overwrite : bool
        Whether an earlier *dpdask release* at ``path`` may be replaced (once the new
        one is complete). Anything else at ``path`` is never replaced.
    protected : iterable of (what, path)
        Paths the output must not be, contain or lie inside (the input data, the
        ledger, the work folder), each with a word for the message.

    Returns
    -------
    pathlib.Path
        The resolved output path.

    Raises
    ------
    UnsafeOutputError
        If the output overlaps a protected path, or exists and is not a dpdask release.
    StoreExistsError
        If a release exists at ``path`` and ``overwrite`` is false.
    """
    out = pathlib.Path(os.path.abspath(path)).resolve()
    for what, other in protected:
        if other is None:
            continue
        o = pathlib.Path(os.path.abspath(other)).resolve()
        if _overlaps(out, o):
            raise UnsafeOutputError(
                f"the output {out} overlaps the {what} {o}; publish somewhere else"
            )
    if out.exists() or out.is_symlink():
        if release_attributes(out) is None:
            raise UnsafeOutputError(
                f"{out} exists and is not a dpdask release; it is never replaced "
                "(choose another output path)"
            )
        if not overwrite:
            raise StoreExistsError(
                f"{out} already holds a release; it is left untouched "
                "(run with --overwrite to replace it once the new one is complete)"
            )
    return out


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
            f"{path} already exists; it is left untouched (overwrite=True, or --overwrite, "
            "replaces it)"
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
