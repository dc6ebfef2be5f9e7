"""HDMM: strategy optimisation by templates (McKenna et al., "Optimizing error of
high-dimensional statistical queries under differential privacy").

OPT_0 on one attribute (:func:`opt_0`, p-Identity strategies, :class:`PIdentity`),
OPT_x over Kronecker products (:func:`opt_kron`), OPT_+ over unions of them and
OPT_M over weighted marginals (:func:`opt_marginals`, :class:`WeightedMarginals`),
closed forms where they exist, and the per-factor optimisations as Dask tasks.
:func:`dpdask.strategy.select` is the entry point; this package is its engine.
"""

from dpdask.strategy.hdmm._hdmm import TEMPLATES, Candidate, default_templates, optimize
from dpdask.strategy.hdmm._opt_kron import opt_kron
from dpdask.strategy.hdmm._opt_marginals import opt_marginals
from dpdask.strategy.hdmm._optimize import budget_split, default_p, opt_0
from dpdask.strategy.hdmm._pidentity import PIdentity
from dpdask.strategy.hdmm._tasks import blas_limit

__all__ = [
    "TEMPLATES",
    "Candidate",
    "PIdentity",
    "blas_limit",
    "budget_split",
    "default_p",
    "default_templates",
    "opt_0",
    "opt_kron",
    "opt_marginals",
    "optimize",
]
