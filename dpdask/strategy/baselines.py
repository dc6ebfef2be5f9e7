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

The convex optimum (CA, wCA-I, wCA-II) lives in :mod:`dpdask.strategy.convex` and
is re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, ArgumentTypeError
from dpdask.linalg import (
    Identity,
    Kron,
    LinearQuery,
    Sparse,
    aslinearquery,
    check_size,
    interval_tree,
    tree_intervals,
)
from dpdask.strategy.convex import ConvexSolution, ca_solve, convex_ca, wca_i, wca_ii, workload_gram

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
        raise ArgumentTypeError(
            f"expected a size, a Domain or a sequence of sizes, got {n_or_domain!r}"
        )
    if not sizes:
        raise ArgumentError("a domain needs at least one attribute")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1:
            raise ArgumentError(f"domain sizes must be positive integers, got {s!r}")
    return tuple(int(s) for s in sizes)


def _per_attribute(n_or_domain: SizeLike, build: Callable[[int], LinearQuery]) -> LinearQuery:
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
def hierarchical(n_or_domain: SizeLike, branching: int = 2, root: bool = True) -> LinearQuery:
    """The hierarchical strategy ``H_b``: every node of a ``b``-ary interval tree.

    Hay et al. (2010): the root (all cells), its ``b`` children ranges, and so on
    down to the single cells; ``H_2`` is the binary tree. See
    :func:`~dpdask.linalg.tree_intervals` for the split when ``n`` is not a power of ``b``. On a
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
    return _per_attribute(n_or_domain, lambda n: interval_tree(n, branching, root))


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
    n = check_size(n, "hb_branching", "domain size")
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
    return _per_attribute(n_or_domain, lambda n: interval_tree(n, max(2, hb_branching(n)), False))


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
    n = check_size(n, "wavelet", "domain size")
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
