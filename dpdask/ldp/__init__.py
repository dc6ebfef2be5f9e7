"""Local differential privacy: the workload factorization mechanism (paper 002).

When people do not trust the collector, each randomizes their own record with a strategy
matrix ``Q`` (column ``u``: the response distribution of a person of type ``u``); the
collector counts the responses and reconstructs the workload answers with the optimal
``V* = W (Q^T D^-1 Q)^+ Q^T D^-1``. This package builds and checks strategies
(:mod:`.strategy`), bounds what any strategy can achieve (:mod:`.bounds`), optimises ``Q``
for a workload (:mod:`.projection`, :mod:`.optimize`), provides the published mechanisms
as baselines (:mod:`.baselines`), the device's randomizer (:mod:`.client`, standard
library only), a simulator (:mod:`.simulate`), the server's aggregation (:mod:`.aggregate`)
and the local-model plan, :func:`dpdask.ldp.local_plan.select_local` (:mod:`.local_plan`).
"""

from dpdask.ldp.aggregate import LocalEstimate, aggregate, count_responses
from dpdask.ldp.baselines import LaplaceFactorization, baselines
from dpdask.ldp.bounds import lower_bound
from dpdask.ldp.optimize import optimize
from dpdask.ldp.projection import project
from dpdask.ldp.simulate import randomize, simulate_counts
from dpdask.ldp.strategy import LocalStrategy, check_ldp

__all__ = [
    "LaplaceFactorization",
    "LocalEstimate",
    "LocalStrategy",
    "aggregate",
    "baselines",
    "check_ldp",
    "count_responses",
    "lower_bound",
    "optimize",
    "project",
    "randomize",
    "simulate_counts",
]
