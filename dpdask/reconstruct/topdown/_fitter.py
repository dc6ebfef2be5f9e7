"""The fits of one top-down level: :class:`ChildrenFitter` and :class:`SupportEstimate`.

:func:`dpdask.reconstruct.topdown.children_fitter` builds a :class:`ChildrenFitter`
(documented there); its entry points turn a family's measurements or least-squares
estimates into the linear terms on the parent's support, a few rows at a time, and
hand them to :func:`dpdask.reconstruct.topdown._solve.solve_support`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from threadpoolctl import ThreadpoolController

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import LinearQuery, Scaled
from dpdask.reconstruct._inputs import as_batch
from dpdask.reconstruct._report import ConvergenceReport, Estimate
from dpdask.reconstruct.structured import KronPairInverse, structured_pinv
from dpdask.reconstruct.topdown._level import Level
from dpdask.reconstruct.topdown._solve import solve_support

__all__ = ["ChildrenFitter", "SupportEstimate"]

_METHODS = ("auto", "newton", "fista", "active")
_STARTS = ("auto", "admm", "estimates", "simple")


@functools.cache
def _blas() -> ThreadpoolController:
    """The process's BLAS pools, found once (a limit on them is then cheap, ~10 us)."""
    return ThreadpoolController()


_BATCH_ENTRIES = 1 << 21
"""Rows of whole-domain arrays are formed this many entries at a time (16 MB in float64)."""


@dataclass(frozen=True)
class SupportEstimate:
    """One family's children on their parent's support (:meth:`children_fitter`'s
    ``on_support``).

    Attributes
    ----------
    idx : ndarray
        The parent's support: sorted ``int64`` cell indices (where the parent is positive).
    x : ndarray
        ``(K, idx.size)`` float64, the children on the support: non-negative, each column
        summing to ``parent[idx]`` (zero everywhere else).
    report : ConvergenceReport
        As for :func:`fit_children`.
    """

    idx: np.ndarray
    x: np.ndarray
    report: ConvergenceReport

    def dense(self, n: int) -> np.ndarray:
        """The children on the whole domain of ``n`` cells, ``(K, n)``."""
        X = np.zeros((self.x.shape[0], n))
        X[:, self.idx] = self.x
        return X


def _batches(K: int, n: int) -> list[tuple[int, int]]:
    """Row ranges ``(a, b)`` of at most :data:`_BATCH_ENTRIES` entries of ``n`` cells."""
    step = max(1, _BATCH_ENTRIES // max(n, 1))
    return [(a, min(K, a + step)) for a in range(0, K, step)]


class ChildrenFitter:
    """The fits of one level (build with :func:`children_fitter`, which documents it)."""

    def __init__(
        self, A: LinearQuery, weights: np.ndarray | float | None, tol: float, maxiter: int,
        gram: str, method: str, start: str,
    ) -> None:  # fmt: skip
        if not tol > 0:
            raise ArgumentError(f"tol must be positive, got {tol}")
        if method not in _METHODS:
            raise ArgumentError(f"unknown method {method!r}; use one of {', '.join(_METHODS)}")
        self.level = Level(A, weights, gram)
        if method == "auto":
            kind = self.level.kind
            method = {"dense": "fista", "union": "active"}.get(kind, "newton")
        if start not in _STARTS:
            raise ShapeError(f"unknown start {start!r}; use one of {', '.join(_STARTS)}")
        self.method, self.tol, self.maxiter, self.start = method, tol, maxiter, start
        m = A.shape[0]
        w = None if weights is None else np.broadcast_to(np.asarray(weights, dtype=float), (m,))
        self.root_w = None if w is None else np.sqrt(w)

    def _parent(self, parent: np.ndarray) -> np.ndarray:
        n = self.level.n
        p = np.asarray(parent, dtype=float)
        if p.shape != (n,):
            raise ShapeError(f"parent has shape {p.shape}; expected ({n},)")
        if not np.isfinite(p).all() or (p < 0).any():
            raise ArgumentError("the parent's estimate must be finite and non-negative")
        return p

    @functools.cached_property
    def _pinv(self) -> LinearQuery | None:
        """The row-weighted strategy's structured pseudo-inverse, if any (through a scalar
        weight: ``(c A)^+ = A^+ / c``)."""
        Aw, c = self.level.Aw, 1.0
        while isinstance(Aw, Scaled):
            c *= float(Aw.c)
            Aw = Aw.A
        inner = structured_pinv(Aw) if c != 0 else None
        return inner if inner is None or c == 1.0 else Scaled(inner, 1.0 / c)

    def _least_squares(self, pinv: LinearQuery, Yw: np.ndarray, AtY: np.ndarray) -> np.ndarray:
        """The least-squares estimates of the rows ``Yw`` (row-weighted measurements),
        from ``AtY = A_w^T Yw`` when the pseudo-inverse solves the normal equations
        (:class:`~dpdask.reconstruct.structured.KronPairInverse`: it would compute
        ``A_w^T Yw`` again)."""
        inner, c = pinv, 1.0
        if isinstance(inner, Scaled):
            c = float(inner.c)
            inner = inner.A
        if isinstance(inner, KronPairInverse):
            # pinv = inner / w for A_w = w A: (A^T A)^+ A^T y / w = (A^T A)^+ (A_w^T y) / w^2
            return inner._normal_solve(AtY) * (c * c)
        return pinv.apply(Yw)

    def _linear(
        self, Y: np.ndarray | None, Z: np.ndarray | None, idx: np.ndarray, lean: bool
    ) -> tuple[
        np.ndarray, float, np.ndarray | None, np.ndarray | None, Callable[[], np.ndarray] | None
    ]:
        """The scaled linear terms on the support ``(K, |S|)``, the objective's constant,
        the scaled estimates on the support and their marginals there
        (:meth:`~dpdask.reconstruct.topdown._level.Level.marginals`; each None when not
        known), and the whole-domain linear terms for the ADMM start (a callable, or
        None), formed a few rows at a time."""
        level = self.level
        n, s = level.n, level.scale
        if (Y is None) == (Z is None):
            raise ShapeError("give exactly one of Y (measurements) or Z (estimates)")
        pinv = None
        if Y is not None:
            Yb, _ = as_batch(Y, level.A.shape[0], "measurements")
            K = Yb.shape[0]
            if lean and K > 1 and self.start in ("auto", "estimates"):
                pinv = self._pinv
        elif Z is not None:  # always, when Y is None (checked above)
            Zb, _ = as_batch(Z, n, "estimates")
            K = Zb.shape[0]
        C = np.empty((K, idx.size))
        Zs = np.empty((K, idx.size)) if Z is not None or pinv is not None else None
        const = 0.0
        margins = np.empty((K, idx.size)) if Zs is not None and level.unions else None
        for a, b in _batches(K, n):
            if Y is not None:
                Yw = Yb[a:b] if self.root_w is None else Yb[a:b] * self.root_w
                const += 0.5 * float(np.vdot(Yw, Yw))
                AtY = level.Aw.T.apply(Yw)
                C[a:b] = AtY[:, idx] * s[idx]
                rows = None if pinv is None else self._least_squares(pinv, Yw, AtY)
            else:
                rows = Zb[a:b]
                Zsb = rows / s
                Cb = level.gram_rows(Zsb)
                const += 0.5 * float(np.vdot(Zsb, Cb))
                C[a:b] = Cb[:, idx]
            if Zs is not None and rows is not None:
                Zs[a:b] = rows[:, idx] / s[idx]
                if margins is not None:
                    margins[a:b] = level.marginals(rows, idx)
        full = None
        admm = self.method == "newton" and level.admm is not None
        if admm and (not lean or self.start == "admm"):

            def full() -> np.ndarray:
                if Y is not None:
                    return level.Aw.T.apply(Yb if self.root_w is None else Yb * self.root_w) * s
                return level.gram_rows(Zb / s)

        return C, const, Zs, margins, full

    def _support_fit(
        self, parent: np.ndarray, Y: np.ndarray | None, Z: np.ndarray | None, lean: bool,
        fixed: np.ndarray | None = None, totals: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> SupportEstimate:  # fmt: skip
        p = self._parent(parent)
        idx = np.flatnonzero(p > 0).astype(np.int64)
        F = None if fixed is None else np.asarray(fixed, dtype=bool)[:, idx]
        # one BLAS thread: the products are small, and a second thread that is not
        # scheduled (a busy core) stalls each of them by milliseconds
        with _blas().limit(limits=1, user_api="blas"):
            C, const, Zs, margins, full = self._linear(Y, Z, idx, lean)
            x, report = solve_support(
                self,
                C,
                const,
                p,
                idx,
                Zs,
                full,
                margins,
                stacklevel=6,
                fixed=F,
                totals=totals,
            )
        return SupportEstimate(idx, x, report)

    def on_support(
        self, parent: np.ndarray, *, Y: np.ndarray | None = None, Z: np.ndarray | None = None,
        fixed: np.ndarray | None = None, totals: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> SupportEstimate:  # fmt: skip
        """The fit of one family on its parent's support, in memory ``O(K |S|)``.

        Parameters
        ----------
        parent : ndarray
            ``(n,)`` the parent's final, non-negative estimate.
        Y : ndarray, optional
            ``(K, m)`` the children's measurements.
        Z : ndarray, optional
            ``(K, n)`` the children's (weighted) least-squares estimates instead.
        fixed : ndarray, optional
            ``(K, n)`` bool, pairs held at zero (per-child structural zeros); only with
            the FISTA method (a dense Gram). Every cell of the support must keep a child
            that is not fixed.
        totals : tuple of ndarray, optional
            ``(v, u)``, each ``(K,)``: an extra row ``1^T x_c = v_c`` of weight ``u_c``
            per child in the objective (FISTA only).

        Returns
        -------
        SupportEstimate
            The support, the children on it and the report: the fit of ``__call__``
            (or ``from_estimates``) restricted to the support. The linear terms are
            formed a few rows at a time and only their support is kept, so nothing of
            shape ``(K, n)`` is allocated. From ``Y`` with a structured pseudo-inverse
            (:func:`~dpdask.reconstruct.structured.structured_pinv`) the fit may start
            from the least-squares estimates on the support, as ``from_estimates``
            does; the ADMM start (whole-domain, ``(K, n)`` float32) is taken only when
            the fitter's ``start`` is ``"admm"``.

        Raises
        ------
        ValueError
            Unless exactly one of ``Y`` and ``Z`` is given, or as for ``__call__``.
        """
        return self._support_fit(parent, Y, Z, lean=True, fixed=fixed, totals=totals)

    def __call__(self, Y: np.ndarray, parent: np.ndarray) -> Estimate:
        est = self._support_fit(parent, Y, None, lean=False)
        return Estimate(est.dense(self.level.n), est.report)

    def from_estimates(self, Z: np.ndarray, parent: np.ndarray) -> Estimate:
        est = self._support_fit(parent, None, Z, lean=False)
        return Estimate(est.dense(self.level.n), est.report)
