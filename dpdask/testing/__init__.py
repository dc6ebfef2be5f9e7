"""Reusable test kits for dpdask and for code built on it.

* :class:`LinearQueryTests` (:mod:`dpdask.testing.linear_query`): the contract of an
  implicit matrix as a pytest suite that the tests of every
  :class:`~dpdask.linalg.LinearQuery` class subclass (requires ``pytest`` and
  ``hypothesis``, development dependencies; imported on first use);
* :mod:`dpdask.testing.strategies`: hypothesis strategies for domains and implicit
  operators (requires ``hypothesis``, a development dependency);
* :mod:`dpdask.testing.faults`: operators that misbehave on purpose, for fault tests;
* :mod:`dpdask.testing.ledger`: ways to tamper with a ledger file;
* :mod:`dpdask.testing.audit`: an end-to-end privacy audit of releases (a lower bound
  on epsilon from published outputs, with a positive control; ``dpdask audit``);
* :mod:`dpdask.testing.fault_injection`: releases killed at random points, resumed and
  compared bit for bit with an uninterrupted one (``dpdask faults``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LinearQueryTests", "check_linear_query", "dense_oracle"]


def __getattr__(name: str) -> Any:
    # lazily: ``dpdask audit`` and ``dpdask faults`` import this package without pytest
    if name in __all__:
        from dpdask.testing import linear_query

        return getattr(linear_query, name)
    raise AttributeError(f"module 'dpdask.testing' has no attribute {name!r}")
