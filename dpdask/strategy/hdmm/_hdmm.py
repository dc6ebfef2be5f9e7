"""HDMM's templates as Dask tasks: build the problems, run them, keep the best.

=====================  ====================================================
workload               templates tried by default
=====================  ====================================================
one attribute          ``pidentity`` (OPT_0)
one Kronecker term     ``kron`` (OPT_x: one OPT_0 per attribute, independent)
union of marginals     ``marginals`` (OPT_M), ``kron``, ``identity``
other unions of terms  ``kron``, ``union`` (OPT_+), ``marginals`` (OPT_M),
                       ``identity``
=====================  ====================================================

A union of marginals (every factor the identity or the total) skips OPT_+: its
factor Gram matrices are combinations of ``I`` and ``J``, for which the
p-Identity optima are close to ``[I; c 1^T]``, so the Kronecker strategies and
their unions are (near) weighted marginals, which OPT_M optimises directly at a
cost per evaluation independent of the domain's size, where OPT_+'s exact union
analysis works with vectors over all the cells.

The templates are run as independent *pieces* with restarts and successive halving,
all templates together, by :mod:`._pieces`.

OPT_+ here is a union of two Kronecker strategies, split on an attribute ``a``:
part 1 answers the terms that ask only the total of ``a`` (its factor on ``a`` is
the total), part 2 the rest. Part 1 also answers the total-of-``a`` component of
the other terms, so part 2 is fitted to their residual: each term's factor on
``a`` projected onto ``I - J/n_a``. The union's error is exact (least squares over
both parts, :mod:`dpdask.strategy._pair`) and the budget split between the parts is optimised on
it. Each attribute that splits the terms is screened with one start per part
(run to convergence: short runs rank the splits wrongly on SF1), and the best
split gets the restarts. On domains too large for vectors over
the cells, the parts answer their own terms (``groups``; block reconstruction)
with the closed-form budget split.

Closed-form members. Every template's result is compared with the members of its
family among Identity, Total and the workload's own marginals
(:mod:`._closed_form`), and replaced by the best of them when that is better
(``details["closed_form"]`` then names it); OPT_M also starts from them.

In process. Problems under :data:`INLINE_MAX_CELLS` cells run their tasks in the
calling thread (:func:`._tasks.run_tasks` with ``inline=True``), whatever the
client: their tasks take milliseconds, less than scheduling them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpdask.errors import PlanError
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, VStack
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import inverse_gram
from dpdask.strategy._marginals import WeightedMarginals
from dpdask.strategy._pair import PAIR_MAX_CELLS, PairAnalysis
from dpdask.strategy._terms import KronTerms
from dpdask.strategy.analysis import ErrorAnalysis
from dpdask.strategy.hdmm._closed_form import MAX_ATTRIBUTES, Member, members
from dpdask.strategy.hdmm._opt_kron import FactorResult, factor_kind
from dpdask.strategy.hdmm._opt_marginals import marginals_spectrum
from dpdask.strategy.hdmm._optimize import budget_split
from dpdask.strategy.hdmm._pieces import (
    SHORT,
    Context,
    ConvexPiece,
    KronPiece,
    MarginalsPiece,
    Piece,
    Steps,
    TreePiece,
    drive_all,
    lockstep,
    opt0_piece,
    opt0_strategy,
    solve_pieces,
)

__all__ = ["INLINE_MAX_CELLS", "SHORT", "TEMPLATES", "Candidate", "default_templates", "optimize"]

TEMPLATES = ("pidentity", "kron", "union", "marginals", "identity")

INLINE_MAX_CELLS = 100_000
"""Domains with fewer cells run their optimisation tasks in the calling thread."""


@dataclass
class Candidate:
    """One template's best strategy.

    ``loss`` is ``||A||_p^2 ||W A^+||_F^2``: the expected total squared error per
    unit of noise variance at sensitivity 1.
    """

    name: str
    strategy: LinearQuery
    loss: float
    groups: list[list[int]] | None = None
    details: dict[str, Any] = field(default_factory=dict)


def default_templates(terms: KronTerms) -> list[str]:
    """The templates :func:`optimize` tries by default for this workload."""
    if terms.d == 1:
        return ["pidentity"]
    if terms.k == 1:
        return ["kron"]
    if all(
        factor_kind(terms.subset([j]), i) != "pidentity"
        for j in range(terms.k)
        for i in range(terms.d)
    ):
        return ["marginals", "kron", "identity"]
    return ["kron", "union", "marginals", "identity"]


# ---------------------------------------------------------------------------
# Kronecker strategies on a set of terms
# ---------------------------------------------------------------------------
def _kron_pieces(
    ctx: Context, terms: KronTerms, words: list[str]
) -> list[tuple[str, Piece | None]]:
    """``[("factors", ...)]`` per attribute for one term, else one OPT_x piece."""
    if terms.k == 1:
        out: list[tuple[str, Piece | None]] = []
        for i in range(terms.d):
            kind = factor_kind(terms, i)
            if kind != "pidentity":
                out.append((kind, None))
            else:
                piece = opt0_piece(ctx, terms.gram(0, i), ["factor", ctx.names[i]])
                out.append(("pidentity", piece))
        return out
    ps = [ctx.p_for(n) for n in terms.sizes]
    return [("kron", KronPiece(terms, ps, ctx.norm, ctx.ftol, words))]


def _kron_assemble(
    terms: KronTerms, layout: list[tuple[str, Piece | None]], results: list[Any], norm: int
) -> tuple[Kron, float]:
    if layout[0][0] == "kron":
        best = results[0]
        return best.strategy(), float(best.loss)
    facs, loss, k = [], float(terms.weights[0] ** 2), 0
    for i, (kind, _) in enumerate(layout):
        if kind != "pidentity":
            A = FactorResult(kind, terms.sizes[i]).strategy()
            loss *= inverse_gram(A).trace(terms.gram(0, i))
        else:
            A = opt0_strategy(results[k], norm)
            loss *= results[k][1]
            k += 1
        facs.append(A)
    return Kron(facs), loss


def _solve_kron(ctx: Context, terms: KronTerms, words: list[str]) -> Steps[tuple[Kron, float]]:
    layout = _kron_pieces(ctx, terms, words)
    pieces = [pc for _, pc in layout if pc is not None]
    results = yield from solve_pieces(ctx, pieces)
    return _kron_assemble(terms, layout, results, ctx.norm)


# ---------------------------------------------------------------------------
# OPT_+
# ---------------------------------------------------------------------------
def splits(terms: KronTerms) -> list[tuple[int, list[int], list[int]]]:
    """``(a, g1, g2)``: the terms asking only the total of attribute ``a``, and the others."""
    out, seen = [], set()
    for a in range(terms.d):
        g1 = [j for j in range(terms.k) if factor_kind(terms.subset([j]), a) == "total"]
        g2 = [j for j in range(terms.k) if j not in set(g1)]
        if g1 and g2 and tuple(g1) not in seen:
            seen.add(tuple(g1))
            out.append((a, g1, g2))
    return out


def residual_terms(terms: KronTerms, index: Sequence[int], a: int) -> KronTerms:
    """Terms ``index`` with their factor on attribute ``a`` projected onto ``I - J/n_a``."""
    sub = terms.subset(index)
    facs = []
    for fs in sub.factors:
        M = fs[a].dense()
        fs = list(fs)
        fs[a] = Dense(M - M.mean(axis=1, keepdims=True))
        facs.append(fs)
    return KronTerms(sub.sizes, sub.weights, facs, sub.names)


_Split = tuple[int, list[int], list[int]]
_Union = tuple[VStack, float, list[list[int]] | None]


def _union(ctx: Context, split: _Split, seeds: Sequence[int] | None = None) -> Steps[_Union]:
    """The union on ``split``: its strategy, loss and groups (a task generator)."""
    a, g1, g2 = split
    terms, word = ctx.terms, ctx.names[a]
    exact = math.prod(terms.sizes) <= PAIR_MAX_CELLS
    part1 = terms.subset(g1)
    part2 = residual_terms(terms, g2, a) if exact else terms.subset(g2)
    l1 = _kron_pieces(ctx, part1, ["part", "total", word])
    l2 = _kron_pieces(ctx, part2, ["part", "detail", word])
    p1 = [pc for _, pc in l1 if pc is not None]
    p2 = [pc for _, pc in l2 if pc is not None]
    results = yield from solve_pieces(ctx, p1 + p2, seeds)
    K1, e1 = _kron_assemble(part1, l1, results[: len(p1)], ctx.norm)
    K2, e2 = _kron_assemble(part2, l2, results[len(p1) :], ctx.norm)
    if exact:
        c1, c2, loss = PairAnalysis(terms, K1, K2).best_split(ctx.norm)
        return VStack([K1, K2], weights=[c1, c2]), loss, None
    e2 = ErrorAnalysis(terms.subset(g2), K2).total()
    w, loss = budget_split([e1, e2], ctx.norm)
    return VStack([K1, K2], weights=[float(c) for c in w]), loss, [list(g1), list(g2)]


# ---------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------
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
        Random starts of every piece (see the module docstring).
    seed : int
        Seed of all random starts.
    client : distributed.Client, optional
        Where to run the tasks (default: Dask's default scheduler); problems under
        :data:`INLINE_MAX_CELLS` cells run in the calling thread regardless.
    names : sequence of str, optional
        Attribute names, for task keys.
    p : int, optional
        Rows of every p-Identity's ``Theta`` (default :func:`default_p` per attribute).
    ftol : float
        Relative tolerance of the optimisers' full runs.
    """
    if restarts < 1:
        raise PlanError("restarts must be at least 1")
    templates = list(default_templates(terms) if templates is None else templates)
    for t in templates:
        if t not in TEMPLATES:
            raise PlanError(f"unknown template {t!r}; choose from {TEMPLATES}")
    if "pidentity" in templates and terms.d != 1:
        raise PlanError("the p-Identity template needs a one-attribute workload")
    if names is None:
        names = [f"attr{chr(97 + i % 26)}" for i in range(terms.d)]
    seeds = [int(s) for s in np.random.SeedSequence(seed).generate_state(restarts)]
    inline = math.prod(terms.sizes) < INLINE_MAX_CELLS
    ctx = Context(terms, norm, seeds, list(names), p, ftol, client, inline)
    t0 = time.perf_counter()
    gens = [_template(tpl, ctx) for tpl in templates]
    # OPT_+ has two stages of successive halving (screening, then restarts): first
    cands = drive_all(gens, client, inline, [int(t == "union") for t in templates])
    out = [c for c in cands if c is not None]
    _never_worse_than_closed_form(ctx, out)
    elapsed = time.perf_counter() - t0
    for c in out:
        c.details["wall_time_s"] = elapsed
        c.details["in_process"] = inline
    return out


def _members(ctx: Context) -> list[Member]:
    """The closed-form members of the families (:mod:`._closed_form`), or none for large ``d``."""
    if ctx.terms.d > MAX_ATTRIBUTES:
        return []
    return members(ctx.terms, marginals_spectrum(ctx.terms), ctx.norm)


def _never_worse_than_closed_form(ctx: Context, cands: list[Candidate]) -> None:
    """Replace, in place, every candidate that a closed-form member beats by that member."""
    found = [m for m in _members(ctx) if math.isfinite(m.loss)] if cands else []
    if not found:
        return
    for c in cands:
        family = [m for m in found if c.name == "marginals" or m.single]
        if c.name == "identity" or not family:
            continue
        best = min(family, key=lambda m: m.loss)
        if best.loss < c.loss:
            c.details = {"closed_form": best.name, "optimised_loss": float(c.loss)}
            c.strategy = best.strategy(ctx.terms, ctx.names)
            c.loss = best.loss
            c.groups = None


def _template(tpl: str, ctx: Context) -> Steps[Candidate | None]:
    """One template's best :class:`Candidate` (or ``None``), as a task generator."""
    terms, norm = ctx.terms, ctx.norm
    if tpl == "pidentity":
        G = Gram.combine(terms.weights**2, [terms.gram(j, 0) for j in range(terms.k)])
        piece = opt0_piece(ctx, G, ["restart", "pidentity"])
        res = (yield from solve_pieces(ctx, [piece]))[0]
        A = opt0_strategy(res, norm)
        details: dict[str, Any] = {"iterations": int(res[2])}
        if isinstance(piece, ConvexPiece):
            details.update(solver="convex", lower_bound=float(res[3]))
        else:
            details["p"] = int(res[0].shape[0])
        if isinstance(piece, TreePiece):
            details["solver"] = "hierarchical start"
        return Candidate(tpl, A, float(res[1]), details=details)
    if tpl == "kron":
        A, loss = yield from _solve_kron(ctx, terms, ["restart", "kron"])
        return Candidate(tpl, A, loss)
    if tpl == "union":
        cands = splits(terms)
        if not cands:
            return None
        screens = yield from lockstep([_union(ctx, s, ctx.seeds[:1]) for s in cands])
        screened = [(r[1], s) for r, s in zip(screens, cands, strict=True)]
        _, split = min(screened, key=lambda x: x[0])
        A, loss, groups = yield from _union(ctx, split)
        return Candidate(
            tpl,
            A,
            loss,
            groups,
            {
                "split_attribute": ctx.names[split[0]],
                "screened": {ctx.names[s[0]]: float(v) for v, s in screened},
            },
        )
    if tpl == "marginals":
        h = marginals_spectrum(terms)
        piece = MarginalsPiece(h, terms.sizes, norm, ["restart", "marginals"])
        starts = [m.theta for m in _members(ctx) if math.isfinite(m.loss)]
        best = (yield from solve_pieces(ctx, [piece], [*ctx.seeds, *starts]))[0]
        A = WeightedMarginals(terms.sizes, best.theta, ctx.names)
        return Candidate(tpl, A, float(best.loss), details={"iterations": int(best.nit)})
    A = Kron([Identity(n) for n in terms.sizes]) if terms.d > 1 else Identity(terms.sizes[0])
    return Candidate("identity", A, ErrorAnalysis(terms, A).total())
