"""Workers drop a task's spec once it has run: their memory must not grow with the graph.

A distributed worker keeps a :class:`~distributed.worker_state_machine.TaskState` for
every task it ran for as long as the scheduler keeps the task, and the state keeps the
task's spec: its function and arguments, with a release's per-chunk arguments (a chunk's
constraints part, its unit ranges) inline. Run after run of a level's chunks, a worker
then holds every spec it ran, as memory Dask cannot spill (``unmanaged``): on the 8.1
million-block national run a worker holding the specs of its finished sweep tasks paused
at its memory limit and stalled the release (BENCHMARKS.md, session 19).

`ForgetSpecs`, a worker plugin that :func:`dpdask.graph._caches.forget_specs` registers on the
release's client, drops the spec of a task once it holds the result (``memory``) or has
let it go (``released``). Nothing needs it then: a task the scheduler asks for again
arrives with its spec (the worker state machine sets it from the new ``compute-task``),
and a task still running (``executing``, ``cancelled``, ``resumed``) is left alone.
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["ForgetSpecs"]

_DONE = frozenset({"memory", "released"})


class ForgetSpecs(WorkerPlugin):
    """Drop each task's spec on a worker once the task is done (module notes)."""

    name = "dpdask-forget-specs"
    idempotent = True  # one per worker, whatever the number of releases

    def setup(self, worker: Any) -> None:
        self.worker = worker

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish not in _DONE:
            return
        ts = self.worker.state.tasks.get(key)
        if ts is not None and ts.state in _DONE:
            ts.run_spec = None
