"""The per-chunk work of a release: measure, reconstruct, answer (NumPy in, NumPy out).

These functions run inside Dask tasks. Each takes one geography chunk of one
level and everything it needs as arguments (no global state), so that a retried
task recomputes exactly the same numbers: the noise comes from the keyed stream
of the chunk's identity.

Two paths lead from counts to estimates:

* the general one, :func:`measure_block` (``y = A x + z``) then
  :func:`reconstruct_block` (any estimator);
* for least squares with a strategy of full column rank whose pseudo-inverse is
  structured (:func:`structured_pinv`), :func:`estimate_block` fuses the two: since
  ``A^+ A = I``, ``A^+ (A x + z) = x + A^+ z``, so it draws the chunk's noise ``z``
  from the same keyed stream as :func:`measure_block` and never computes ``A x``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import pathlib
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from dpdask.linalg import Kron, LinearQuery, VStack
from dpdask.measure import measure, measurement_noise
from dpdask.reconstruct import admm, least_squares, nnls, wnnls

__all__ = [
    "ESTIMATORS",
    "NONNEGATIVE",
    "KronPairInverse",
    "answer_block",
    "blas_threads_per_task",
    "estimate_block",
    "full_column_rank",
    "measure_block",
    "reconstruct_block",
    "structured_pinv",
    "tune_allocator",
]

_FACTOR_MAX = 4_000_000  # entries of a factor still handled densely
_MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's largest M_MMAP_THRESHOLD on 64-bit systems
_allocator_tuned = False


def tune_allocator() -> bool:
    """Let glibc keep freed chunk-sized blocks for reuse, once per process.

    Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_``, which freezes glibc's mmap
    threshold at 128 KiB: every array of a chunk is then a fresh ``mmap`` whose pages
    are faulted in and zeroed on first touch, and unmapped when freed. On the
    county-level CPH release that was 25 million page faults and half the CPU time
    (system time 160 s of 312 s at 3,143 counties). Raising the mmap threshold to
    its maximum (32 MiB; the release's chunks are sized below it) and the trim
    threshold to 1 GiB makes such blocks come from, and return to, the heap: on 200
    counties with 2 workers, 1.0e6 page faults instead of 2.2e6 and 9.0-9.2 s
    instead of 11.9-12.1 s. Returns whether the setting was applied (glibc only;
    elsewhere nothing changes).
    """
    global _allocator_tuned
    if _allocator_tuned:
        return True
    _allocator_tuned = True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(-3, _MMAP_THRESHOLD_MAX)  # M_MMAP_THRESHOLD
        ok = ok and libc.mallopt(-1, 2**30)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        return False
    return bool(ok)


def _chunk_index(block_info: dict | None) -> int:
    return int(block_info[0]["chunk-location"][0]) if block_info else 0


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
    blas_threads: int | None = None,
    block_info: dict | None = None,
) -> np.ndarray:
    """Noisy strategy answers ``(g, m)`` for one chunk (``x`` is ``(g, *domain.shape)``)."""
    tune_allocator()
    chunk = _chunk_index(block_info)
    with threadpool_limits(limits=blas_threads, user_api="blas"):
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


def estimate_block(
    x: np.ndarray,
    plan: Any,
    pinv: LinearQuery,
    key: Any,
    release: str,
    level: str,
    run_id: str,
    receipt: Any,
    noise: bool,
    test_mode: bool,
    blas_threads: int | None = None,
    block_info: dict | None = None,
) -> np.ndarray:
    """Least-squares estimates ``(g, *domain.shape)`` of one chunk: ``x + A^+ z``.

    Measure and reconstruct fused, for a strategy ``A`` of full column rank with
    structured pseudo-inverse ``pinv`` (see :func:`full_column_rank`): then
    ``A^+ (A x + z) = x + A^+ z`` exactly, and ``z`` is drawn by
    :func:`~dpdask.measure.measurement_noise` from the stream :func:`measure_block`
    uses, so the estimate equals the general path's up to rounding (and a retry
    reproduces it bit for bit). The noisy
    measurements ``A x + z`` are never formed nor published; what is released is
    their least-squares post-processing, exactly as on the general path, so the
    privacy guarantee is the measurement's.
    """
    tune_allocator()
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        if not noise:
            if not test_mode:
                raise ValueError("noise can only be switched off in test mode")
            return np.asarray(x, dtype=np.float64)
        identity = (release, level, _chunk_index(block_info), "strategy")
        z = measurement_noise(
            plan, x, key, identity, ledger=receipt, run_id=run_id, test_mode=test_mode
        )
        est = np.asarray(pinv.apply(z), dtype=np.float64).reshape(x.shape)
        est += x
    return est


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
    blas_threads: int | None = None,
    noise_scale: float | None = None,
    block_info: dict | None = None,
) -> np.ndarray:
    """Estimates ``(g, *domain.shape)`` from one chunk of measurements.

    ``noise_scale`` (the per-row scale of the level's noise) puts the iterative
    estimators' stopping rules in noise units: NNLS and WNNLS weigh rows by
    ``1 / scale^2``, ADMM measures residuals in units of the scale.

    ``method`` is ``"ls"`` (or ``"wls"``: one measurement of uniform noise per level, so
    the same estimate), ``"nnls"``, ``"wnnls"`` (fits the workload answers; needs
    ``workload``), ``"admm-l1"`` or ``"admm-enet"``. ``pinv``, when given, is the
    strategy's pseudo-inverse computed once for all chunks. A chunk whose estimator
    stops before converging is reported in ``report_dir`` (``<level>-<chunk>.json``)
    and in the published attributes; its estimate is still the solver's last iterate.
    """
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        if method in ("ls", "wls") and pinv is not None:
            return np.asarray(pinv.apply(y)).reshape((y.shape[0], *cell_shape))
        if method in ("ls", "wls"):
            est = least_squares(strategy, y)
        elif method == "nnls":
            est = nnls(strategy, y, weights=_inverse_variance(noise_scale))
        elif method == "wnnls":
            est = wnnls(workload, strategy, y, weights=_inverse_variance(noise_scale))
        elif method in ("admm-l1", "admm-enet"):
            est = admm(strategy, y, loss=method.split("-")[1], scale=noise_scale)
        else:
            raise ValueError(f"unknown estimator {method!r}; use one of {ESTIMATORS}")
    if not est.report.converged and report_dir is not None:
        chunk = _chunk_index(block_info)
        path = pathlib.Path(report_dir) / f"{level}-{chunk}.json"
        path.write_text(json.dumps({"level": level, "chunk": chunk, **est.report.to_dict()}))
    return np.asarray(est.x).reshape((y.shape[0], *cell_shape))


def _inverse_variance(scale: float | None) -> float | None:
    return None if scale is None else 1.0 / float(scale) ** 2


def answer_block(
    x: np.ndarray, workload: LinearQuery, blas_threads: int | None = None
) -> np.ndarray:
    """Workload answers ``(g, q)`` for one chunk of estimates."""
    tune_allocator()
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        return np.asarray(workload.apply(x), dtype=np.float64)


# -- structured pseudo-inverses ---------------------------------------------------------
class KronPairInverse(LinearQuery):
    """``(A^T A)^{-1} A^T`` for a union of two Kronecker products ``A = [c_1 K_1; c_2 K_2]``.

    Factor by factor the two Grams are diagonalised together: for attribute ``i``,
    with ``M_i = G_1i + G_2i`` (``G_ki = K_ki^T K_ki``) positive definite, ``V_i``
    solves ``V_i^T M_i V_i = I`` and ``V_i^T G_1i V_i = L_i`` (diagonal), hence
    ``V_i^T G_2i V_i = I - L_i``. With ``V = (x)_i V_i``,
    ``V^T A^T A V = c_1^2 (x)_i L_i + c_2^2 (x)_i (I - L_i) = D``, a diagonal, so
    ``(A^T A)^{-1} = V D^{-1} V^T``: least squares over the whole union in a few
    Kronecker products, with no matrix over the cells. Build with
    :func:`structured_pinv`, which checks that it applies.

    When ``A`` is rank deficient (OPT_+ on SF1 is: neither part asks for some
    interactions the workload does not need), zeros of ``D`` are skipped:
    ``G = V D^+ V^T`` is a generalised inverse of ``A^T A``, so ``G A^T y`` still
    solves the normal equations (a least-squares estimate, though not the one of
    minimum norm), and for any workload ``W`` the strategy supports (``W A^+ A =
    W``) the answers ``W G A^T y`` and their covariance ``v W G W^T = v W (A^T A)^+
    W^T`` are those of the minimum-norm solution (``A G A^T`` is the orthogonal
    projector onto the range of ``A`` for every generalised inverse ``G``).
    ``full_rank`` says whether ``D`` has no zero.
    """

    def __init__(self, A: VStack, V: list[np.ndarray], d: np.ndarray):
        from dpdask.linalg import Dense

        self.A = A
        self.V = Kron([Dense(v) for v in V])
        self.Vt = Kron([Dense(np.ascontiguousarray(v.T)) for v in V])
        keep = d > d.max() * 1e-10
        self.full_rank = bool(keep.all())
        self.dinv = np.where(keep, 1.0 / np.where(keep, d, 1.0), 0.0)
        self.shape = (A.shape[1], A.shape[0])

    def _normal_solve(self, U: np.ndarray) -> np.ndarray:  # (g, n) -> (g, n)
        W = self.Vt.apply(U)
        W *= self.dinv
        return self.V.apply(W)

    def _apply_batch(self, Y: np.ndarray) -> np.ndarray:
        U = np.zeros((Y.shape[0], self.shape[0]))
        for part, c, sl in zip(self.A.parts, self.A.weights, self.A.part_slices(), strict=True):
            U += c * part.T.apply(Y[:, sl])
        return self._normal_solve(U)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return self._apply_batch(X.T).T

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        W = self._normal_solve(Y.T)  # (A^T A)^{-1} is symmetric
        return self.A._matmat(W.T)

    def _params(self) -> tuple:
        return (self.A, self.dinv)


def _pair_inverse(A: VStack) -> KronPairInverse | None:
    """The :class:`KronPairInverse` of ``A``, or None when it does not apply."""
    if len(A.parts) != 2 or A._kron_shape() is None:
        return None
    K1, K2 = A.parts
    if any(f.size > _FACTOR_MAX for f in (*K1.factors, *K2.factors)):
        return None
    V, lam = [], []
    for f1, f2 in zip(K1.factors, K2.factors, strict=True):
        G1, G2 = f1.gram().dense(), f2.gram().dense()
        try:
            L = np.linalg.cholesky(G1 + G2)
        except np.linalg.LinAlgError:
            return None  # a direction no part measures: rank deficient
        Linv = np.linalg.inv(L)
        S = Linv @ G1 @ Linv.T
        w, Q = np.linalg.eigh((S + S.T) / 2)
        V.append(Linv.T @ Q)
        lam.append(np.clip(w, 0.0, 1.0))
    c1, c2 = (float(c) ** 2 for c in A.weights)
    d = c1 * _kron_vector(lam) + c2 * _kron_vector([1.0 - v for v in lam])
    return KronPairInverse(A, V, d)


def _kron_vector(vectors: list[np.ndarray]) -> np.ndarray:
    out = np.ones(1)
    for v in vectors:
        out = np.multiply.outer(out, v).ravel()
    return out


def structured_pinv(A: LinearQuery) -> LinearQuery | None:
    """An implicit pseudo-inverse of ``A`` when its structure gives one cheaply, else None.

    Kronecker products of small factors: factor by factor. A union of two Kronecker
    products over one domain (HDMM's OPT_+): :class:`KronPairInverse` (a generalised
    inverse when the union is rank deficient; see there). A small operator (at most
    4e6 entries): densely. Anything else returns None (the estimators then solve
    iteratively).
    """
    if isinstance(A, Kron) and all(f.size <= _FACTOR_MAX for f in A.factors):
        return A.pinv()
    if isinstance(A, VStack):
        pair = _pair_inverse(A)
        if pair is not None:
            return pair
    if A.size <= _FACTOR_MAX:
        return A.pinv()
    return None


def full_column_rank(A: LinearQuery, pinv: LinearQuery | None) -> bool:
    """Whether ``A`` has full column rank (so ``A^+ A = I``), decided from its structure.

    A Kronecker product has it when every factor has; a union with a
    :class:`KronPairInverse` has it by construction; a small operator is checked
    densely. Otherwise False (unknown).
    """
    if isinstance(pinv, KronPairInverse):
        return pinv.full_rank
    if isinstance(A, Kron) and all(f.size <= _FACTOR_MAX for f in A.factors):
        return all(full_column_rank(f, None) for f in A.factors)
    if A.size <= _FACTOR_MAX:
        return A.shape[0] >= A.shape[1] and np.linalg.matrix_rank(A.dense()) == A.shape[1]
    return False


def blas_threads_per_task(total_threads: int, cores: int | None = None) -> int:
    """BLAS threads each task may use so that ``total_threads`` concurrent tasks share
    ``cores`` (default: this machine's) without oversubscription."""
    import os

    cores = cores or os.cpu_count() or 1
    return max(1, math.floor(cores / max(1, total_threads)))
