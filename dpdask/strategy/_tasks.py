"""Independent optimisation problems as Dask tasks with readable keys.

Restarts, per-factor problems and per-group problems do not depend on each other,
so :func:`run_tasks` submits them all at once: to the given
:class:`distributed.Client`, else to Dask's default scheduler (the active
distributed client if one exists, otherwise threads in this process). Keys read
``optimize-<what>-<token>``, for example ``optimize-factor-age-<token>`` or
``optimize-restart-marginals-<token>``; the token hashes the problem, so two
identical problems (the same factor Gram, ``p`` and seed) are solved once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask
from dask.base import tokenize

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

    @property
    def key(self) -> str:
        prefix = "-".join(["optimize", *(key_word(w) for w in self.words)])
        return (
            f"{prefix}-{tokenize(self.fn.__module__, self.fn.__qualname__, self.args, self.kwargs)}"
        )


def run_tasks(tasks: Sequence[Task], client: Any = None) -> list[Any]:
    """Run the tasks (in parallel where the scheduler allows) and return their results in order."""
    if not tasks:
        return []
    delayed = {}
    for t in tasks:
        if t.key not in delayed:
            delayed[t.key] = dask.delayed(t.fn, pure=True)(*t.args, dask_key_name=t.key, **t.kwargs)
    keys = list(delayed)
    if client is not None:
        values = client.gather(client.compute([delayed[k] for k in keys]))
    else:
        values = dask.compute(*[delayed[k] for k in keys])
    by_key = dict(zip(keys, values, strict=True))
    return [by_key[t.key] for t in tasks]
