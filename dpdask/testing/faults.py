"""Operators for fault-injection tests (importable by Dask worker processes)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dpdask.linalg import LinearQuery, NormTerms


class SlowOperator(LinearQuery):
    """Wraps an operator and sleeps ``delay`` seconds per application.

    For fault-injection tests that need tasks long enough to kill a worker mid-run.
    Importable by worker processes because it lives in the package.
    """

    def __init__(self, base: LinearQuery, delay: float = 0.2):
        self.base, self.delay = base, float(delay)
        self.shape = base.shape

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        time.sleep(self.delay)
        return self.base._matmat(X)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return self.base._rmatmat(Y)

    def _apply_axis(self, T: np.ndarray, axis: int) -> np.ndarray:
        time.sleep(self.delay)
        return self.base._apply_axis(T, axis)

    def _norm_terms(self, p: int) -> NormTerms:
        return self.base._norm_terms(p)

    def _params(self) -> tuple[Any, ...]:
        return (self.base, self.delay)

    def _rounding(self) -> tuple[float, float]:
        from dpdask.linalg import rounding_pair

        return rounding_pair(self.base)

    def gram(self) -> LinearQuery:
        return self.base.gram()

    def pinv(self) -> LinearQuery:
        return self.base.pinv()
