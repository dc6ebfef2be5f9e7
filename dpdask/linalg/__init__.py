"""Implicit matrices for linear counting queries.

Operators represent workloads and strategies over domains far too large for
dense matrices: products act factor by factor, unions part by part, and
``dense()`` refuses beyond ``dpdask.linalg.max-dense-elements`` entries.
"""

from dpdask.linalg._base import (
    LinearQuery,
    Product,
    Scaled,
    Sum,
    Transpose,
    aslinearquery,
    check_dense_size,
)
from dpdask.linalg._explicit import Dense, Sparse
from dpdask.linalg._geo import apply_per_geography, apply_rows
from dpdask.linalg._integral import has_integer_entries
from dpdask.linalg._kron import Kron
from dpdask.linalg._norms import NormTerms, kron_vector
from dpdask.linalg._primitives import (
    AllRange,
    Diagonal,
    Identity,
    Ones,
    Prefix,
    RangeQueries,
    Total,
    check_size,
)
from dpdask.linalg._roots import gram_root
from dpdask.linalg._rounding import UNIT_ROUNDOFF, evaluation_error, gamma, rounding_pair
from dpdask.linalg._serialize import from_dict, to_dict
from dpdask.linalg._serialize import register as register_operator
from dpdask.linalg._tree import interval_tree, tree_intervals
from dpdask.linalg._union import VStack

__all__ = [
    "UNIT_ROUNDOFF",
    "AllRange",
    "Dense",
    "Diagonal",
    "Identity",
    "Kron",
    "LinearQuery",
    "NormTerms",
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
    "apply_rows",
    "aslinearquery",
    "check_dense_size",
    "check_size",
    "evaluation_error",
    "from_dict",
    "gamma",
    "gram_root",
    "has_integer_entries",
    "interval_tree",
    "kron_vector",
    "register_operator",
    "rounding_pair",
    "to_dict",
    "tree_intervals",
]
