"""An end-to-end privacy audit: a lower bound on epsilon from published releases.

The audit runs the real release path (:func:`dpdask.dataflow.release` and
:meth:`~dpdask.dataflow.release.Release.to_zarr`: a fresh key from the operating system,
charged to a ledger, measured, reconstructed, made consistent, answered and published,
``test_mode=False``) on two neighbouring datasets ``D`` and ``D'`` that differ in one
person, many times, and turns the published outputs into a lower bound on the epsilon
the release actually gives. The bound is compared with the epsilon the release claims.
A *positive control* (the same release with half the noise, still claiming the
original budget) must be flagged, which shows that the audit has the power to catch a
release that spends more than it says.

What is run per trial
---------------------
The strategy is selected once (:func:`dpdask.pipeline.run.plan_spec`; selection does not
read the data, and privacy does not depend on it). A *trial* is one published release
of a small geography: the first unit of every released level above the finest, and
the first ``blocks`` units of the finest level below them (for the P.L. 94-171 file of
Providence County: the state, the county, the first tract, its first block group and
that block group's first two blocks), with the data's own counts (``D``) or those
counts plus one person in one cell of the first block (``D'``). To make thousands of
trials affordable, a *batch* of trials is one release of a store that holds ``2 x
batch`` disjoint copies of that small geography (copies ``0, 2, 4, ...`` hold ``D``,
copies ``1, 3, 5, ...`` hold ``D'``), each copy a separate tree with its own root. A
person is in one copy only, every unit is measured with its own keyed noise and
reconstruction and consistency never cross trees, so each copy's published output is
distributed exactly as the release of that copy on its own, and the copies are
independent trials (parallel composition). The copies of a batch share the batch's key
but draw disjoint noise streams of it. Every batch is a new release: a fresh key from the OS, a new
run charged to a ledger in a temporary folder, the whole graph run on the local
threaded scheduler and published to a temporary store, from which the estimates are
read back. Nothing is charged to any other ledger and nothing is kept.

The statistic and the bound
---------------------------
The person is put in the cell ``j`` where the strategy's column norm (L2 for Gaussian
noise, L1 for Laplace) is largest, that is where the sensitivity is attained. From the
published, consistent estimates ``xhat_l`` of the units containing the person's block
(one per released level ``l``) the audit computes

.. math::

   s = \\sum_l \\frac{1}{\\sigma_l^2} (G_l\\, \\hat x_l)_j ,\\qquad G_l = A_l^\\top A_l ,

with ``A_l`` the level's measured strategy and ``sigma_l^2`` its claimed noise variance
per measurement. For least squares over one strategy (the release model) this is the
likelihood-ratio statistic of the published output: the consistent estimates are the
best linear unbiased estimates of the tree, so ``s`` is Gaussian with variance equal
to its shift ``sum_l G_jj / sigma_l^2`` (``2 rho`` in units of the sensitivity), and
the test loses nothing against the measurements themselves. The audit standardises
``s`` with the *claimed* noise (so the control is tested as if it had the claimed noise:
the auditor is not told) and tests ``2m`` events fixed before any trial: ``z > t_k``
(likely under ``D'``) and ``z < mu - t_k`` (likely under ``D``), with ``t_k`` the upper
``p_k`` quantiles of the standard normal, ``p_k`` log-spaced from 1/2 to ``1/trials``.
For each event, Clopper-Pearson bounds at level ``(1 - confidence) / (4 m)`` (Bonferroni
over both probabilities of all ``2 m`` events) give a lower bound on the probability under
the dataset that favours it (``b``) and an upper bound under the other (``a``); with
probability at least ``confidence`` all of them hold at once, and then every
(epsilon, delta) the release satisfies has

.. math:: \\epsilon \\ge \\log\\frac{b - \\delta}{a} ,

for every delta at once. For a zCDP claim, Renyi divergences are bounded by data
processing too, ``rho >= D_alpha(Bern(b) || Bern(a)) / alpha`` for every ``alpha > 1``,
which gives a lower bound on rho (reported beside epsilon).

The delta
---------
A pure-DP claim is audited at ``delta = 0`` and an (epsilon, delta) claim at its delta.
A rho-zCDP claim implies ``(epsilon_rho(delta), delta)``-DP for every delta
(:func:`dpdask.privacy.zcdp_epsilon`); unless a delta is given, the audit reports at
the delta of :data:`DELTAS` where the positive control exceeds the claim most
(the real release's bound is reported at the same delta, and its largest excess over
the whole grid as ``max_excess``; the bounds hold for all deltas at once, so choosing
one after the trials costs no confidence). At small deltas (``1e-6``) the claimed
epsilon is dominated by the Gaussian's tail, which thousands of trials cannot reach:
a half-noise control is flagged there only with some ``10^5`` trials per dataset.
"""

from __future__ import annotations

import copy
import math
import pathlib
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
from scipy.special import logsumexp
from scipy.stats import beta, norm

from dpdask.dataflow import DataStore, write_store
from dpdask.domain import Geography
from dpdask.privacy import ApproxDP, Budget, Ledger, PureDP, split_levels, zCDP, zcdp_epsilon

__all__ = [
    "DELTAS",
    "AuditResult",
    "TailCounts",
    "audit_release",
    "audit_spec",
    "clopper_pearson",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "control_budget",
    "epsilon_lower_bound",
    "rho_lower_bound",
    "tail_counts",
    "thresholds",
]

#: The deltas at which a zCDP claim is compared (unless one is given).
DELTAS: tuple[float, ...] = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.02, 0.05, 0.1, 0.15, 0.2)

_ALPHAS = np.exp(np.linspace(math.log(1.0005), math.log(1000.0), 400))


# -- binomial confidence bounds -------------------------------------------------------------
def clopper_pearson_lower(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound on a binomial proportion.

    Parameters
    ----------
    k, n : int
        Successes and trials, ``0 <= k <= n``, ``n >= 1``.
    alpha : float
        Error probability, ``0 < alpha < 1``: the bound exceeds the true proportion
        with probability at most ``alpha``.

    Returns
    -------
    float
        The ``alpha`` quantile of ``Beta(k, n - k + 1)`` (0 when ``k == 0``).
    """
    k, n = _check_counts(k, n, alpha)
    return 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound on a binomial proportion.

    Parameters
    ----------
    k, n : int
        Successes and trials, ``0 <= k <= n``, ``n >= 1``.
    alpha : float
        Error probability: the bound is below the true proportion with probability at
        most ``alpha``.

    Returns
    -------
    float
        The ``1 - alpha`` quantile of ``Beta(k + 1, n - k)`` (1 when ``k == n``).
    """
    k, n = _check_counts(k, n, alpha)
    return 1.0 if k == n else float(beta.isf(alpha, k + 1, n - k))


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The two-sided Clopper-Pearson interval (each side at ``(1 - confidence) / 2``).

    Examples
    --------
    >>> lo, hi = clopper_pearson(0, 10)
    >>> lo, round(hi, 4)
    (0.0, 0.3085)
    """
    a = (1.0 - float(confidence)) / 2.0
    return clopper_pearson_lower(k, n, a), clopper_pearson_upper(k, n, a)


def _check_counts(k: int, n: int, alpha: float) -> tuple[int, int]:
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
    return k, n


# -- from two samples of the statistic to bounds ---------------------------------------------
@dataclass(frozen=True)
class TailCounts:
    """The tested events and their Clopper-Pearson bounds.

    Attributes
    ----------
    a_upper : ndarray
        Per event, an upper bound on its probability under the dataset it disfavours.
    b_lower : ndarray
        Per event, a lower bound on its probability under the dataset it favours.
    k_favoured, k_other : ndarray
        The counts behind them.
    n : int
        Trials per dataset.
    alpha : float
        The error probability of each bound (Bonferroni share of ``1 - confidence``).
    """

    a_upper: np.ndarray
    b_lower: np.ndarray
    k_favoured: np.ndarray
    k_other: np.ndarray
    n: int
    alpha: float


def thresholds(n: int, m: int = 12) -> np.ndarray:
    """The ``m`` thresholds of the tests: upper normal quantiles of ``p`` log-spaced from
    1/2 down to ``1 / n`` (fixed before any trial)."""
    p = np.geomspace(0.5, 1.0 / max(int(n), 2), int(m))
    return norm.isf(p)


def tail_counts(
    z0: np.ndarray, z1: np.ndarray, shift: float, m: int = 12, confidence: float = 0.95
) -> TailCounts:
    """Count the audit's events in two samples of the standardised statistic.

    Parameters
    ----------
    z0, z1 : ndarray
        The statistic under ``D`` and under ``D'`` (as many trials each), standardised so
        that under the claim ``z0 ~ N(0, 1)`` and ``z1 ~ N(shift, 1)``.
    shift : float
        The claimed shift (mirrors the thresholds for the events likely under ``D``).
    m : int
        Thresholds per direction (:func:`thresholds`); ``2 m`` events in all.
    confidence : float
        Joint confidence of all ``4 m`` bounds (Bonferroni).

    Returns
    -------
    TailCounts
    """
    z0, z1 = np.asarray(z0, dtype=float).ravel(), np.asarray(z1, dtype=float).ravel()
    if z0.size != z1.size or z0.size == 0:
        raise ValueError(f"need as many trials on both datasets, got {z0.size} and {z1.size}")
    n = z0.size
    t = thresholds(n, m)
    alpha = (1.0 - float(confidence)) / (4 * len(t))
    fav = np.concatenate([(z1[:, None] > t).sum(0), (z0[:, None] < shift - t).sum(0)])
    oth = np.concatenate([(z0[:, None] > t).sum(0), (z1[:, None] < shift - t).sum(0)])
    b = np.array([clopper_pearson_lower(k, n, alpha) for k in fav])
    a = np.array([clopper_pearson_upper(k, n, alpha) for k in oth])
    return TailCounts(a, b, fav, oth, n, alpha)


def epsilon_lower_bound(tails: TailCounts, delta: float = 0.0) -> float:
    """The largest ``log((b - delta) / a)`` over the events (0 if none is positive).

    If the release is (epsilon, delta)-DP and every Clopper-Pearson bound holds (jointly
    with the confidence of :func:`tail_counts`), epsilon is at least this, for every
    delta at once.
    """
    ok = tails.b_lower > delta
    if not ok.any():
        return 0.0
    eps = np.log((tails.b_lower[ok] - delta) / tails.a_upper[ok])
    return max(0.0, float(eps.max()))


def _renyi_bernoulli(b: float, a: float, alphas: np.ndarray) -> np.ndarray:
    """``D_alpha(Bern(b) || Bern(a))`` for every alpha (natural logarithm)."""
    terms = np.stack(
        [
            alphas * math.log(b) + (1 - alphas) * math.log(a),
            alphas * math.log1p(-b) + (1 - alphas) * math.log1p(-a),
        ]
    )
    return logsumexp(terms, axis=0) / (alphas - 1.0)


def rho_lower_bound(tails: TailCounts) -> float:
    """A lower bound on rho: the largest ``D_alpha(Bern(b) || Bern(a)) / alpha`` over the
    events and a grid of orders ``alpha > 1`` (0 if no event has ``b > a``).

    A rho-zCDP release has ``D_alpha <= alpha rho`` between its outputs on neighbours,
    and so (data processing) between the indicators of any event; the divergence grows
    with ``b`` and falls with ``a`` (for ``a < b``), so the Clopper-Pearson bounds give a
    valid bound with the confidence of :func:`tail_counts`.
    """
    best = 0.0
    for a, b in zip(tails.a_upper, tails.b_lower, strict=True):
        if 0.0 < a < b < 1.0:
            best = max(best, float((_renyi_bernoulli(b, a, _ALPHAS) / _ALPHAS).max()))
    return best


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
    raise TypeError(f"no positive control for budget {budget!r} ({mechanism})")


def _with_budget(plan: Any, budget: Budget) -> Any:
    """A copy of ``plan`` measuring the same strategy under another budget."""
    from dpdask.privacy import noise_scale

    new = copy.copy(plan)
    new.privacy = budget
    new.noise_scale = noise_scale(plan.mechanism, plan.sensitivity, budget)
    return new


# -- the trial store ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Trial:
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


def _pick_trial(store: DataStore, levels: Sequence[str], blocks: int) -> tuple[list[int], dict]:
    """Rows of the first finest unit and its siblings (under the level above), and the
    ids of its ancestors at the released levels."""
    geo = store.geography
    finest = geo.levels[-1]
    if levels[-1] != finest:
        raise ValueError(f"the finest released level must be the data's finest, {finest!r}")
    ancestors = {lv: int(geo.ancestor_index(lv)[0]) for lv in levels[:-1]}
    if len(levels) > 1:
        parent = geo.ancestor_index(levels[-2])
        rows = np.flatnonzero(parent == parent[0])[: max(1, int(blocks))]
    else:
        rows = np.arange(1)
    ids = {lv: geo.ids[geo.level_index(lv)][i] for lv, i in ancestors.items()}
    return [int(r) for r in rows], ids


def _trial_store(path: pathlib.Path, trial: _Trial, pairs: int, domain: Any) -> DataStore:
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
class _Design:
    """The audit's statistic, fixed from the claimed plan before any trial."""

    cell: int
    directions: dict[str, np.ndarray]  # level -> w_l G_l e_j (flattened cells)
    null_mean: float  # E[s] under D, with the claimed noise
    sd: float  # sd of s under the claim
    shift: float  # (E[s | D'] - E[s | D]) / sd under the claim


def _design(plan: Any, total: Budget, levels: Sequence[str], split: Any, d: np.ndarray) -> _Design:
    from dpdask.dataflow._level_plan import LevelPlan

    budgets = split_levels(total, levels, split)
    lps: dict[str, LevelPlan] = {}
    for lv, b in budgets.items():
        lps[lv] = LevelPlan(plan, b, like=next(iter(lps.values()), None))
    p = 1 if plan.mechanism.endswith("laplace") else 2
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
    return _Design(j, dirs, mean, math.sqrt(var), math.sqrt(var))


def _statistic(out: pathlib.Path, design: _Design, levels: Sequence[str], k: int) -> np.ndarray:
    """The standardised statistic of every copy of a published batch."""
    import zarr

    root = zarr.open_group(str(out), mode="r")
    s = 0.0
    for lv in levels:
        est = np.asarray(root[lv]["estimate"][:], dtype=float)
        if lv == levels[-1]:
            est = est[::k]  # the first block of each copy holds the person
        s = s + est.reshape(est.shape[0], -1) @ design.directions[lv]
    return (np.asarray(s) - design.null_mean) / design.sd


# -- results ------------------------------------------------------------------------------------
@dataclass
class AuditResult:
    """What an audit found (:meth:`to_dict` for the JSON form).

    Attributes
    ----------
    claim : Budget
        The claimed budget of the release.
    mechanism : str
        Its noise.
    delta : float
        The delta of the comparison.
    claimed_epsilon : float
        The epsilon the claim gives at ``delta``.
    lower_bound, control_lower_bound : float
        Lower confidence bounds on the epsilon at ``delta`` of the release and of the
        positive control (the same release with half the noise).
    confidence : float
        Joint confidence of each lower bound.
    trials : int
        Trials per dataset (``D`` and ``D'``), for the release and for the control each.
    max_excess : float
        The release's largest ``lower bound - claimed epsilon`` over the deltas tried
        (positive: the release is caught spending more than it claims).
    claimed_rho, rho_lower_bound, control_rho_lower_bound : float or None
        For zCDP claims.
    details : dict
        Everything else (statistic, events, geography, timings, epsilon by delta).
    """

    claim: Budget
    mechanism: str
    delta: float
    claimed_epsilon: float
    lower_bound: float
    control_lower_bound: float
    confidence: float
    trials: int
    max_excess: float
    claimed_rho: float | None = None
    rho_lower_bound: float | None = None
    control_rho_lower_bound: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def flagged(self) -> bool:
        """Whether the release is caught exceeding its claim."""
        rho = self.claimed_rho is not None and self.rho_lower_bound > self.claimed_rho
        return self.max_excess > 0 or rho

    @property
    def control_flagged(self) -> bool:
        """Whether the positive control is caught (the audit has the power it needs)."""
        return self.control_lower_bound > self.claimed_epsilon

    def report(self) -> str:
        """A short text report (what ``dpdask audit`` prints without ``--json``)."""
        d = self.details
        verdict = "EXCEEDS its claim" if self.flagged else "within its claim"
        power = "flagged" if self.control_flagged else "NOT flagged (too few trials)"
        lines = [
            f"audit of {d.get('release', 'the release')}: claim {self.claim!r} "
            f"({self.mechanism} noise), {self.trials} trials per dataset, "
            f"levels {d.get('levels')}",
            f"at delta={self.delta:g}: claimed epsilon {self.claimed_epsilon:.4g}",
            f"  release: {self.confidence:.0%} lower bound {self.lower_bound:.4g} -> {verdict}",
            f"  control (half the noise): lower bound {self.control_lower_bound:.4g} -> {power}",
        ]
        if self.claimed_rho is not None:
            lines.append(
                f"rho: claimed {self.claimed_rho:.4g}, lower bounds {self.rho_lower_bound:.4g} "
                f"(release), {self.control_rho_lower_bound:.4g} (control)"
            )
        if "seconds" in d:
            lines.append(f"{d['releases']} releases in {d['seconds']['total']:.1f} s")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        out: dict[str, Any] = {
            "claim": self.claim.to_dict(),
            "mechanism": self.mechanism,
            "delta": self.delta,
            "claimed_epsilon": self.claimed_epsilon,
            "lower_bound": self.lower_bound,
            "control_lower_bound": self.control_lower_bound,
            "confidence": self.confidence,
            "trials": self.trials,
            "flagged": self.flagged,
            "control_flagged": self.control_flagged,
            "max_excess": self.max_excess,
        }
        if self.claimed_rho is not None:
            out["claimed_rho"] = self.claimed_rho
            out["rho_lower_bound"] = self.rho_lower_bound
            out["control_rho_lower_bound"] = self.control_rho_lower_bound
        out.update(self.details)
        return out


# -- running ------------------------------------------------------------------------------------
def _run_side(
    kind: str,
    plan: Any,
    store: DataStore,
    levels: tuple[str, ...],
    split: Any,
    reconstruct: str,
    design: _Design,
    k: int,
    n_batches: int,
    ledger: Ledger,
    tmp: pathlib.Path,
    client: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``n_batches`` releases; the statistic of every copy under D and under D'."""
    from dpdask.dataflow.release import release

    z0, z1 = [], []
    for b in range(n_batches):
        rel = release(
            plan, store, levels=levels, budget_split=split, reconstruct=reconstruct,
            release_id=f"audit-{kind}-{b}", ledger=ledger,
        )  # fmt: skip
        out = rel.to_zarr(tmp / f"{kind}-{b}.zarr", client=client)
        z = _statistic(out, design, levels, k)
        shutil.rmtree(out)
        z0.append(z[0::2])
        z1.append(z[1::2])
    return np.concatenate(z0), np.concatenate(z1)


def audit_release(
    plan: Any,
    store: DataStore,
    *,
    levels: Sequence[str] | None = None,
    budget_split: Mapping[str, Any] | Sequence[Any] | None = None,
    reconstruct: str = "ls",
    trials: int = 1000,
    batch: int = 500,
    blocks: int = 2,
    delta: float | None = None,
    confidence: float = 0.95,
    n_thresholds: int = 12,
    client: Any = None,
    workdir: str | pathlib.Path | None = None,
) -> AuditResult:
    """Audit a release of ``plan`` on (the first units of) ``store``, end to end.

    See the module docstring for what is run and how the bound is computed.

    Parameters
    ----------
    plan : Plan
        The selected plan; its budget is the claim (split over ``levels`` as the release
        splits it).
    store : DataStore
        The data; the trial geography is its first unit at every released level above
        the finest and the first ``blocks`` finest units below them.
    levels : sequence of str, optional
        Released levels, coarsest first (default: the store's).
    budget_split : mapping or sequence, optional
        Each level's share, as for :func:`dpdask.dataflow.release`.
    reconstruct : str
        The release's estimator.
    trials : int
        Trials per dataset, for the release and again for the control (rounded up to a
        multiple of the batches).
    batch : int
        Trials per dataset in one release (each release holds ``2 x batch`` copies).
    blocks : int
        Finest units in the trial geography (so that consistency has children to add up).
    delta : float, optional
        The delta of the comparison for a zCDP claim (default: see the module docstring).
    confidence : float
        Joint confidence of each lower bound.
    n_thresholds : int
        Thresholds per direction of the tests.
    client : distributed.Client, optional
        Where to run the releases (default: the local threaded scheduler).
    workdir : path, optional
        Where the temporary stores, ledger and outputs go (default: the system's).

    Returns
    -------
    AuditResult
    """
    started = time.perf_counter()
    trials, batch = int(trials), int(batch)
    if trials < 1 or batch < 1:
        raise ValueError(f"trials and batch must be positive, got {trials} and {batch}")
    levels = tuple(store.geography.levels if levels is None else levels)
    claim: Budget = plan.privacy
    if isinstance(claim, PureDP):
        deltas: tuple[float, ...] = (0.0,)
    elif isinstance(claim, ApproxDP):
        deltas = (float(claim.delta),)
    else:
        deltas = DELTAS if delta is None else (float(delta),)
    control = control_budget(claim, plan.mechanism)
    cplan = _with_budget(plan, control)
    n_batches = math.ceil(trials / batch)
    per = math.ceil(trials / n_batches)
    rows, ids = _pick_trial(store, levels, blocks if len(levels) > 1 else 1)
    geo = store.geography
    finest = geo.ids[-1]
    d = np.stack([np.asarray(store.counts[r]) for r in rows])
    design = _design(plan, claim, levels, budget_split, d)
    trial = _Trial(
        levels, ids, tuple(finest[r] for r in rows), d,
        tuple(int(i) for i in np.unravel_index(design.cell, store.domain.shape)),
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dpdask-audit-", dir=workdir) as tmpname:
        tmp = pathlib.Path(tmpname)
        tstore = _trial_store(tmp / "trials.zarr", trial, per, store.domain)
        ledger = Ledger.init(tmp / "ledger.sqlite")
        args = (tstore, levels, budget_split, reconstruct, design, len(rows), n_batches, ledger)
        t0 = time.perf_counter()
        r0, r1 = _run_side("release", plan, *args, tmp, client)
        t1 = time.perf_counter()
        c0, c1 = _run_side("control", cplan, *args, tmp, client)
        t2 = time.perf_counter()
    real = tail_counts(r0, r1, design.shift, n_thresholds, confidence)
    ctrl = tail_counts(c0, c1, design.shift, n_thresholds, confidence)
    claimed = {dl: _claimed_epsilon(claim, dl) for dl in deltas}
    real_eps = {dl: epsilon_lower_bound(real, dl) for dl in deltas}
    ctrl_eps = {dl: epsilon_lower_bound(ctrl, dl) for dl in deltas}
    chosen = max(deltas, key=lambda dl: (ctrl_eps[dl] - claimed[dl], -dl))
    n = len(r0)
    details: dict[str, Any] = {
        "statistic": (
            "sum over released levels of (G_l xhat_l)_j / sigma_l^2 on the published "
            "consistent estimates of the units holding the person (G_l: the level "
            "strategy's Gram; j: the person's cell), standardised with the claimed noise"
        ),
        "test": (
            f"{2 * n_thresholds} threshold events fixed before the trials, Clopper-Pearson "
            f"bounds each at {real.alpha:.3g} (Bonferroni)"
        ),
        "control": (
            f"the same release with half the noise (budget {control!r}), claiming {claim!r}"
        ),
        "levels": list(levels),
        "trial_units": {**ids, levels[-1]: list(trial.block_ids)},
        "person": {
            "block": trial.block_ids[0],
            "cell": design.cell,
            "attributes": dict(zip(store.domain.attrs, trial.cell, strict=True)),
        },
        "reconstruct": reconstruct,
        "releases": 2 * n_batches,
        "trials_per_release": per,
        "expected_shift": design.shift,
        "observed": {
            "release": _moments(r0, r1),
            "control": _moments(c0, c1),
        },
        "epsilon_by_delta": [
            {"delta": dl, "claimed": claimed[dl], "release": real_eps[dl], "control": ctrl_eps[dl]}
            for dl in deltas
        ],
        "seconds": {
            "release": round(t1 - t0, 2),
            "control": round(t2 - t1, 2),
            "total": round(time.perf_counter() - started, 2),
        },
    }
    result = AuditResult(
        claim=claim,
        mechanism=plan.mechanism,
        delta=chosen,
        claimed_epsilon=claimed[chosen],
        lower_bound=real_eps[chosen],
        control_lower_bound=ctrl_eps[chosen],
        confidence=confidence,
        trials=n,
        max_excess=max(real_eps[dl] - claimed[dl] for dl in deltas),
        details=details,
    )
    if isinstance(claim, zCDP):
        result.claimed_rho = float(claim.rho)
        result.rho_lower_bound = rho_lower_bound(real)
        result.control_rho_lower_bound = rho_lower_bound(ctrl)
    return result


def _claimed_epsilon(claim: Budget, delta: float) -> float:
    if isinstance(claim, PureDP | ApproxDP):
        return float(claim.epsilon)
    return zcdp_epsilon(float(claim.rho), delta)


def _moments(z0: np.ndarray, z1: np.ndarray) -> dict[str, float]:
    """Observed shift and spread of the standardised statistic (claim: shift, sd 1)."""
    return {
        "shift": float(z1.mean() - z0.mean()),
        "sd": float(np.sqrt((z0.var(ddof=1) + z1.var(ddof=1)) / 2)),
    }


def audit_spec(
    spec: Any,
    *,
    trials: int = 1000,
    batch: int = 500,
    blocks: int = 2,
    delta: float | None = None,
    confidence: float = 0.95,
    client: Any = None,
    workdir: str | pathlib.Path | None = None,
) -> AuditResult:
    """Audit a release spec: its plan, levels, split and estimator, on its data's first
    units (:func:`audit_release`).

    The spec's data are read (converted into a temporary folder if need be); nothing is
    charged to the spec's ledger and nothing is written to its output.
    """
    from dpdask.pipeline.run import load_data, plan_spec

    plan, _report = plan_spec(spec)
    with tempfile.TemporaryDirectory(prefix="dpdask-audit-data-", dir=workdir) as tmp:
        store = load_data(spec, pathlib.Path(tmp) / "work")
        levels = tuple(spec.levels or store.geography.levels)
        split = {lv: spec.split[lv] for lv in levels} if spec.split else None
        result = audit_release(
            plan, store, levels=levels, budget_split=split, reconstruct=spec.reconstruct,
            trials=trials, batch=batch, blocks=blocks, delta=delta, confidence=confidence,
            client=client, workdir=workdir,
        )  # fmt: skip
    result.details = {"release": spec.release, **result.details}
    return result
