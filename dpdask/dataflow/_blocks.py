"""The per-chunk work of a release: measure, reconstruct, answer (NumPy in, NumPy out).

These functions run inside Dask tasks. Each takes one geography chunk of one
level and everything it needs as arguments (no global state), so that a retried
task recomputes exactly the same numbers: the noise comes from the keyed stream
of the chunk's identity.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpdask.linalg import LinearQuery
from dpdask.measure import measure
from dpdask.reconstruct import least_squares

__all__ = ["answer_block", "measure_block", "reconstruct_block"]


def measure_block(
    x: np.ndarray,
    plan: Any,
    key: Any,
    release: str,
    level: str,
    run_id: str,
    receipt: Any,
    noise: bool,
    test_mode: bool,
    block_info: dict | None = None,
) -> np.ndarray:
    """Noisy strategy answers ``(g, m)`` for one chunk (``x`` is ``(g, *domain.shape)``)."""
    chunk = int(block_info[0]["chunk-location"][0]) if block_info else 0
    if not noise:
        if not test_mode:
            raise ValueError("noise can only be switched off in test mode")
        return np.asarray(plan.strategy.apply(x), dtype=np.float64)
    y = measure(
        plan,
        x,
        key,
        (release, level, chunk, "strategy"),
        ledger=receipt,
        run_id=run_id,
        test_mode=test_mode,
    )
    return np.asarray(y, dtype=np.float64)


def reconstruct_block(
    y: np.ndarray,
    strategy: LinearQuery,
    method: str,
    cell_shape: tuple[int, ...],
    pinv: LinearQuery | None = None,
) -> np.ndarray:
    """Least-squares estimates ``(g, *domain.shape)`` from one chunk of measurements.

    ``pinv``, when given, is the strategy's pseudo-inverse computed once for all chunks.
    """
    if pinv is not None:
        return np.asarray(pinv.apply(y)).reshape((y.shape[0], *cell_shape))
    est = least_squares(strategy, y, method=method)
    if not est.report.converged:
        raise RuntimeError(
            f"least squares did not converge on a chunk ({est.report.to_dict()}); "
            "nothing is published"
        )
    return est.x.reshape((y.shape[0], *cell_shape))


def answer_block(x: np.ndarray, workload: LinearQuery) -> np.ndarray:
    """Workload answers ``(g, q)`` for one chunk of estimates."""
    return np.asarray(workload.apply(x), dtype=np.float64)
