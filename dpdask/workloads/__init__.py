"""Builders of real workloads as implicit matrices over a :class:`dpdask.Domain`.

Every builder returns a :class:`dpdask.linalg.LinearQuery` (a
:class:`~dpdask.linalg.Kron`, a :class:`~dpdask.linalg.VStack` of them, or a
structured 1-D operator) whose columns follow the domain's flat C order; nothing
is materialised.

==========================  =====================================================
builder                     workload
==========================  =====================================================
:func:`prefix`              prefix (CDF) queries on one ordered attribute
:func:`all_range`           all interval queries
:func:`random_ranges`       intervals with uniform random end-points
:func:`identity`            every cell
:func:`marginal`            one marginal (Identity on some attributes, Total on the rest)
:func:`marginals`           all k-way marginals, parts named like ``"sex*age"``
:func:`product`             any product workload from per-attribute predicate matrices
:func:`age_pyramid`         age ranges by sex and for all (paper 000, section 7.6)
:func:`pl94`                the PL 94-171 workload (paper 000, section 7.3), 319 queries
:func:`pl94_full`           the Bureau's 2020 P.L. 94 query groups (2,016 cells), 2,603
:func:`ri2010`              the RI 2010 blocks' workload (total, marginals, identity), 27
:func:`sf1_persons`         Census 2010 SF1 person tables on the CPH domain
:func:`sf1_hdmm_reference`  the HDMM reference's SF1 encoding (4,151 queries, race 64)
:func:`sum_query`           sums of a numeric attribute, ``W D`` (paper 004)
==========================  =====================================================

The Census codings (race combinations, relationship categories) are in
:mod:`dpdask.census`.
"""

from dpdask.workloads.marginals import identity, marginal, marginal_name, marginals
from dpdask.workloads.pl94 import pl94
from dpdask.workloads.pl94_full import PL94_FULL_GROUPS, pl94_full, pl94_full_group
from dpdask.workloads.products import indicator, product
from dpdask.workloads.pyramid import age_pyramid, age_ranges
from dpdask.workloads.ranges import all_range, prefix, random_ranges
from dpdask.workloads.ri2010 import ri2010, ri2010_domain
from dpdask.workloads.sf1 import sf1_persons, sf1_tables
from dpdask.workloads.sf1_reference import sf1_hdmm_reference
from dpdask.workloads.sums import sum_query

__all__ = [
    "PL94_FULL_GROUPS",
    "age_pyramid",
    "age_ranges",
    "all_range",
    "identity",
    "indicator",
    "marginal",
    "marginal_name",
    "marginals",
    "pl94",
    "pl94_full",
    "pl94_full_group",
    "prefix",
    "product",
    "random_ranges",
    "ri2010",
    "ri2010_domain",
    "sf1_hdmm_reference",
    "sf1_persons",
    "sf1_tables",
    "sum_query",
]
