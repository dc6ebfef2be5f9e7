"""A plan re-calibrated for one geography level's share of a release budget.

:class:`LevelPlan` keeps the base plan's strategy, workload and domain, and
re-derives the noise from the level's budget; for Gaussian noise it measures a
root of the strategy's Gram (same privacy, same least-squares error, fewer rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from dpdask.domain import Domain
from dpdask.errors import PlanError
from dpdask.linalg import Kron, LinearQuery, gram_root
from dpdask.measure import Lattice, lattice
from dpdask.noise import draw_variance
from dpdask.privacy import Budget, calibrate
from dpdask.reconstruct.structured import full_column_rank, structured_pinv

__all__ = ["LevelPlan", "mean_cell_variance"]


class LevelPlan:
    """A plan re-calibrated for one level's share of the budget.

    The strategy, workload and domain are the base plan's; the noise is calibrated
    to ``privacy`` (Laplace for pure DP, Gaussian for zCDP and (epsilon, delta)),
    and the query variances scale with the noise variance. ``like``, another level's
    plan on the same base plan, shares its measured strategy and pseudo-inverse
    (computed once for all levels). The calibration is
    :func:`dpdask.privacy.noise_scale`'s, the one plans and releases share.
    """

    def __init__(self, base: Any, privacy: Budget, like: LevelPlan | None = None):
        self.base = base
        self.privacy = privacy
        if like is not None and like.base is base:
            self.strategy: LinearQuery = like.strategy
            self._structure: dict[str, Any] = like._structure
        else:
            with threadpool_limits(limits=1, user_api="blas"):  # small matrices: 1 thread
                self.strategy = _compact(base.strategy, base.mechanism)
            self._structure = {}
        self.workload: LinearQuery = base.workload
        self.domain: Domain | None = base.domain
        self.mechanism: str = base.mechanism
        self.calibration = calibrate(privacy, self.strategy)
        if self.calibration.mechanism != self.mechanism:
            raise PlanError(
                f"a {self.mechanism} plan cannot be measured with {privacy!r}; select a plan "
                "for that budget"
            )
        self.noise_scale = self.calibration.scale
        self.drawn: Lattice | None = None

    def realise(self, dtype: Any, max_total: int) -> LevelPlan:
        """Fix how the measure step draws this level's noise for data of ``dtype`` (the
        lattice and scale of :func:`dpdask.measure.lattice`, no data read): from then on
        :attr:`row_variance`, :attr:`drawn_scale` and :meth:`query_variances` are those
        of the noise drawn, not of the plan's nominal continuous mechanism. The
        measurement itself still starts from the plan's calibration."""
        self.drawn = lattice(self, dtype, max_total)
        return self

    @property
    def drawn_scale(self) -> float:
        """The scale of the noise drawn (data units; the nominal scale until
        :meth:`realise`)."""
        return self.noise_scale if self.drawn is None else self.drawn.noise_scale

    def pinv(self) -> LinearQuery | None:
        """The strategy's pseudo-inverse when it is structured (Kronecker products, unions
        of two of them; :func:`~dpdask.reconstruct.structured.structured_pinv`), computed once."""
        if "pinv" not in self._structure:
            with threadpool_limits(limits=1, user_api="blas"):
                self._structure["pinv"] = structured_pinv(self.strategy)
        return self._structure["pinv"]

    def fused(self, reconstruct: str) -> bool:
        """Whether measure and least squares fuse into ``x + A^+ z`` for this level
        (:func:`~dpdask.release._blocks.estimate_block`): a least-squares estimator and a
        strategy of full column rank with a structured pseudo-inverse."""
        if reconstruct not in ("ls", "wls") or self.pinv() is None:
            return False
        if "full_rank" not in self._structure:
            with threadpool_limits(limits=1, user_api="blas"):
                self._structure["full_rank"] = full_column_rank(self.strategy, self.pinv())
        return self._structure["full_rank"]

    @property
    def row_variance(self) -> float:
        """Variance of the noise added to each measurement: of the law drawn once
        :meth:`realise` fixed it (the discrete sampler on its lattice), of the plan's
        nominal mechanism before."""
        if self.drawn is not None:
            return self.drawn.variance
        return self.calibration.variance

    def query_variances(self) -> np.ndarray:
        """Variance of every workload answer's least-squares estimate at
        :attr:`row_variance` per row."""
        ratio = self.row_variance / draw_variance(self.mechanism, self.base.noise_scale)
        return np.asarray(self.base.query_variances(), dtype=float) * ratio


def _compact(A: LinearQuery, mechanism: str) -> LinearQuery:
    """What is measured for strategy ``A``: for Gaussian noise, a root of its Gram
    (same privacy, same least-squares error, at most ``n`` rows; see
    :func:`dpdask.linalg.gram_root`) when that is cheap to form; ``A`` otherwise."""
    if mechanism != "gaussian" or A.shape[0] <= A.shape[1]:
        return A
    if isinstance(A, Kron) and all(f.shape[1] <= 4096 for f in A.factors):
        return gram_root(A)
    if A.shape[1] <= 4096:
        return gram_root(A)
    return A


def mean_cell_variance(A: LinearQuery) -> float:
    """``trace((A^T A)^+) / n``: the average variance of a cell's least-squares estimate
    per unit of noise variance (factor by factor for Kronecker strategies)."""
    if isinstance(A, Kron):
        return float(np.prod([mean_cell_variance(f) for f in A.factors]))
    G = A.gram().dense()
    return float(np.trace(np.linalg.pinv(G, hermitian=True)) / A.shape[1])
