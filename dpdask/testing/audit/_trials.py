"""What one audit trial releases: the positive control's budget, the trial geography with
its neighbouring datasets, and the statistic fixed from the claimed plan before any trial
(see :mod:`dpdask.testing.audit`)."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.domain import Geography
from dpdask.errors import ArgumentError, BudgetTypeError
from dpdask.privacy import ApproxDP, Budget, PureDP, split_levels, zCDP
from dpdask.store import DataStore, write_store

__all__ = [
    "Design",
    "Trial",
    "control_budget",
    "design_statistic",
    "pick_trial",
    "read_statistic",
    "with_budget",
    "write_trial_store",
]


# -- budgets ------------------------------------------------------------------------------------
def control_budget(budget: Budget, mechanism: str) -> Budget:
    """The budget whose noise is half the scale ``budget`` calibrates (the positive control).

    ``4 rho`` for zCDP (Gaussian sigma halves exactly), ``2 epsilon`` for pure DP (Laplace
    scale halves exactly), and for (epsilon, delta) the smallest epsilon on a fine grid,
    at the same delta, whose analytic-Gaussian sigma is at most half.
    """
    if isinstance(budget, zCDP):
        return budget * 4
    if isinstance(budget, PureDP):
        return budget * 2
    if isinstance(budget, ApproxDP):
        target = float(budget.gaussian_sigma(1.0)) / 2.0
        lo, hi = Fraction(budget.epsilon), Fraction(budget.epsilon) * 64
        for _ in range(60):
            mid = Fraction(round((lo + hi) / 2 * 10**9), 10**9)
            if mid in (lo, hi):
                break
            if float(ApproxDP(mid, budget.delta).gaussian_sigma(1.0)) <= target:
                hi = mid
            else:
                lo = mid
        return ApproxDP(hi, budget.delta)
    raise BudgetTypeError(f"no positive control for budget {budget!r} ({mechanism})")


def with_budget(plan: Any, budget: Budget) -> Any:
    """A copy of ``plan`` measuring the same strategy under another budget
    (:meth:`dpdask.strategy.Plan.at`)."""
    return plan.at(budget)


# -- the trial store ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Trial:
    """The small geography a trial releases, and the neighbouring datasets on it."""

    levels: tuple[str, ...]
    unit_ids: dict[str, str]  # the source unit of each level above the finest
    block_ids: tuple[str, ...]  # the finest units (the person is in the first)
    d: np.ndarray  # (blocks, *domain.shape) counts of D
    cell: tuple[int, ...]  # the person's cell (D' = D + 1 there, in block 0)

    def d_prime(self) -> np.ndarray:
        x = self.d.copy()
        x[(0, *self.cell)] += 1
        return x


def pick_trial(
    store: DataStore, levels: Sequence[str], blocks: int
) -> tuple[list[int], dict[str, str]]:
    """Rows of the first finest unit and its siblings (under the level above), and the
    ids of its ancestors at the released levels."""
    geo = store.geography
    finest = geo.levels[-1]
    if levels[-1] != finest:
        raise ArgumentError(f"the finest released level must be the data's finest, {finest!r}")
    ancestors = {lv: int(geo.ancestor_index(lv)[0]) for lv in levels[:-1]}
    if len(levels) > 1:
        parent = geo.ancestor_index(levels[-2])
        rows = np.flatnonzero(parent == parent[0])[: max(1, int(blocks))]
    else:
        rows = np.arange(1)
    ids = {lv: geo.ids[geo.level_index(lv)][i] for lv, i in ancestors.items()}
    return [int(r) for r in rows], ids


def write_trial_store(path: pathlib.Path, trial: Trial, pairs: int, domain: Any) -> DataStore:
    """``2 * pairs`` disjoint copies of the trial geography: even copies hold D, odd D'."""
    copies = 2 * pairs
    k = len(trial.block_ids)
    ids: list[tuple[str, ...]] = []
    parents: list[np.ndarray] = []
    for i, _lv in enumerate(trial.levels):
        if i < len(trial.levels) - 1:
            ids.append(tuple(f"t{c:07d}" for c in range(copies)))
            if i:
                parents.append(np.arange(copies))
        else:
            ids.append(tuple(f"t{c:07d}b{b:04d}" for c in range(copies) for b in range(k)))
            if i:
                parents.append(np.repeat(np.arange(copies), k))
    geo = Geography(levels=trial.levels, ids=tuple(ids), parents=tuple(parents))
    pair = np.stack([trial.d, trial.d_prime()])  # (2, k, *shape)
    counts = np.broadcast_to(pair[None], (pairs, *pair.shape)).reshape(copies * k, *domain.shape)
    return write_store(path, np.ascontiguousarray(counts), domain, geo, source="dpdask audit")


# -- the statistic ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Design:
    """The audit's statistic, fixed from the claimed plan before any trial."""

    cell: int
    directions: dict[str, np.ndarray]  # level -> w_l G_l e_j (flattened cells)
    null_mean: float  # E[s] under D, with the claimed noise
    sd: float  # sd of s under the claim
    shift: float  # (E[s | D'] - E[s | D]) / sd under the claim


def design_statistic(
    plan: Any, total: Budget, levels: Sequence[str], split: Any, d: np.ndarray
) -> Design:
    """The statistic of a plan under its claimed budget: the person's cell (where the
    sensitivity is attained), each level's direction, and the null mean and sd."""
    lps = {lv: plan.at(b, operator=True) for lv, b in split_levels(total, levels, split).items()}
    p = plan.calibration.norm
    power = sum(lp.strategy.column_norms(p) ** 2 / lp.row_variance for lp in lps.values())
    j = int(np.argmax(power))
    n = d[0].size
    e = np.zeros((1, n))
    e[0, j] = 1.0
    dirs = {}
    for lv, lp in lps.items():
        A = lp.strategy
        dirs[lv] = A.T.apply(A.apply(e)).ravel() / lp.row_variance
    block, total_counts = d[0].ravel().astype(float), d.reshape(len(d), -1).sum(0).astype(float)
    mean = sum(float(g @ (block if lv == levels[-1] else total_counts)) for lv, g in dirs.items())
    var = float(sum(g[j] for g in dirs.values()))  # = the shift, for least squares
    return Design(j, dirs, mean, math.sqrt(var), math.sqrt(var))


def read_statistic(out: pathlib.Path, design: Design, levels: Sequence[str], k: int) -> np.ndarray:
    """The standardised statistic of every copy of a published batch."""
    import zarr

    root = zarr.open_group(str(out), mode="r")
    s = 0.0
    for lv in levels:
        group: Any = root[lv]  # a zarr group per level
        est = np.asarray(group["estimate"][:], dtype=float)
        if lv == levels[-1]:
            est = est[::k]  # the first block of each copy holds the person
        s = s + est.reshape(est.shape[0], -1) @ design.directions[lv]
    return (np.asarray(s) - design.null_mean) / design.sd
