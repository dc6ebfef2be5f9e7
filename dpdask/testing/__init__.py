"""Reusable test kits for dpdask and for code built on it.

* :mod:`dpdask.testing.strategies`: hypothesis strategies for domains and implicit
  operators (requires ``hypothesis``, a development dependency);
* :mod:`dpdask.testing.faults`: operators that misbehave on purpose, for fault tests;
* :mod:`dpdask.testing.ledger`: ways to tamper with a ledger file;
* :mod:`dpdask.testing.audit`: an end-to-end privacy audit of releases (a lower bound
  on epsilon from published outputs, with a positive control; ``dpdask audit``);
* :mod:`dpdask.testing.fault_injection`: releases killed at random points, resumed and
  compared bit for bit with an uninterrupted one (``dpdask faults``).
"""
