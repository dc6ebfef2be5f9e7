"""Strategy selection: what to measure so that a workload is answered accurately.

:func:`select` returns a :class:`Plan` from a workload and a privacy budget, by
HDMM's strategy optimisation (p-Identity, Kronecker, union-of-Kronecker and
weighted-marginals templates) or as a named baseline
(:mod:`dpdask.strategy.baselines`); its engine is :mod:`dpdask.strategy.hdmm`.
:mod:`dpdask.strategy.analysis` has the error
analytics (total squared error, per-query variances, the SVD bound), computed
implicitly for structured strategies.
"""

from dpdask.strategy._marginals import WeightedMarginals
from dpdask.strategy.analysis import ErrorAnalysis, query_variances, squared_error, svd_bound
from dpdask.strategy.hdmm import PIdentity, budget_split, default_p, opt_0, opt_kron, opt_marginals
from dpdask.strategy.plan import Plan
from dpdask.strategy.select import BASELINES, TEMPLATES, optimize, select

__all__ = [
    "BASELINES",
    "TEMPLATES",
    "ErrorAnalysis",
    "PIdentity",
    "Plan",
    "WeightedMarginals",
    "budget_split",
    "default_p",
    "opt_0",
    "opt_kron",
    "opt_marginals",
    "optimize",
    "query_variances",
    "select",
    "squared_error",
    "svd_bound",
]
