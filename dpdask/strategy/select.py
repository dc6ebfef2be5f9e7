"""Strategy selection: :func:`select` turns a workload and a budget into a :class:`Plan`.

``strategy="hdmm"`` runs HDMM's templates (:mod:`._hdmm`) as Dask tasks and keeps
the strategy of least expected error. For a workload of two or more marginals under
Gaussian noise (zCDP, approximate DP) without named templates it also plans the
residual strategy (:mod:`dpdask.strategy.residual`, the optimum over all strategies:
its total variance is the SVD bound) and returns it when its total variance is lower
than HDMM's by more than :data:`RESIDUAL_MARGIN` (where HDMM already reaches the
optimum, as on a workload nested in one marginal, its plan is kept). Pure DP keeps
HDMM. ``strategy="residual"`` asks for the residual plan by name; any other name
builds a baseline from :mod:`dpdask.strategy.baselines`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dpdask.domain import Domain
from dpdask.errors import BudgetTypeError, PlanError
from dpdask.linalg import LinearQuery
from dpdask.privacy import MECHANISM_NORM, Budget, mechanism_for
from dpdask.strategy._terms import KronTerms, kron_terms
from dpdask.strategy.analysis import ErrorAnalysis
from dpdask.strategy.hdmm import TEMPLATES, Candidate, blas_limit, default_templates, optimize
from dpdask.strategy.plan import Plan

__all__ = [
    "BASELINES",
    "TEMPLATES",
    "Candidate",
    "default_templates",
    "optimize",
    "select",
]

BASELINES = ("identity", "workload", "hierarchical", "hb", "wavelet", "convex", "tda-2020")
RESIDUAL = "residual"
RESIDUAL_MARGIN = 1e-6
"""Relative improvement over HDMM's total variance for ``hdmm`` to return the residual plan."""

SERIAL_BLAS_MAX_N = 256
"""When every attribute has fewer values, HDMM's work in this process (the analyses
between task rounds, in-process tasks, the final check) uses one BLAS thread: its
matrices are small, and threads on them cost more than they save, most of all when
the cores are busy (with the cluster's workers or anything else)."""


def _spent(privacy: Budget | None, strategy: str) -> Budget:
    """``privacy``, which only strategy ``"fitness"`` may leave out (it finds the budget)."""
    if privacy is None:
        raise BudgetTypeError(
            f"strategy {strategy!r} needs a privacy budget (PureDP, zCDP or ApproxDP); "
            "only strategy 'fitness' finds the least budget for privacy=None"
        )
    return privacy


def verified_loss(terms: KronTerms, cand: Candidate, norm: int) -> float:
    """``||A||_p^2 ||W A^+||_F^2`` of a candidate, computed by :mod:`.error` from scratch."""
    sens = float(cand.strategy.sensitivity(norm))
    try:
        return sens * sens * ErrorAnalysis(terms, cand.strategy, groups=cand.groups).total()
    except ValueError:  # the candidate does not support the workload
        return math.inf


def _attr_names(terms: KronTerms, domain: Domain | None) -> list[str]:
    if domain is not None:
        return list(domain.attrs)
    return [f"attr{chr(97 + i % 26)}" for i in range(terms.d)]


def _baseline(
    name: str,
    workload: LinearQuery,
    sizes: tuple[int, ...],
    domain: Domain | None,
    norm: int,
    options: dict[str, Any],
) -> LinearQuery:
    from dpdask.strategy import baselines

    where = domain if domain is not None else sizes
    if name == "identity":
        return baselines.identity(where)
    if name == "workload":
        return baselines.workload(workload)
    if name == "hierarchical":
        return baselines.hierarchical(where, **options)
    if name == "hb":
        return baselines.hb(where)
    if name == "wavelet":
        return baselines.wavelet(where)
    if name == "convex":
        if norm == 1:
            raise PlanError("the convex (CA) optimum is defined for Gaussian noise only")
        return baselines.convex_ca(workload, **options)
    raise PlanError(
        f"unknown strategy {name!r}; choose 'hdmm', 'fitness', 'residual' or one of {BASELINES}"
    )


def _residual_if_better(plan: Plan, domain: Domain | None) -> Plan:
    """The residual plan of a marginal workload when it beats HDMM's ``plan``, else ``plan``."""
    from dpdask.strategy.residual import as_marginals, plan_residual

    marg = as_marginals(plan.workload, plan.sizes)
    if marg is None or marg.m < 2:  # one marginal: measuring it is optimal, HDMM finds it
        return plan
    res = plan_residual(plan.workload, plan.privacy, domain=domain, template="hdmm-residual")
    hdmm = plan.expected_error()
    if res.expected_error() >= hdmm * (1 - RESIDUAL_MARGIN):
        return plan
    res.info.update(
        {"hdmm_template": plan.template, "hdmm_expected_error": hdmm, "hdmm": plan.info}
    )
    return res


def select(
    workload: LinearQuery,
    privacy: Budget | None,
    strategy: str = "hdmm",
    *,
    domain: Domain | None = None,
    restarts: int = 3,
    client: Any = None,
    seed: int = 0,
    templates: Sequence[str] | None = None,
    p: int | None = None,
    ftol: float = 1e-5,
    model: str = "central",
    weights: Mapping[str, float] | str | None = None,
    **options: Any,
) -> Plan:
    """Choose the strategy to measure for ``workload`` under ``privacy``.

    Parameters
    ----------
    workload : LinearQuery
        The queries to answer: a :class:`~dpdask.linalg.Kron`, a
        :class:`~dpdask.linalg.VStack` of them, or any operator on one attribute.
    privacy : PureDP, zCDP, ApproxDP or None
        The budget: pure DP gets Laplace noise (L1 sensitivity), the others
        Gaussian noise (L2 sensitivity). ``None`` only with ``strategy="fitness"``:
        the least budget that meets the variance targets.
    strategy : str
        ``"hdmm"`` (optimise), ``"fitness"`` (per-query variance targets, paper 000;
        options ``targets``, ``basis`` and those of
        :func:`dpdask.strategy.fitness.solve`; returns a
        :class:`~dpdask.strategy.fitness.FitnessPlan`), or a baseline:
        ``"identity"``, ``"workload"``, ``"hierarchical"`` (option ``branching``),
        ``"hb"``, ``"wavelet"``, ``"convex"`` (the CA optimum; Gaussian, small domains),
        or ``"residual"`` (marginal workloads, Gaussian noise; options ``objective``
        ``"sum"``/``"max"``/``"targets"``, ``targets``, ``gap`` of
        :func:`dpdask.strategy.residual.plan_residual`; returns a
        :class:`~dpdask.strategy.residual.ResidualPlan`). ``"hdmm"`` returns the
        residual plan (sum of variances) for workloads of two or more marginals
        under Gaussian noise, when ``templates`` is not given and it is better.
    domain : Domain, optional
        The data domain (attribute names for keys and labels; sizes checked).
    restarts : int
        Random starts per template.
    client : distributed.Client, optional
        Run the optimisation tasks there (default: Dask's default scheduler,
        which is the active distributed client if any, else threads).
    seed : int
        Seed of the random starts (the result is a function of the inputs and the seed).
    templates : sequence of str, optional
        HDMM templates to try (see :data:`TEMPLATES`).
    p : int, optional
        Rows of the p-Identity parameter matrices.
    ftol : float
        Relative tolerance of the optimisers.
    model : {"central"}
        Only the central model is planned here. The local model (every person
        randomizes their own record, paper 002) is planned by
        :func:`dpdask.ldp.local_plan.select_local`; ``model="local"`` raises a
        :class:`~dpdask.errors.PlanError` that says so.
    weights : mapping of str to float, or str, optional
        HDMM only: per-query-group weights (a group's squared error counts ``w``
        times; :mod:`dpdask.strategy.weights`), or a preset name (``"pl94"``).
    **options
        Options of the baseline strategy; ``"tda-2020"`` (the Census Bureau's 2020
        production strategy, :mod:`dpdask.strategy.tda2020`) takes ``level``, and
        ``"fitness"`` takes ``targets="tda-2020"`` with ``level`` (and ``persons``,
        the persons budget the baseline spends when ``privacy`` is ``None``).

    Returns
    -------
    Plan

    Raises
    ------
    PlanError
        For ``model="local"`` or any model other than ``"central"``, an unknown
        strategy, or a workload no strategy of the kind asked for supports.
    BudgetTypeError
        If ``privacy`` is not a budget (``None`` only with ``strategy="fitness"``).

    Examples
    --------
    >>> from dpdask.linalg import Prefix
    >>> from dpdask.privacy import PureDP
    >>> plan = select(Prefix(64), PureDP(1), restarts=1)
    >>> plan.mechanism
    'laplace'
    >>> plan.expected_error() < select(Prefix(64), PureDP(1), "identity").expected_error()
    True
    """
    if model == "local":
        raise PlanError(
            "dpdask.select plans the central model; plan a local-model collection with "
            "dpdask.ldp.local_plan.select_local(workload, privacy, ...)"
        )
    if model != "central":
        raise PlanError(f"model must be 'central', got {model!r}")
    named_targets = options.get("targets")  # a name, or one target per query (an array)
    if strategy == "tda-2020" or (
        strategy == "fitness" and isinstance(named_targets, str) and named_targets == "tda-2020"
    ):
        from dpdask.strategy import tda2020

        if strategy == "tda-2020":
            return tda2020.tda2020_plan(
                workload, _spent(privacy, strategy), domain=domain, **options
            )
        return tda2020.fitness_plan(workload, privacy, domain=domain, **options)
    if weights is not None and strategy != "hdmm":
        raise PlanError("weights are an option of strategy 'hdmm'")
    if strategy == "fitness":
        from dpdask.strategy.fitness import fitness_plan

        return fitness_plan(workload, privacy, domain=domain, client=client, **options)
    if strategy == RESIDUAL:
        from dpdask.strategy.residual import plan_residual

        return plan_residual(workload, privacy, domain=domain, **options)
    budget = _spent(privacy, strategy)
    norm = MECHANISM_NORM[mechanism_for(budget)]  # the one budget -> norm mapping
    sizes = domain.shape if domain is not None else None
    if strategy == "hdmm" and weights is not None:
        from dpdask.strategy.weights import weighted_workload

        terms = kron_terms(weighted_workload(workload, weights), sizes)
    else:
        terms = kron_terms(workload, sizes)
    names = _attr_names(terms, domain)
    if strategy == "hdmm":
        with blas_limit(1 if max(terms.sizes) < SERIAL_BLAS_MAX_N else None):
            cands = optimize(
                terms,
                norm,
                templates=templates,
                restarts=restarts,
                seed=seed,
                client=client,
                names=names,
                p=p,
                ftol=ftol,
            )
            if not cands:
                raise PlanError("no template applies to this workload")
            # rank by an independent evaluation, not by the optimisers' own bookkeeping
            checked = {c.name: verified_loss(terms, c, norm) for c in cands}
        cands = [c for c in cands if math.isfinite(checked[c.name])]
        if not cands:
            raise PlanError("no template found a strategy that supports the workload")
        best = min(cands, key=lambda c: checked[c.name])
        info = {
            "templates": {k: (v if math.isfinite(v) else None) for k, v in checked.items()},
            "restarts": int(restarts),
            "seed": int(seed),
            "optimisation_wall_time_s": float(cands[0].details.get("wall_time_s", 0.0)),
            **{k: v for k, v in best.details.items() if k != "wall_time_s"},
        }
        if weights is not None:
            from dpdask.strategy.weights import group_weights

            info["weights"] = group_weights(weights)
        plan = Plan(
            workload,
            best.strategy,
            budget,
            domain=domain,
            groups=best.groups,
            template=f"hdmm-{best.name}",
            info=info,
            sizes=terms.sizes,
        )
        if norm == 2 and templates is None and weights is None:
            return _residual_if_better(plan, domain)
        return plan
    A = _baseline(strategy, workload, terms.sizes, domain, norm, options)
    return Plan(workload, A, budget, domain=domain, template=strategy, sizes=terms.sizes)
