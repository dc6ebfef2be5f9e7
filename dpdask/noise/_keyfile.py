"""Key files: a secret key persisted, owner-only, for resuming a release.

The master key lives in the run's private work folder until publication; then
:meth:`KeyFile.delete` overwrites and removes it (ARCHITECTURE.md, "Keys stay on
the client").
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from dpdask.errors import NoiseKeyError
from dpdask.noise._keys import KEY_BYTES, SecretKey, as_secret_key, new_key

__all__ = ["KeyFile"]


class KeyFile:
    """A secret key persisted for resuming a release, readable only by its owner.

    The file holds the 32 raw bytes, is created with mode ``0600`` (refusing to
    overwrite), and :meth:`load` refuses a file that others can read or that
    another user owns. Call :meth:`delete` when the release is published: it
    overwrites the bytes, syncs and removes the file.

    Parameters
    ----------
    path : str or Path
        Where the key lives.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> kf = KeyFile.create(d / "release.key")
    >>> oct(kf.path.stat().st_mode & 0o777)
    '0o600'
    >>> key = kf.load()
    >>> kf.delete()
    >>> kf.path.exists()
    False
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    @classmethod
    def create(cls, path: str | os.PathLike[str], key: SecretKey | None = None) -> KeyFile:
        """Write ``key`` (a new one by default) to a new owner-only file."""
        key = new_key() if key is None else as_secret_key(key)
        if key.test_only:
            raise NoiseKeyError("refusing to persist a test-only key")
        kf = cls(path)
        if kf.path.exists() or kf.path.is_symlink():
            raise FileExistsError(f"{kf.path} exists; a key file is never overwritten")
        # written whole under a temporary name, then linked into place: a crash leaves
        # either no key file or a complete one, never an empty one
        tmp = kf.path.with_name(f".{kf.path.name}.{os.getpid()}-{secrets.token_hex(4)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(tmp, flags, 0o600)
        try:
            try:
                os.fchmod(fd, 0o600)  # in case the umask was unusual
                os.write(fd, bytes(key))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(tmp, kf.path)  # fails if the key file appeared meanwhile
        finally:
            os.unlink(tmp)
        return kf

    def load(self) -> SecretKey:
        """Read the key back, refusing files that are not private to this user."""
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise PermissionError(f"{self.path} is not a regular file")
            if st.st_mode & 0o077:
                raise PermissionError(
                    f"{self.path} is readable by others (mode {oct(st.st_mode & 0o777)}); "
                    "a key file must be 0600"
                )
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                raise PermissionError(f"{self.path} is owned by another user")
            raw = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        return SecretKey(raw)

    def delete(self) -> None:
        """Overwrite, sync and remove the key file (call on publication)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            os.write(fd, b"\0" * size)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.path.unlink()

    def __repr__(self) -> str:
        return f"KeyFile({str(self.path)!r})"
