"""Builders of real workloads as implicit matrices over a :class:`dpdask.Domain`.

Every builder returns a :class:`dpdask.linalg.LinearQuery` (usually a
:class:`~dpdask.linalg.Kron` or a :class:`~dpdask.linalg.VStack` of them) whose
columns follow the domain's flat C order; nothing is materialised.
"""

from dpdask.workloads import census

__all__ = ["census"]
