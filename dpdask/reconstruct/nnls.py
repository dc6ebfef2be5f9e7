"""Non-negative least squares on implicit operators: NNLS and workload NNLS (WNNLS).

Both minimise a convex quadratic over the non-negative orthant,

    f(x) = 1/2 x^T G x - c^T x,   x >= 0,

with ``G = A^T W A`` and ``c = A^T W y`` for NNLS (``W`` the row weights), and
``G = W^T W`` and ``c = G x_ls`` for WNNLS (McKenna et al., appendix A of paper 002:
fit the workload answers ``W x_ls`` of the least-squares estimate, not the
strategy's). ``G`` is only ever applied, through the operators' structured
``gram()`` (a Kronecker product of small factors for a Kronecker strategy).

Two solvers. The default (``method="auto"``) is projected Newton
(:mod:`dpdask.reconstruct._newton`): float32 Kronecker (or union-of-Kronecker) Gram
products, started for a Kronecker strategy from a few ADMM iterations that use the
factors' eigenvectors (:mod:`dpdask.reconstruct._admm_start`); each right-hand side is
solved on its own working set, the inner solves on the free set only, with a product
restricted to it (:meth:`~dpdask.reconstruct._kron_gram.ScaledKronGram.restricted`, or
for a union :meth:`~dpdask.reconstruct._union_gram.ScaledUnionGram.restricted`, whose
cost grows with the free set and the parts' marginals).
:func:`nonnegative_fit` solves the same problem from an estimate instead of the
measurements, and :func:`nonnegative_fitter` does so for many estimates (a chunk of
geographies), computing what the fits share once (:mod:`._metric`). The other
(``method="spg"``) is the spectral projected gradient method (:mod:`._spg`), started
from the clipped least-squares estimate.

Stopping rule: the root-mean-square projected gradient ``||u - P(u - grad)|| /
sqrt(n)`` of the Jacobi-scaled variables ``u_i = sqrt(G_ii) x_i`` is at most ``tol``.
With weights ``1 / variance`` its entries are in units of the noise: at the true
data each scaled gradient entry ``a_i^T W (A x - y) / sqrt(G_ii)`` has variance one.
So the default ``tol = 1e-2`` asks that what is left to optimise be a hundredth of
the noise (with unweighted measurements, of unit variance; scale ``tol`` by the noise
standard deviation otherwise).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import LinearQuery
from dpdask.reconstruct._inputs import as_batch
from dpdask.reconstruct._kron_gram import ScaledKronGram
from dpdask.reconstruct._metric import Metric, shared_metric
from dpdask.reconstruct._newton import projected_newton
from dpdask.reconstruct._report import ConvergenceReport, Estimate, warn_at_limit
from dpdask.reconstruct._spg import spg_quadratic
from dpdask.reconstruct._union_gram import ScaledUnionGram
from dpdask.reconstruct.least_squares import _cheap_pinv, least_squares

__all__ = ["nnls", "nonnegative_fit", "nonnegative_fitter", "wnnls"]


def _start(
    x0: np.ndarray | str, ls: Callable[[], np.ndarray], cheap: bool, g: int, n: int
) -> tuple[np.ndarray, str]:
    """The starting point ``(g, n)`` and its name: clipped least squares, zero or given.

    ``cheap`` says whether ``"auto"`` takes least squares."""
    if isinstance(x0, str):
        if x0 not in ("auto", "ls", "zero"):
            raise ArgumentError(f"unknown start {x0!r}; use 'auto', 'ls', 'zero' or an array")
        if x0 == "ls" or (x0 == "auto" and cheap):
            return np.maximum(ls(), 0.0), "ls"
        return np.zeros((g, n)), "zero"
    X0 = np.broadcast_to(np.asarray(x0, dtype=float), (g, n))
    if not np.isfinite(X0).all():
        raise ArgumentError("the starting point contains NaN or infinite values")
    return np.maximum(X0, 0.0), "given"


def _solve(
    metric: Metric,
    C: np.ndarray,
    X0: np.ndarray,
    *,
    method: str,
    tol: float,
    maxiter: int,
    warm: bool = False,
) -> tuple[np.ndarray, ConvergenceReport]:
    """Minimise ``1/2 x^T G x - c^T x`` over ``x >= 0``, ``G = A^T A`` (``metric.A``), in
    the variables ``u = x / s`` with ``s = diag(G)^-1/2``.

    A Kronecker ``A`` of small factors gets the float32 Kronecker product of the scaled
    factors, a union of such products the float32 sum of the parts' products (both
    checked in float64 before stopping; :mod:`._kron_gram`, :mod:`._union_gram`), with
    one BLAS thread (their matrices are small: threads cost more than they save);
    anything else the structured ``gram()``. With ``warm``, a Kronecker ``A`` starts
    projected Newton from a few ADMM iterations (:mod:`._admm_start`) instead of ``X0``;
    ``details["start"]`` is then ``"admm"``.
    """
    s = metric.scale
    if method == "newton":
        fast = metric.fast
        gmv: Callable[[np.ndarray], np.ndarray]
        exact: Callable[[np.ndarray], np.ndarray] | None
        if fast is not None:
            gmv, exact = fast.rows, metric.exact
        else:
            G = metric.compact
            srow = s[:, 0]

            def compact_rows(V: np.ndarray) -> np.ndarray:
                return np.ascontiguousarray((s * G._matmat((srow * V).T)).T)

            gmv, exact = compact_rows, None
        Ct = (s * C).T.copy()
        kron = isinstance(fast, ScaledKronGram)
        admm = warm and kron
        with threadpool_limits(limits=1, user_api="blas"):
            U0 = metric.admm(Ct) if admm else (X0 / s).T.copy()
            Ut, report = projected_newton(
                gmv,
                Ct,
                U0,
                tol=tol,
                maxiter=maxiter,
                exact=exact,
                restrict=fast.restricted if fast is not None else None,
                entries=fast.from_entries if isinstance(fast, ScaledKronGram) else None,
            )
        if admm:
            report.details["start"] = "admm"
        report.details["kronecker_float32"] = kron
        report.details["union_float32"] = isinstance(fast, ScaledUnionGram)
        return s * Ut.T, report
    G = metric.compact

    def gmv_cols(U: np.ndarray) -> np.ndarray:
        out: np.ndarray = s * G._matmat(s * U)
        return out

    U, report = spg_quadratic(gmv_cols, s * C, X0 / s, tol=tol, maxiter=maxiter)
    return s * U, report


def _check_method(method: str) -> str:
    if method not in ("auto", "newton", "spg"):
        raise ArgumentError(f"unknown NNLS method {method!r}; use 'auto', 'newton' or 'spg'")
    return "newton" if method == "auto" else method


def _estimate(
    metric: Metric,
    C: np.ndarray,
    X0: np.ndarray,
    start: tuple[np.ndarray | str, str],
    single: bool,
    *,
    method: str,
    tol: float,
    maxiter: int,
) -> Estimate:
    """The :class:`Estimate` of :func:`nnls` and :func:`nonnegative_fit`: ``metric`` the
    row-weighted operator, ``C`` its ``(n, g)`` linear terms, ``X0`` the ``(g, n)``
    start and ``start`` the start asked for and the one taken (``"auto"`` lets a
    Kronecker operator start from ADMM)."""
    asked, started = start
    X, report = _solve(
        metric, C, X0.T, method=method, tol=tol, maxiter=maxiter,
        warm=isinstance(asked, str) and asked == "auto",
    )  # fmt: skip
    report.method = f"nnls-{method}"
    report.details.setdefault("start", started)
    warn_at_limit(report, maxiter, stacklevel=4)  # the caller of nnls, or of fit(x)
    Xt = X.T
    return Estimate(Xt[0] if single else Xt, report)


def nnls(
    A: LinearQuery,
    y: np.ndarray,
    weights: np.ndarray | float | None = None,
    *,
    x0: np.ndarray | str = "auto",
    tol: float = 1e-2,
    maxiter: int = 5000,
    method: str = "auto",
) -> Estimate:
    """The non-negative (weighted) least-squares estimate ``argmin_{x >= 0} ||A x - y||_W^2``.

    Parameters
    ----------
    A : LinearQuery
        The strategy, ``m x n``, implicit.
    y : ndarray
        Measurements, shape ``(m,)``, or ``(g, m)`` for ``g`` geographies (solved together).
    weights : ndarray or float, optional
        Per-row weights, usually ``1 / variance`` of each measurement.
    x0 : {"auto", "ls", "zero"} or ndarray
        Starting point: the clipped least-squares estimate, zero, or an array of shape
        ``(n,)`` or ``(g, n)`` (clipped at zero). ``"auto"``, for the projected Newton
        method, is 12 to 20 ADMM iterations when ``A`` is a Kronecker product of small
        factors (:mod:`dpdask.reconstruct._admm_start`) and zero otherwise (the free set
        then grows to the support of a sparse solution instead of shrinking from half
        the cells); for SPG it is least squares
        when its pseudo-inverse is structured (a Kronecker strategy) and zero otherwise.
    tol : float
        Stop when the root-mean-square projected gradient of the Jacobi-scaled problem
        is at most ``tol`` (in units of the noise standard deviation when ``weights``
        are inverse variances; see the module docstring), per right-hand side.
    maxiter : int
        Iteration limit, per right-hand side (SPG: one application of ``A^T W A`` each;
        projected Newton: about a dozen, ``details["products"]`` counting the full ones
        and ``details["restricted"]`` those restricted to the free set, summed over the
        right-hand sides). Stopping there before ``tol`` emits a
        :class:`~dpdask.errors.ConvergenceWarning` (and ``report.converged`` is False).
    method : {"auto", "newton", "spg"}
        Projected Newton with conjugate-residual inner solves (``"auto"``; for a
        Kronecker strategy of small factors its products are float32 Kronecker
        products of the Gram factors, verified in float64 before stopping), or the
        spectral projected gradient method (see the module docstring).

    Returns
    -------
    Estimate
        ``x >= 0`` of shape ``(n,)`` or ``(g, n)``, and the report (``method`` is
        ``"nnls-newton"`` or ``"nnls-spg"``; ``details["start"]`` is how the iteration
        was started).

    Raises
    ------
    ValueError
        If the measurements or weights have the wrong shape or are not finite.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Total, VStack
    >>> A = VStack([Identity(3), Total(3)])
    >>> x, report = nnls(A, np.array([-1.0, 2.0, 3.0, 4.0]))
    >>> np.round(x, 6).tolist(), report.converged
    ([0.0, 1.666667, 2.666667], True)
    """
    method = _check_method(method)
    Y, single = as_batch(y, A.shape[0], "measurements")
    g, n = Y.shape[0], A.shape[1]
    metric = Metric(A, weights)
    Aw = metric.A
    Yw = Y if weights is None else Y * np.sqrt(np.broadcast_to(weights, (A.shape[0],)))
    cheap = method == "spg" and _cheap_pinv(Aw)
    X0, started = _start(x0, lambda: least_squares(A, Y, weights).x, cheap, g, n)
    C = Aw.T._matmat(Yw.T)
    return _estimate(metric, C, X0, (x0, started), single, method=method, tol=tol, maxiter=maxiter)


def nonnegative_fit(
    M: LinearQuery,
    x: np.ndarray,
    weights: np.ndarray | float | None = None,
    *,
    x0: np.ndarray | str = "auto",
    tol: float = 1e-2,
    maxiter: int = 5000,
    method: str = "auto",
) -> Estimate:
    """The ``x >= 0`` nearest to an estimate in the metric of ``M``: ``argmin ||M (x - x_hat)||_W``.

    When ``x_hat`` is a (weighted) least-squares estimate from measurements ``y`` of a
    strategy ``M``, ``||M x - y||_W^2 = ||M (x - x_hat)||_W^2 + const``, so this is
    :func:`nnls` on ``y`` computed from ``x_hat`` alone (one product with the Gram
    ``M^T W M`` instead of ``M^T W y``); with ``M`` a workload it is the fit of
    :func:`wnnls`.

    Parameters
    ----------
    M : LinearQuery
        The operator whose answers are fitted, ``m x n``.
    x : ndarray
        Estimates ``(n,)`` or ``(g, n)``.
    weights : ndarray or float, optional
        Per-row weights of ``M`` (inverse variances put ``tol`` in noise units).
    x0, tol, maxiter, method
        As for :func:`nnls`; ``"auto"`` starts a Kronecker ``M`` of small factors from a
        few ADMM iterations, anything else from the clipped estimate.

    Returns
    -------
    Estimate
        ``x >= 0`` of shape ``(n,)`` or ``(g, n)`` and the report.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Total, VStack
    >>> A = VStack([Identity(2), Total(2)])
    >>> x, report = nonnegative_fit(A, np.array([3.0, -1.0]))
    >>> np.round(x, 6).tolist(), report.converged
    ([2.5, 0.0], True)
    """
    return nonnegative_fitter(M, weights, x0=x0, tol=tol, maxiter=maxiter, method=method)(x)


def nonnegative_fitter(
    M: LinearQuery,
    weights: np.ndarray | float | None = None,
    *,
    x0: np.ndarray | str = "auto",
    tol: float = 1e-2,
    maxiter: int = 5000,
    method: str = "auto",
) -> Callable[[np.ndarray], Estimate]:
    """:func:`nonnegative_fit` with the operator and its options fixed, for many estimates.

    What every fit in the metric of ``M`` shares (the Jacobi scaling, the float32 Gram,
    its eigenvectors for the ADMM start) is computed once, by the first fit, and kept
    for the process's later fitters of the same ``M`` and ``weights`` (the last few
    such metrics are kept); geographies fitted one by one, a chunk or a task at a time,
    then pay for it once instead of once per geography.

    Parameters
    ----------
    M, weights, x0, tol, maxiter, method
        As for :func:`nonnegative_fit`.

    Returns
    -------
    callable
        ``fit(x)``: :func:`nonnegative_fit` of the estimates ``x``, ``(n,)`` or
        ``(g, n)``.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Total, VStack
    >>> fit = nonnegative_fitter(VStack([Identity(2), Total(2)]))
    >>> [np.round(fit(x).x, 6).tolist() for x in ([3.0, -1.0], [1.0, 1.0])]
    [[2.5, 0.0], [1.0, 1.0]]
    """
    method = _check_method(method)
    metric = shared_metric(M, weights)
    n = M.shape[1]

    def fit(x: np.ndarray) -> Estimate:
        X, single = as_batch(x, n, "estimates")
        C = metric.compact._matmat(X.T)
        X0, started = _start(x0, lambda: X, True, X.shape[0], n)
        return _estimate(
            metric, C, X0, (x0, started), single, method=method, tol=tol, maxiter=maxiter
        )

    return fit


def wnnls(
    W: LinearQuery,
    A: LinearQuery,
    y: np.ndarray,
    weights: np.ndarray | float | None = None,
    *,
    x0: np.ndarray | str = "auto",
    tol: float = 1e-2,
    maxiter: int = 5000,
    method: str = "auto",
) -> Estimate:
    """Workload NNLS: the ``x >= 0`` whose workload answers best fit the least-squares ones.

    Computes ``x_ls``, the (weighted) least-squares estimate from the strategy
    measurements, then ``argmin_{x >= 0} ||W x - W x_ls||^2`` (appendix A of paper 002),
    through the Gram matrix ``W^T W`` only.

    Parameters
    ----------
    W : LinearQuery
        The workload, ``q x n``.
    A : LinearQuery
        The strategy, ``m x n``.
    y : ndarray
        Measurements of the strategy, ``(m,)`` or ``(g, m)``.
    weights : ndarray or float, optional
        Per-row weights of the strategy's measurements (for the least-squares step).
    x0, tol, maxiter, method
        As for :func:`nnls`, except that ``"auto"`` always starts from the least-squares
        estimate (computed anyway; when it is non-negative it is the answer); the
        gradient is in the units of the workload answers.

    Returns
    -------
    Estimate
        ``x >= 0`` of shape ``(n,)`` or ``(g, n)``; the workload answers are ``W @ x``.
        When ``W`` does not have full column rank, ``x`` is one minimiser and ``W x`` is
        what is determined.

    Examples
    --------
    >>> from dpdask.linalg import Identity, Prefix, Total, VStack
    >>> A = VStack([Identity(3), Total(3)])
    >>> x, _ = wnnls(Prefix(3), A, np.array([-2.0, 1.0, 3.0, 2.0]))
    >>> bool((x >= 0).all())
    True
    """
    if W.shape[1] != A.shape[1]:
        raise ShapeError(f"workload has {W.shape[1]} columns but the strategy has {A.shape[1]}")
    method = _check_method(method)
    Y, single = as_batch(y, A.shape[0], "measurements")
    ls = least_squares(A, Y, weights)
    start = "ls" if isinstance(x0, str) and x0 == "auto" else x0
    X, report = nonnegative_fit(W, ls.x, x0=start, tol=tol, maxiter=maxiter, method=method)
    report.method = f"wnnls-{method}"
    report.details["least_squares"] = ls.report.to_dict()
    return Estimate(X[0] if single else X, report)
