"""SQM, the single query mode of paper 004 (Table 1, Algorithms 1-3).

Every query ``i`` of the ``m`` rows is answered alone, with its own truncation threshold
``theta_i`` and budget ``eps / m``: ``Trunc_theta_i(q_i)(x) + Lap(m s_i / eps)`` with
``s_i = max_j |W_ij| min(d_j, theta_i)`` the query's sensitivity. Its error is
``(w_i (D - T_i) x)^2 + 2 (m s_i / eps)^2``.

In a release the ``m`` queries are measured together (:meth:`SQMechanism.plan`): the
rows ``M = diag(1 / s) Q``, ``Q_ij = W_ij min(d_j, theta_i)``, each of unit sensitivity,
get Laplace noise calibrated to ``||M||_1 <= m`` (the Laplace mechanism on ``M``; by
sequential composition the paper's ``m``), and answer ``i`` is ``s_i`` times measurement
``i``. The noise is then at most the paper's; :meth:`SQMechanism.variances_at` gives the
variance for the noise scale actually used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dpdask.errors import ArgumentError, PlanError
from dpdask.linalg import Dense
from dpdask.noise import KeyedRNG, draw_variance
from dpdask.privacy import PureDP
from dpdask.strategy.plan import Plan
from dpdask.workloads.sums import SumWorkload

__all__ = ["SQMechanism"]

_DENSE_LIMIT = 25_000_000


@dataclass
class SQMechanism:
    """SQM: every query alone, budget ``eps / m`` each, with its own threshold ``theta_i``.

    Attributes: ``sums``, ``thetas`` (one per row of the workload; ``inf``: none),
    ``privacy`` (the measurement's budget), ``noise_scales`` (the paper's Laplace scale
    ``m s_i / eps`` of every answer) and ``sensitivities`` (``s_i``).
    """

    sums: SumWorkload
    thetas: np.ndarray
    privacy: PureDP
    name: str = "SQM"

    def __post_init__(self) -> None:
        m = self.sums.shape[0]
        th = np.broadcast_to(np.asarray(self.thetas, dtype=float), (m,)).copy()
        if not (th > 0).all():
            raise ArgumentError("thresholds must be positive (inf: no truncation)")
        self.thetas = th
        if self.sums.shape[0] * self.sums.shape[1] > _DENSE_LIMIT:
            raise ArgumentError("SQM needs a dense workload")
        W: NDArray[np.float64] = np.asarray(self.sums.counting.dense(), dtype=np.float64)
        self._W = W
        # t_ij = min(d_j, theta_i)
        self._T: NDArray[np.float64] = np.minimum(self.sums.weights[None, :], th[:, None])
        self.sensitivities: NDArray[np.float64] = np.abs(W * self._T).max(axis=1)
        if not (self.sensitivities > 0).all():
            raise PlanError("every SQM query must cover a bin")
        self.row_scale = m / float(self.privacy.epsilon)  # Laplace scale of a plan row
        self.noise_scales = self.sensitivities * self.row_scale

    @property
    def theta(self) -> float:
        """The largest threshold (``inf`` if a query is not truncated)."""
        return float(self.thetas.max())

    def query_variances(self) -> NDArray[np.float64]:
        """``2 (m s_i / eps)^2``: the paper's variance of every answer (continuous
        Laplace noise of scale ``m / eps`` on every row of :meth:`plan`)."""
        return self.variances_at(draw_variance("laplace", self.row_scale))

    def variances_at(self, row_variance: float) -> NDArray[np.float64]:
        """``s_i^2 v``: the variances when :meth:`plan`'s rows get noise of variance ``v``
        (the noise drawn: :attr:`dpdask.measure.Lattice.variance`)."""
        variances: NDArray[np.float64] = self.sensitivities**2 * float(row_variance)
        return variances

    def true_answers(self, x: np.ndarray) -> NDArray[np.float64]:
        """``W D x``, the untruncated sums."""
        answers: NDArray[np.float64] = self._W @ (self.sums.weights * np.asarray(x, dtype=float))
        return answers

    def truncated_answers(self, x: np.ndarray) -> NDArray[np.float64]:
        """``Trunc_theta_i(q_i)(x)`` for every query."""
        answers: NDArray[np.float64] = (self._W * self._T) @ np.asarray(x, dtype=float)
        return answers

    def bias(self, x: np.ndarray) -> NDArray[np.float64]:
        """``Trunc_theta_i(q_i)(x) - q_i(x)`` (needs the data; never positive)."""
        bias: NDArray[np.float64] = self.truncated_answers(x) - self.true_answers(x)
        return bias

    def expected_squared_error(self, x: np.ndarray) -> NDArray[np.float64]:
        """``bias^2 + variance`` per query."""
        error: NDArray[np.float64] = self.bias(x) ** 2 + self.query_variances()
        return error

    def bias_per_record(self) -> NDArray[np.float64]:
        """``max_j |W_ij| (d_j - t_ij)``: the most one truncated record lowers query ``i``."""
        per_record: NDArray[np.float64] = np.abs(
            self._W * (self.sums.weights[None, :] - self._T)
        ).max(axis=1)
        return per_record

    def bias_bound(self, n_truncated: float) -> np.ndarray:
        """``|bias_i| <= n * bias_per_record()_i`` for ``n`` records above ``theta_i``."""
        n = float(n_truncated)
        if not (n >= 0 and math.isfinite(n)):
            raise ArgumentError(f"n_truncated must be non-negative, got {n_truncated!r}")
        return n * self.bias_per_record()

    # -- a release: the queries measured together ---------------------------------------
    def plan(self) -> Plan:
        """The rows ``diag(1 / s) Q`` measured with the Laplace mechanism (module notes)."""
        M = Dense((self._W * self._T) / self.sensitivities[:, None])
        return Plan(
            M,
            M,
            self.privacy,
            domain=self.sums.domain,
            template="sum-SQM",
            info={"thresholds": int(np.unique(self.thetas).size)},
        )

    def answer(self, measurements: np.ndarray) -> np.ndarray:
        """``s_i z_i``: answers from :meth:`plan`'s measurements, ``(rows,)`` or ``(g, rows)``."""
        return np.asarray(measurements, dtype=float) * self.sensitivities

    def sample(self, x: np.ndarray, rng: KeyedRNG, size: int = 1) -> NDArray[np.float64]:
        """``size`` independent noisy answers (float Laplace, the paper's scales), ``(size, m)``."""
        m = self.sums.shape[0]
        z = rng.laplace(1.0, (int(size), m), unsafe_float=True)
        noisy: NDArray[np.float64] = (
            self.truncated_answers(x)[None, :] + z * self.noise_scales[None, :]
        )
        return noisy
