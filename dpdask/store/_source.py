"""Fingerprints of confidential inputs, and the private folders their copies live in.

A release reads its input (P.L. 94-171 files, person records, a data store) once
and may convert it to a data store. Such a converted copy is as confidential as the
input, so it lives only in the run's private work folder (mode ``0700``: its files
are reachable only through it), named by a fingerprint of the source (sizes,
modification times and a content hash), rebuilt when the source changes, and
removed with the work folder when the release is published.

The content hash alone (no sizes or times) is also the default *dataset id* of a
spec that gives none: the same bytes are the same dataset, whatever their name.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SourcePrint", "fingerprint_options", "fingerprint_path", "private_dir"]

_BLOCK = 1 << 20


@dataclass(frozen=True)
class SourcePrint:
    """What identifies an input: ``content`` (a hash of its bytes and file names) and
    ``full`` (the content hash with every file's size and modification time)."""

    content: str
    full: str

    @property
    def dataset_id(self) -> str:
        """The default dataset id: ``sha256-`` and 16 hex digits of the content hash."""
        return f"sha256-{self.content[:16]}"

    @property
    def cache_name(self) -> str:
        """The name of a converted copy of this input in a work folder."""
        return f"input-{self.full[:16]}.zarr"


def _files(path: pathlib.Path) -> list[pathlib.Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"data.path: {path} does not exist")
    return sorted(p for p in path.rglob("*") if p.is_file())


def fingerprint_path(path: str | os.PathLike[str]) -> SourcePrint:
    """Hash a file, or every file below a folder (names relative to it, sorted).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    """
    root = pathlib.Path(path)
    content, full = hashlib.sha256(), hashlib.sha256()
    for f in _files(root):
        name = f.name if f == root else f.relative_to(root).as_posix()
        st = f.stat()
        content.update(name.encode() + b"\0")
        full.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        with open(f, "rb") as fh:
            while block := fh.read(_BLOCK):
                content.update(block)
    digest = content.hexdigest()
    full.update(digest.encode())
    return SourcePrint(digest, full.hexdigest())


def fingerprint_options(kind: str, options: Mapping[str, Any]) -> SourcePrint:
    """The fingerprint of generated data: its kind and options, canonically."""
    text = json.dumps({"kind": kind, **dict(options)}, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return SourcePrint(digest, digest)


def private_dir(path: str | os.PathLike[str]) -> pathlib.Path:
    """Create ``path`` (and missing parents) readable by its owner only, or check that an
    existing one is; return it.

    Raises
    ------
    PermissionError
        If an existing ``path`` is not a folder of this user's, closed to others.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        raise PermissionError(f"{path} is not a folder of this user's")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path
