"""Baseline strategies: identity, workload, hierarchical trees, Haar wavelet, convex optimum.

Each function returns the strategy ``A`` (the queries measured) as a
:class:`dpdask.linalg.LinearQuery`. None is normalised: a mechanism scales its
noise by ``A``'s sensitivity (L1 for Laplace, L2 for Gaussian), so ``A`` and
``c A`` are the same strategy. Trees and wavelets are interval / sparse operators,
and a multi-attribute domain gets the Kronecker product of per-attribute ones.

=============================  ==================================================
function                       strategy
=============================  ==================================================
:func:`identity`               every cell (also :func:`input_perturbation`, "IP")
:func:`workload`               the workload itself
:func:`hierarchical`           the interval tree ``H_b`` of Hay et al. (2010)
:func:`hb`                     ``H_b`` with Qardaji et al.'s (2013) branching
:func:`hm`                     the "HM" baseline of paper 000: HB on the flat domain
:func:`wavelet`                the Haar wavelet of Privelet (Xiao et al. 2010)
:func:`convex_ca`              the optimal Gaussian strategy, "CA" (Yuan et al. 2016)
:func:`wca_i`, :func:`wca_ii`  CA weighted by the targets (paper 000, section 7)
=============================  ==================================================

The convex optimum
------------------
For Gaussian noise the matrix mechanism's total squared error is
``||A||_2^2 ||W A^+||_F^2`` (``||A||_2`` the largest column L2 norm), and with
``X = A^T A`` the best strategy solves the convex program (CA)::

    minimise tr(G X^+)  over X >= 0 (PSD) with diag(X) <= 1,   G = W^T D W

(``D`` = diag of query weights, identity by default). Write ``G = F F^T`` with
``F`` (``n x r``, ``r`` = rank of ``W``) of full column rank. With a multiplier
``lambda_i >= 0`` per diagonal constraint the Lagrange dual is::

    maximise g(lambda) = 2 tr(K^{1/2}) - sum(lambda),   K = F^T diag(lambda) F  (r x r)

because ``min_X tr(G X^+) + tr(diag(lambda) X) = 2 tr(K^{1/2})``, attained at
``X(lambda) = F K^{-1/2} F^T``, which has exactly the range of ``G`` and so
supports ``W``; a factor is ``A = K^{-1/4} U^T F^T`` (``K = U diag U^T``). The
gradient is ``dg/dlambda_i = X_ii - 1``: at the optimum every cell whose
multiplier is positive has ``X_ii = 1`` (a rank-deficient ``W`` may leave some
constraints slack, with ``lambda_i = 0``). We maximise ``g`` by projected Newton
with conjugate gradients (Hessian-vector products by the Daleckii-Krein formula
for the derivative of ``K^{-1/2}`` in ``K``'s eigenbasis, damped on the flat
directions of rank-deficient problems) and an Armijo search along the projection
onto ``lambda >= 0``. Every iterate carries a certificate: with
``T = tr(K^{1/2})``, the strategy scaled to sensitivity 1 has error exactly
``T max_i X_ii``, and weak duality bounds the error of every strategy from below
by ``max_c g(c lambda) = T^2 / sum(lambda)``; the solver stops when the two agree
to ``tol`` (strong duality holds: ``X = I / 2`` is strictly feasible). Cells that
no query touches get zero columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpdask.domain import Domain
from dpdask.linalg import (
    Dense,
    Diagonal,
    Identity,
    Kron,
    LinearQuery,
    RangeQueries,
    Sparse,
    aslinearquery,
)
from dpdask.linalg._base import check_dense_size

__all__ = [
    "ConvexSolution",
    "ca_solve",
    "convex_ca",
    "hb",
    "hb_branching",
    "hierarchical",
    "hm",
    "identity",
    "input_perturbation",
    "tree_intervals",
    "wavelet",
    "wca_i",
    "wca_ii",
    "workload",
    "workload_gram",
]

SizeLike = int | Domain | Sequence[int]


def _sizes(n_or_domain: SizeLike) -> tuple[int, ...]:
    """Attribute sizes of an int, a Domain or a sequence of ints."""
    if isinstance(n_or_domain, Domain):
        return n_or_domain.shape
    if isinstance(n_or_domain, int | np.integer) and not isinstance(n_or_domain, bool):
        sizes: tuple[Any, ...] = (n_or_domain,)
    elif isinstance(n_or_domain, Sequence) and not isinstance(n_or_domain, str):
        sizes = tuple(n_or_domain)
    else:
        raise TypeError(f"expected a size, a Domain or a sequence of sizes, got {n_or_domain!r}")
    if not sizes:
        raise ValueError("a domain needs at least one attribute")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1:
            raise ValueError(f"domain sizes must be positive integers, got {s!r}")
    return tuple(int(s) for s in sizes)


def _per_attribute(n_or_domain: SizeLike, build: Any) -> LinearQuery:
    """``build(n)`` for one attribute, the Kronecker product of them for several."""
    sizes = _sizes(n_or_domain)
    if len(sizes) == 1:
        return build(sizes[0])
    return Kron([build(n) for n in sizes])


# -- fixed strategies ---------------------------------------------------------
def identity(n_or_domain: SizeLike) -> LinearQuery:
    """The identity strategy: measure every cell.

    Parameters
    ----------
    n_or_domain : int, Domain or sequence of int
        The domain size, or the attribute sizes (a Kronecker product of identities).

    Returns
    -------
    LinearQuery
        :class:`~dpdask.linalg.Identity`, or a :class:`~dpdask.linalg.Kron` of them.

    Examples
    --------
    >>> identity(3).dense()
    array([[1., 0., 0.],
           [0., 1., 0.],
           [0., 0., 1.]])
    """
    return _per_attribute(n_or_domain, Identity)


def input_perturbation(n_or_domain: SizeLike) -> LinearQuery:
    """Input perturbation ("IP" in paper 000): noise on every cell, i.e. :func:`identity`."""
    return identity(n_or_domain)


def workload(W: Any) -> LinearQuery:
    """The workload strategy: answer ``W`` directly (the Laplace / Gaussian mechanism).

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload.

    Returns
    -------
    LinearQuery
        ``W`` itself (wrapped if it was an array).
    """
    return aslinearquery(W)


# -- hierarchical trees -------------------------------------------------------
def _check_size(n: Any, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"{what} needs a positive integer domain size, got {n!r}")
    return int(n)


def tree_intervals(n: int, branching: int = 2, root: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The nodes of the ``branching``-ary interval tree over ``0..n-1``, level by level.

    The root covers every cell; each node of length ``L > 1`` has
    ``min(branching, L)`` children that split it into contiguous parts whose
    lengths differ by at most one (the longer ones first); cells are the leaves.
    This balanced split handles any ``n``: the height is the least ``h`` with
    ``branching**h >= n`` and every cell lies in at most ``h + 1`` nodes, as in
    the tree over ``n`` padded to ``branching**h``.

    Parameters
    ----------
    n : int
        Domain size.
    branching : int
        Children per node, at least 2.
    root : bool
        Include the root node (the total query).

    Returns
    -------
    lo, hi : ndarray of int
        Inclusive bounds of the nodes, root first, then each level left to right.

    Examples
    --------
    >>> lo, hi = tree_intervals(4)
    >>> [(int(a), int(b)) for a, b in zip(lo, hi)]
    [(0, 3), (0, 1), (2, 3), (0, 0), (1, 1), (2, 2), (3, 3)]
    """
    n = _check_size(n, "tree_intervals")
    if isinstance(branching, bool) or not isinstance(branching, int | np.integer) or branching < 2:
        raise ValueError(f"branching must be an integer >= 2, got {branching!r}")
    b = int(branching)
    levels_lo, levels_hi = [np.array([0])], [np.array([n - 1])]
    lo, hi = levels_lo[0], levels_hi[0]
    while True:
        length = hi - lo + 1
        split = length > 1
        if not split.any():
            break
        lo, length = lo[split], length[split]
        k = np.minimum(b, length)
        # child j of a node of length L into k parts: size L // k, plus one for j < L % k
        parent = np.repeat(np.arange(lo.size), k)
        j = np.arange(parent.size) - np.repeat(np.cumsum(k) - k, k)
        q, r = length[parent] // k[parent], length[parent] % k[parent]
        start = lo[parent] + j * q + np.minimum(j, r)
        size = q + (j < r)
        lo, hi = start, start + size - 1
        levels_lo.append(lo)
        levels_hi.append(hi)
    first = 0 if root else 1
    if first >= len(levels_lo):  # n == 1 without the root: the single cell is the root
        first = 0
    return np.concatenate(levels_lo[first:]), np.concatenate(levels_hi[first:])


def hierarchical(n_or_domain: SizeLike, branching: int = 2, root: bool = True) -> LinearQuery:
    """The hierarchical strategy ``H_b``: every node of a ``b``-ary interval tree.

    Hay et al. (2010): the root (all cells), its ``b`` children ranges, and so on
    down to the single cells; ``H_2`` is the binary tree. See
    :func:`tree_intervals` for the split when ``n`` is not a power of ``b``. On a
    multi-attribute domain the strategy is the Kronecker product of one tree per
    attribute (the multi-dimensional tree of Qardaji et al. 2013).

    Parameters
    ----------
    n_or_domain : int, Domain or sequence of int
        Domain size, or attribute sizes.
    branching : int
        The branching factor ``b >= 2``.
    root : bool
        Measure the root (the total). Hay et al. do; Qardaji et al.'s HB does not.

    Returns
    -------
    LinearQuery
        A :class:`~dpdask.linalg.RangeQueries` (rows root first, level by level),
        or a :class:`~dpdask.linalg.Kron` of them.

    Examples
    --------
    >>> hierarchical(4).dense()
    array([[1., 1., 1., 1.],
           [1., 1., 0., 0.],
           [0., 0., 1., 1.],
           [1., 0., 0., 0.],
           [0., 1., 0., 0.],
           [0., 0., 1., 0.],
           [0., 0., 0., 1.]])
    """

    def build(n: int) -> RangeQueries:
        lo, hi = tree_intervals(n, branching, root)
        return RangeQueries(n, lo, hi)

    return _per_attribute(n_or_domain, build)


def _tree_height(n: int, b: int) -> int:
    """Least ``h >= 1`` with ``b**h >= n`` (integer arithmetic, no rounding of logs)."""
    h, reach = 1, b
    while reach < n:
        h, reach = h + 1, reach * b
    return h


def hb_branching(n: int) -> int:
    """Qardaji et al.'s (2013) branching factor for range queries on ``n`` cells.

    Their rule ("HB"), derived here. Take a ``b``-ary tree of height
    ``h = ceil(log_b n)`` whose ``h`` levels below the root are measured, each
    with the same noise; a level's noise variance grows as ``h^2`` (pure DP, the
    budget split in ``h``) so take it as ``h^2``. A random range query is the
    sum of about ``b - 1`` nodes per level, so without post-processing its
    variance is about ``(b - 1) h * h^2 = (b - 1) h^3``. Constrained inference
    (least squares over the tree) lowers the average-case variance to about::

        V(b) = (b - 1) h^3 - 2 (b + 1) h^2 / 3

    and HB uses the ``b`` in ``2..n`` that minimises ``V(b)`` (the smallest such
    ``b`` on ties). ``b = n`` gives ``h = 1``: the flat method (identity). This
    reproduces the HB column of the HDMM tutorial's prefix table (paper 003:
    flat at ``n = 128``, ``b = 16`` at 256 and 4096, ``b = 21`` at 8192).

    Parameters
    ----------
    n : int
        Domain size.

    Returns
    -------
    int
        The branching factor (``n`` means the flat method; 1 when ``n = 1``).

    Examples
    --------
    >>> hb_branching(128), hb_branching(256), hb_branching(8192)
    (128, 16, 21)
    """
    n = _check_size(n, "hb_branching")
    if n == 1:
        return 1
    # For a fixed height h, V grows with b, so only the least b of each height
    # can be best: b_h = ceil(n^(1/h)).
    best_b, best_v = n, None
    for h in range(1, n.bit_length() + 1):
        b = max(2, round(n ** (1.0 / h)))
        while b > 2 and (b - 1) ** h >= n:
            b -= 1
        while b**h < n:
            b += 1
        h_b = _tree_height(n, b)
        v = (b - 1) * h_b**3 - 2 * (b + 1) * h_b**2 / 3
        if best_v is None or v < best_v or (v == best_v and b < best_b):
            best_b, best_v = b, v
    return best_b


def hb(n_or_domain: SizeLike) -> LinearQuery:
    """HB (Qardaji et al. 2013): the tree with branching :func:`hb_branching`, no root.

    On a multi-attribute domain, the Kronecker product of one HB tree per
    attribute. A size whose best branching is the flat method gives the identity
    (as interval queries of single cells).

    Parameters
    ----------
    n_or_domain : int, Domain or sequence of int
        Domain size, or attribute sizes.

    Returns
    -------
    LinearQuery
        A :class:`~dpdask.linalg.RangeQueries`, or a :class:`~dpdask.linalg.Kron` of them.
    """

    def build(n: int) -> RangeQueries:
        b = max(2, hb_branching(n))
        lo, hi = tree_intervals(n, b, root=False)
        return RangeQueries(n, lo, hi)

    return _per_attribute(n_or_domain, build)


def hm(n_or_domain: SizeLike) -> LinearQuery:
    """The hierarchical mechanism "HM" of paper 000 (section 7): HB on the flat domain.

    Paper 000 treats the data as one vector of counts and uses "a tree structure
    with optimal branching factor (Qardaji et al.)"; so the tree is built over
    the flattened domain (C order), not per attribute as in :func:`hb`.

    The paper's tables do not pin HM down: the IP / HM variance ratios they
    imply (e.g. PL94 36.56 / 13.93) are not reproduced by this tree, nor by
    trees with other branchings, with or without the root, padded to a power of
    the branching, or over other attribute orders. Use it as "a Qardaji tree",
    not as the paper's exact HM.

    Parameters
    ----------
    n_or_domain : int, Domain or sequence of int
        Domain size, or attribute sizes (their product is the flat size).

    Returns
    -------
    RangeQueries
    """
    n = int(np.prod(_sizes(n_or_domain)))
    return hb(n)


# -- Haar wavelet -------------------------------------------------------------
def _haar_matrix(n: int) -> sp.csr_array:
    """The unnormalised Haar matrix on ``n`` cells (padded to a power of two)."""
    n = _check_size(n, "wavelet")
    size = 1 << (n - 1).bit_length()
    cells = np.arange(n)
    rows, cols, vals = [np.zeros(n, dtype=np.int64)], [cells], [np.ones(n)]
    count, block = 1, size
    while block > 1:
        # one row per dyadic block with a cell in the domain, in order
        rows.append(count + cells // block)
        cols.append(cells)
        vals.append(np.where(cells % block < block // 2, 1.0, -1.0))
        count += -(-n // block)
        block //= 2
    data = (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols)))
    return sp.csr_array(data, shape=(count, n))


def wavelet(n_or_domain: SizeLike) -> LinearQuery:
    """The Haar wavelet strategy of Privelet (Xiao et al. 2010), unnormalised.

    Row 0 is the total; then, coarsest first, for every dyadic block the
    difference ``(sum of its left half) - (sum of its right half)``: entries
    ``+1, -1`` as in the HDMM tutorial (paper 003). When ``n`` is not a power of
    two the domain is padded with empty cells up to the next power of two and the
    padding columns are dropped (the padded cells are known to be empty, so this
    is the padded strategy restricted to the real cells); blocks that lie wholly
    in the padding disappear and blocks cut by it keep their ``+1`` / ``-1``
    parts inside the domain. Every cell lies in ``log2(size) + 1`` rows, as before. On a
    multi-attribute domain, the Kronecker product of per-attribute wavelets.

    Parameters
    ----------
    n_or_domain : int, Domain or sequence of int
        Domain size, or attribute sizes.

    Returns
    -------
    LinearQuery
        A :class:`~dpdask.linalg.Sparse`, or a :class:`~dpdask.linalg.Kron` of them.

    Examples
    --------
    >>> wavelet(4).dense()
    array([[ 1.,  1.,  1.,  1.],
           [ 1.,  1., -1., -1.],
           [ 1., -1.,  0.,  0.],
           [ 0.,  0.,  1., -1.]])
    """
    return _per_attribute(n_or_domain, lambda n: Sparse(_haar_matrix(n)))


# -- the convex optimum (CA) --------------------------------------------------
_EXPLICIT_GRAMS = (Dense, Sparse, Identity, Diagonal)
_GRAM_BLOCK_ELEMENTS = 4_000_000


def _query_weights(weights: Any, m: int) -> np.ndarray:
    w = np.asarray(weights, dtype=float).ravel()
    if w.shape != (m,):
        raise ValueError(f"the workload has {m} queries but {w.size} weights were given")
    if not np.isfinite(w).all() or (w <= 0).any():
        raise ValueError("query weights must be finite and positive")
    return w


def workload_gram(W: Any, weights: Any = None) -> np.ndarray:
    """The dense weighted Gram matrix ``W^T diag(weights) W`` (``n x n``).

    Uses the workload's structured Gram where it has one (prefix, all-range,
    explicit matrices); otherwise applies ``W`` to blocks of identity columns, so
    the ``m x n`` matrix of a large workload is never formed whole.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload, ``m x n``.
    weights : array_like of float, optional
        A positive weight per query (default all 1).

    Returns
    -------
    ndarray
        The symmetric ``n x n`` Gram matrix.

    Raises
    ------
    ValueError
        If the weights do not match the queries or are not finite and positive.
    MemoryError
        If ``n x n`` exceeds ``dpdask.linalg.max-dense-elements``.
    """
    W = aslinearquery(W)
    m, n = W.shape
    check_dense_size(n * n, f"the {n} x {n} Gram matrix of a workload")
    if weights is None:
        G = W.gram()
        if isinstance(G, _EXPLICIT_GRAMS):
            return np.asarray(G.dense(), dtype=float)
        w = np.ones(m)
    else:
        w = _query_weights(weights, m)
    out = np.empty((n, n))
    block = max(1, _GRAM_BLOCK_ELEMENTS // max(m, n, 1))
    for start in range(0, n, block):
        stop = min(n, start + block)
        E = np.zeros((n, stop - start))
        E[np.arange(start, stop), np.arange(stop - start)] = 1.0
        out[:, start:stop] = W.T @ (w[:, None] * (W @ E))
    return (out + out.T) / 2


@dataclass(frozen=True)
class ConvexSolution:
    """The result of :func:`ca_solve`, with its optimality certificate.

    Attributes
    ----------
    strategy : Dense
        ``A`` (``r x n``, ``r`` the rank of the workload) with largest column L2
        norm 1; ``A^T A`` is the optimal ``X``.
    error : float
        Upper bound on ``A``'s weighted total squared error at L2 sensitivity 1,
        ``sum_i w_i Var_i`` with unit-variance noise (equal to it when ``W`` has
        full column rank).
    lower_bound : float
        A lower bound, from the dual, on the error of every strategy.
    multipliers : ndarray
        The dual variables ``lambda`` (one per cell; 0 for cells no query uses).
    iterations : int
        Newton iterations taken.
    converged : bool
        Whether the relative gap reached the tolerance.
    """

    strategy: Dense
    error: float
    lower_bound: float
    multipliers: np.ndarray
    iterations: int
    converged: bool

    @property
    def gap(self) -> float:
        """The relative duality gap ``error / lower_bound - 1`` (0 at the optimum)."""
        return self.error / self.lower_bound - 1.0


class _DualPoint:
    """The dual at ``lam``: ``K = F^T diag(lam) F`` in its eigenbasis, and ``diag X(lam)``."""

    def __init__(self, F: np.ndarray, lam: np.ndarray):
        kappa, U = np.linalg.eigh(F.T @ (lam[:, None] * F))
        self.lam, self.F = lam, F
        self.ok = bool(kappa[0] > kappa[-1] * kappa.size * np.finfo(float).eps)
        if not self.ok:  # K singular: g's gradient is unbounded here
            self.g = -np.inf
            return
        self.kappa, self.U = kappa, U
        self.sk = np.sqrt(kappa)
        self.T = float(self.sk.sum())  # tr(K^{1/2}) = ||W diag(lam)^{1/2}||_*
        self.FU = F @ U
        self.H = self.FU / np.sqrt(self.sk)[None, :]  # F U K^{-1/4}: A = H^T
        self.Xd = np.einsum("ij,ij->i", self.H, self.H)  # diag X(lam) = dg/dlam + 1
        self.g = 2.0 * self.T - float(lam.sum())

    def rescale(self) -> None:
        """Scale ``lam`` by the best constant ``c`` (``max_c g(c lam)``), in place."""
        root_c = self.T / float(self.lam.sum())
        c = root_c * root_c
        self.lam = self.lam * c
        self.kappa = self.kappa * c
        self.sk = self.sk * root_c
        self.T *= root_c
        self.H = self.H / np.sqrt(root_c)
        self.Xd = self.Xd / root_c
        self.g = 2.0 * self.T - float(self.lam.sum())

    @property
    def rel_gap(self) -> float:
        """``upper / lower - 1`` (invariant under scaling ``lam``)."""
        return float(self.Xd.max()) * float(self.lam.sum()) / self.T - 1.0

    @property
    def upper(self) -> float:
        return self.T * float(self.Xd.max())

    @property
    def lower(self) -> float:
        return self.T * self.T / float(self.lam.sum())

    def kernel(self) -> np.ndarray:
        """Divided differences of ``k -> k^{-1/2}`` at the eigenvalues, negated."""
        sk = self.sk
        return 1.0 / (sk[:, None] * sk[None, :] * (sk[:, None] + sk[None, :]))

    def neg_hess_vec(self, N: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``-H v`` with ``H`` the Hessian of ``g`` (the Jacobian of ``diag X``)."""
        # dK = F^T diag(v) F; in K's eigenbasis d(K^{-1/2}) = -U ((U^T dK U) * N) U^T
        E = self.FU.T @ (v[:, None] * self.FU)
        return np.einsum("ij,ij->i", self.FU @ (E * N), self.FU)

    def neg_hess_diag(self, N: np.ndarray) -> np.ndarray:
        FU2 = self.FU * self.FU
        return np.einsum("ij,ij->i", FU2 @ N, FU2)


def _newton_direction(
    pt: _DualPoint, grad: np.ndarray, free: np.ndarray, max_cg: int, damping: float
) -> np.ndarray:
    """Projected-Newton direction: CG on ``(-H_FF + mu P) d_F = grad_F``, scaled gradient elsewhere.

    ``-H`` is singular when ``W`` is rank-deficient (the dual then has flat
    directions), so the system is damped by ``mu`` times its diagonal ``P``.
    """
    N = pt.kernel()
    P = np.maximum(pt.neg_hess_diag(N), np.finfo(float).tiny)
    d = grad / P  # the scaled gradient, kept on the bound-active coordinates
    g = np.where(free, grad, 0.0)
    gnorm = float(np.linalg.norm(g))
    if gnorm == 0:
        return d
    stop = min(0.1, np.sqrt(gnorm)) * gnorm
    x = np.zeros_like(g)
    res = g.copy()
    z = res / P
    p = z.copy()
    rz = float(res @ z)
    for _ in range(max_cg):
        Ap = np.where(free, pt.neg_hess_vec(N, p) + damping * P * p, 0.0)
        curv = float(p @ Ap)
        if curv <= 0:
            break
        a = rz / curv
        x += a * p
        res -= a * Ap
        if np.linalg.norm(res) <= stop:
            break
        z = res / P
        rz_new = float(res @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    if x.any():
        d[free] = x[free]
    return d


def _solve_gram(G: np.ndarray, tol: float, max_iter: int, max_cg: int) -> ConvexSolution:
    n = G.shape[0]
    if not np.isfinite(G).all():
        raise ValueError("the workload's Gram matrix has non-finite entries")
    ev, V = np.linalg.eigh(G)
    keep = ev > max(ev[-1], 0.0) * n * np.finfo(float).eps
    if not keep.any():
        raise ValueError("the workload has no nonzero query: there is nothing to measure")
    F = V[:, keep] * np.sqrt(ev[keep])[None, :]  # G = F F^T, F of full column rank

    pt = _DualPoint(F, np.maximum(np.einsum("ij,ij->i", F, F), 0.0))  # exact for diagonal G
    if not pt.ok:
        pt = _DualPoint(F, np.ones(n))
    converged, it = False, 0
    for it in range(max_iter + 1):
        pt.rescale()
        if pt.rel_gap <= tol:
            converged = True
            break
        if it == max_iter:
            break
        lam, grad = pt.lam, pt.Xd - 1.0
        # coordinates at their bound lam = 0 that the gradient pushes further out
        eps = min(1e-3 * float(lam.mean()), float(np.linalg.norm(lam - np.maximum(lam + grad, 0))))
        free = ~((lam <= eps) & (grad < 0))
        d = _newton_direction(pt, grad, free, max_cg, min(0.1, pt.rel_gap))
        step = 1.0
        while True:
            new_lam = np.maximum(lam + step * d, 0.0)
            trial = _DualPoint(F, new_lam)
            if trial.ok:
                # Armijo along the projection arc; near the optimum g is flat to
                # rounding, so a halved certified gap also counts as progress
                ascent = float(grad[free] @ (new_lam - lam)[free])
                ascent += float(grad[~free] @ (new_lam - lam)[~free])
                if trial.g >= pt.g + 1e-4 * ascent or trial.rel_gap < 0.5 * pt.rel_gap:
                    break
            step *= 0.5
            if step < 1e-10:
                trial = None
                break
        if trial is None:  # no ascent left in floating point
            break
        pt = trial

    scale = float(pt.Xd.max())
    return ConvexSolution(
        strategy=Dense(pt.H.T / np.sqrt(scale)),
        error=pt.upper,
        lower_bound=pt.lower,
        multipliers=pt.lam,
        iterations=it,
        converged=converged,
    )


def ca_solve(
    W: Any,
    weights: Any = None,
    *,
    tol: float = 1e-7,
    max_iter: int = 100,
    max_cg: int = 100,
) -> ConvexSolution:
    """Solve CA, the optimal Gaussian matrix mechanism, with an optimality certificate.

    Minimises ``sum_i w_i Var_i``, the weighted total squared error of the
    workload answers at L2 sensitivity 1, over all strategies; see the module
    docstring for the dual Newton method and its certificate. Costs
    ``O(n^3)`` per iteration (dense ``n x n`` eigendecompositions); meant for
    domains up to a few thousand cells.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload, ``m x n``.
    weights : array_like of float, optional
        A positive weight per query (default all 1).
    tol : float
        Relative duality gap at which to stop.
    max_iter : int
        Most Newton iterations.
    max_cg : int
        Most conjugate-gradient steps per Newton iteration.

    Returns
    -------
    ConvexSolution
        The strategy, its error, the dual lower bound and convergence information.

    Raises
    ------
    ValueError
        If the weights are invalid or the workload is zero.
    MemoryError
        If the ``n x n`` Gram matrix exceeds ``dpdask.linalg.max-dense-elements``.

    Examples
    --------
    >>> sol = ca_solve(np.eye(3))
    >>> round(sol.error, 6), sol.converged
    (3.0, True)
    """
    if not (tol > 0):
        raise ValueError(f"tol must be positive, got {tol!r}")
    return _solve_gram(workload_gram(W, weights), float(tol), int(max_iter), int(max_cg))


def convex_ca(W: Any, weights: Any = None, **options: Any) -> Dense:
    """The CA strategy of Yuan et al. (2016): the optimal Gaussian strategy for ``W``.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload.
    weights : array_like of float, optional
        A positive weight per query: minimise ``sum_i w_i Var_i``.
    **options
        ``tol``, ``max_iter``, ``max_cg`` of :func:`ca_solve`.

    Returns
    -------
    Dense
        ``A`` with ``A^T A`` optimal and largest column L2 norm 1.

    Raises
    ------
    RuntimeError
        If the solver did not reach its tolerance.
    """
    sol = ca_solve(W, weights, **options)
    if not sol.converged:
        raise RuntimeError(
            f"CA did not converge: relative duality gap {sol.gap:.3g} after "
            f"{sol.iterations} iterations"
        )
    return sol.strategy


def _targets(W: Any, targets: Any) -> np.ndarray:
    m = aslinearquery(W).shape[0]
    c = np.asarray(targets, dtype=float).ravel()
    if c.size == 1:
        c = np.full(m, float(c[0]))
    if c.shape != (m,):
        raise ValueError(f"the workload has {m} queries but {c.size} variance targets")
    if not np.isfinite(c).all() or (c <= 0).any():
        raise ValueError("variance targets must be finite and positive")
    return c


def wca_i(W: Any, targets: Any, **options: Any) -> Dense:
    """wCA-I of paper 000: CA weighting each query by the inverse of its target variance.

    "Weighting a query" in a sum-of-squared-errors objective multiplies its
    variance: wCA-I minimises ``sum_i Var_i / c_i`` (``w_i = 1 / c_i``), i.e. CA
    on the workload with row ``i`` scaled by ``1 / sqrt(c_i)``. The strategy is
    then used for the unscaled workload.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload.
    targets : array_like of float
        The variance target ``c_i > 0`` of each query (or one for all).
    **options
        Passed to :func:`ca_solve`.

    Returns
    -------
    Dense
    """
    return convex_ca(W, 1.0 / _targets(W, targets), **options)


def wca_ii(W: Any, targets: Any, **options: Any) -> Dense:
    """wCA-II of paper 000: CA weighting each query by ``1 / sqrt(target)``.

    Minimises ``sum_i Var_i / sqrt(c_i)``; see :func:`wca_i`.

    Parameters
    ----------
    W : LinearQuery or array_like
        The workload.
    targets : array_like of float
        The variance target ``c_i > 0`` of each query (or one for all).
    **options
        Passed to :func:`ca_solve`.

    Returns
    -------
    Dense
    """
    return convex_ca(W, 1.0 / np.sqrt(_targets(W, targets)), **options)
