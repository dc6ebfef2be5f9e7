"""Processes racing to charge one dataset on a server ledger (the 20-process race of
``tests/system/test_ledger_postgres.py``).

:func:`race` starts them from a fork server that has imported :mod:`dpdask.privacy`
once, so that twenty processes cost twenty forks, not twenty interpreters importing
dpdask: each is still a process of its own, with its own connection to the server,
opened and verified before the start, and all are released at once.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

__all__ = ["race"]


def _racer(url: str, i: int, ready: Any, go: Any, results: Any) -> None:
    from dpdask.privacy import BudgetExceededError, Charge, Ledger, zCDP

    try:
        ledger = Ledger(url)  # its own connection, opened and verified before the start
        ready.put(i)
        go.wait()
        ledger.open_release(f"r{i}", zCDP(1), "cef")
        ledger.charge(Charge(f"r{i}", "run", "county", "A", "gaussian", 1.0, 0.5, zCDP(1),
                             f"fp{i}"))  # fmt: skip
        results.put((i, "published", ""))
    except BudgetExceededError as exc:
        results.put((i, "refused", str(exc)))
    except BaseException as exc:  # reported, never hidden: the test fails on it
        results.put((i, "error", f"{type(exc).__name__}: {exc}"))
        ready.put(i)


def race(url: str, n: int, timeout: float = 300.0) -> list[tuple[int, str, str]]:
    """Start ``n`` processes that each open release ``r<i>`` on dataset ``cef`` with
    zCDP(1) and charge it, all released at once; ``(i, outcome, message)`` for each,
    outcome ``published``, ``refused`` (the budget) or ``error``."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["dpdask.privacy", "psycopg", __name__])
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_racer, args=(url, i, ready, go, results)) for i in range(n)]
    for p in procs:
        p.start()
    for _ in procs:  # every process connected and waiting: then all start at once
        ready.get(timeout=timeout)
    go.set()
    out = [results.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout)
    return sorted(out)
