"""Output safety and atomic publication, for every kind of release.

:func:`check_output` is the one check of an output path, made before anything is
charged: never an input, the ledger or its head file, a work folder or the spec (any
overlap), never a symbolic link, and never anything but an earlier *dpdask artefact*,
replaced only with ``overwrite``. An artefact is recognised by what dpdask wrote:

* a release directory (zarr) by the ``dpdask`` attributes of its ``zarr.json``
  (:func:`release_attributes`);
* a file (a local model's estimates, CSV or Parquet) by its sidecar
  ``<name>.dpdask.json``, written by :func:`publish_file` and holding the SHA-256 of
  the file's bytes: a sidecar vouches only for the exact file dpdask wrote, so an input,
  a ledger or an edited output is never taken for an artefact
  (:func:`artefact_attributes`);
* a file of another dpdask format (a local strategy) by the recogniser its writer
  passes (``artefact=``).

A directory or file is either absent or complete at its final path: whatever writes
it works under a hidden sibling name, and only a build that finishes without error is
renamed to the final name (:func:`move_into_place`, :func:`publish_file`). A failed
build removes its temporary copy and leaves an earlier artefact at the final path
untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from dpdask.errors import StoreExistsError, UnsafeOutputError

__all__ = [
    "StoreExistsError",
    "UnsafeOutputError",
    "artefact_attributes",
    "check_output",
    "check_target",
    "move_into_place",
    "publish_file",
    "publishing",
    "release_attributes",
    "sidecar",
]

RELEASE_FORMAT = "dpdask-release"
#: ``format`` of the sidecar that vouches for a file dpdask published
ARTEFACT_FORMAT = "dpdask-artefact"
# a run's work folder (publish._workdir.work_dir): ``.<output name>.run-<run id>``
_WORK_FOLDER = re.compile(r"\A\..+\.run-[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def release_attributes(path: str | os.PathLike[str]) -> dict[str, Any] | None:
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


def sidecar(path: str | os.PathLike[str]) -> pathlib.Path:
    """The sidecar of a published file: ``<name>.dpdask.json`` beside it."""
    p = pathlib.Path(path)
    return p.with_name(p.name + ".dpdask.json")


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def artefact_attributes(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sidecar record of the file dpdask published at ``path``, or ``None`` if there
    is no such file, no sidecar (or a link), or the file's bytes are not those the
    sidecar vouches for."""
    p, side = pathlib.Path(path), sidecar(path)
    if p.is_symlink() or side.is_symlink() or not p.is_file():
        return None
    try:
        record = json.loads(side.read_text())
        if not isinstance(record, dict) or record.get("format") != ARTEFACT_FORMAT:
            return None
        return record if record.get("sha256") == _sha256(p) else None
    except (OSError, ValueError):
        return None


def _is_artefact(path: pathlib.Path) -> bool:
    return release_attributes(path) is not None or artefact_attributes(path) is not None


def _overlaps(a: pathlib.Path, b: pathlib.Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def check_output(
    path: str | os.PathLike[str],
    overwrite: bool = False,
    protected: Iterable[tuple[str, str | os.PathLike[str] | None]] = (),
    *,
    artefact: Callable[[pathlib.Path], bool] | None = None,
) -> pathlib.Path:
    """Refuse an output path that is unsafe to publish to, before anything is charged.

    Parameters
    ----------
    path : str or path-like
        Where the release will be published.
    overwrite : bool
        Whether an earlier *dpdask artefact* at ``path`` may be replaced (once the new
        one is complete). Anything else at ``path`` is never replaced.
    protected : iterable of (what, path)
        Paths the output must not be, contain or lie inside (the input data, the
        ledger and its head file, the work folder, the spec), each with a word for the
        message. No output lies in any run's work folder either.
    artefact : callable, optional
        Whether an existing file at ``path`` is an earlier dpdask artefact of the kind
        written there (module notes); by default a release directory or a file whose
        sidecar vouches for it.

    Returns
    -------
    pathlib.Path
        The resolved output path.

    Raises
    ------
    UnsafeOutputError
        If the output (or its sidecar) is a symbolic link, overlaps a protected path or
        a work folder, or exists and is not a dpdask artefact.
    StoreExistsError
        If an artefact exists at ``path`` and ``overwrite`` is false.
    """
    given = pathlib.Path(os.path.abspath(path))
    for link in (given, sidecar(given)):
        if link.is_symlink():
            raise UnsafeOutputError(
                f"{link} is a symbolic link; dpdask never publishes through a link "
                "(name the real path)"
            )
    out = given.resolve()
    if any(_WORK_FOLDER.match(part) for part in out.parts):
        raise UnsafeOutputError(f"the output {out} lies in a run's work folder; publish elsewhere")
    for what, other in protected:
        if other is None:
            continue
        o = pathlib.Path(os.path.abspath(other)).resolve()
        for mine in (out, sidecar(out)):
            if _overlaps(mine, o):
                raise UnsafeOutputError(
                    f"the output {mine} overlaps the {what} {o}; publish somewhere else"
                )
    if out.exists():
        if not (artefact or _is_artefact)(out):
            raise UnsafeOutputError(
                f"{out} exists and is not a dpdask release (nor a file dpdask published); "
                "it is never replaced (choose another output path)"
            )
        if not overwrite:
            raise StoreExistsError(
                f"{out} already holds a release (or file) dpdask published; it is left untouched "
                "(run with --overwrite to replace it once the new one is complete)"
            )
    return out


def check_target(path: str | os.PathLike[str], overwrite: bool = False) -> pathlib.Path:
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


def publish_file(
    path: pathlib.Path,
    write: Callable[[pathlib.Path], Any],
    overwrite: bool = False,
    record: dict[str, Any] | None = None,
    *,
    protected: Iterable[tuple[str, str | os.PathLike[str] | None]] = (),
    artefact: Callable[[pathlib.Path], bool] | None = None,
) -> pathlib.Path:
    """Publish one file atomically: ``write(tmp)`` builds it under a hidden sibling name,
    then it is checked again (:func:`check_output`) and renamed into place.

    Parameters
    ----------
    path : pathlib.Path
        The checked output path (:func:`check_output`'s return value).
    write : callable
        Writes the complete file at the path it is given.
    overwrite : bool
        Replace an earlier artefact at ``path``.
    record : dict, optional
        What the sidecar records (release, kind, ...); with it a sidecar holding the
        file's SHA-256 is published beside the file (:func:`artefact_attributes`).
        Without it (a format that names itself, passed as ``artefact``) none is.
    protected, artefact
        As :func:`check_output`, checked again just before the rename.

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    protected = list(protected)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, "partial")
    side_tmp = _sibling(sidecar(path), "partial")
    try:
        write(tmp)
        if record is not None:
            doc = {**record, "format": ARTEFACT_FORMAT, "file": path.name, "sha256": _sha256(tmp)}
            side_tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        check_output(path, overwrite, protected, artefact=artefact)  # nothing appeared since
        os.replace(tmp, path)
        if record is not None:
            os.replace(side_tmp, sidecar(path))
    finally:
        for t in (tmp, side_tmp):
            if t.exists():
                t.unlink()
    return path


@contextmanager
def publishing(path: str | os.PathLike[str], overwrite: bool = False) -> Iterator[pathlib.Path]:
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
