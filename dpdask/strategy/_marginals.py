"""Weighted marginals strategies and the algebra of their Gram matrices (HDMM's OPT_M).

On a domain of sizes ``(n_1, ..., n_d)`` a subset ``a`` of the attributes names
the marginal ``M_a = (x)_i (I if i in a else 1^T)``. Subsets are indexed like the
cells of a ``(2,) * d`` array in C order: index ``k`` stands for the subset whose
indicator vector is ``np.unravel_index(k, (2,) * d)``, so ``k = 0`` is the total
and ``k = 2**d - 1`` the full table.

Gram algebra. Write ``K_a = (x)_i (I if i in a else J)``. The Gram matrix of the
weighted marginals ``[theta_a M_a]_a`` is ``sum_a theta_a^2 K_a``. All ``K_a``
share the eigenspaces ``P_s = (x)_{i in s} (I - J/n_i) (x)_{i not in s} J/n_i``
(``sum_s P_s = I``, ``dim P_s = prod_{i in s} (n_i - 1)``), and ``K_a`` acts on
``P_s`` as ``w(a) = prod_{i not in a} n_i`` when ``s`` is a subset of ``a``, else
as 0. So for ``X = sum_a u_a K_a``::

    X P_s = mu(s) P_s,   mu(s) = sum_{a superset of s} u_a w(a)   (a superset sum)
    X^+ = sum_{s: mu(s) > 0} P_s / mu(s)
        = sum_b c_b K_b,  c_b = (1 / w(b)) sum_{s superset of b} (-1)^{|s|-|b|} / mu(s)

the last step expanding ``P_s`` in the ``K`` basis (a Moebius transform). Every
transform costs ``O(d 2^d)``.

Error. For a workload term ``W = (x)_i W_i`` with ``G_i = W_i^T W_i``,
``tr(G P_s) = prod_{i in s} (tr G_i - 1^T G_i 1 / n_i) prod_{i not in s} 1^T G_i 1 / n_i``;
summing over the terms gives ``h(s)`` once per workload, and then
``||W A^+||_F^2 = sum_s h(s) / mu(s)`` for any weights: ``O(2^d)`` per
evaluation of the OPT_M objective, whatever the domain's size. The workload is
supported exactly when ``h(s) = 0`` wherever ``mu(s) = 0``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dpdask.errors import ArgumentError, PlanError, ShapeError
from dpdask.linalg import (
    Identity,
    Kron,
    LinearQuery,
    Ones,
    Scaled,
    VStack,
    kron_vector,
    register_operator,
)

__all__ = [
    "WeightedMarginals",
    "marginal_eigenvalues",
    "marginal_gram",
    "marginals_loss",
    "pinv_coefficients",
    "subset_label",
]

_SUPPORT_RTOL = 1e-10


def _axes(d: int) -> tuple[int, ...]:
    return (2,) * d


def _lattice(f: np.ndarray, d: int, step: Callable[[np.ndarray, np.ndarray], object]) -> np.ndarray:
    """Apply ``step(lower, upper)`` along every attribute axis of the subset lattice."""
    g = np.array(f, dtype=float).reshape(_axes(d))
    for ax in range(d):
        lower = [slice(None)] * d
        upper = [slice(None)] * d
        lower[ax], upper[ax] = slice(0, 1), slice(1, 2)
        step(g[tuple(lower)], g[tuple(upper)])
    return g.ravel()


def superset_sum(f: np.ndarray, d: int) -> np.ndarray:
    """``g(s) = sum_{a superset of s} f(a)`` over the subset lattice."""

    def step(lo: np.ndarray, up: np.ndarray) -> None:
        lo += up

    return _lattice(f, d, step)


def subset_sum(f: np.ndarray, d: int) -> np.ndarray:
    """``g(a) = sum_{s subset of a} f(s)``."""

    def step(lo: np.ndarray, up: np.ndarray) -> None:
        up += lo

    return _lattice(f, d, step)


def superset_moebius(f: np.ndarray, d: int) -> np.ndarray:
    """``g(b) = sum_{s superset of b} (-1)^{|s|-|b|} f(s)`` (inverse of :func:`superset_sum`)."""

    def step(lo: np.ndarray, up: np.ndarray) -> None:
        lo -= up

    return _lattice(f, d, step)


def outer_pairs(pairs: Sequence[tuple[float, float]]) -> np.ndarray:
    """``v(s) = prod_i pairs[i][s_i]`` as a flat vector over the ``2^d`` subsets."""
    return kron_vector([np.array([a, b], dtype=float) for a, b in pairs])


def complement_sizes(sizes: Sequence[int]) -> np.ndarray:
    """``w(a) = prod_{i not in a} n_i`` for every subset ``a``."""
    return outer_pairs([(float(n), 1.0) for n in sizes])


def eigenspace_dims(sizes: Sequence[int]) -> np.ndarray:
    """``dim P_s = prod_{i in s} (n_i - 1)`` for every subset ``s``."""
    return outer_pairs([(1.0, float(n - 1)) for n in sizes])


def marginal_eigenvalues(u: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Eigenvalue ``mu(s)`` of ``sum_a u_a K_a`` on each eigenspace ``P_s``."""
    return superset_sum(np.asarray(u, dtype=float) * complement_sizes(sizes), len(sizes))


def pseudo_inverse_eigenvalues(mu: np.ndarray) -> np.ndarray:
    """``1 / mu`` where ``mu`` is numerically positive, else 0."""
    tol = max(float(np.max(np.abs(mu), initial=0.0)), 1e-300) * 1e-12
    out = np.zeros_like(mu)
    pos = mu > tol
    out[pos] = 1.0 / mu[pos]
    return out


def pinv_coefficients(u: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Coefficients ``c_b`` with ``(sum_a u_a K_a)^+ = sum_b c_b K_b``."""
    d = len(sizes)
    mu_inv = pseudo_inverse_eigenvalues(marginal_eigenvalues(u, sizes))
    out: np.ndarray = superset_moebius(mu_inv, d) / complement_sizes(sizes)
    return out


def subset_label(k: int, names: Sequence[str]) -> str:
    """A readable name of subset ``k``: the attribute names joined by ``x``, or ``total``."""
    bits = np.unravel_index(int(k), _axes(len(names)))
    chosen = [nm for nm, b in zip(names, bits, strict=True) if b]
    return " x ".join(chosen) if chosen else "total"


class WeightedMarginals(VStack):
    """The strategy ``[theta_a M_a]`` of weighted marginals over a domain.

    A :class:`~dpdask.linalg.VStack` of :class:`~dpdask.linalg.Kron` marginals (only
    the subsets with a non-zero weight are stacked) that also keeps the full weight
    vector, so that its Gram matrix and pseudo-inverse stay in closed form.

    Parameters
    ----------
    sizes : sequence of int
        Attribute sizes ``(n_1, ..., n_d)``.
    theta : array_like, shape (2**d,)
        Weight of every marginal, indexed as in the module docstring.
    names : sequence of str, optional
        Attribute names (for the part labels).

    Examples
    --------
    >>> A = WeightedMarginals((2, 3), [0.0, 0.5, 0.5, 0.0])  # the two one-way marginals
    >>> A.shape
    (5, 6)
    >>> A.sensitivity(1)
    1.0
    """

    def __init__(self, sizes: Sequence[int], theta: np.ndarray, names: Sequence[str] | None = None):
        sizes = tuple(int(n) for n in sizes)
        d = len(sizes)
        th = np.asarray(theta, dtype=float).ravel()
        if th.size != 2**d:
            raise ShapeError(f"{d} attributes need {2**d} marginal weights, got {th.size}")
        if not np.isfinite(th).all():
            raise ArgumentError("marginal weights must be finite")
        keep = np.flatnonzero(th)
        if keep.size == 0:
            raise ArgumentError("a weighted marginals strategy needs a non-zero weight")
        labels = list(names) if names is not None else [f"a{i}" for i in range(d)]
        parts = []
        for k in keep:
            bits = np.unravel_index(int(k), _axes(d))
            parts.append(
                Kron([Identity(n) if b else Ones(n) for n, b in zip(sizes, bits, strict=True)])
            )
        super().__init__(
            parts,
            weights=[float(w) for w in th[keep]],
            names=[subset_label(int(k), labels) for k in keep],
        )
        self.sizes = sizes
        self.theta = th
        self.attr_names = tuple(names) if names is not None else None

    def _params(self) -> tuple[object, ...]:
        return (self.sizes, self.theta)

    def gram_coefficients(self) -> np.ndarray:
        """``u_a = theta_a^2``: the Gram matrix is ``sum_a u_a K_a``."""
        return self.theta**2

    def __repr__(self) -> str:
        return f"WeightedMarginals(sizes={self.sizes}, {np.count_nonzero(self.theta)} marginals)"


def marginal_gram(A: LinearQuery, sizes: Sequence[int]) -> np.ndarray | None:
    """Coefficients ``u`` with ``A^T A = sum_a u_a K_a`` over ``sizes``, or ``None``.

    Recognises weighted marginals, Kronecker products of identities and totals,
    their unions and scalings, and the identity and total on the flat domain.
    """
    sizes = tuple(int(n) for n in sizes)
    d = len(sizes)
    N = int(np.prod(sizes))
    if isinstance(A, WeightedMarginals) and A.sizes == sizes:
        return A.gram_coefficients()
    if isinstance(A, Scaled):
        u = marginal_gram(A.A, sizes)
        return None if u is None else A.c**2 * u
    if isinstance(A, VStack):
        acc = np.zeros(2**d)
        for part, w in zip(A.parts, A.weights, strict=True):
            u = marginal_gram(part, sizes)
            if u is None:
                return None
            acc += w**2 * u
        return acc
    if isinstance(A, Identity) and A.n == N:
        u = np.zeros(2**d)
        u[-1] = 1.0
        return u
    if isinstance(A, Ones) and A.n == N:
        u = np.zeros(2**d)
        u[0] = float(A.m)
        return u
    if isinstance(A, Kron) and A.in_shape == sizes:
        bits, coef = [], 1.0
        for f in A.factors:
            c = 1.0
            while isinstance(f, Scaled):
                c, f = c * f.c**2, f.A
            if isinstance(f, Identity):
                bits.append(1)
            elif isinstance(f, Ones):
                bits.append(0)
                c *= f.m
            else:
                return None
            coef *= c
        u = np.zeros(2**d)
        u[np.ravel_multi_index(tuple(bits), _axes(d))] = coef
        return u
    return None


def workload_spectrum(
    traces: np.ndarray, totals: np.ndarray, weights: np.ndarray, sizes: Sequence[int]
) -> np.ndarray:
    """``h(s) = tr(W^T W P_s)`` for a union of Kronecker terms.

    Parameters
    ----------
    traces, totals : ndarray, shape (k, d)
        ``tr(G_ij)`` and ``1^T G_ij 1`` of factor ``i`` of term ``j``.
    weights : ndarray, shape (k,)
        Squared term weights.
    sizes : sequence of int
        Attribute sizes.
    """
    n = np.asarray(sizes, dtype=float)
    k, d = traces.shape
    inside = traces - totals / n  # tr(G (I - J/n))
    outside = totals / n  # tr(G J/n)
    acc = weights[:, None] * np.ones((k, 1))
    for i in range(d):
        acc = acc[:, :, None] * np.stack([outside[:, i], inside[:, i]], axis=1)[:, None, :]
        acc = acc.reshape(k, -1)
    out: np.ndarray = np.clip(acc.sum(axis=0), 0.0, None)
    return out


def check_marginal_support(h: np.ndarray, mu: np.ndarray, what: str = "the workload") -> None:
    """Raise ``PlanError`` if ``h(s) > 0`` on an eigenspace where ``mu(s) = 0``."""
    missing = (pseudo_inverse_eigenvalues(mu) == 0) & (h > _SUPPORT_RTOL * max(h.max(), 1e-300))
    if missing.any():
        raise PlanError(
            f"the strategy does not support {what}: it measures no marginal that "
            "determines some of the workload's queries, so their error is unbounded"
        )


def marginals_loss(
    theta: np.ndarray, h: np.ndarray, wc: np.ndarray, d: int, norm: int = 1
) -> tuple[float, np.ndarray]:
    """``||A||_norm^2 * sum_s h(s) / mu(s)`` and its gradient in ``theta``.

    ``mu = superset_sum(theta^2 * wc)``; ``d sum_s h/mu / d theta_a =
    -2 theta_a wc(a) sum_{s subset of a} h(s) / mu(s)^2``.
    """
    u = theta * theta
    mu = superset_sum(u * wc, d)
    live = h > 0
    if np.any(mu[live] <= 0):
        return np.inf, np.zeros_like(theta)
    q = np.zeros_like(h)
    q[live] = h[live] / mu[live]
    F = float(q.sum())
    q[live] /= mu[live]
    dF = -2.0 * theta * wc * subset_sum(q, d)
    if norm == 1:
        s = float(np.abs(theta).sum())
        return s * s * F, 2.0 * s * np.sign(theta) * F + s * s * dF
    s2 = float(u.sum())
    return s2 * F, 2.0 * theta * F + s2 * dF


register_operator(
    WeightedMarginals,
    lambda o, w: {
        "sizes": list(o.sizes),
        "theta": w.array(o.theta),
        "attr_names": list(o.attr_names) if o.attr_names is not None else None,
    },
    lambda d, r: WeightedMarginals(d["sizes"], r.array(d["theta"]), d.get("attr_names")),
)
