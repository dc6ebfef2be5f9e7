"""The per-chunk work of a release: measure, reconstruct, answer (NumPy in, NumPy out).

These functions run inside Dask tasks. Each takes one geography chunk of one
level and everything it needs as arguments (no global state), so that a retried
task recomputes exactly the same numbers: the noise comes from the keyed stream
of the chunk's identity.

Keys stay on the client: a measuring task receives only its own chunk's
:class:`~dpdask.noise.StreamKey` (made by :func:`~dpdask.measure.stream_key` on the
client and delivered as a one-element block of a key array), which draws that
chunk's stream and no other; never the release's secret key.

Two paths lead from counts to estimates:

* the general one, :func:`measure_block` (``y = A x + z``) then
  :func:`reconstruct_block` (any estimator);
* for least squares with a strategy of full column rank whose pseudo-inverse is
  structured (:func:`~dpdask.reconstruct.structured.structured_pinv`),
  :func:`estimate_block` fuses the two: since
  ``A^+ A = I``, ``A^+ (A x + z) = x + A^+ z``, so it draws the chunk's noise ``z``
  from the same keyed stream as :func:`measure_block` and never computes ``A x``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import json
import pathlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError, NoiseKeyError
from dpdask.graph._blas import task_blas
from dpdask.linalg import LinearQuery
from dpdask.measure import DEFAULT_MAX_TOTAL, lattice, measure, measurement_noise
from dpdask.noise import StreamKey
from dpdask.privacy import Charge
from dpdask.reconstruct import admm, least_squares
from dpdask.reconstruct.nnls import nonnegative_fitter

__all__ = [
    "ESTIMATORS",
    "LS_FIRST",
    "NONNEGATIVE",
    "ChunkContext",
    "answer_block",
    "estimate_block",
    "measure_block",
    "reconstruct_block",
    "tune_allocator",
]

_MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's largest M_MMAP_THRESHOLD on 64-bit systems
_allocator_tuned = False


def tune_allocator() -> bool:
    """Let glibc keep freed chunk-sized blocks for reuse, once per process.

    Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``, which freezes glibc's mmap
    threshold at 128 KiB: every array of a chunk is then a fresh ``mmap`` whose pages
    are faulted in and zeroed on first touch, and unmapped when freed, which costs a
    large share of a county-level release's CPU time in system calls. Raising the
    mmap threshold to its maximum (32 MiB; the release's chunks are sized below it)
    and the trim threshold to 1 GiB makes such blocks come from, and return to, the
    heap (the measured effect is in BENCHMARKS.md). Returns whether the setting was
    applied (glibc only; elsewhere nothing changes).
    """
    global _allocator_tuned
    if _allocator_tuned:
        return True
    _allocator_tuned = True
    try:
        libc = _libc()
        ok = libc.mallopt(-3, _MMAP_THRESHOLD_MAX)  # M_MMAP_THRESHOLD
        ok = ok and libc.mallopt(-1, 2**30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False
    return bool(ok)


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library (raises ``OSError`` where there is none to load)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def trim_heap() -> bool:
    """Return the heap's free memory to the system (glibc's ``malloc_trim``).

    With the trim threshold at 1 GiB (:func:`tune_allocator`), a worker keeps up to
    that much freed heap after a task; the few long tasks of a top-down release (a
    state's NNLS, a family's fit) call this first, so one task's leftovers do not
    count against the next one's memory limit. Returns whether anything was released
    (glibc only; elsewhere it does nothing).
    """
    try:
        return bool(_libc().malloc_trim(0))
    except (OSError, AttributeError):
        return False


def _chunk_index(block_info: dict[Any, Any] | None) -> int:
    return int(block_info[0]["chunk-location"][0]) if block_info else 0


def _stream_key(key: Any) -> StreamKey | None:
    """The chunk's stream key from its one-element block of the key array (or ``None``)."""
    if isinstance(key, np.ndarray):
        if key.size != 1:
            raise NoiseKeyError(f"a chunk's key block holds one stream key, got {key.size}")
        key = key.reshape(-1)[0]
    if key is not None and not isinstance(key, StreamKey):
        raise ArgumentTypeError(
            f"a block task takes its chunk's StreamKey, never the secret key; got "
            f"{type(key).__name__}"
        )
    return key


@dataclass(frozen=True)
class ChunkContext:
    """What a measuring task of one level needs besides its data and its stream key.

    Attributes
    ----------
    release, level, run_id : str
        The measurement's identity: chunk ``k`` of ``level`` measures the stream
        ``(release, level, k, "strategy")`` of run ``run_id``.
    receipt : Charge or None
        The level's charge, recorded before any task runs (``None`` only in test mode
        without a ledger); :func:`~dpdask.measure.measure` checks it.
    noise, test_mode : bool
        ``noise=False`` (test mode only) measures exactly: the tests' oracle.
    max_total : int
        The public bound on one geography's total the lattice is sized for
        (:func:`~dpdask.measure.lattice`).
    """

    release: str
    level: str
    run_id: str
    receipt: Charge | None = None
    noise: bool = True
    test_mode: bool = False
    max_total: int = DEFAULT_MAX_TOTAL

    def identity(self, chunk: int) -> tuple[str, str, int, str]:
        """The measurement identity of chunk ``chunk`` of this level."""
        return (self.release, self.level, chunk, "strategy")


def _exact_answers(ctx: ChunkContext) -> bool:
    """Whether the task skips the noise (test mode only: the oracle)."""
    if ctx.noise:
        return False
    if not ctx.test_mode:
        raise ArgumentError("noise can only be switched off in test mode")
    return True


def measure_block(
    x: np.ndarray,
    plan: Any,
    key: Any,
    ctx: ChunkContext,
    block_info: dict[Any, Any] | None = None,
) -> np.ndarray:
    """Noisy strategy answers ``(g, m)`` for one chunk (``x`` is ``(g, *domain.shape)``).

    ``key`` is the chunk's :class:`~dpdask.noise.StreamKey` (or its one-element
    object array block); it must be the key of this chunk's stream.
    """
    tune_allocator()
    chunk = _chunk_index(block_info)
    key = _stream_key(key)
    with task_blas():
        if _exact_answers(ctx):  # test mode: a sparse chunk densified (the strategy's apply)
            if hasattr(x, "todense"):
                x = np.asarray(x.reshape((x.shape[0], -1)).todense())  # type: ignore[attr-defined]
            return np.asarray(plan.strategy.apply(x), dtype=np.float64)
        if key is None:
            raise NoiseKeyError("a noisy measurement needs its chunk's stream key")
        y = measure(
            plan, x, key, ctx.identity(chunk), ledger=ctx.receipt, run_id=ctx.run_id,
            test_mode=ctx.test_mode, max_total=ctx.max_total,
        )  # fmt: skip
    return np.asarray(y, dtype=np.float64)


def estimate_block(
    x: np.ndarray,
    plan: Any,
    pinv: LinearQuery,
    key: Any,
    ctx: ChunkContext,
    block_info: dict[Any, Any] | None = None,
) -> np.ndarray:
    """Least-squares estimates ``(g, *domain.shape)`` of one chunk: ``x + A^+ z``.

    Measure and reconstruct fused, for a strategy ``A`` of full column rank with
    structured pseudo-inverse ``pinv`` (see
    :func:`~dpdask.reconstruct.structured.full_column_rank`): then
    ``A^+ (A x + z) = x + A^+ z`` exactly, and ``z`` is drawn by
    :func:`~dpdask.measure.measurement_noise` from the stream :func:`measure_block`
    uses, so the estimate equals the general path's up to rounding (and a retry
    reproduces it bit for bit). The noisy
    measurements ``A x + z`` are never formed nor published; what is released is
    their least-squares post-processing, exactly as on the general path, so the
    privacy guarantee is the measurement's. ``key`` is the chunk's
    :class:`~dpdask.noise.StreamKey`, as for :func:`measure_block`.

    Only exact integer measurements fuse this way (integer counts and a strategy of
    integer entries, :func:`~dpdask.measure.lattice`). On the lattice (float data or
    a non-integer strategy) the measurement is ``y = h round(A x / h) + h Z``, and
    ``x + A^+ h Z`` is not a function of ``y`` (it would leak the rounding residue,
    the floating-point attack in another form); there the task forms ``y`` with
    :func:`~dpdask.measure.measure` and returns ``A^+ y``, still one task.
    """
    tune_allocator()
    key = _stream_key(key)
    with task_blas():
        if _exact_answers(ctx):
            return np.asarray(x, dtype=np.float64)
        if key is None:
            raise NoiseKeyError("a noisy measurement needs its chunk's stream key")
        identity = ctx.identity(_chunk_index(block_info))
        kw: dict[str, Any] = {
            "ledger": ctx.receipt, "run_id": ctx.run_id, "test_mode": ctx.test_mode,
            "max_total": ctx.max_total,
        }  # fmt: skip
        if not lattice(plan, x.dtype, ctx.max_total).exact:
            # on the lattice the measurement is round(A x / h) h + noise: form it and
            # publish its least-squares post-processing A^+ y (never x + A^+ z)
            y = measure(plan, x, key, identity, **kw)
            y = np.asarray(y, dtype=np.float64).reshape(x.shape[0], -1)
            return np.asarray(pinv.apply(y), dtype=np.float64).reshape(x.shape)
        z = measurement_noise(plan, x, key, identity, **kw)
        est = np.asarray(pinv.apply(z), dtype=np.float64).reshape(x.shape)
        est += x
    return est


NONNEGATIVE = ("nnls", "wnnls", "admm-l1", "admm-enet")
ESTIMATORS = ("ls", "wls", *NONNEGATIVE, "topdown")
# quadratic fits computed from consistent least-squares estimates, at the finest level
FIT_AFTER_CONSISTENCY = ("nnls", "wnnls")
# estimators that start from every level's least-squares estimates
LS_FIRST = (*FIT_AFTER_CONSISTENCY, "topdown")


def reconstruct_block(
    y: np.ndarray,
    strategy: LinearQuery,
    method: str,
    cell_shape: tuple[int, ...],
    pinv: LinearQuery | None = None,
    report_dir: str | None = None,
    level: str = "",
    noise_scale: float | None = None,
    block_info: dict[Any, Any] | None = None,
) -> np.ndarray:
    """Estimates ``(g, *domain.shape)`` from one chunk of measurements.

    ``noise_scale`` (the per-row scale of the level's noise) puts ADMM's stopping rule
    in noise units: it measures residuals in units of the scale.

    ``method`` is ``"ls"`` (or ``"wls"``: one measurement of uniform noise per level, so
    the same estimate), ``"admm-l1"`` or ``"admm-enet"`` (NNLS and WNNLS are fitted to
    the consistent estimates instead, :func:`nonnegative_block`). ``pinv``, when given,
    is the strategy's pseudo-inverse computed once for all chunks. A chunk whose
    estimator stops before converging is reported in ``report_dir``
    (``<level>-<chunk>.json``) and in the published attributes; its estimate is still
    the solver's last iterate.
    """
    with task_blas():
        if method in ("ls", "wls") and pinv is not None:
            return np.asarray(pinv.apply(y)).reshape((y.shape[0], *cell_shape))
        if method in ("ls", "wls"):
            est = least_squares(strategy, y)
        elif method in ("admm-l1", "admm-enet"):
            est = admm(strategy, y, loss=method.split("-")[1], scale=noise_scale)
        else:
            raise ArgumentError(
                f"unknown estimator {method!r} for measurements; use ls, wls or admm"
            )
    if not est.report.converged and report_dir is not None:
        _report(report_dir, level, _chunk_index(block_info), est.report.to_dict())
    return np.asarray(est.x).reshape((y.shape[0], *cell_shape))


def nonnegative_block(
    x: np.ndarray,
    M: LinearQuery,
    weights: float | None,
    report_dir: str | None = None,
    level: str = "",
    block_info: dict[Any, Any] | None = None,
) -> np.ndarray:
    """Non-negative estimates ``(g, *domain.shape)`` fitted to one chunk of estimates.

    Each row (geography) is solved on its own (:func:`~dpdask.reconstruct.nonnegative_fit`
    with operator ``M`` and row ``weights``, through one
    :func:`~dpdask.reconstruct.nnls.nonnegative_fitter`, which computes what the fits
    share once per worker process), each with its own report. Rows that stop before converging
    are reported in ``report_dir`` as for :func:`reconstruct_block`.
    """
    tune_allocator()
    X = np.asarray(x, dtype=np.float64).reshape(x.shape[0], -1)
    out = np.empty_like(X)
    failed = []
    fit = nonnegative_fitter(M, weights)
    with task_blas():
        for r, row in enumerate(X):
            est = fit(row)
            out[r] = est.x
            if not est.report.converged:
                failed.append({"row": r, **est.report.to_dict()})
    if failed and report_dir is not None:
        worst = max(failed, key=lambda f: f["residual"])
        info = {**worst, "rows_not_converged": [f["row"] for f in failed]}
        _report(report_dir, level, _chunk_index(block_info), info)
    return out.reshape(x.shape)


def _report(report_dir: str, level: str, chunk: int, info: dict[str, Any]) -> None:
    path = pathlib.Path(report_dir) / f"{level}-{chunk}.json"
    path.write_text(json.dumps({"level": level, "chunk": chunk, **info}))


def answer_block(x: np.ndarray, workload: LinearQuery) -> np.ndarray:
    """Workload answers ``(g, q)`` for one chunk of estimates."""
    tune_allocator()
    with task_blas():
        return np.asarray(workload.apply(x), dtype=np.float64)
