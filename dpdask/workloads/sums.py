"""Sum queries over a numeric attribute, in the ``W D`` form of paper 004.

A sum query adds up a numeric attribute over the records meeting a predicate. On
the histogram of an attribute whose value ``i`` stands for the number
``values[i]`` (a bucket's upper end, say), the answers are ``W D x`` with ``W`` an
ordinary counting workload over the attribute and ``D = diag(values)`` (paper 004
section 2, "weighted workload matrix"). The column norms, hence the sensitivity,
grow with ``|values|``; truncating the values (replacing ``D`` by ``diag(min(values,
theta))``) is how paper 004 bounds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import ArgumentError, ShapeError
from dpdask.linalg import Diagonal, Identity, Kron, LinearQuery, Ones
from dpdask.workloads.products import product

_FLAT_SUPPORT_LIMIT = 50_000_000  # entries of a dense W beyond which support maxima are refused

__all__ = ["SumWorkload", "sum_query"]


def sum_query(
    domain: Domain,
    attr: str,
    values: Sequence[float] | np.ndarray,
    workload: LinearQuery | None = None,
    by: Sequence[str] = (),
) -> Kron:
    """Sums of ``values[attr]`` over the records, as ``(W D)`` on ``attr``.

    Parameters
    ----------
    domain : Domain
    attr : str
        The numeric attribute.
    values : array_like
        The number each value of ``attr`` stands for (length ``domain[attr]``).
    workload : LinearQuery, optional
        ``W``, the predicates on ``attr`` whose sums are asked (``m x domain[attr]``),
        e.g. :func:`~dpdask.workloads.prefix` for the prefix sums of paper 004.
        Default: one query, the sum over all records.
    by : sequence of str
        Attributes to break the sums down by (Identity on them).

    Returns
    -------
    Kron
        ``W D`` on ``attr`` (an implicit :class:`~dpdask.linalg.Product` of ``W``
        and :class:`~dpdask.linalg.Diagonal` ``D``, so a strategy can truncate
        ``D``), Identity on ``by``, Total elsewhere.

    Raises
    ------
    ArgumentError
        If ``attr`` is in ``by``; ``ShapeError`` if ``values`` or ``workload`` do
        not fit ``domain[attr]``.

    Examples
    --------
    >>> import numpy as np
    >>> from dpdask import Domain
    >>> W = sum_query(Domain(sex=2, income=3), "income", [10.0, 20.0, 30.0], by=["sex"])
    >>> W @ np.array([1.0, 0.0, 2.0, 0.0, 1.0, 0.0])   # sex 0: 1 x 10 + 2 x 30
    array([70., 20.])
    >>> W.sensitivity(1)
    30.0
    """
    n = domain[attr]
    d = np.asarray(values, dtype=float).ravel()
    if d.shape != (n,):
        raise ShapeError(f"attribute {attr!r} has {n} values but {d.size} numbers were given")
    if attr in by:
        raise ArgumentError(f"cannot break the sums of {attr!r} down by {attr!r} itself")
    W = Ones(n) if workload is None else workload
    if W.shape[1] != n:
        raise ShapeError(f"the workload on {attr!r} has {W.shape[1]} columns, not {n}")
    return product(domain, {attr: W @ Diagonal(d), **{b: Identity(domain[b]) for b in by}})


class SumWorkload:
    """Sums of one numeric attribute, possibly by groups, with truncation (paper 004).

    Holds the counting workload ``W`` (predicates on ``attr``, Identity on ``by``,
    Total elsewhere) and the weight of every cell of the domain, the representative
    value of its ``attr`` value; the sums are ``W D x`` and the truncated sums
    ``W T x`` with ``T = diag(min(d, theta))``.

    Parameters
    ----------
    domain : Domain
    attr : str
        The numeric (bucketized) attribute.
    values : array_like
        The representative value of each value of ``attr`` (positive).
    workload : LinearQuery, optional
        ``W`` on ``attr`` (default: the total).
    by : sequence of str
        Group the sums by these attributes (e.g. wages by county and sex).

    Examples
    --------
    >>> import numpy as np
    >>> from dpdask import Domain
    >>> sw = SumWorkload(Domain(sex=2, income=3), "income", [10.0, 20.0, 30.0], by=["sex"])
    >>> x = np.array([1.0, 0.0, 2.0, 0.0, 1.0, 0.0])
    >>> (sw.weighted() @ x).tolist(), (sw.weighted(15.0) @ x).tolist()
    ([70.0, 20.0], [40.0, 15.0])
    """

    def __init__(
        self,
        domain: Domain,
        attr: str,
        values: Sequence[float] | np.ndarray,
        workload: LinearQuery | None = None,
        by: Sequence[str] = (),
    ):
        d = np.asarray(values, dtype=float).ravel()
        if not np.isfinite(d).all() or (d <= 0).any():
            raise ArgumentError("the representative values must be positive and finite")
        self.domain = domain
        self.attr = attr
        self.by = tuple(by)
        self.attr_values = d
        self.attr_workload = Ones(domain[attr]) if workload is None else workload
        sum_query(domain, attr, d, self.attr_workload, self.by)  # validates
        self.counting = product(
            domain, {attr: self.attr_workload, **{b: Identity(domain[b]) for b in self.by}}
        )
        shape = [1] * len(domain)
        axis = list(domain).index(attr)
        shape[axis] = domain[attr]
        self.weights = np.broadcast_to(d.reshape(shape), domain.shape).ravel().copy()

    @property
    def shape(self) -> tuple[int, int]:
        return self.counting.shape

    def truncated_values(self, theta: float | None = None) -> np.ndarray:
        """``min(values, theta)`` on ``attr`` (``None`` or ``inf``: the values)."""
        if theta is None:
            return self.attr_values.copy()
        t = float(theta)
        if not t > 0:
            raise ArgumentError(f"the truncation threshold must be positive, got {theta!r}")
        truncated: np.ndarray = np.minimum(self.attr_values, t)
        return truncated

    def cell_weights(self, theta: float | None = None) -> np.ndarray:
        """The diagonal of ``D`` (``theta=None``) or ``T`` over the whole domain."""
        if theta is None:
            return self.weights.copy()
        weights: np.ndarray = np.minimum(self.weights, float(theta))
        return weights

    def weighted(self, theta: float | None = None) -> Kron:
        """``W D`` (``theta=None``) or ``W T`` as a Kronecker product (for strategy selection)."""
        return sum_query(
            self.domain, self.attr, self.truncated_values(theta), self.attr_workload, self.by
        )

    def support_max(self, cell_values: np.ndarray) -> np.ndarray:
        """``max_j |W_ij| v_j`` per query: the most one record can add to query ``i``."""
        v = np.asarray(cell_values, dtype=float).ravel()
        if v.shape != (self.shape[1],):
            raise ShapeError(f"expected {self.shape[1]} cell values, got {v.shape}")
        if self.shape[0] * self.shape[1] > _FLAT_SUPPORT_LIMIT:
            raise ArgumentError("the workload is too large for a dense support computation")
        largest: np.ndarray = np.abs(self.counting.dense() * v[None, :]).max(axis=1)
        return largest
