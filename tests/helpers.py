"""Helpers shared by test modules: dense oracle plans, published reference values."""

from __future__ import annotations

import dataclasses

import numpy as np

from dpdask import Domain
from dpdask.linalg import Identity, Kron, LinearQuery, Prefix, Total, VStack
from dpdask.privacy import zCDP

__all__ = ["DOMAIN", "P12_BANDS", "PCT12_BANDS", "DensePlan", "dense_profile", "make_plan"]


@dataclasses.dataclass
class DensePlan:
    """A plan computed densely, independently of dpdask.strategy (the oracle)."""

    strategy: LinearQuery
    workload: LinearQuery
    domain: Domain
    mechanism: str
    noise_scale: float
    privacy: object

    def query_variances(self) -> np.ndarray:
        A, W = self.strategy.dense(), self.workload.dense()
        cov = np.linalg.pinv(A.T @ A)
        return self.noise_scale**2 * np.einsum("ij,jk,ik->i", W, cov, W)


DOMAIN = Domain(a=2, b=3)


def make_plan(rho=1, strategy=None) -> DensePlan:
    A = strategy or VStack([Kron([Identity(2), Identity(3)]), Kron([Total(2), Prefix(3)])])
    W = VStack([Kron([Identity(2), Total(3)]), Kron([Total(2), Prefix(3)]), Identity(6)])
    budget = zCDP(rho)
    return DensePlan(A, W, DOMAIN, "gaussian", budget.gaussian_sigma(A.sensitivity(2)), budget)


def dense_profile(B: np.ndarray, Sigma: np.ndarray) -> np.ndarray:
    """``sqrt(diag(B^T Sigma^-1 B))`` by a dense solve."""
    return np.sqrt(np.einsum("ij,ij->j", B, np.linalg.solve(Sigma, B)))


# the SF1 age bands, as published
P12_BANDS = [
    (0, 4), (5, 9), (10, 14), (15, 17), (18, 19), (20, 20), (21, 21), (22, 24), (25, 29),
    (30, 34), (35, 39), (40, 44), (45, 49), (50, 54), (55, 59), (60, 61), (62, 64), (65, 66),
    (67, 69), (70, 74), (75, 79), (80, 84), (85, 999),
]  # fmt: skip
PCT12_BANDS = [(a, a) for a in range(100)] + [(100, 104), (105, 109), (110, 999)]
