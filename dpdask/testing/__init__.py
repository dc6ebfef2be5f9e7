"""Reusable test kits for dpdask and for code built on it.

:mod:`dpdask.testing.strategies` has hypothesis strategies for domains and implicit
operators (requires ``hypothesis``, a development dependency).
"""
