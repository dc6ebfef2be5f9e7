"""What a release's tasks keep per worker process, and forgetting it when the release ends.

The fits of a level share what depends only on its plan: the top-down fitter
(:mod:`dpdask.graph._topdown_blocks`), the multi-pass objective
(:mod:`dpdask.graph._multipass`), the total estimator of the levels below
(:mod:`dpdask.graph._subtree`) and the unbiased answers' matrix
(:mod:`dpdask.graph._unbiased`), each built once per worker process and level. They are
tens of megabytes per level on the 2,016-cell domain, so a long-lived cluster that runs
release after release would keep every one of them: :func:`forget` clears them in this
process and on every worker when a release has been published. A worker also keeps the
spec of every task it ran unless told not to: :func:`forget_specs`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["clear_caches", "forget", "forget_specs"]


def clear_caches() -> int:
    """Clear this process's per-level caches; return how many entries were dropped."""
    from dpdask.graph import _multipass, _subtree, _topdown_blocks, _unbiased
    from dpdask.graph._blocks import trim_heap

    caches: list[dict[str, Any]] = [
        _multipass._OBJECTIVES, _subtree._ESTIMATORS, _topdown_blocks._FITTERS,
        _unbiased._MATRICES, _unbiased._FACTORS,
    ]  # fmt: skip
    dropped = sum(len(c) for c in caches)
    for c in caches:
        c.clear()
    trim_heap()
    return dropped


def forget(client: Any) -> None:
    """:func:`clear_caches` here and, with a distributed ``client``, on every worker."""
    clear_caches()
    if client is not None and hasattr(client, "run"):
        client.run(clear_caches)


def forget_specs(client: Any) -> None:
    """Have every worker of a distributed ``client`` (and every one joining later) drop a
    task's spec once the task is done (:mod:`dpdask.graph._worker_specs`); nothing
    without one."""
    if client is not None and hasattr(client, "register_plugin"):
        from dpdask.graph._worker_specs import ForgetSpecs

        client.register_plugin(ForgetSpecs())
