"""Marginal workloads: the identity, one marginal, all k-way marginals."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dpdask.domain import Domain
from dpdask.errors import ArgumentError
from dpdask.linalg import Identity, Kron, VStack
from dpdask.workloads.products import product

__all__ = ["identity", "marginal", "marginal_name", "marginals"]


def identity(domain: Domain) -> Kron:
    """Every cell on its own: the Kronecker product of identities (``domain.size`` queries)."""
    return Kron([Identity(n) for n in domain.shape])


def marginal(domain: Domain, attrs: Sequence[str] | str) -> Kron:
    """The marginal on ``attrs``: Identity on those attributes, Total on the rest.

    Row order is the C order of the attributes in ``attrs``, taken in *domain* order.

    Parameters
    ----------
    domain : Domain
    attrs : str or sequence of str
        The attributes kept (an empty sequence gives the grand total).

    Raises
    ------
    DomainError
        If an attribute is not in the domain.

    Examples
    --------
    >>> import numpy as np
    >>> from dpdask import Domain
    >>> d = Domain(a=2, b=3)
    >>> marginal(d, "b") @ np.arange(6.0)
    array([3., 5., 7.])
    """
    attrs = [attrs] if isinstance(attrs, str) else list(attrs)
    return product(domain, {a: Identity(domain[a]) for a in attrs})


def marginal_name(domain: Domain, attrs: Sequence[str]) -> str:
    """The name of a marginal: its attributes in domain order joined by ``*`` ("total" if none)."""
    kept = [a for a in domain.attrs if a in set(attrs)]
    return "*".join(kept) if kept else "total"


def marginals(domain: Domain, k: int) -> VStack:
    """All ``k``-way marginals of ``domain``, one part each, named like ``"sex*age"``.

    Parts are in the order of :func:`itertools.combinations` over the domain's
    attributes.

    Raises
    ------
    ArgumentError
        If ``k`` is not in ``0..len(domain)``.

    Examples
    --------
    >>> from dpdask import Domain
    >>> W = marginals(Domain(a=2, b=3, c=4), 2)
    >>> W.names, W.shape
    (('a*b', 'a*c', 'b*c'), (26, 24))
    """
    if isinstance(k, bool) or not 0 <= k <= len(domain):
        raise ArgumentError(f"k-way marginals need 0 <= k <= {len(domain)}, got k = {k!r}")
    combos = list(itertools.combinations(domain.attrs, k))
    return VStack(
        [marginal(domain, c) for c in combos], names=[marginal_name(domain, c) for c in combos]
    )
