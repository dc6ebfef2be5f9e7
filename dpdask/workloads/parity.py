"""Parity queries on binary attributes: a workload the local model's paper benchmarks
(paper 002, section 6), hard for marginal-based strategies."""

from __future__ import annotations

import itertools

import numpy as np

from dpdask.linalg import Dense

__all__ = ["parities"]


def parities(d: int, k: int) -> Dense:
    """All ``k``-way parity queries on ``d`` binary attributes, as 0/1 counting queries.

    Query ``alpha`` (``|alpha| = k``) counts the people whose ``k`` attributes have odd
    parity: ``(1 - chi_alpha(u)) / 2``. Attribute 0 is the most significant bit of ``u``.
    """
    u = np.arange(2**d)
    bits = (u[None, :] >> np.arange(d - 1, -1, -1)[:, None]) & 1  # d x n
    rows = [bits[list(c)].sum(axis=0) % 2 for c in itertools.combinations(range(d), k)]
    return Dense(np.array(rows, dtype=float))
