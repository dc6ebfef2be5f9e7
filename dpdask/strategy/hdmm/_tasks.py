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

Without waiting. :func:`submit_tasks` hands tasks to a distributed client and
returns their futures (for :func:`dpdask.strategy.hdmm._pieces.drive_all`).

In process. ``run_tasks(..., inline=True)`` runs the tasks one after the other in
the calling thread, with no graph, no keys and no scheduler: HDMM does that for
problems under :data:`dpdask.strategy.hdmm._hdmm.INLINE_MAX_CELLS` cells, whose tasks
take milliseconds and would spend most of their time being scheduled.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask.local
from dask.base import get_scheduler, tokenize
from threadpoolctl import ThreadpoolController

__all__ = ["Task", "blas_limit", "distributed_client", "key_word", "run_tasks", "submit_tasks"]

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
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    blas_threads: int | None = 1

    @functools.cached_property
    def key(self) -> str:
        """``optimize-<words>-<token>``, the token hashing the function and its inputs
        (computed once: the inputs must not change after it is read)."""
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

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        blas_threads: int | None,
    ):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.blas_threads = blas_threads


_CONTROLLER: ThreadpoolController | None = None


@contextlib.contextmanager
def blas_limit(threads: int | None) -> Iterator[None]:
    """At most ``threads`` BLAS threads in the block (``None``: leave them as they are)."""
    global _CONTROLLER
    if threads is None:
        yield
        return
    if _CONTROLLER is None:  # scanning the loaded libraries costs milliseconds: once
        _CONTROLLER = ThreadpoolController()
    with _CONTROLLER.limit(limits=threads, user_api="blas"):
        yield


def _call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], blas_threads: int | None
) -> Any:
    """``fn(*args, **kwargs)`` with at most ``blas_threads`` BLAS threads (``None``: all)."""
    if blas_threads is None:
        return fn(*args, **kwargs)
    with blas_limit(blas_threads):
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


def _graph(tasks: Sequence[Task]) -> dict[str, Any]:
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
        client_get: Callable[..., Any] = client.get
        return client_get
    # dask.config's scheduler, or the active distributed client
    get = get_scheduler()  # type: ignore[no-untyped-call]
    return get if get is not None else dask.local.get_sync


def distributed_client(client: Any = None) -> Any:
    """The :class:`distributed.Client` that :func:`run_tasks` would use, else ``None``.

    ``client`` itself when it is one; without it, the active distributed client when
    it is Dask's default scheduler.
    """
    get = _scheduler(client)
    owner = getattr(get, "__self__", None)
    if owner is None or not type(owner).__module__.startswith("distributed"):
        return None
    return owner if hasattr(owner, "gather") else None


def submit_tasks(tasks: Sequence[Task], client: Any, priority: int = 0) -> list[Any]:
    """Submit the tasks to a distributed client without waiting: one future per task
    (``priority``: Dask's; higher runs first)."""
    dsk = _graph(tasks)
    keys = list(dict.fromkeys(t.key for t in tasks))
    futures = dict(zip(keys, client.get(dsk, keys, sync=False, priority=priority), strict=True))
    return [futures[t.key] for t in tasks]


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
