"""Running an audit: the batches of releases on both datasets, for the release and its
positive control, and the bounds they give (see :mod:`dpdask.testing.audit`)."""

from __future__ import annotations

import math
import pathlib
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, BudgetTypeError
from dpdask.privacy import ApproxDP, Budget, Ledger, PureDP, zCDP, zcdp_epsilon
from dpdask.store import DataStore
from dpdask.testing.audit._bounds import epsilon_lower_bound, rho_lower_bound, tail_counts
from dpdask.testing.audit._result import AuditResult
from dpdask.testing.audit._trials import (
    Design,
    Trial,
    control_budget,
    design_statistic,
    pick_trial,
    read_statistic,
    with_budget,
    write_trial_store,
)

__all__ = ["DELTAS", "audit_release", "audit_spec"]


#: The deltas at which a zCDP claim is compared (unless one is given).
DELTAS: tuple[float, ...] = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.02, 0.05, 0.1, 0.15, 0.2)


def _run_side(
    kind: str,
    plan: Any,
    store: DataStore,
    levels: tuple[str, ...],
    split: Any,
    reconstruct: str,
    design: Design,
    k: int,
    n_batches: int,
    ledger: Ledger,
    tmp: pathlib.Path,
    client: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``n_batches`` releases; the statistic of every copy under D and under D'."""
    from dpdask.graph import release

    z0, z1 = [], []
    for b in range(n_batches):
        rel = release(
            plan, store, levels=levels, budget_split=split, reconstruct=reconstruct,
            release_id=f"audit-{kind}-{b}", ledger=ledger,
        )  # fmt: skip
        out = rel.to_zarr(tmp / f"{kind}-{b}.zarr", client=client)
        z = read_statistic(out, design, levels, k)
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

    See :mod:`dpdask.testing.audit` for what is run and how the bound is computed.

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
        Each level's share, as for :func:`dpdask.release`.
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
        The delta of the comparison for a zCDP claim (default: see :mod:`dpdask.testing.audit`).
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
        raise ArgumentError(f"trials and batch must be positive, got {trials} and {batch}")
    levels = tuple(store.geography.levels if levels is None else levels)
    claim: Budget = plan.privacy
    if isinstance(claim, PureDP):
        deltas: tuple[float, ...] = (0.0,)
    elif isinstance(claim, ApproxDP):
        deltas = (float(claim.delta),)
    else:
        deltas = DELTAS if delta is None else (float(delta),)
    control = control_budget(claim, plan.mechanism)
    cplan = with_budget(plan, control)
    n_batches = math.ceil(trials / batch)
    per = math.ceil(trials / n_batches)
    rows, ids = pick_trial(store, levels, blocks if len(levels) > 1 else 1)
    geo = store.geography
    finest = geo.ids[-1]
    d = np.stack([np.asarray(store.counts[r]) for r in rows])
    design = design_statistic(plan, claim, levels, budget_split, d)
    trial = Trial(
        levels, ids, tuple(finest[r] for r in rows), d,
        tuple(int(i) for i in np.unravel_index(design.cell, store.domain.shape)),
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="dpdask-audit-", dir=workdir) as tmpname:
        tmp = pathlib.Path(tmpname)
        tstore = write_trial_store(tmp / "trials.zarr", trial, per, store.domain)
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
    if isinstance(claim, zCDP):
        return zcdp_epsilon(float(claim.rho), delta)
    raise BudgetTypeError(f"unsupported budget {claim!r}")


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
