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
from dpdask.linalg import Diagonal, Identity, Kron, LinearQuery, Ones
from dpdask.workloads.products import product

__all__ = ["sum_query"]


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
    ValueError
        If ``values`` or ``workload`` do not fit ``domain[attr]``, or ``attr`` is in ``by``.

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
        raise ValueError(f"attribute {attr!r} has {n} values but {d.size} numbers were given")
    if attr in by:
        raise ValueError(f"cannot break the sums of {attr!r} down by {attr!r} itself")
    W = Ones(n) if workload is None else workload
    if W.shape[1] != n:
        raise ValueError(f"the workload on {attr!r} has {W.shape[1]} columns, not {n}")
    return product(domain, {attr: W @ Diagonal(d), **{b: Identity(domain[b]) for b in by}})
