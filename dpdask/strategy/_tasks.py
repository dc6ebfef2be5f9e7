"""Independent optimisation problems as Dask tasks with readable keys.

Restarts, per-factor problems and per-group problems do not depend on each other,
so :func:`run_tasks` submits them all at once: to the given
:class:`distributed.Client`, else to the scheduler set in ``dask.config`` or the
active distributed client, else one after the other in this process. (Threads in
one process lose to running in turn: the tasks are many small NumPy calls that
hold the GIL.)

BLAS threads. Each task runs with one BLAS thread unless it asks for more
(``Task.blas_threads=None``): BLAS threading on the small matrices of these
problems costs more than it saves, while a large OPT_0 gains from it. Keys read
``optimize-<what>-<token>``, for example ``optimize-factor-age-<token>`` or
``optimize-restart-marginals-<token>``; the token hashes the problem, so two
identical problems (the same factor Gram, ``p`` and seed) are solved once.

In process. ``run_tasks(..., inline=True)`` runs the tasks one after the other in
the calling thread, with no graph, no keys and no scheduler: HDMM does that for
problems under :data:`dpdask.strategy._hdmm.INLINE_MAX_CELLS` cells, whose tasks
take milliseconds and would spend most of their time being scheduled.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask.local
from dask.base import get_scheduler, tokenize
from threadpoolctl import ThreadpoolController

__all__ = ["Task", "key_word", "run_tasks"]

_NOT_LETTERS = re.compile(r"[^A-Za-z]+")


def key_word(name: str, fallback: str = "attr") -> str:
    """A key-safe word: the letters of ``name`` in lower case (digits and symbols dropped)."""
    word = _NOT_LETTERS.sub("", str(name)).lower()
    return word or fallback


@dataclass
class Task:
    """One problem: ``fn(*args, **kwargs)`` under the key prefix ``optimize-<words>``."""

    words: Sequence[str]
    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    blas_threads: int | None = 1

    @property
    def key(self) -> str:
        prefix = "-".join(["optimize", *(key_word(w) for w in self.words)])
        return (
            f"{prefix}-{tokenize(self.fn.__module__, self.fn.__qualname__, self.args, self.kwargs)}"
        )


class _Ref:
    """Placeholder for the ``index``-th shared input of a task."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Call:
    """An opaque task payload (so that Dask does not traverse the arguments)."""

    __slots__ = ("args", "blas_threads", "fn", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict, blas_threads: int | None):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.blas_threads = blas_threads


_CONTROLLER: ThreadpoolController | None = None


def _call(fn: Callable[..., Any], args: tuple, kwargs: dict, blas_threads: int | None) -> Any:
    """``fn(*args, **kwargs)`` with at most ``blas_threads`` BLAS threads (``None``: all)."""
    global _CONTROLLER
    if blas_threads is None:
        return fn(*args, **kwargs)
    if _CONTROLLER is None:  # scanning the loaded libraries costs milliseconds: once
        _CONTROLLER = ThreadpoolController()
    with _CONTROLLER.limit(limits=blas_threads, user_api="blas"):
        return fn(*args, **kwargs)


def _run(call: _Call, *shared: Any) -> Any:
    def fill(v: Any) -> Any:
        return shared[v.index] if isinstance(v, _Ref) else v

    args = tuple(fill(a) for a in call.args)
    kwargs = {k: fill(v) for k, v in call.kwargs.items()}
    return _call(call.fn, args, kwargs, call.blas_threads)


def _is_shared(v: Any) -> bool:
    """Large inputs that many tasks share: sent once as their own graph key."""
    from dpdask.strategy._gram import Gram
    from dpdask.strategy._terms import KronTerms

    return isinstance(v, KronTerms | Gram)


def _graph(tasks: Sequence[Task]) -> dict:
    dsk: dict[str, Any] = {}
    for t in tasks:
        if t.key in dsk:
            continue
        refs: list[str] = []

        def hoist(v: Any, refs: list[str] = refs) -> Any:
            if not _is_shared(v):
                return v
            key = f"strategy-input-{tokenize(v)}"
            dsk.setdefault(key, v)
            refs.append(key)
            return _Ref(len(refs) - 1)

        args = tuple(hoist(a) for a in t.args)
        kwargs = {k: hoist(v) for k, v in t.kwargs.items()}
        dsk[t.key] = (_run, _Call(t.fn, args, kwargs, t.blas_threads), *refs)
    return dsk


def _scheduler(client: Any) -> Callable[..., Any]:
    if client is not None:
        return client.get
    get = get_scheduler()  # dask.config's scheduler, or the active distributed client
    return get if get is not None else dask.local.get_sync


def run_tasks(tasks: Sequence[Task], client: Any = None, inline: bool = False) -> list[Any]:
    """Run the tasks and return their results in order.

    Parameters
    ----------
    tasks : sequence of Task
        The problems.
    client : distributed.Client, optional
        Where to run them (see the module docstring); ignored with ``inline``.
    inline : bool
        Run them one after the other in the calling thread, without Dask.

    Returns
    -------
    list
        One result per task.
    """
    if not tasks:
        return []
    if inline:
        return [_call(t.fn, tuple(t.args), dict(t.kwargs), t.blas_threads) for t in tasks]
    dsk = _graph(tasks)
    keys = list(dict.fromkeys(t.key for t in tasks))
    values = _scheduler(client)(dsk, keys)
    by_key = dict(zip(keys, values, strict=True))
    return [by_key[t.key] for t in tasks]
