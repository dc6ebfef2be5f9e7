"""Domains of the data vector and the geography hierarchy along its leading axis.

A :class:`Domain` names the attributes of a histogram and their sizes, in a fixed
order; the data vector of one geography is the histogram flattened in C order
(the last attribute varies fastest). A :class:`Geography` describes the leading
axis of a release's data: the geography units at the finest level and, for every
coarser level, the parent of each unit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Domain", "Geography"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Domain(Mapping[str, int]):
    """Named attributes with sizes, in a fixed order.

    Parameters
    ----------
    attrs : mapping of str to int, optional
        Attribute names and sizes, in order.
    **sizes : int
        Attribute sizes given as keyword arguments (appended after ``attrs``).

    Raises
    ------
    ValueError
        If a name is not an identifier, is repeated, or a size is not a positive
        integer. The message names the attribute.

    Examples
    --------
    >>> d = Domain(sex=2, hisp=2, race=63, relation=17, age=115)
    >>> d.shape
    (2, 2, 63, 17, 115)
    >>> d.size
    492660
    >>> d.project(["sex", "age"])
    Domain(sex=2, age=115)
    """

    __slots__ = ("_attrs",)

    def __init__(self, attrs: Mapping[str, int] | Iterable[tuple[str, int]] = (), **sizes: int):
        items = list(attrs.items() if isinstance(attrs, Mapping) else attrs) + list(sizes.items())
        checked: dict[str, int] = {}
        for name, size in items:
            if not isinstance(name, str) or not _NAME.match(name):
                raise ValueError(f"attribute name {name!r} is not a valid identifier")
            if name in checked:
                raise ValueError(f"attribute {name!r} is given twice")
            if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
                raise ValueError(f"attribute {name!r} has size {size!r}; sizes are integers >= 1")
            checked[name] = int(size)
        self._attrs = checked

    # Mapping interface -------------------------------------------------
    def __getitem__(self, name: str) -> int:
        try:
            return self._attrs[name]
        except KeyError:
            raise ValueError(
                f"unknown attribute {name!r}; the domain has {list(self._attrs)}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._attrs)

    def __len__(self) -> int:
        return len(self._attrs)

    def __contains__(self, name: object) -> bool:
        return name in self._attrs

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Domain):
            return NotImplemented
        return list(self._attrs.items()) == list(other._attrs.items())

    def __hash__(self) -> int:
        return hash(tuple(self._attrs.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self._attrs.items())
        return f"Domain({inner})"

    def __dask_tokenize__(self) -> tuple:
        return ("dpdask.Domain", tuple(self._attrs.items()))

    # Properties --------------------------------------------------------
    @property
    def attrs(self) -> tuple[str, ...]:
        """Attribute names, in order."""
        return tuple(self._attrs)

    @property
    def shape(self) -> tuple[int, ...]:
        """Attribute sizes, in order."""
        return tuple(self._attrs.values())

    @property
    def size(self) -> int:
        """Number of cells: the product of the sizes."""
        return math.prod(self._attrs.values())

    def axis(self, name: str) -> int:
        """Position of attribute ``name``."""
        self[name]
        return self.attrs.index(name)

    def project(self, names: Sequence[str] | str) -> Domain:
        """The sub-domain of ``names``, kept in this domain's order."""
        names = [names] if isinstance(names, str) else list(names)
        for n in names:
            self[n]
        return Domain([(k, v) for k, v in self._attrs.items() if k in names])

    def marginalize(self, names: Sequence[str] | str) -> Domain:
        """The sub-domain without ``names``."""
        names = [names] if isinstance(names, str) else list(names)
        for n in names:
            self[n]
        return Domain([(k, v) for k, v in self._attrs.items() if k not in names])

    def to_dict(self) -> dict[str, int]:
        """Plain ``{name: size}`` dictionary, in order (JSON-safe)."""
        return dict(self._attrs)


@dataclass(frozen=True)
class Geography:
    """A geography hierarchy: units at the finest level and their ancestors.

    Parameters
    ----------
    levels : sequence of str
        Level names from coarsest to finest, e.g. ``("state", "county", "tract")``.
    ids : sequence of sequence of str
        For each level, the unit identifiers at that level.
    parents : sequence of ndarray
        For each level but the coarsest, an integer array mapping each unit of
        that level to the index of its parent in the level above.

    Raises
    ------
    ValueError
        If the arrays do not describe a tree (wrong lengths, parent out of range,
        a parent with no child).
    """

    levels: tuple[str, ...]
    ids: tuple[tuple[str, ...], ...]
    parents: tuple[np.ndarray, ...] = field(default=())

    def __post_init__(self) -> None:
        levels = tuple(self.levels)
        ids = tuple(tuple(str(u) for u in lv) for lv in self.ids)
        parents = tuple(np.asarray(p, dtype=np.int64) for p in self.parents)
        if len(ids) != len(levels):
            raise ValueError(f"{len(levels)} levels but ids for {len(ids)}")
        if len(parents) != max(len(levels) - 1, 0):
            raise ValueError(f"{len(levels)} levels need {len(levels) - 1} parent arrays")
        for i, p in enumerate(parents, start=1):
            name = levels[i]
            if p.shape != (len(ids[i]),):
                raise ValueError(f"level {name!r}: {len(ids[i])} units but {p.size} parents")
            if p.size and (p.min() < 0 or p.max() >= len(ids[i - 1])):
                raise ValueError(f"level {name!r}: a parent index is out of range")
            if np.unique(p).size != len(ids[i - 1]):
                raise ValueError(f"level {levels[i - 1]!r}: some unit has no child")
        for name, lv in zip(levels, ids, strict=True):
            if len(set(lv)) != len(lv):
                raise ValueError(f"level {name!r}: unit ids are not unique")
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "parents", parents)

    @classmethod
    def flat(cls, ids: Sequence[str], level: str = "geography") -> Geography:
        """A single-level geography."""
        return cls(levels=(level,), ids=(tuple(ids),), parents=())

    def n_units(self, level: str | None = None) -> int:
        """Number of units at ``level`` (the finest level by default)."""
        return len(self.ids[self.level_index(level)])

    def level_index(self, level: str | None) -> int:
        """Position of ``level`` (``None`` means the finest)."""
        if level is None:
            return len(self.levels) - 1
        if level not in self.levels:
            raise ValueError(f"unknown geography level {level!r}; levels are {self.levels}")
        return self.levels.index(level)

    def ancestor_index(self, level: str) -> np.ndarray:
        """For each finest-level unit, the index of its ancestor at ``level``."""
        target = self.level_index(level)
        idx = np.arange(self.n_units(), dtype=np.int64)
        for i in range(len(self.levels) - 1, target, -1):
            idx = self.parents[i - 1][idx]
        return idx
