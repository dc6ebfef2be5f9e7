"""Sum queries over numeric attributes under differential privacy (paper 004).

=======================================  ===============================================
name                                     what
=======================================  ===============================================
:class:`NumericBins`                     bins with representative values (upper ends)
:class:`~dpdask.workloads.SumWorkload`   sums ``W D x``, by groups, truncated ``W T x``
:func:`svt_threshold`                    theta by the sparse vector technique
:func:`recursive_threshold`              theta by the recursive mechanism's first stage
:func:`sum_mechanism`                    SQM, Identity, Workload, TiMM, TaMM
:func:`select_strategy`                  TiMM's / TaMM's ``A`` by an objective
:func:`relative_weights`                 the public proxy of the relative error
:func:`split_budget`                     rho between threshold and measurement
:func:`threshold_charge`                 the threshold's ledger charge
:func:`relative_error`                   ``|y~ - y| / max(y, delta)``
=======================================  ===============================================
"""

from dpdask.sums.accounting import split_budget, threshold_charge
from dpdask.sums.bins import NumericBins
from dpdask.sums.mechanisms import (
    DEFAULT_OBJECTIVE,
    MECHANISMS,
    OBJECTIVES,
    SQMechanism,
    SumMechanism,
    relative_weights,
    select_strategy,
    sum_mechanism,
)
from dpdask.sums.metrics import monotone, relative_error
from dpdask.sums.thresholds import (
    ThresholdResult,
    exponential_grid,
    recursive_margin,
    recursive_statistic,
    recursive_sum,
    recursive_threshold,
    recursive_truncation_bound,
    svt_threshold,
    svt_truncation_bound,
)
from dpdask.workloads.sums import SumWorkload

__all__ = [
    "DEFAULT_OBJECTIVE",
    "MECHANISMS",
    "OBJECTIVES",
    "NumericBins",
    "SQMechanism",
    "SumMechanism",
    "SumWorkload",
    "ThresholdResult",
    "exponential_grid",
    "monotone",
    "recursive_margin",
    "recursive_statistic",
    "recursive_sum",
    "recursive_threshold",
    "recursive_truncation_bound",
    "relative_error",
    "relative_weights",
    "select_strategy",
    "split_budget",
    "sum_mechanism",
    "svt_threshold",
    "svt_truncation_bound",
    "threshold_charge",
]
