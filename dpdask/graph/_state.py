"""What a release holds: a frozen level per released level, and the state of one run.

A :class:`~dpdask.graph.Release` is a frozen configuration; its steps (the charge,
:mod:`._run`; the measure graph, :mod:`._graph` or :mod:`._topdown`; the finish,
:mod:`._finish`) are functions taking it and the :class:`RunState` of the run they
belong to, the only thing a run changes.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any

from dpdask.noise import SecretKey
from dpdask.privacy import Charge
from dpdask.strategy import Plan

__all__ = ["Level", "RunState"]


@dataclass(frozen=True)
class Level:
    """One released level: its plan, its charge (before a key binds it), its chunks
    and the variance scalar of one unit's estimate in the tree model."""

    name: str
    plan: Plan
    charge: Charge
    chunks: tuple[int, ...]
    unit_variance: float


@dataclass
class RunState:
    """One run of a release: its work folder, its key, every level's charge bound to
    the key, the ledger's head after the charges, the reports of chunks whose
    estimator did not converge, and (integer multi-pass) each level's rounding gap."""

    work: pathlib.Path
    key: SecretKey | None = None
    charges: list[Charge] = field(default_factory=list)
    head: Any = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    rounding: dict[str, float] = field(default_factory=dict)
