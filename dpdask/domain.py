"""Domains of the data vector and the geography hierarchy along its leading axis.

A :class:`Domain` names the attributes of a histogram and their sizes, in a fixed
order; the data vector of one geography is the histogram flattened in C order
(the last attribute varies fastest). A :class:`Geography` describes the leading
axis of a release's data: the geography units at the finest level and, for every
coarser level, the parent of each unit.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, DomainError, ShapeError

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
    ArgumentError
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
                raise ArgumentError(f"attribute name {name!r} is not a valid identifier")
            if name in checked:
                raise ArgumentError(f"attribute {name!r} is given twice")
            if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
                raise ArgumentError(
                    f"attribute {name!r} has size {size!r}; sizes are integers >= 1"
                )
            checked[name] = int(size)
        self._attrs = checked

    # Mapping interface -------------------------------------------------
    def __getitem__(self, name: str) -> int:
        try:
            return self._attrs[name]
        except KeyError:
            raise DomainError(
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

    def __dask_tokenize__(self) -> tuple[Any, ...]:
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


@dataclass(frozen=True, eq=False)
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
    ArgumentError
        If the arrays do not describe a tree (wrong lengths: ``ShapeError``, parent out of range,
        a parent with no child).

    Examples
    --------
    >>> g = Geography.from_geoids(["44007000101", "44007000102", "44009000100"],
    ...                           {"state": 2, "county": 5, "tract": 11})
    >>> g.ids[1]
    ('44007', '44009')
    >>> g.ancestor_index("county").tolist()
    [0, 0, 1]
    """

    levels: tuple[str, ...]
    ids: tuple[tuple[str, ...], ...]
    parents: tuple[np.ndarray, ...] = field(default=())

    def __post_init__(self) -> None:
        levels = tuple(self.levels)
        ids = tuple(tuple(str(u) for u in lv) for lv in self.ids)
        parents = tuple(np.asarray(p, dtype=np.int64) for p in self.parents)
        if not levels:
            raise ArgumentError("a geography needs at least one level")
        for name in levels:
            if not isinstance(name, str) or not _NAME.match(name):
                raise ArgumentError(f"geography level name {name!r} is not a valid identifier")
        if len(set(levels)) != len(levels):
            raise ArgumentError(f"geography level names are repeated: {levels}")
        if len(ids) != len(levels):
            raise ShapeError(f"{len(levels)} levels but ids for {len(ids)}")
        if len(parents) != max(len(levels) - 1, 0):
            raise ShapeError(f"{len(levels)} levels need {len(levels) - 1} parent arrays")
        for i, p in enumerate(parents, start=1):
            name = levels[i]
            if p.shape != (len(ids[i]),):
                raise ShapeError(f"level {name!r}: {len(ids[i])} units but {p.size} parents")
            if p.size and (p.min() < 0 or p.max() >= len(ids[i - 1])):
                raise ArgumentError(f"level {name!r}: a parent index is out of range")
            if np.unique(p).size != len(ids[i - 1]):
                raise ArgumentError(f"level {levels[i - 1]!r}: some unit has no child")
        for name, lv in zip(levels, ids, strict=True):
            if len(set(lv)) != len(lv):
                raise ArgumentError(f"level {name!r}: unit ids are not unique")
        for p in parents:
            p.setflags(write=False)
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "parents", parents)

    # Constructors ------------------------------------------------------
    @classmethod
    def flat(cls, ids: Sequence[str], level: str = "geography") -> Geography:
        """A single-level geography."""
        return cls(levels=(level,), ids=(tuple(ids),), parents=())

    @classmethod
    def from_geoids(cls, geoids: Iterable[str], levels: Mapping[str, int]) -> Geography:
        """The hierarchy implied by fixed-width GEOID prefixes.

        Parameters
        ----------
        geoids : iterable of str
            Identifiers of the finest units (repeats are allowed and collapsed).
            Every one must have the length of the finest level.
        levels : mapping of str to int
            Level names, coarsest first, each with the length of its GEOID prefix,
            e.g. ``{"state": 2, "county": 5, "tract": 11, "block": 15}``.

        Returns
        -------
        Geography
            Units of every level sorted by GEOID, so that the children of a unit
            are contiguous at every level.

        Raises
        ------
        ArgumentError
            If the prefix lengths do not increase strictly or a GEOID has the
            wrong length (the message names the GEOID).
        """
        names = list(levels)
        widths = [levels[n] for n in names]
        if not names:
            raise ArgumentError("levels is empty; give at least one {level: prefix length}")
        for n, w in zip(names, widths, strict=True):
            if isinstance(w, bool) or not isinstance(w, int | np.integer) or w < 1:
                raise ArgumentError(f"level {n!r}: prefix length {w!r} is not a positive integer")
        if any(b <= a for a, b in itertools.pairwise(widths)):
            raise ArgumentError(f"prefix lengths must increase from coarse to fine, got {levels}")
        finest = np.unique(np.asarray([str(g) for g in geoids], dtype=str))
        if finest.size == 0:
            raise ArgumentError("no geography ids given")
        lengths = np.char.str_len(finest)
        bad = np.flatnonzero(lengths != widths[-1])
        if bad.size:
            g = str(finest[bad[0]])
            raise ArgumentError(
                f"geography id {g!r} has {len(g)} characters; level {names[-1]!r} "
                f"needs {widths[-1]}"
            )
        return cls._from_columns(names, [finest.astype(f"<U{w}") for w in widths])

    @classmethod
    def from_table(
        cls, table: Mapping[str, Sequence[str]], levels: Sequence[str] | None = None
    ) -> Geography:
        """The hierarchy given by an explicit parent table.

        Parameters
        ----------
        table : mapping of str to sequence of str (a ``pandas.DataFrame`` works)
            One column per level; each row is one finest unit with the id of its
            ancestor at every coarser level.
        levels : sequence of str, optional
            The level columns, coarsest first (default: all columns in order).

        Raises
        ------
        ArgumentError
            If a finest unit appears twice or a unit has two different parents
            (the message names them).
        """
        names = list(table.keys()) if levels is None else list(levels)
        if not names:
            raise ArgumentError("the parent table has no level columns")
        for n in names:
            if n not in table:
                raise DomainError(f"the parent table has no column {n!r}")
        cols = [np.asarray([str(v) for v in table[n]], dtype=str) for n in names]
        finest = cols[-1]
        uniq, counts = np.unique(finest, return_counts=True)
        if (counts > 1).any():
            raise ArgumentError(
                f"level {names[-1]!r}: unit {str(uniq[np.argmax(counts > 1)])!r} "
                "appears in more than one row of the parent table"
            )
        return cls._from_columns(names, cols)

    @classmethod
    def _from_columns(cls, names: list[str], cols: list[np.ndarray]) -> Geography:
        """Build from per-finest-unit ancestor ids, one array per level (coarsest first)."""
        order = np.lexsort(cols[::-1])
        cols = [c[order] for c in cols]
        ids, parents, prev_inv = [], [], None
        for i, (name, col) in enumerate(zip(names, cols, strict=True)):
            uniq, first, inv = np.unique(col, return_index=True, return_inverse=True)
            ids.append(tuple(uniq.tolist()))
            if prev_inv is not None:
                parent = prev_inv[first]
                clash = np.flatnonzero(parent[inv] != prev_inv)
                if clash.size:
                    j = clash[0]
                    raise ArgumentError(
                        f"level {name!r}: unit {str(col[j])!r} has two parents at level "
                        f"{names[i - 1]!r}: {str(cols[i - 1][first[inv[j]]])!r} and "
                        f"{str(cols[i - 1][j])!r}"
                    )
                parents.append(parent)
            prev_inv = inv
        return cls(levels=tuple(names), ids=tuple(ids), parents=tuple(parents))

    # Comparison --------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Geography):
            return NotImplemented
        return (
            self.levels == other.levels
            and self.ids == other.ids
            and all(np.array_equal(a, b) for a, b in zip(self.parents, other.parents, strict=True))
        )

    def __hash__(self) -> int:
        return hash((self.levels, tuple(len(lv) for lv in self.ids), self.ids[-1][:8]))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={len(lv)}" for n, lv in zip(self.levels, self.ids, strict=True))
        return f"Geography({inner})"

    def __dask_tokenize__(self) -> tuple[Any, ...]:
        return ("dpdask.Geography", self.levels, self.ids, tuple(p.tobytes() for p in self.parents))

    # Queries -----------------------------------------------------------
    def n_units(self, level: str | None = None) -> int:
        """Number of units at ``level`` (the finest level by default)."""
        return len(self.ids[self.level_index(level)])

    def level_index(self, level: str | None) -> int:
        """Position of ``level`` (``None`` means the finest)."""
        if level is None:
            return len(self.levels) - 1
        if level not in self.levels:
            raise DomainError(f"unknown geography level {level!r}; levels are {self.levels}")
        return self.levels.index(level)

    def ancestor_index(self, level: str, of: str | None = None) -> np.ndarray:
        """For each unit of level ``of`` (the finest by default), its ancestor at ``level``.

        Raises
        ------
        ArgumentError
            If ``level`` is finer than ``of``.
        """
        target, source = self.level_index(level), self.level_index(of)
        if target > source:
            raise ArgumentError(
                f"level {level!r} is finer than {self.levels[source]!r}; it has no ancestor there"
            )
        idx = np.arange(len(self.ids[source]), dtype=np.int64)
        for i in range(source, target, -1):
            idx = self.parents[i - 1][idx]
        return idx

    def truncate(self, level: str) -> Geography:
        """The hierarchy down to ``level`` only (its units become the finest)."""
        k = self.level_index(level) + 1
        return Geography(self.levels[:k], self.ids[:k], self.parents[: k - 1])
