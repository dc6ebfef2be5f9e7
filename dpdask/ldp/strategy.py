"""Local strategies: the exact privacy check, the optimal reconstruction and its variances.

A strategy for local differential privacy (paper 002, section 2.2) is a column-stochastic
``m x n`` matrix ``Q``: a person of type ``u`` reports output ``o`` with probability
``Q[o, u]``. It is ``epsilon``-LDP when every row's entries are within a factor
``e^epsilon`` of each other (Proposition 2.2). dpdask keeps ``Q`` as integer weights
``K`` over a common denominator ``T`` (``Q = K / T``), so that the columns sum to one
*exactly* and the privacy condition is checked in exact integer arithmetic against a
rational lower bound of ``e^epsilon``; the client samples from the same integers.

Formulas (rebuilt from the paper, whose extracted text lost them; ``D = diag(Q 1)``, the
row sums, ``G = W^T W``, ``X = Q^T D^-1 Q``):

* Theorem 3.3 (optimal reconstruction for fixed ``Q``): ``V* = W X^+ Q^T D^-1``, the
  weighted least-squares reconstruction with weights ``1 / (Q 1)``; it needs ``W`` in the
  row space of ``Q`` (``W X^+ X = W``).
* Theorem 3.1 / Corollaries 3.1-3.2 (variance per person): a person of type ``u`` adds
  ``sum_o ||v_o||^2 Q[o, u] - ||w_u||^2`` to the total squared error of ``V y``
  (``v_o`` the columns of ``V``, ``w_u`` those of ``W``); the worst case is the maximum
  over ``u``, the average case the mean.
* Theorem 3.4: with ``V = V*``, the average-case variance per person is
  ``(tr[X^+ G] - tr[G]) / n``; ``tr[X^+ G]`` is the optimisation objective.
* Corollary 5.2 (sample complexity): ``N = worst variance per person / (p alpha)`` people
  give normalised variance ``alpha`` on the ``p`` workload queries.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpdask.errors import ArgumentError, ArgumentTypeError, BudgetTypeError, PlanError, ShapeError
from dpdask.linalg import LinearQuery

__all__ = [
    "DENOMINATOR",
    "FORMAT",
    "LocalStrategy",
    "as_epsilon",
    "check_ldp",
    "exp_lower_bound",
    "workload_gram",
]

#: Denominator of the integer weights: ``Q = K / 2**52`` (exact in float64 and int64).
DENOMINATOR = 2**52
#: ``format`` field of the JSON strategy files the client reads.
FORMAT = "dpdask-ldp-strategy/1"
_MIXES = (0.0, 1e-12, 1e-9, 1e-6)


def as_epsilon(epsilon: Any) -> Fraction:
    """``epsilon`` as an exact non-negative fraction (accepts a :class:`~dpdask.privacy.PureDP`).

    Raises
    ------
    BudgetTypeError
        If ``epsilon`` is not a number or a pure-DP budget.
    PlanError
        If it is negative or not finite.
    """
    eps = getattr(epsilon, "epsilon", epsilon)
    if isinstance(eps, bool):
        raise BudgetTypeError("epsilon must be a number, got a bool")
    if isinstance(eps, float) and not math.isfinite(eps):
        raise PlanError(f"epsilon must be finite, got {eps}")
    try:
        frac = Fraction(eps) if not isinstance(eps, np.floating) else Fraction(float(eps))
    except (TypeError, ValueError) as err:
        raise BudgetTypeError(f"epsilon must be a number or PureDP, got {epsilon!r}") from err
    if frac < 0:
        raise PlanError(f"epsilon must be >= 0, got {eps}")
    return frac


def exp_lower_bound(epsilon: Any, bits: int = 64) -> Fraction:
    """A rational ``L <= e^epsilon``, within ``2^-bits`` relative (Taylor sum, rounded down).

    Every Taylor term of ``e^x`` at ``x >= 0`` is non-negative, so partial sums are lower
    bounds; the sum is then rounded down to a multiple of ``2^-bits``.
    """
    eps = as_epsilon(epsilon)
    total, term, k = Fraction(1), Fraction(1), 0
    while True:
        k += 1
        term = term * eps / k
        total += term
        if term * 2 ** (bits + 8) < total and k > eps:
            break
    scale = 2**bits
    return Fraction(math.floor(total * scale), scale)


def check_ldp(counts: np.ndarray, epsilon: Any, denominator: int = DENOMINATOR) -> None:
    """Fail unless ``counts / denominator`` is an ``epsilon``-LDP strategy, checked exactly.

    Conditions (Proposition 2.2): integer entries ``>= 0``; every column sums to exactly
    ``denominator``; in every row, ``max <= min * e^epsilon`` (against a rational lower
    bound of ``e^epsilon``, so a borderline row fails: fail closed).

    Raises
    ------
    ArgumentTypeError
        If ``counts`` is not an integer matrix.
    PlanError
        If any condition fails (the message names the first offending row or column).
    """
    K = np.asarray(counts)
    if K.ndim != 2 or K.shape[0] < 1 or K.shape[1] < 1:
        raise PlanError(f"a strategy is a non-empty m x n matrix, got shape {K.shape}")
    if not np.issubdtype(K.dtype, np.integer):
        raise ArgumentTypeError(f"strategy weights must be integers, got {K.dtype}")
    if int(denominator) <= 0:
        raise PlanError("the denominator must be positive")
    if (K < 0).any():
        o, u = np.argwhere(K < 0)[0]
        raise PlanError(f"negative probability at row {o}, column {u}")
    sums = [sum(col) for col in K.T.tolist()]  # Python ints: exact
    bad = [u for u, s in enumerate(sums) if s != int(denominator)]
    if bad:
        raise PlanError(
            f"column {bad[0]} sums to {sums[bad[0]]}/{denominator}, not exactly 1 "
            f"({len(bad)} bad column(s))"
        )
    bound = exp_lower_bound(epsilon)
    num, den = bound.numerator, bound.denominator
    for o, (hi, lo) in enumerate(zip(K.max(axis=1).tolist(), K.min(axis=1).tolist(), strict=True)):
        if hi * den > lo * num:
            ratio = hi / lo if lo else math.inf
            raise PlanError(
                f"row {o} violates {float(as_epsilon(epsilon)):g}-LDP: max/min = {ratio:.17g}"
            )


def _quantize_once(Q: np.ndarray, denominator: int) -> np.ndarray:
    scaled = Q * float(denominator)
    K = np.floor(scaled).astype(np.int64)
    short = int(denominator) - K.sum(axis=0)
    rem = scaled - K
    # largest remainders first, per column (at most m units short, usually a handful)
    order = np.argsort(-rem, axis=0, kind="stable")
    m = Q.shape[0]
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(m)[:, None], axis=0)
    K += (rank < short[None, :]).astype(np.int64)
    return K


def quantize(Q: np.ndarray, epsilon: Any, denominator: int = DENOMINATOR) -> np.ndarray:
    """Integer weights over ``denominator`` of a float strategy, exactly ``epsilon``-LDP.

    Rows of negligible mass (below ``1e-13``) are dropped to zero, columns renormalised,
    and the result rounded per column by largest remainder. If rounding breaks a row at
    the ``e^epsilon`` boundary, ``Q`` is first mixed with a row-constant distribution
    (``(1 - d) Q + d p 1^T``, which keeps the ratios within ``e^epsilon`` and moves them
    strictly inside) for ``d`` in ``1e-12, 1e-9, 1e-6``.

    Raises
    ------
    PlanError
        If ``Q`` is not (close to) a valid ``epsilon``-LDP strategy.
    """
    Q = np.array(Q, dtype=float)
    if Q.ndim != 2 or not np.isfinite(Q).all():
        raise PlanError("a strategy is a finite m x n matrix")
    if (Q < -1e-12).any():
        raise PlanError("a strategy has non-negative entries")
    Q = np.clip(Q, 0.0, None)
    Q[Q.max(axis=1) < 1e-13] = 0.0
    Q = Q[Q.max(axis=1) > 0] if (Q.max(axis=1) > 0).any() else Q
    col = Q.sum(axis=0)
    if (np.abs(col - 1.0) > 1e-6).any():
        raise PlanError(f"columns must sum to one (worst: {col[np.argmax(np.abs(col - 1))]!r})")
    Q = Q / col
    p = Q.mean(axis=1)
    last: Exception | None = None
    for d in _MIXES:
        K = _quantize_once((1 - d) * Q + d * p[:, None], denominator)
        try:
            check_ldp(K, epsilon, denominator)
            return K
        except ValueError as err:
            last = err
    raise PlanError(f"not an epsilon-LDP strategy: {last}")


def workload_gram(W: Any) -> NDArray[np.float64]:
    """``G = W^T W`` as a dense ``n x n`` array (from an implicit workload's ``gram()``)."""
    if isinstance(W, LinearQuery):
        return np.asarray(W.gram().dense(), dtype=float)
    A = np.asarray(W, dtype=float)
    if A.ndim != 2:
        raise ShapeError("a workload is a 2-D matrix")
    G: NDArray[np.float64] = A.T @ A
    return G


def _rows(W: Any) -> int:
    return int(W.shape[0])


def sym_pinv(X: np.ndarray, rtol: float = 1e-10) -> tuple[np.ndarray, np.ndarray]:
    """Pseudo-inverse of a symmetric PSD matrix and the projector onto its range."""
    lam, U = np.linalg.eigh((X + X.T) / 2)
    keep = lam > rtol * max(float(lam.max()), 0.0)
    Uk = U[:, keep]
    return (Uk / lam[keep]) @ Uk.T, Uk @ Uk.T


class LocalStrategy:
    """An ``epsilon``-LDP strategy matrix ``Q = counts / denominator`` (checked on creation).

    Parameters
    ----------
    counts : ndarray of int, shape (m, n)
        Integer weights; column ``u`` is the response distribution of type ``u``.
    epsilon : number or PureDP
        The privacy parameter the strategy must meet (checked exactly, see :func:`check_ldp`).
    denominator : int
        Common denominator of every column.
    name : str
        A label (``"optimized"``, ``"randomized_response"``, ...).
    info : dict, optional
        Provenance (optimisation history, baseline options).

    Raises
    ------
    ValueError, TypeError
        If the weights are not an exactly ``epsilon``-LDP strategy.

    Examples
    --------
    >>> import numpy as np
    >>> from dpdask.linalg import Identity
    >>> rr = LocalStrategy.from_probabilities(np.array([[0.75, 0.25], [0.25, 0.75]]), np.log(3))
    >>> round(rr.worst_variance(Identity(2)), 6)  # 2 e^eps / (e^eps - 1)^2 with e^eps = 3
    1.5
    """

    def __init__(
        self,
        counts: np.ndarray,
        epsilon: Any,
        *,
        denominator: int = DENOMINATOR,
        name: str = "custom",
        info: dict[str, Any] | None = None,
    ) -> None:
        K = np.asarray(counts)
        check_ldp(K, epsilon, denominator)
        self.counts = K.astype(np.int64)
        self.counts.setflags(write=False)
        self.denominator = int(denominator)
        self.epsilon = as_epsilon(epsilon)
        self.name = str(name)
        self.info = dict(info or {})
        self._cache: dict[int, dict[str, Any]] = {}

    @classmethod
    def from_probabilities(
        cls,
        Q: np.ndarray,
        epsilon: Any,
        *,
        name: str = "custom",
        info: dict[str, Any] | None = None,
    ) -> LocalStrategy:
        """Quantise a float strategy (see :func:`quantize`) and check it exactly."""
        return cls(quantize(Q, epsilon), epsilon, name=name, info=info)

    # -- the matrix --------------------------------------------------------
    @cached_property
    def Q(self) -> np.ndarray:
        """The probabilities ``counts / denominator`` (float64, read-only)."""
        Q = self.counts / float(self.denominator)
        Q.setflags(write=False)
        return Q

    @property
    def shape(self) -> tuple[int, int]:
        """``(m, n)``: outputs by types."""
        m, n = self.counts.shape
        return int(m), int(n)

    def __repr__(self) -> str:
        m, n = self.shape
        return f"LocalStrategy(name={self.name!r}, m={m}, n={n}, epsilon={float(self.epsilon):g})"

    # -- analysis given G ---------------------------------------------------
    def _analysis(self, G: np.ndarray) -> dict[str, Any]:
        key = id(G)
        hit = self._cache.get(key)
        if hit is not None and hit["G"] is G:
            return hit
        Q = self.Q
        s = Q.sum(axis=1)
        P = np.divide(Q, s[:, None], out=np.zeros_like(Q), where=s[:, None] > 0)
        X = Q.T @ P
        Xp, proj = sym_pinv(X)
        resid = G - proj @ G @ proj
        scale = max(float(np.trace(G)), 1e-300)
        supported = float(np.abs(resid).sum()) <= 1e-7 * scale * G.shape[0]
        out = {"G": G, "s": s, "P": P, "X": X, "Xp": Xp, "supported": supported}
        self._cache = {key: out}  # one workload at a time
        return out

    def _gram(self, W: Any) -> NDArray[np.float64]:
        if W is None:
            raise ArgumentError("a workload is needed")
        cached = getattr(self, "_wcache", None)
        if cached is not None and cached[0] is W:
            G: NDArray[np.float64] = cached[1]
            return G
        G = workload_gram(W)
        if G.shape != (self.shape[1],) * 2:
            raise ShapeError(f"workload has {G.shape[0]} columns, strategy has {self.shape[1]}")
        self._wcache = (W, G)
        return G

    def supports(self, W: Any) -> bool:
        """Whether ``W`` is in the row space of ``Q`` (so ``W`` is estimable without bias)."""
        return bool(self._analysis(self._gram(W))["supported"])

    def _require(self, a: dict[str, Any]) -> None:
        if not a["supported"]:
            raise PlanError(
                f"strategy {self.name!r} does not support the workload (W not in Q's row space)"
            )

    def estimator(self, W: Any = None) -> NDArray[np.float64]:
        """``E = X^+ Q^T D^-1`` (``n x m``): ``x_hat = E y`` and ``V* = W E``.

        With a workload, first checks that the workload is supported.
        """
        if W is not None:
            self._require(self._analysis(self._gram(W)))
        Q = self.Q
        s = Q.sum(axis=1)
        P = np.divide(Q, s[:, None], out=np.zeros_like(Q), where=s[:, None] > 0)
        Xp, _ = sym_pinv(Q.T @ P)
        E: NDArray[np.float64] = Xp @ P.T
        return E

    def reconstruction(self, W: Any) -> NDArray[np.float64]:
        """``V* = W (Q^T D^-1 Q)^+ Q^T D^-1``, ``p x m`` (Theorem 3.3; dense)."""
        E = self.estimator(W)
        if isinstance(W, LinearQuery):
            return np.asarray(W @ E, dtype=float)
        V: NDArray[np.float64] = np.asarray(W, dtype=float) @ E
        return V

    def objective(self, W: Any) -> float:
        """``tr[(Q^T D^-1 Q)^+ W^T W]`` (Theorem 3.4), ``inf`` when ``W`` is unsupported."""
        a = self._analysis(self._gram(W))
        if not a["supported"]:
            return math.inf
        return float(np.sum(a["Xp"] * a["G"]))

    def person_variances(self, W: Any) -> NDArray[np.float64]:
        """Variance added by one person of each type: ``sum_o ||v*_o||^2 Q[o,u] - ||w_u||^2``."""
        a = self._analysis(self._gram(W))
        self._require(a)
        if "person" not in a:
            M = a["Xp"] @ a["G"] @ a["Xp"]
            P = a["P"]
            d = np.einsum("ou,ou->o", P @ M, P)  # ||v*_o||^2 = p_o^T X^+ G X^+ p_o
            a["person"] = d @ self.Q - np.diag(a["G"])
        person: NDArray[np.float64] = a["person"].copy()
        return person

    def worst_variance(self, W: Any) -> float:
        """Worst-case total variance per person (Corollary 3.1, divided by ``N``)."""
        return float(self.person_variances(W).max())

    def average_variance(self, W: Any) -> float:
        """Average-case total variance per person (Corollary 3.2, divided by ``N``)."""
        return float(self.person_variances(W).mean())

    def sample_complexity(self, W: Any, alpha: float = 0.01) -> float:
        """People needed for normalised worst-case variance ``alpha`` (Corollary 5.2)."""
        if not alpha > 0:
            raise ArgumentError("alpha must be positive")
        return self.worst_variance(W) / (_rows(W) * float(alpha))

    def summary(self, W: Any, alpha: float = 0.01) -> dict[str, Any]:
        """Name, shape, objective, worst and average variance, sample complexity."""
        if not self.supports(W):
            return {"name": self.name, "m": self.shape[0], "supported": False}
        return {
            "name": self.name,
            "m": int(self.shape[0]),
            "supported": True,
            "objective": self.objective(W),
            "worst_variance": self.worst_variance(W),
            "average_variance": self.average_variance(W),
            "sample_complexity": self.sample_complexity(W, alpha),
        }

    # -- files ---------------------------------------------------------------
    def to_json(self) -> str:
        """The client's strategy file: integer weights per type (column), exact."""
        doc = {
            "format": FORMAT,
            "name": self.name,
            "epsilon": str(self.epsilon),
            "n": int(self.shape[1]),
            "m": int(self.shape[0]),
            "denominator": self.denominator,
            "columns": self.counts.T.tolist(),
        }
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> LocalStrategy:
        """Read a strategy file (checked exactly again).

        Raises
        ------
        PlanError
            If the format is unknown or the weights are not ``epsilon``-LDP.
        """
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise PlanError(f"not a {FORMAT} file (format={doc.get('format')!r})")
        cols = np.array(doc["columns"], dtype=np.int64)
        if cols.shape != (int(doc["n"]), int(doc["m"])):
            raise PlanError("columns do not match n and m")
        return cls(
            cols.T, Fraction(doc["epsilon"]), denominator=int(doc["denominator"]), name=doc["name"]
        )
