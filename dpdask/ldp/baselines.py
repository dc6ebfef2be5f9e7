"""Published local mechanisms as strategy matrices (paper 002, section 6.1).

Each is a factorization mechanism with a fixed ``Q``; dpdask pairs it with the optimal
reconstruction ``V*`` for the workload at hand (Theorem 3.3), as the paper does.

* **Randomized response** (Warner 1965): ``Q = ((e^eps - 1) I + 1 1^T) / (e^eps + n - 1)``.
* **Hadamard response** (Acharya, Sun and Zhang 2019), the single-block symmetric variant:
  ``K = 2^ceil(log2(n + 1))`` outputs; type ``u`` has the set ``C_u = {o : H[o, u+1] = +1}``
  (``H`` the Sylvester Hadamard matrix, column 0 skipped) of ``K / 2`` outputs, each
  reported with probability ``2 e^eps / (K (1 + e^eps))``, the others with
  ``2 / (K (1 + e^eps))``.
* **Hierarchical** (Cormode, Kulkarni and Srivastava 2019): a ``b``-ary tree over the
  ordered domain without its root; each person picks a level uniformly and reports their
  node there through the Hadamard response oracle above. The branching ``b`` is the best
  of 2, 4, 8 and 16 for the workload.
* **Fourier** (Cormode, Kulkarni and Srivastava 2018), for ``n = 2^d`` (binary attributes):
  the non-zero Fourier coefficients ``alpha`` the workload needs
  (``||W chi_alpha|| > 0``); each person picks one uniformly and reports the sign
  ``chi_alpha(u)`` through binary randomized response (``m = 2 |T|``).
* **Matrix mechanism** adapted to the local model (Edmonds, Nikolov and Ullman 2020): each
  person releases ``A e_u + Laplace(Delta / eps)`` noise, with ``A`` the central HDMM
  strategy (or the identity, whichever is better) and ``Delta = 2 max_u ||a_u||_1`` (the
  L1 distance between any two columns is at most that). Not a finite ``Q``:
  :class:`LaplaceFactorization`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, PlanError
from dpdask.ldp.strategy import LocalStrategy, as_epsilon, sym_pinv, workload_gram
from dpdask.linalg import LinearQuery
from dpdask.noise import draw_variance

__all__ = [
    "LaplaceFactorization",
    "baselines",
    "fourier",
    "hadamard",
    "hierarchical",
    "matrix_mechanism",
    "randomized_response",
]


def _e(epsilon: Any) -> float:
    return math.exp(float(as_epsilon(epsilon)))


def _sylvester(K: int) -> np.ndarray:
    H = np.ones((1, 1))
    while H.shape[0] < K:
        H = np.block([[H, H], [H, -H]])
    return H


def randomized_response_matrix(n: int, epsilon: Any) -> np.ndarray:
    """Float ``Q`` of randomized response on ``n`` types."""
    e = _e(epsilon)
    return ((e - 1.0) * np.eye(n) + 1.0) / (e + n - 1.0)


def hadamard_matrix(n: int, epsilon: Any) -> np.ndarray:
    """Float ``Q`` (``K x n``) of single-block Hadamard response."""
    e = _e(epsilon)
    K = 1 << int(n).bit_length()  # smallest power of two >= n + 1
    H = _sylvester(K)[:, 1 : n + 1]
    return np.where(H > 0, e, 1.0) * (2.0 / (K * (1.0 + e)))


def randomized_response(n: int, epsilon: Any) -> LocalStrategy:
    """Randomized response (``m = n``)."""
    Q = randomized_response_matrix(n, epsilon)
    return LocalStrategy.from_probabilities(Q, epsilon, name="randomized_response")


def hadamard(n: int, epsilon: Any) -> LocalStrategy:
    """Hadamard response, single-block variant (``m = 2^ceil(log2(n + 1))``)."""
    return LocalStrategy.from_probabilities(hadamard_matrix(n, epsilon), epsilon, name="hadamard")


def _tree_levels(n: int, branching: int) -> list[np.ndarray]:
    """Aggregation matrices of the levels below the root, coarse to fine."""
    levels = []
    width = 1
    while width < n:
        width *= branching
    width //= branching  # cells per node at the first level below the root
    while width >= 1:
        nodes = -(-n // width)
        A = np.zeros((nodes, n))
        A[np.arange(n) // width, np.arange(n)] = 1.0
        levels.append(A)
        width //= branching
    return levels


def hierarchical_matrix(n: int, epsilon: Any, branching: int = 4) -> np.ndarray:
    """Float ``Q`` of the hierarchical mechanism with Hadamard-response oracles."""
    if branching < 2:
        raise ArgumentError("branching must be >= 2")
    if n < 2:
        return randomized_response_matrix(n, epsilon)
    levels = _tree_levels(n, branching)
    blocks = [hadamard_matrix(A.shape[0], epsilon) @ A for A in levels]
    return np.vstack(blocks) / len(blocks)


def hierarchical(
    n: int, epsilon: Any, branching: int | None = None, W: Any = None
) -> LocalStrategy:
    """The hierarchical mechanism; ``branching=None`` picks the best of 2, 4, 8, 16 for ``W``."""
    if branching is not None:
        Q = hierarchical_matrix(n, epsilon, branching)
        return LocalStrategy.from_probabilities(
            Q, epsilon, name="hierarchical", info={"branching": int(branching)}
        )
    if W is None:
        return hierarchical(n, epsilon, 4)
    from dpdask.ldp.optimize import objective

    G = workload_gram(W)
    scored: list[tuple[float, int]] = []
    for b in (2, 4, 8, 16):
        if b > max(n, 2) and scored:
            break
        Q = hierarchical_matrix(n, epsilon, b)
        scored.append((objective(Q, G), b))  # average-case: the cheap criterion
    f, b = min(scored)
    if not math.isfinite(f):
        raise PlanError("no hierarchical strategy supports the workload")
    return hierarchical(n, epsilon, b)


def fourier_coefficients(G: np.ndarray, rtol: float = 1e-9) -> np.ndarray:
    """Non-zero ``alpha`` with ``||W chi_alpha||^2 = (H G H)_aa > 0`` (``n = 2^d``)."""
    n = G.shape[0]
    H = _sylvester(n)
    weight = np.einsum("ai,ai->a", H @ G, H)
    keep = weight > rtol * max(float(weight.max()), 1e-300)
    keep[0] = False
    return np.flatnonzero(keep)


def fourier(W: Any, epsilon: Any) -> LocalStrategy:
    """The Fourier mechanism for the coefficients ``W`` needs (``n`` a power of two).

    Raises
    ------
    PlanError
        If ``n`` is not a power of two or ``W`` needs no non-constant coefficient.
    """
    G = workload_gram(W)
    n = G.shape[0]
    if n < 2 or n & (n - 1):
        raise PlanError("the Fourier mechanism needs n = 2^d")
    alphas = fourier_coefficients(G)
    if alphas.size == 0:
        raise PlanError("the workload needs no non-constant Fourier coefficient")
    e = _e(epsilon)
    chi = _sylvester(n)[alphas]  # |T| x n, entries +-1
    hi = np.where(chi > 0, e, 1.0) / (1.0 + e)
    Q = np.vstack([hi, 1.0 - hi]) / alphas.size
    return LocalStrategy.from_probabilities(
        Q, epsilon, name="fourier", info={"coefficients": alphas.tolist()}
    )


class LaplaceFactorization:
    """The matrix mechanism run by each person: ``A e_u + Laplace(Delta / eps)^m``.

    Unbiased with reconstruction ``W A^+``; a person adds variance
    ``2 (Delta / eps)^2 ||W A^+||_F^2`` whatever their type, so the worst and average
    cases coincide. ``Q`` is ``None``: the responses are real vectors, not indices.
    """

    Q = None

    def __init__(
        self,
        A: np.ndarray,
        epsilon: Any,
        name: str = "matrix_mechanism",
        info: dict[str, Any] | None = None,
    ) -> None:
        self.A = np.asarray(A, dtype=float)
        self.epsilon = as_epsilon(epsilon)
        if self.epsilon <= 0:
            raise PlanError("the Laplace factorization needs epsilon > 0")
        self.sensitivity = 2.0 * float(np.abs(self.A).sum(axis=0).max())
        self.name = name
        self.info = dict(info or {})

    @property
    def shape(self) -> tuple[int, int]:
        m, n = self.A.shape
        return int(m), int(n)

    def __repr__(self) -> str:
        return f"LaplaceFactorization(m={self.A.shape[0]}, n={self.A.shape[1]})"

    def _error(self, W: Any) -> float:
        """``tr[(A^T A)^+ G]`` (``inf`` if ``W`` is unsupported), kept for the last ``W``."""
        cached = getattr(self, "_last", None)
        if cached is not None and cached[0] is W:
            err: float = cached[1]
            return err
        G = workload_gram(W)
        Xp, proj = sym_pinv(self.A.T @ self.A)
        if np.abs(G - proj @ G @ proj).sum() > 1e-7 * max(np.trace(G), 1e-300) * G.shape[0]:
            err = math.inf
        else:
            err = float(np.sum(Xp * G))
        self._last = (W, err)  # supports, worst_variance and summary ask for the same W
        return err

    def supports(self, W: Any) -> bool:
        return math.isfinite(self._error(W))

    def worst_variance(self, W: Any) -> float:
        scale = self.sensitivity / float(self.epsilon)
        return draw_variance("laplace", scale) * self._error(W)

    average_variance = worst_variance

    def sample_complexity(self, W: Any, alpha: float = 0.01) -> float:
        return self.worst_variance(W) / (int(W.shape[0]) * float(alpha))

    def summary(self, W: Any, alpha: float = 0.01) -> dict[str, Any]:
        v = self.worst_variance(W)
        return {
            "name": self.name,
            "m": int(self.A.shape[0]),
            "supported": math.isfinite(v),
            "worst_variance": v,
            "average_variance": v,
            "sample_complexity": v / (int(W.shape[0]) * float(alpha)),
        }


def matrix_mechanism(
    W: Any, epsilon: Any, *, restarts: int = 1, seed: int = 0
) -> LaplaceFactorization:
    """The local matrix mechanism with the better of HDMM's central strategy and ``I``."""
    n = int(W.shape[1])
    cands = [LaplaceFactorization(np.eye(n), epsilon, info={"strategy": "identity"})]
    if isinstance(W, LinearQuery):
        try:
            from dpdask.privacy import PureDP
            from dpdask.strategy.select import select

            plan = select(W, PureDP(1), restarts=restarts, seed=seed)
            A = plan.strategy.dense()
            cands.append(LaplaceFactorization(A, epsilon, info={"strategy": plan.template}))
        except (ValueError, MemoryError):  # no template applies: the identity stays
            pass
    return min(cands, key=lambda c: c.worst_variance(W))


def baselines(
    W: Any, epsilon: Any, *, matrix_mech: bool = True
) -> dict[str, LocalStrategy | LaplaceFactorization]:
    """Every baseline defined for ``W``, keyed by name (only those that support ``W``)."""
    n = int(W.shape[1])
    out: dict[str, Any] = {
        "randomized_response": randomized_response(n, epsilon),
        "hadamard": hadamard(n, epsilon),
        "hierarchical": hierarchical(n, epsilon, W=W),
    }
    if n >= 2 and not n & (n - 1):
        try:
            out["fourier"] = fourier(W, epsilon)
        except ValueError:
            pass
    if matrix_mech and as_epsilon(epsilon) > 0:
        out["matrix_mechanism"] = matrix_mechanism(W, epsilon)
    return {k: v for k, v in out.items() if v.supports(W)}
