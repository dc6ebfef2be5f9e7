"""Strategy selection: HDMM's templates with restarts on Dask, or a named baseline.

:func:`select` turns a workload and a privacy budget into a :class:`Plan`. With
``strategy="hdmm"`` it runs the templates that fit the workload's structure,
each from several random starts, and keeps the strategy of least expected error:

=====================  ====================================================
workload               templates tried
=====================  ====================================================
one attribute          OPT_0 (p-Identity)
one Kronecker term     OPT_x (one OPT_0 per attribute, independent)
union of terms         OPT_x, OPT_+ (terms grouped by the attributes they
                       do not total over), OPT_M, and the identity
=====================  ====================================================

All optimisation problems of one call are independent Dask tasks (see
:mod:`._tasks`): the restarts of OPT_0, OPT_x and OPT_M, and, where a Kronecker
term's factors do not interact, one task per attribute and restart
(``optimize-factor-<attribute>-<token>``). The best restart is kept per
independent piece: per attribute for a single Kronecker term (its error is the
product of the factors'), per group for OPT_+ (its error increases with every
group's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpdask.domain import Domain
from dpdask.linalg import Identity, Kron, LinearQuery, VStack
from dpdask.privacy import ApproxDP, Budget, PureDP, zCDP
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import inverse_gram
from dpdask.strategy._marginals import WeightedMarginals
from dpdask.strategy._optimize import (
    FactorResult,
    budget_split,
    default_p,
    factor_kind,
    marginals_spectrum,
    opt_0,
    opt_kron,
    opt_marginals,
)
from dpdask.strategy._pidentity import PIdentity
from dpdask.strategy._tasks import Task, run_tasks
from dpdask.strategy._terms import KronTerms, kron_terms
from dpdask.strategy.error import ErrorAnalysis
from dpdask.strategy.plan import Plan

__all__ = ["BASELINES", "TEMPLATES", "Candidate", "optimize", "select"]

TEMPLATES = ("pidentity", "kron", "union", "marginals", "identity")
BASELINES = ("identity", "workload", "hierarchical", "hb", "wavelet", "convex")


def sensitivity_norm(privacy: Budget) -> int:
    """1 for pure DP (Laplace noise), 2 for zCDP and approximate DP (Gaussian noise)."""
    if isinstance(privacy, PureDP):
        return 1
    if isinstance(privacy, zCDP | ApproxDP):
        return 2
    raise TypeError(
        f"privacy must be a dpdask.privacy budget (PureDP, zCDP or ApproxDP), got {privacy!r}"
    )


@dataclass
class Candidate:
    """One template's best strategy.

    ``loss`` is ``||A||_p^2 ||W A^+||_F^2`` (the error per unit noise variance at
    sensitivity 1) as the optimiser computed it.
    """

    name: str
    strategy: LinearQuery
    loss: float
    groups: list[list[int]] | None = None
    details: dict = field(default_factory=dict)


def _attr_names(terms: KronTerms, domain: Domain | None) -> list[str]:
    if domain is not None:
        return list(domain.attrs)
    return [f"attr{chr(ord('a') + i % 26)}" for i in range(terms.d)]


def default_templates(terms: KronTerms) -> list[str]:
    """The templates :func:`optimize` tries by default for this workload."""
    if terms.d == 1:
        return ["pidentity"]
    if terms.k == 1:
        return ["kron"]
    return ["kron", "union", "marginals", "identity"]


def group_terms(terms: KronTerms) -> list[list[int]]:
    """Terms grouped by the set of attributes on which they ask more than the total."""
    groups: dict[tuple[bool, ...], list[int]] = {}
    for j in range(terms.k):
        sig = tuple(factor_kind(terms.subset([j]), i) != "total" for i in range(terms.d))
        groups.setdefault(sig, []).append(j)
    return list(groups.values())


class _Book:
    """Bookkeeping of the tasks of one :func:`optimize` call."""

    def __init__(self) -> None:
        self.tasks: list[Task] = []

    def add(self, task: Task) -> int:
        self.tasks.append(task)
        return len(self.tasks) - 1


def _factor_tasks(
    book: _Book,
    terms: KronTerms,
    names: Sequence[str],
    seeds: Sequence[int],
    norm: int,
    p: int | None,
    ftol: float,
) -> list[tuple[str, list[int]]]:
    """Per-attribute OPT_0 tasks for a single Kronecker term: (kind, task ids) per attribute."""
    out = []
    for i in range(terms.d):
        kind = factor_kind(terms, i)
        if kind != "pidentity":
            out.append((kind, []))
            continue
        G = terms.gram(0, i)
        pp = default_p(terms.sizes[i], norm) if p is None else min(p, terms.sizes[i])
        ids = [
            book.add(
                Task(
                    ["factor", names[i]],
                    opt_0,
                    (G, pp),
                    {"norm": norm, "seed": int(s), "ftol": ftol},
                )
            )
            for s in seeds
        ]
        out.append(("pidentity", ids))
    return out


def _reduce_factors(
    terms: KronTerms, plan: list[tuple[str, list[int]]], results: list, norm: int
) -> tuple[Kron, float, list[int]]:
    """Best restart per attribute; the term's loss is the product of the factors'."""
    facs, loss, iters = [], terms.weights[0] ** 2, []
    for i, (kind, ids) in enumerate(plan):
        n = terms.sizes[i]
        if kind != "pidentity":
            facs.append(FactorResult(kind, n).strategy())
            loss *= inverse_gram(facs[-1]).trace(terms.gram(0, i))
            continue
        best = min((results[t] for t in ids), key=lambda r: r[1])
        facs.append(FactorResult("pidentity", n, best[0], norm).strategy())
        loss *= best[1]
        iters.append(int(best[2]))
    return Kron(facs), float(loss), iters


def optimize(
    terms: KronTerms,
    norm: int = 1,
    *,
    templates: Sequence[str] | None = None,
    restarts: int = 3,
    seed: int = 0,
    client: Any = None,
    names: Sequence[str] | None = None,
    p: int | None = None,
    ftol: float = 1e-5,
) -> list[Candidate]:
    """Run HDMM's templates on a workload; one :class:`Candidate` per template.

    Parameters
    ----------
    terms : KronTerms
        The workload as Kronecker terms.
    norm : {1, 2}
        Sensitivity norm (1: Laplace, 2: Gaussian).
    templates : sequence of str, optional
        Among :data:`TEMPLATES` (default :func:`default_templates`).
    restarts : int
        Random starts per template (per attribute or group where they are independent).
    seed : int
        Seed of all random starts.
    client : distributed.Client, optional
        Where to run the tasks (default: Dask's default scheduler).
    names : sequence of str, optional
        Attribute names for task keys and labels.
    p : int, optional
        Rows of every p-Identity's ``Theta`` (default :func:`default_p` per attribute).
    ftol : float
        Relative tolerance of the L-BFGS runs.
    """
    if restarts < 1:
        raise ValueError("restarts must be at least 1")
    templates = list(default_templates(terms) if templates is None else templates)
    for t in templates:
        if t not in TEMPLATES:
            raise ValueError(f"unknown template {t!r}; choose from {TEMPLATES}")
    names = list(names) if names is not None else _attr_names(terms, None)
    seeds = [int(s) for s in np.random.SeedSequence(seed).generate_state(restarts)]
    book = _Book()
    todo: list[tuple[str, Any]] = []
    t0 = time.perf_counter()
    for tpl in templates:
        if tpl == "pidentity":
            if terms.d != 1:
                raise ValueError("the p-Identity template needs a one-attribute workload")
            G = _combined_gram(terms)
            pp = default_p(terms.sizes[0], norm) if p is None else p
            ids = [
                book.add(
                    Task(
                        ["restart", "pidentity"],
                        opt_0,
                        (G, pp),
                        {"norm": norm, "seed": s, "ftol": ftol},
                    )
                )
                for s in seeds
            ]
            todo.append((tpl, ids))
        elif tpl == "kron":
            if terms.k == 1:
                todo.append(
                    (tpl, ("factors", _factor_tasks(book, terms, names, seeds, norm, p, ftol)))
                )
            else:
                ps = None if p is None else [p] * terms.d
                ids = [
                    book.add(
                        Task(
                            ["restart", "kron"],
                            opt_kron,
                            (terms,),
                            {"norm": norm, "seed": s, "ps": ps, "ftol": ftol},
                        )
                    )
                    for s in seeds
                ]
                todo.append((tpl, ("restarts", ids)))
        elif tpl == "union":
            groups = group_terms(terms)
            if len(groups) < 2:
                continue
            plans = []
            for g in groups:
                sub = terms.subset(g)
                if sub.k == 1:
                    plans.append(
                        (g, sub, "factors", _factor_tasks(book, sub, names, seeds, norm, p, ftol))
                    )
                else:
                    words = ["group"] + [
                        names[i] for i in range(terms.d) if factor_kind(sub, i) != "total"
                    ]
                    ps = None if p is None else [p] * terms.d
                    ids = [
                        book.add(
                            Task(
                                words,
                                opt_kron,
                                (sub,),
                                {"norm": norm, "seed": s, "ps": ps, "ftol": ftol},
                            )
                        )
                        for s in seeds
                    ]
                    plans.append((g, sub, "restarts", ids))
            todo.append((tpl, plans))
        elif tpl == "marginals":
            h = marginals_spectrum(terms)
            ids = [
                book.add(
                    Task(
                        ["restart", "marginals"],
                        opt_marginals,
                        (terms,),
                        {"norm": norm, "seed": s, "h": h},
                    )
                )
                for s in seeds
            ]
            todo.append((tpl, ids))
        elif tpl == "identity":
            todo.append((tpl, None))
    results = run_tasks(book.tasks, client)
    elapsed = time.perf_counter() - t0
    out = []
    for tpl, spec in todo:
        cand = _reduce(tpl, spec, results, terms, norm, names)
        cand.details["wall_time_s"] = elapsed
        out.append(cand)
    return out


def _combined_gram(terms: KronTerms) -> Gram:
    return Gram.combine(terms.weights**2, [terms.gram(j, 0) for j in range(terms.k)])


def _reduce(
    tpl: str, spec: Any, results: list, terms: KronTerms, norm: int, names: Sequence[str]
) -> Candidate:
    if tpl == "pidentity":
        best = min((results[t] for t in spec), key=lambda r: r[1])
        return Candidate(
            tpl,
            PIdentity(best[0], norm),
            float(best[1]),
            details={"iterations": int(best[2]), "p": int(best[0].shape[0])},
        )
    if tpl == "kron":
        how, payload = spec
        if how == "factors":
            A, loss, iters = _reduce_factors(terms, payload, results, norm)
            return Candidate(tpl, A, loss, details={"iterations": iters})
        best = min((results[t] for t in payload), key=lambda r: r.loss)
        return Candidate(tpl, best.strategy(), best.loss, details={"sweeps": best.sweeps})
    if tpl == "union":
        parts, errors, groups, labels = [], [], [], []
        for g, sub, how, payload in spec:
            if how == "factors":
                A, loss, _ = _reduce_factors(sub, payload, results, norm)
            else:
                best = min((results[t] for t in payload), key=lambda r: r.loss)
                A, loss = best.strategy(), best.loss
            parts.append(A)
            errors.append(loss)
            groups.append(list(g))
            active = [names[i] for i in range(terms.d) if factor_kind(sub, i) != "total"]
            labels.append(" x ".join(active) if active else "total")
        weights, loss = budget_split(errors, norm)
        return Candidate(
            tpl,
            VStack(parts, weights=weights, names=labels),
            loss,
            groups,
            details={"group_errors": [float(e) for e in errors]},
        )
    if tpl == "marginals":
        best = min((results[t] for t in spec), key=lambda r: r.loss)
        A = WeightedMarginals(terms.sizes, best.theta, names)
        return Candidate(tpl, A, best.loss, details={"iterations": best.nit})
    # identity
    A = Kron([Identity(n) for n in terms.sizes]) if terms.d > 1 else Identity(terms.sizes[0])
    return Candidate(tpl, A, ErrorAnalysis(terms, A).total())


def _baseline(
    name: str,
    workload: LinearQuery,
    sizes: tuple[int, ...],
    domain: Domain | None,
    norm: int,
    options: dict,
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
            raise ValueError("the convex (CA) optimum is defined for Gaussian noise only")
        return baselines.convex_ca(workload, **options)
    raise ValueError(f"unknown strategy {name!r}; choose 'hdmm' or one of {BASELINES}")


def select(
    workload: LinearQuery,
    privacy: Budget,
    strategy: str = "hdmm",
    *,
    domain: Domain | None = None,
    restarts: int = 3,
    client: Any = None,
    seed: int = 0,
    templates: Sequence[str] | None = None,
    p: int | None = None,
    ftol: float = 1e-5,
    **options: Any,
) -> Plan:
    """Choose the strategy to measure for ``workload`` under ``privacy``.

    Parameters
    ----------
    workload : LinearQuery
        The queries to answer: a :class:`~dpdask.linalg.Kron`, a
        :class:`~dpdask.linalg.VStack` of them, or any operator on one attribute.
    privacy : PureDP, zCDP or ApproxDP
        The budget: pure DP gets Laplace noise (L1 sensitivity), the others
        Gaussian noise (L2 sensitivity).
    strategy : str
        ``"hdmm"`` (optimise), or a baseline: ``"identity"``, ``"workload"``,
        ``"hierarchical"`` (option ``branching``), ``"hb"``, ``"wavelet"``,
        ``"convex"`` (the CA optimum; Gaussian, small domains).
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
    **options
        Options of the baseline strategy.

    Returns
    -------
    Plan

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
    norm = sensitivity_norm(privacy)
    sizes = domain.shape if domain is not None else None
    terms = kron_terms(workload, sizes)
    names = _attr_names(terms, domain)
    if strategy == "hdmm":
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
            raise ValueError("no template applies to this workload")
        best = min(cands, key=lambda c: c.loss)
        info = {
            "templates": {c.name: float(c.loss) for c in cands},
            "restarts": int(restarts),
            "seed": int(seed),
            "optimisation_wall_time_s": float(cands[0].details.get("wall_time_s", 0.0)),
            **{k: v for k, v in best.details.items() if k != "wall_time_s"},
        }
        return Plan(
            workload,
            best.strategy,
            privacy,
            domain=domain,
            groups=best.groups,
            template=f"hdmm-{best.name}",
            info=info,
            sizes=terms.sizes,
        )
    A = _baseline(strategy, workload, terms.sizes, domain, norm, options)
    return Plan(workload, A, privacy, domain=domain, template=strategy, sizes=terms.sizes)
