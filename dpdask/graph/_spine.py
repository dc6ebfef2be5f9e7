"""The spine option of a top-down release: a parent's only child reuses its estimate.

A unit whose parent (in the released level above) has exactly one child holds the same
records as its parent, so its estimate is its parent's, exactly: the top-down fit forces
a single child to equal its parent anyway, and the child's measurement buys nothing
(issue 33). With ``spine=True`` (``reconstruct: {method: topdown, spine: true}``):

* **a spine level** (every unit its parent's only child: a one-county state, a level
  identical to the one above) is not measured and not charged: no noise is drawn for it,
  its tasks (``measure-reconstruct-<level>``) copy the parent rows
  (:func:`spine_block`), and its budget moves to the nearest measured level above,
  whose plan is calibrated once for the sum (:func:`~dpdask.graph._plans.level_plans`
  ``moves``, :meth:`dpdask.strategy.Plan.at`): that level's charge in the ledger is the
  larger one, and the total charged is the spec's. A spine level's plan is its
  receiver's (its published variances are that level's; it publishes no unbiased
  answers, its attribute ``unbiased`` says they are the receiver's);
* **a partial level** keeps its budget and is measured; the measurements of its spine
  units are discarded inside the task that draws them, right after the draw and before
  any use (:func:`discarded`: the rows become NaN), and their estimate is their parent's
  (:func:`~dpdask.graph._topdown_blocks.family_block`). Their ``<level>/unbiased``
  answers are therefore NaN: the group's attribute ``spine`` says so, and that their
  unbiased answer is the parent's (a level publishes one variance per query, and the
  parent's differs).

A multi-pass release (``passes`` / ``constraints``, :mod:`~dpdask.graph._multipass`)
does the same: a spine unit's family of one is not fitted but copied from its parent,
whose constraints include its only child's (checked in the task, naming the unit); its
sweep of the levels' totals (:mod:`~dpdask.graph._subtree`) measures through
:func:`spine_measure`, so a spine level's noise is never drawn there either, and a spine
unit's own total counts as unknown (its subtree below still counts).

The plan (``dpdask plan``), the summary and the release's attributes state per level how
many units reuse their parent's estimate, whether the level is measured and where a
moved budget went (:meth:`Spine.summary`). The geography is public: nothing here reads
data. Per-level plans whose budget would move are refused before anything is charged.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import sparse

from dpdask.domain import Geography
from dpdask.errors import ArgumentError
from dpdask.graph._blocks import measure_block
from dpdask.graph._chunked import level_chunk_constraints
from dpdask.graph._levels import _released_parents
from dpdask.graph._topdown_blocks import parent_chunks, parent_rows
from dpdask.reconstruct.topdown import Constraints, check_family

if TYPE_CHECKING:
    from dpdask.graph._release import Release

__all__ = [
    "Spine",
    "SpineLevel",
    "annotate_spine",
    "charged_levels",
    "discarded",
    "spine_block",
    "spine_levels",
    "spine_measure",
    "spine_option",
    "spine_task",
    "spine_unbiased",
]


@dataclass(frozen=True)
class SpineLevel:
    """One released level under the spine option.

    Attributes
    ----------
    level : str
        The level.
    units : int
        Its units.
    reusing : int
        Its units whose parent has exactly one child (0 at the top level): their
        estimate is their parent's.
    budget_to : str or None
        For a spine level (every unit reusing), the measured level its budget moved to;
        None for a measured level.
    budget_from : tuple of str
        The spine levels whose budget this level received.
    """

    level: str
    units: int
    reusing: int
    budget_to: str | None = None
    budget_from: tuple[str, ...] = ()

    @property
    def measured(self) -> bool:
        """Whether the level is measured (and charged)."""
        return self.budget_to is None


@dataclass(frozen=True, eq=False)
class Spine:
    """Every released level's spine units (a mask per level, None at the top)."""

    levels: tuple[SpineLevel, ...]
    masks: tuple[np.ndarray | None, ...]

    @property
    def moves(self) -> dict[str, str]:
        """Each spine level and the measured level its budget moved to."""
        return {s.level: s.budget_to for s in self.levels if s.budget_to is not None}

    def summary(self, level: str) -> dict[str, Any]:
        """What the plan and the release state about ``level``."""
        s = next(s for s in self.levels if s.level == level)
        return {
            "units_reusing_parent": s.reusing,
            "share_reusing_parent": s.reusing / s.units if s.units else 0.0,
            "measured": s.measured,
            "budget_moved_to": s.budget_to,
            "budget_received_from": list(s.budget_from),
        }


def spine_levels(geo: Geography, levels: Sequence[str]) -> Spine:
    """The spine units of every released level, from the public geography.

    Parameters
    ----------
    geo : Geography
        The data's geography (public).
    levels : sequence of str
        The released levels, coarsest first.

    Returns
    -------
    Spine
        Per level, the units whose parent in the released level above has one child; a
        level all of whose units are such is not measured and its budget moves to the
        nearest measured level above (:attr:`Spine.moves`).
    """
    parents = _released_parents(geo, levels)
    masks: list[np.ndarray | None] = [None]
    for i, p in enumerate(parents):
        counts = np.bincount(p, minlength=geo.n_units(levels[i]))
        masks.append(counts[p] == 1)
    out: list[SpineLevel] = []
    above = levels[0]  # the nearest measured level
    for lv, mask in zip(levels, masks, strict=True):
        n = geo.n_units(lv)
        reusing = 0 if mask is None else int(mask.sum())
        spine = mask is not None and reusing == n
        out.append(SpineLevel(lv, n, reusing, above if spine else None))
        above = above if spine else lv
    received = {s.level: tuple(t.level for t in out if t.budget_to == s.level) for s in out}
    levels_ = tuple(
        SpineLevel(s.level, s.units, s.reusing, s.budget_to, received[s.level]) for s in out
    )
    return Spine(levels_, tuple(masks))


def spine_option(
    spine: bool,
    reconstruct: str,
    per_level: bool,
    geo: Geography,
    levels: Sequence[str],
) -> Spine | None:
    """The spine of a release with ``spine=spine`` (None without), or an
    ``ArgumentError`` for what it does not go with (before anything is charged)."""
    if not isinstance(spine, bool):
        raise ArgumentError(f"spine must be true or false, got {spine!r}")
    if not spine:
        return None
    if reconstruct != "topdown":
        raise ArgumentError(f"spine=True goes with reconstruct='topdown', not {reconstruct!r}")
    out = spine_levels(geo, levels)
    if out.moves and per_level:
        raise ArgumentError(
            f"spine=True moves the budget of level(s) {sorted(out.moves)} to a level "
            "above, which needs one plan whose budget the levels split, not a plan per level"
        )
    return out


def _spine(rel: Release) -> Spine | None:
    spine: Spine | None = getattr(rel, "spine", None)
    return spine


def charged_levels(rel: Release) -> tuple[Any, ...]:
    """The released levels that are measured, hence charged (not spine levels)."""
    spine = _spine(rel)
    moved = {} if spine is None else spine.moves
    return tuple(L for L in rel.released if L.name not in moved)


def discarded(
    x: Any, plan: Any, key: Any, ctx: Any, info: Any, *, measure: Any, rows: np.ndarray
) -> np.ndarray:
    """The chunk's measurements with the rows of its spine units discarded (NaN) as soon
    as they are drawn, before any use (``measure``: the measurement it wraps)."""
    y = np.array((measure or measure_block)(x, plan, key, ctx, info), dtype=np.float64)
    y[rows] = np.nan
    return y


def spine_block(
    parent_blocks: list[Any], parent_starts: list[int], parents: np.ndarray, n: int,
    cons: Constraints | None = None, level: str = "",
) -> sparse.COO:  # fmt: skip
    """A spine level's chunk: each unit's row is its parent's estimate (no measurement).

    ``cons``: the chunk's units' constraints (a multi-pass release's), which their
    parents' estimates meet (a parent's constraints include its only child's); checked,
    so that a copy outside them is an error naming the unit, never a published row."""
    parents = np.asarray(parents, dtype=np.int64)
    first, last = int(parents[0]), int(parents[-1])
    P = parent_rows(parent_blocks, parent_starts, first, last)[parents - first]
    if cons is not None:
        rows = P.toarray()
        for u in range(parents.size):
            check_family(rows[u], cons.take(np.array([u])),
                         parent_name=f"{level} parent {int(parents[u])}")  # fmt: skip
    P.eliminate_zeros()
    coo = P.tocoo()
    order = np.lexsort((coo.col, coo.row))
    coords = np.stack([coo.row[order], coo.col[order]]).astype(np.int64)
    data = np.asarray(coo.data[order], dtype=np.float64)
    return sparse.COO(coords, data, shape=(parents.size, n), sorted=True, has_duplicates=False)


def spine_task(
    rel: Release, i: int, bounds: np.ndarray, prev: tuple[str, np.ndarray] | None, k: int,
    measure: Any,
) -> tuple[tuple[Any, ...] | None, Any]:  # fmt: skip
    """For chunk ``k`` of level ``i``: the task copying its parents when the level is a
    spine level (else None), and the measurement to use (its spine rows discarded)."""
    if prev is None:
        return None, measure
    lo, hi = int(bounds[k]), int(bounds[k + 1])
    measured, measure = spine_measure(rel, i, lo, hi, measure)
    if measured:
        return None, measure
    p = rel.lc.parents[i - 1][lo:hi]
    keys, starts = parent_chunks(p, *prev)
    name = rel.released[i].name
    cons = level_chunk_constraints(rel.constraints, name, lo, hi)
    return (spine_block, keys, starts, p, rel.domain.size, cons, name), measure


def spine_measure(rel: Release, i: int, lo: int, hi: int, measure: Any) -> tuple[bool, Any]:
    """Whether units ``lo:hi`` of level ``i`` are measured at all (False: a spine level,
    never measured, its noise never drawn), and the measurement that draws them, its
    spine units' rows discarded (:func:`discarded`). The fits and the multi-pass sweep
    (:mod:`~dpdask.graph._subtree`) both measure through it."""
    spine = _spine(rel)
    if spine is None or i == 0:
        return True, measure
    if not spine.levels[i].measured:
        return False, measure
    mask = spine.masks[i]
    rows = np.flatnonzero(mask[lo:hi]) if mask is not None else np.zeros(0, dtype=np.int64)
    if rows.size == 0:
        return True, measure
    return True, functools.partial(discarded, measure=measure, rows=rows)


def spine_unbiased(rel: Release, i: int, group: Any) -> None:
    """State on level ``i``'s output group why its spine units' unbiased answers are not
    its own (module notes)."""
    spine = _spine(rel)
    if spine is None or i == 0 or not rel.noise:
        return
    s, parent = spine.levels[i], rel.released[i - 1].name
    if not s.measured:
        group.attrs["unbiased"] = (
            f"none published: every unit is its parent's only child and reuses its estimate "
            f"(spine); not measured, its budget moved to {s.budget_to!r}, whose unbiased "
            "answers are its own"
        )
    elif s.reusing and "unbiased" in group:
        group["unbiased"].attrs["spine"] = (
            f"NaN for the {s.reusing} units that are their parent's only child: not "
            f"measured, their estimate is their parent's and so is their unbiased answer "
            f"(in {parent}/unbiased, with its variance)"
        )


def annotate_spine(
    spine: Spine | None, rows: list[dict[str, Any]], plans: Mapping[str, Any]
) -> None:
    """Add each level's spine statement (:meth:`Spine.summary`) to its row.

    Parameters
    ----------
    spine : Spine or None
        The release's spine (nothing is added without one).
    rows : list of dict
        A plan's or a summary's rows, each with ``level`` and ``budget``: a spine
        level's ``budget`` becomes none (it moved).
    plans : mapping of str to Plan
        Each level's plan (a spine level's is its receiver's).
    """
    if spine is None:
        return
    for row in rows:
        info = spine.summary(row["level"])
        row["spine"] = info
        if not info["measured"]:
            row["budget"] = plans[row["level"]].privacy.zero().to_dict()
