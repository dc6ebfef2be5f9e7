"""The per-chunk work of a release: measure, reconstruct, answer (NumPy in, NumPy out).

These functions run inside Dask tasks. Each takes one geography chunk of one
level and everything it needs as arguments (no global state), so that a retried
task recomputes exactly the same numbers: the noise comes from the keyed stream
of the chunk's identity.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np

from dpdask.linalg import LinearQuery
from dpdask.measure import measure
from dpdask.reconstruct import admm, least_squares, nnls, wnnls

__all__ = ["ESTIMATORS", "NONNEGATIVE", "answer_block", "measure_block", "reconstruct_block"]


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


NONNEGATIVE = ("nnls", "wnnls", "admm-l1", "admm-enet")
ESTIMATORS = ("ls", "wls", *NONNEGATIVE)


def reconstruct_block(
    y: np.ndarray,
    strategy: LinearQuery,
    method: str,
    cell_shape: tuple[int, ...],
    pinv: LinearQuery | None = None,
    workload: LinearQuery | None = None,
    report_dir: str | None = None,
    level: str = "",
    block_info: dict | None = None,
) -> np.ndarray:
    """Estimates ``(g, *domain.shape)`` from one chunk of measurements.

    ``method`` is ``"ls"`` (or ``"wls"``: one measurement of uniform noise per level, so
    the same estimate), ``"nnls"``, ``"wnnls"`` (fits the workload answers; needs
    ``workload``), ``"admm-l1"`` or ``"admm-enet"``. ``pinv``, when given, is the
    strategy's pseudo-inverse computed once for all chunks. A chunk whose estimator
    stops before converging is reported in ``report_dir`` (``<level>-<chunk>.json``)
    and in the published attributes; its estimate is still the solver's last iterate.
    """
    if method in ("ls", "wls") and pinv is not None:
        return np.asarray(pinv.apply(y)).reshape((y.shape[0], *cell_shape))
    if method in ("ls", "wls"):
        est = least_squares(strategy, y)
    elif method == "nnls":
        est = nnls(strategy, y)
    elif method == "wnnls":
        est = wnnls(workload, strategy, y)
    elif method in ("admm-l1", "admm-enet"):
        est = admm(strategy, y, loss=method.split("-")[1])
    else:
        raise ValueError(f"unknown estimator {method!r}; use one of {ESTIMATORS}")
    if not est.report.converged and report_dir is not None:
        chunk = int(block_info[0]["chunk-location"][0]) if block_info else 0
        path = pathlib.Path(report_dir) / f"{level}-{chunk}.json"
        path.write_text(json.dumps({"level": level, "chunk": chunk, **est.report.to_dict()}))
    return np.asarray(est.x).reshape((y.shape[0], *cell_shape))


def answer_block(x: np.ndarray, workload: LinearQuery) -> np.ndarray:
    """Workload answers ``(g, q)`` for one chunk of estimates."""
    return np.asarray(workload.apply(x), dtype=np.float64)
