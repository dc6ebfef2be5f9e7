"""One BLAS thread count for every release task in a process, whatever runs them.

BLAS results depend on the number of threads a call uses (the order of a sum does),
so a release is bit-reproducible (a resumed or retried run publishes what an
uninterrupted one does) only if every task computes with the same count, on any
cluster. Release tasks therefore use one BLAS thread each: the cores are shared
among tasks, not within one.

``threadpool_limits`` changes a process-wide setting. Tasks that run in threads of
one process (the threaded scheduler, an in-process cluster) would enter and leave it
at different times, each restoring what it found, so that one task's exit could
switch another's BLAS back mid-task. :func:`task_blas` counts the tasks inside it:
the first sets the limit, the last restores the original, and in between every task
sees the same setting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from threadpoolctl import threadpool_limits

__all__ = ["TASK_BLAS_THREADS", "task_blas"]

TASK_BLAS_THREADS = 1

_lock = threading.Lock()
_depth = 0
_limiter: threadpool_limits | None = None


@contextmanager
def task_blas() -> Iterator[None]:
    """BLAS limited to :data:`TASK_BLAS_THREADS` for the tasks inside, process-wide."""
    global _depth, _limiter
    with _lock:
        if _depth == 0:
            _limiter = threadpool_limits(limits=TASK_BLAS_THREADS, user_api="blas")
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _limiter is not None:
                _limiter.restore_original_limits()
                _limiter = None
