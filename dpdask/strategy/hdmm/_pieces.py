"""HDMM's optimisation tasks: pieces, restarts with successive halving, batches.

All templates run together: each is a generator of task batches. In process (and
on Dask's local schedulers) every round's batches from all templates go to the
scheduler as one graph (:func:`lockstep`); on a distributed client each template
moves on as soon as its own batch is done (:func:`drive_all`), so that the workers
are not left waiting on another template's slowest task. A task run once (the key
hashes the problem) is not run again in a later round.

Pieces and restarts. A template is made of independent *pieces*: an OPT_0
problem, an OPT_x problem on several terms, an OPT_M problem; for a single
Kronecker term, one OPT_0 problem per attribute (its error is the product of the
factors'); for OPT_+, one OPT_x problem per part. Every piece is started from
``restarts`` random points, with successive halving: all starts run a short
budget (:data:`SHORT`), the best ``max(1, restarts // 8)`` continue to
convergence, and the best of those is kept. Each run is a task (:mod:`._tasks`),
all tasks of a stage are submitted together, keyed ``optimize-factor-age-<token>``,
``optimize-restart-kron-<token>`` and so on.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import numpy as np

from dpdask.linalg import LinearQuery
from dpdask.strategy._gram import Gram
from dpdask.strategy._terms import KronTerms
from dpdask.strategy._tridiag import uses_tridiagonal
from dpdask.strategy.convex import CONVEX_MAX_N
from dpdask.strategy.hdmm._opt0_tree import opt_0_tree, uses_tree
from dpdask.strategy.hdmm._opt_kron import KronResult, opt_kron
from dpdask.strategy.hdmm._opt_marginals import fit_marginals
from dpdask.strategy.hdmm._optimize import default_p, opt_0, opt_0_l2
from dpdask.strategy.hdmm._pidentity import PIdentity
from dpdask.strategy.hdmm._tasks import Task, distributed_client, run_tasks, submit_tasks

_T = TypeVar("_T")
Steps: TypeAlias = Generator[list[Task], list[Any], _T]
"""A task generator: yields lists of tasks, is sent their results, returns a ``_T``."""

__all__ = [
    "SHORT",
    "Context",
    "ConvexPiece",
    "KronPiece",
    "MarginalsPiece",
    "Opt0Piece",
    "Piece",
    "TreePiece",
    "drive",
    "drive_all",
    "lockstep",
    "opt0_piece",
    "opt0_strategy",
    "solve_pieces",
]

LARGE_OPT0 = 1 << 18
"""``n * p`` from which an OPT_0 task keeps all BLAS threads."""

SHORT = {"opt0_iter": 30, "kron_sweeps": 1, "kron_inner_iter": 15, "marginals_iter": 40}
"""Budget of the short runs of successive halving."""

CLOSED_FORM_JITTER = 0.01
"""OPT_M from a closed-form member starts at its weights plus this fraction of their largest
(a weight of exactly 0 has a zero gradient and would stay 0)."""


def loss_of(result: Any) -> float:
    return float(result[1]) if isinstance(result, tuple) else float(result.loss)


class Piece:
    words: list[str]
    once = False
    """One run, no restarts and no full stage (a convex problem)."""

    def short(self, seed: int) -> Task:
        raise NotImplementedError

    def full(self, result: Any) -> Task:
        raise NotImplementedError


@dataclass
class Opt0Piece(Piece):
    G: Gram
    p: int
    norm: int
    ftol: float
    words: list[str]

    @property
    def blas_threads(self) -> int | None:
        """All BLAS threads for a large problem, one for a small one (see :mod:`._tasks`)."""
        return None if self.G.n * self.p >= LARGE_OPT0 else 1

    def short(self, seed: int) -> Task:
        kw = {"norm": self.norm, "seed": seed, "ftol": self.ftol, "maxiter": SHORT["opt0_iter"]}
        return Task(self.words, opt_0, (self.G, self.p), kw, self.blas_threads)

    def full(self, result: Any) -> Task:
        return Task(
            self.words,
            opt_0,
            (self.G,),
            {"norm": self.norm, "theta0": result[0], "ftol": self.ftol},
            self.blas_threads,
        )


@dataclass
class ConvexPiece(Piece):
    """Gaussian OPT_0 as the convex program over ``X = A^T A`` (:func:`opt_0_l2`).

    All BLAS threads for the dense solver's ``O(n^3)`` products, one for
    :mod:`dpdask.strategy._tridiag`'s ``O(n)`` factorisations and ``O(n^2)`` eigendecompositions.
    """

    G: Gram
    words: list[str]
    once = True

    def short(self, seed: int) -> Task:
        threads = 1 if uses_tridiagonal(self.G) else None
        return Task(self.words, opt_0_l2, (self.G,), {}, threads)


@dataclass
class TreePiece(Piece):
    """Pure-DP OPT_0 on a large interval workload from a hierarchy (:func:`opt_0_tree`).

    One run: the start is not random. One BLAS thread: its products are sparse or
    ``p x p``, and its dense work is cumulative sums.
    """

    G: Gram
    ftol: float
    words: list[str]
    once = True

    def short(self, seed: int) -> Task:
        return Task(self.words, opt_0_tree, (self.G,), {"ftol": self.ftol})


def opt0_piece(ctx: Context, G: Gram, words: list[str]) -> Piece:
    """OPT_0 on ``G``: convex for Gaussian noise up to :data:`CONVEX_MAX_N` (and at any
    size for prefix and all-range workloads, :func:`uses_tridiagonal`); from a
    hierarchy for pure DP on large interval workloads (:func:`uses_tree`); else
    p-Identity from random starts."""
    if ctx.p is None and ctx.norm == 2 and (G.n <= CONVEX_MAX_N or uses_tridiagonal(G)):
        return ConvexPiece(G, ["convex", *words[1:]] if words[0] == "restart" else words)
    if ctx.p is None and uses_tree(G, ctx.norm):
        return TreePiece(G, ctx.ftol, ["tree", *words[1:]] if words[0] == "restart" else words)
    return Opt0Piece(G, ctx.p_for(G.n), ctx.norm, ctx.ftol, words)


def opt0_strategy(result: tuple[Any, ...], norm: int) -> LinearQuery:
    """The strategy of an OPT_0 result: a p-Identity's ``theta`` or a convex optimum."""
    x = result[0]
    return x if isinstance(x, LinearQuery) else PIdentity(x, norm)


@dataclass
class KronPiece(Piece):
    terms: KronTerms
    ps: list[int]
    norm: int
    ftol: float
    words: list[str]

    def short(self, seed: int) -> Task:
        kw = {
            "norm": self.norm,
            "seed": seed,
            "ps": self.ps,
            "ftol": self.ftol,
            "max_sweeps": SHORT["kron_sweeps"],
            "inner_maxiter": SHORT["kron_inner_iter"],
        }
        return Task(self.words, opt_kron, (self.terms,), kw)

    def full(self, result: KronResult) -> Task:
        return Task(
            self.words,
            opt_kron,
            (self.terms,),
            {"norm": self.norm, "start": result.factors, "ftol": self.ftol},
        )


@dataclass
class MarginalsPiece(Piece):
    h: np.ndarray
    sizes: tuple[int, ...]
    norm: int
    words: list[str]

    def short(self, seed: int | np.ndarray) -> Task:
        """A short run from a random start (``seed``) or from given weights."""
        kw: dict[str, Any] = {"norm": self.norm, "maxiter": SHORT["marginals_iter"]}
        if isinstance(seed, np.ndarray):
            kw["theta0"] = seed + CLOSED_FORM_JITTER * float(seed.max())
        else:
            kw["seed"] = seed
        return Task(self.words, fit_marginals, (self.h, self.sizes), kw)

    def full(self, result: Any) -> Task:
        return Task(
            self.words,
            fit_marginals,
            (self.h, self.sizes),
            {"norm": self.norm, "theta0": result.theta},
        )


@dataclass
class Context:
    terms: KronTerms
    norm: int
    seeds: list[int]
    names: list[str]
    p: int | None
    ftol: float
    client: Any
    inline: bool = False

    def p_for(self, n: int) -> int:
        return default_p(n, self.norm) if self.p is None else min(self.p, n)

    @property
    def keep(self) -> int:
        return max(1, len(self.seeds) // 8)


def solve_pieces(
    ctx: Context, pieces: Sequence[Piece], seeds: Sequence[Any] | None = None, full: bool = True
) -> Steps[list[Any]]:
    """Best result of each piece: short runs from every seed, then full runs of the best.

    A generator: it yields lists of tasks and receives their results (see :func:`drive`).
    """
    seeds = ctx.seeds if seeds is None else list(seeds)
    if not pieces:
        return []
    starts = [seeds[:1] if pc.once else seeds for pc in pieces]
    short = yield [pc.short(s) for pc, ss in zip(pieces, starts, strict=True) for s in ss]
    per_piece, k = [], 0
    for ss in starts:
        per_piece.append(short[k : k + len(ss)])
        k += len(ss)
    if not full:
        return [min(rs, key=loss_of) for rs in per_piece]
    tops = [
        [] if pc.once else sorted(rs, key=loss_of)[: ctx.keep]
        for pc, rs in zip(pieces, per_piece, strict=True)
    ]
    done = yield [pc.full(r) for pc, rs in zip(pieces, tops, strict=True) for r in rs]
    out, k = [], 0
    for pc, rs, first in zip(pieces, tops, per_piece, strict=True):
        if pc.once:
            out.append(first[0])
            continue
        out.append(min(done[k : k + len(rs)], key=loss_of))
        k += len(rs)
    return out


def lockstep(gens: Sequence[Steps[Any]]) -> Steps[list[Any]]:
    """Run several task generators together: each round's tasks go out as one batch."""
    out: list[Any] = [None] * len(gens)
    pending: dict[int, list[Task]] = {}
    for k, g in enumerate(gens):
        try:
            pending[k] = next(g)
        except StopIteration as stop:
            out[k] = stop.value
    while pending:
        order = list(pending)
        results = yield [t for k in order for t in pending[k]]
        nxt: dict[int, list[Task]] = {}
        pos = 0
        for k in order:
            chunk = results[pos : pos + len(pending[k])]
            pos += len(pending[k])
            try:
                nxt[k] = gens[k].send(chunk)
            except StopIteration as stop:
                out[k] = stop.value
        pending = nxt
    return out


def drive_all(
    gens: Sequence[Steps[Any]],
    client: Any,
    inline: bool = False,
    priorities: Sequence[int] | None = None,
) -> list[Any]:
    """Run several task generators to completion; their results in order.

    In process, or on a scheduler other than a distributed client, in
    :func:`lockstep`. On a distributed client each generator moves on as soon as its
    own tasks are done, with the others' still running: no round waits for the
    slowest task of another template, and the work between a generator's rounds
    (analyses in this process) overlaps the tasks on the workers. A round's tasks
    get the generator's priority (``priorities``, default 0) plus the number of
    its rounds before: the longest chains of rounds are kept moving, and the other
    generators' tasks fill the gaps.
    """
    remote = None if inline else distributed_client(client)
    if remote is None:
        return drive(lockstep(gens), client, inline)
    from distributed import as_completed

    out: list[Any] = [None] * len(gens)
    done: dict[str, Any] = {}  # results by key, as in :func:`drive`
    waiting: dict[int, tuple[list[Task], dict[str, Any]]] = {}
    owner: dict[Any, int] = {}
    rounds = [0] * len(gens) if priorities is None else [int(p) for p in priorities]
    flow = as_completed()  # type: ignore[no-untyped-call]

    def advance(k: int, sent: list[Any] | None) -> None:
        try:
            tasks = next(gens[k]) if sent is None else gens[k].send(sent)
        except StopIteration as stop:
            out[k] = stop.value
            return
        todo = list({t.key: t for t in tasks if t.key not in done}.values())
        futures = dict(
            zip((t.key for t in todo), submit_tasks(todo, remote, rounds[k]), strict=True)
        )
        rounds[k] += 1
        if not futures:
            advance(k, [done[t.key] for t in tasks])
            return
        waiting[k] = (tasks, futures)
        for f in futures.values():
            owner[f] = k
            flow.add(f)  # type: ignore[no-untyped-call]

    for k in range(len(gens)):
        advance(k, None)
    for f in flow:
        k = owner.pop(f)
        tasks, futures = waiting[k]
        if any(g in owner for g in futures.values()):
            continue
        del waiting[k]
        done.update(zip(futures, remote.gather(list(futures.values())), strict=True))
        advance(k, [done[t.key] for t in tasks])
    return out


def drive(gen: Steps[_T], client: Any, inline: bool = False) -> _T:
    """Run a task generator to completion, one :func:`run_tasks` call per batch.

    A task whose key was run before (the key hashes the problem: a union's screening
    run is also the first of its restarts) is not run again.
    """
    done: dict[str, Any] = {}
    result: _T
    try:
        tasks = next(gen)
    except StopIteration as stop:
        result = stop.value
        return result
    while True:
        todo = list({t.key: t for t in tasks if t.key not in done}.values())
        done.update(zip((t.key for t in todo), run_tasks(todo, client, inline=inline), strict=True))
        try:
            tasks = gen.send([done[t.key] for t in tasks])
        except StopIteration as stop:
            result = stop.value
            return result
