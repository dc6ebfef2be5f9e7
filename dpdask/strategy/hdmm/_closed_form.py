"""The members of HDMM's template families that are known in closed form.

Identity (the full marginal), Total (the empty marginal) and the workload's own
marginals (one per distinct set of attributes on which a term asks more than the
total, equally weighted) are weighted marginals strategies (:mod:`dpdask.strategy._marginals`),
so their loss ``||A||_p^2 ||W A^+||_F^2`` is a sum over the ``2^d`` eigenspaces,
computed from the workload's spectrum ``h`` without touching the cells.

All three are members of OPT_M's family. A single marginal (Identity, Total, the
marginal of a one-term workload) is a Kronecker product of identities and totals:
a member of the Kronecker templates' families too (a p-Identity with ``Theta = 0``
is the identity, and the total is its limit for a large single row), see
:attr:`Member.single`. :func:`._hdmm.optimize` never returns a template's result
when a member of its family is better; the members are also starting points of
OPT_M, whose random starts can end far above Identity (on binary domains).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpdask.linalg import Identity, Kron, LinearQuery, Ones
from dpdask.strategy._marginals import WeightedMarginals, complement_sizes, marginals_loss
from dpdask.strategy._terms import KronTerms

__all__ = ["MAX_ATTRIBUTES", "Member", "members", "workload_subsets"]

MAX_ATTRIBUTES = 20
"""Most attributes for which the ``2^d`` marginal weights are formed."""


@dataclass
class Member:
    """A closed-form strategy: ``theta`` over the ``2^d`` marginals, its loss and its name."""

    name: str
    theta: np.ndarray
    loss: float

    @property
    def single(self) -> bool:
        """Whether the strategy is one marginal (a Kronecker product of identities and totals)."""
        return int(np.count_nonzero(self.theta)) == 1

    def strategy(self, terms: KronTerms, names: list[str] | None = None) -> LinearQuery:
        """The strategy as an operator: one marginal as a :class:`~dpdask.linalg.Kron`."""
        if not self.single:
            return WeightedMarginals(terms.sizes, self.theta, names)
        bits = np.unravel_index(int(np.flatnonzero(self.theta)[0]), (2,) * terms.d)
        facs = [Identity(n) if b else Ones(n) for n, b in zip(terms.sizes, bits, strict=True)]
        return facs[0] if terms.d == 1 else Kron(facs)


def _asks_total_only(terms: KronTerms, j: int, i: int) -> bool:
    return {k for _, k, _ in terms.gram(j, i).terms()} == {"ones"}


def workload_subsets(terms: KronTerms) -> list[int]:
    """Indices (see :mod:`dpdask.strategy._marginals`) of the distinct marginals that
    answer each term."""
    out: list[int] = []
    for j in range(terms.k):
        bits = tuple(0 if _asks_total_only(terms, j, i) else 1 for i in range(terms.d))
        k = int(np.ravel_multi_index(bits, (2,) * terms.d))
        if k not in out:
            out.append(k)
    return out


def _unit(theta: np.ndarray, norm: int) -> np.ndarray:
    scale = theta.sum() if norm == 1 else math.sqrt(float(theta @ theta))
    return theta / scale


def members(terms: KronTerms, h: np.ndarray, norm: int) -> list[Member]:
    """Identity, Total and the workload's marginals, with their losses (``inf``: unsupported).

    Parameters
    ----------
    terms : KronTerms
        The workload.
    h : ndarray
        Its spectrum (:func:`._opt_marginals.marginals_spectrum`).
    norm : {1, 2}
        Sensitivity norm.

    Returns
    -------
    list of Member
        Distinct strategies, weights at unit sensitivity.
    """
    d = terms.d
    size = 2**d
    wc = complement_sizes(terms.sizes)
    out: list[Member] = []
    seen: list[np.ndarray] = []
    cands = [
        ("identity", [size - 1]),
        ("total", [0]),
        ("workload marginals", workload_subsets(terms)),
    ]
    for name, subsets in cands:
        theta = np.zeros(size)
        theta[subsets] = 1.0
        theta = _unit(theta, norm)
        if any(np.array_equal(theta, s) for s in seen):
            continue
        seen.append(theta)
        loss = float(marginals_loss(theta, h, wc, d, norm)[0])
        out.append(Member(name, theta, loss))
    return out
