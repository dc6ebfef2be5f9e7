"""Implicit matrices for linear counting queries.

Operators represent workloads and strategies over domains far too large for
dense matrices: products act factor by factor, unions part by part, and
``dense()`` refuses beyond ``dpdask.linalg.max-dense-elements`` entries.
"""

from dpdask.linalg._base import LinearQuery, Product, Scaled, Sum, Transpose, aslinearquery
from dpdask.linalg._explicit import Dense, Sparse
from dpdask.linalg._geo import apply_per_geography
from dpdask.linalg._kron import Kron
from dpdask.linalg._primitives import (
    AllRange,
    Diagonal,
    Identity,
    Ones,
    Prefix,
    RangeQueries,
    Total,
)
from dpdask.linalg._roots import gram_root
from dpdask.linalg._rounding import UNIT_ROUNDOFF, evaluation_error, gamma, rounding_pair
from dpdask.linalg._union import VStack

__all__ = [
    "UNIT_ROUNDOFF",
    "AllRange",
    "Dense",
    "Diagonal",
    "Identity",
    "Kron",
    "LinearQuery",
    "Ones",
    "Prefix",
    "Product",
    "RangeQueries",
    "Scaled",
    "Sparse",
    "Sum",
    "Total",
    "Transpose",
    "VStack",
    "apply_per_geography",
    "aslinearquery",
    "evaluation_error",
    "gamma",
    "gram_root",
    "rounding_pair",
]
