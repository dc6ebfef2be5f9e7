"""Exact least-squares error of a union of two Kronecker strategies.

For ``A = [c_1 (x)_i F_i; c_2 (x)_i H_i]`` the Gram matrix is
``c_1^2 (x)_i P_i + c_2^2 (x)_i Q_i`` with ``P_i = F_i^T F_i``, ``Q_i = H_i^T H_i``.
Two symmetric matrices whose sum ``S_i = P_i + Q_i`` is positive definite are
diagonalised together by congruence: with ``V_i`` from the generalised eigenproblem
``P_i v = lambda S_i v`` (normalised ``V_i^T S_i V_i = I``),
``V_i^T P_i V_i = diag(lambda_i)`` and ``V_i^T Q_i V_i = diag(1 - lambda_i)``. So,
with ``V = (x)_i V_i``,

    A^T A = V^-T diag(D) V^-1,
    D(c) = c_1^2 prod_i lambda_i(c_i) + c_2^2 prod_i (1 - lambda_i(c_i)),

a diagonal over the ``N`` cells, and ``(A^T A)^+ = V diag(1/D) V^T`` on the
directions where ``D > 0``. For a workload term ``W_j = (x)_i W_ji``:

* ``||W_j A^+||_F^2 = sum_c prod_i g_ji(c_i) / D(c)`` with
  ``g_ji = diag(V_i^T W_ji^T W_ji V_i)``;
* its variances are ``((x)_i (W_ji V_i)^2) (1 / D)`` (entrywise squares, one
  Kronecker matrix-vector product).

Where ``S_i`` is singular (both parts total on an attribute, say) the problem is
solved on ``range(S_i)``. Cost: ``O(N)`` memory and ``O(N k)`` time for ``N`` cells
and ``k`` terms (vectors over the domain, never an ``N x N`` matrix); the numerator
``sum_j w_j^2 (x)_i g_ji`` does not depend on ``c``, so optimising the budget split
costs ``O(N)`` per trial.
"""

from __future__ import annotations

import math

import numpy as np

from dpdask.errors import PlanError
from dpdask.linalg import Dense, Kron, LinearQuery, kron_vector
from dpdask.strategy._gram import Gram
from dpdask.strategy._terms import KronTerms

__all__ = ["PAIR_MAX_CELLS", "PairAnalysis"]

PAIR_MAX_CELLS = 20_000_000
_BLOCK = 2_000_000
_RANK_TOL = 1e-10
_SUPPORT_RTOL = 1e-9


def _joint_basis(P: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``V`` (n x r), ``lambda``: ``V^T P V = diag(lambda)``, ``V^T Q V = I - diag(lambda)``."""
    S = P + Q
    s, U = np.linalg.eigh(S)
    keep = s > _RANK_TOL * max(s.max(initial=0.0), 1e-300)
    B = U[:, keep] / np.sqrt(s[keep])  # B^T S B = I on range(S)
    lam, Y = np.linalg.eigh(B.T @ P @ B)
    V = B @ Y
    return V, np.clip(lam, 0.0, 1.0)


def _balanced_cut(sizes: list[int]) -> int:
    """Index splitting ``sizes`` into two halves of about equal products."""
    total = math.prod(sizes)
    best, acc = 0, 1
    for k, n in enumerate(sizes):
        if abs(math.log(acc * n) - math.log(total) / 2) < abs(math.log(acc) - math.log(total) / 2):
            acc *= n
            best = k + 1
        else:
            break
    return best


def _khatri_rao(mats: list[np.ndarray], k: int) -> np.ndarray:
    """Row ``j`` is ``mats[0][j] (x) mats[1][j] (x) ...`` (a ``(k, prod n_i)`` array)."""
    out = np.ones((k, 1))
    for M in mats:
        out = (out[:, :, None] * M[:, None, :]).reshape(k, -1)
    return out


def _congruent_diagonals(terms: KronTerms, i: int, V: np.ndarray) -> np.ndarray:
    """``g[j] = diag(V^T G_ji V)`` for every term ``j`` (shape ``(k, r)``)."""
    stack = terms.stacked_grams(i)
    if stack is None:
        rows = []
        for j in range(terms.k):
            GV = terms.gram(j, i).matmat(V)
            rows.append(np.einsum("ab,ab->b", V, GV))
        return np.stack(rows)
    Gs, index = stack
    GV = Gs @ V  # (u, n, r)
    out: np.ndarray = np.einsum("ab,uab->ub", V, GV)[index]
    return out


class PairAnalysis:
    """Error of ``[c_1 K_1; c_2 K_2]`` (two Kronecker strategies) on a union of terms.

    Parameters
    ----------
    terms : KronTerms
        The workload.
    K1, K2 : Kron
        The two parts, unweighted, over ``terms.sizes``.
    """

    def __init__(self, terms: KronTerms, K1: Kron, K2: Kron):
        self.terms = terms
        N = math.prod(terms.sizes)
        if N > PAIR_MAX_CELLS:
            raise NotImplementedError(
                f"the exact error of a two-part union needs vectors over the domain; "
                f"{N:,} cells exceed {PAIR_MAX_CELLS:,}"
            )
        self.V: list[np.ndarray] = []
        self.lam: list[np.ndarray] = []
        for F, H in zip(K1.factors, K2.factors, strict=True):
            V, lam = _joint_basis(Gram.of(F).dense(), Gram.of(H).dense())
            self.V.append(V)
            self.lam.append(lam)
        self.L = kron_vector(self.lam)
        self.M = kron_vector([1.0 - lam for lam in self.lam])
        g = [_congruent_diagonals(terms, i, V) for i, V in enumerate(self.V)]
        # sum_j w_j^2 (x)_i g[i][j] as a matrix product of two Khatri-Rao halves
        sizes = [v.shape[1] for v in g]
        cut = _balanced_cut(sizes)
        self._left = _khatri_rao(g[:cut], terms.k)  # (k, N_left)
        self._right = _khatri_rao(g[cut:], terms.k)  # (k, N_right)
        self._w2 = terms.weights**2
        self.numerator = ((self._w2[:, None] * self._left).T @ self._right).ravel()

    def denominator(self, c1: float, c2: float) -> np.ndarray:
        return c1 * c1 * self.L + c2 * c2 * self.M

    def _inverse(self, c1: float, c2: float) -> np.ndarray:
        D = self.denominator(c1, c2)
        tol = _RANK_TOL * max(D.max(initial=0.0), 1e-300)
        inv = np.zeros_like(D)
        pos = D > tol
        inv[pos] = 1.0 / D[pos]
        return inv

    def check_supports(self, c1: float, c2: float) -> None:
        """Raise ``PlanError`` if the workload has a component the union does not measure."""
        inv = self._inverse(c1, c2)
        lost = float(self.numerator[inv == 0].sum())
        if lost > _SUPPORT_RTOL * max(float(self.numerator.sum()), 1e-300):
            raise PlanError(
                "the strategy does not support the workload: some queries have a component "
                "that neither part of the union measures, so their error is unbounded"
            )

    def total(self, c1: float, c2: float) -> float:
        """``||W A^+||_F^2`` for part weights ``c1``, ``c2`` (unsupported parts ignored)."""
        return float(self.numerator @ self._inverse(c1, c2))

    def by_term(self, c1: float, c2: float) -> np.ndarray:
        inv = self._inverse(c1, c2).reshape(self._left.shape[1], self._right.shape[1])
        out: np.ndarray = self._w2 * np.einsum(
            "ja,ab,jb->j", self._left, inv, self._right, optimize=True
        )
        return out

    def term_variances(self, j: int, c1: float, c2: float) -> np.ndarray:
        inv = self._inverse(c1, c2)
        facs: list[LinearQuery] = []
        for i, V in enumerate(self.V):
            WV = self.terms.factors[j][i]._matmat(V)
            facs.append(Dense(WV * WV))
        out: np.ndarray = self.terms.weights[j] ** 2 * Kron(facs)._matmat(inv[:, None])[:, 0]
        return out

    def best_split(self, norm: int = 1) -> tuple[float, float, float]:
        """Part weights of unit sensitivity minimising the error, and that error.

        L1: ``c_1 + c_2 = 1``; L2: ``c_1^2 + c_2^2 = 1`` (each part has unit column norms).
        """
        from scipy.optimize import minimize_scalar

        def weights(t: float) -> tuple[float, float]:
            if norm == 1:
                return t, 1.0 - t
            return math.cos(t * math.pi / 2), math.sin(t * math.pi / 2)

        live = self.numerator > _SUPPORT_RTOL * max(float(self.numerator.max()), 1e-300)
        num, L, M = self.numerator[live], self.L[live], self.M[live]

        def f(t: float) -> float:
            c1, c2 = weights(t)
            D = c1 * c1 * L + c2 * c2 * M
            if np.any(D <= _RANK_TOL * max(float(D.max(initial=0.0)), 1e-300)):
                return np.inf
            return float((num / D).sum())

        grid = np.linspace(0.02, 0.98, 25)
        vals = [f(t) for t in grid]
        k = int(np.argmin(vals))
        lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
        res = minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
        t = float(res.x) if res.fun <= vals[k] else float(grid[k])
        c1, c2 = weights(t)
        return c1, c2, f(t)
