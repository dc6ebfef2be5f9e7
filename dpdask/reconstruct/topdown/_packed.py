"""0/1 arrays packed a bit per entry, for what is pickled into many tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Packed", "pack_binary", "unpack"]


@dataclass(frozen=True)
class Packed:
    """A 0/1 array of ``shape`` and ``dtype``, a bit per entry."""

    shape: tuple[int, ...]
    dtype: str
    bits: np.ndarray

    def unpack(self) -> np.ndarray:
        """The array."""
        flat = np.unpackbits(self.bits, count=int(np.prod(self.shape)))
        out: np.ndarray = flat.reshape(self.shape).astype(self.dtype)
        return out


def pack_binary(a: np.ndarray) -> np.ndarray | Packed:
    """``a`` packed when every entry is 0 or 1, else ``a`` itself.

    Examples
    --------
    >>> p = pack_binary(np.eye(3))
    >>> p.bits.nbytes, unpack(p).tolist()
    (2, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    >>> pack_binary(np.array([0.5]))
    array([0.5])
    """
    if a.size and bool(np.isin(a, (0, 1)).all()):
        return Packed(a.shape, a.dtype.str, np.packbits(a.astype(bool)))
    return a


def unpack(a: Any) -> Any:
    """What :func:`pack_binary` was given."""
    return a.unpack() if isinstance(a, Packed) else a
