"""What a :class:`~dpdask.release._release.Release` holds, declared once for its parts.

The release's steps live in mixins (:mod:`._release_run`, :mod:`._release_graph`,
:mod:`._release_finish`); they share the state that ``Release.__init__`` sets, typed
here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpdask.noise import SecretKey
from dpdask.privacy import Budget, Charge, Ledger

if TYPE_CHECKING:
    from dpdask.release._levels import LevelChunks
    from dpdask.store import DataStore
    from dpdask.strategy import Plan

__all__ = ["LevelState", "ReleaseState"]


@dataclass
class LevelState:
    """One released level: its plan, its charge, its chunks and unit variance."""

    name: str
    plan: Plan
    charge: Charge
    chunks: tuple[int, ...]
    unit_variance: float  # variance scalar of one unit's estimate in the tree model


class ReleaseState:
    """The state ``Release.__init__`` sets (:mod:`dpdask.release._release`)."""

    store: DataStore
    levels: tuple[str, ...]
    release_id: str
    run_id: str
    total: Budget
    reconstruct: str
    ledger: Ledger | None
    dataset: str | None
    key: SecretKey | None
    noise: bool
    test_mode: bool
    integer: bool
    max_total: int
    lc: LevelChunks
    _levels: list[LevelState]
    _head: Any
    _reports: list[dict[str, Any]]

    def summary(self) -> dict[str, Any]:  # pragma: no cover - defined by Release
        raise NotImplementedError
