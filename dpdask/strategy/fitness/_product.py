"""Beyond paper 000: Kronecker workloads solved factor by factor, unions by budget split.

**Kronecker products (exact).** Let ``W = W_1 (x) ... (x) W_k`` with targets that
factor, ``c = c_1 (x) ... (x) c_k``, and let ``(B_i, Sigma_i)`` solve Problem 1 for
``(W_i, c_i)`` with squared cost ``p_i``. The product mechanism ``B = (x) B_i``,
``Sigma = (x) Sigma_i`` has

* variances ``diag(L Sigma L^T) = (x) diag(L_i Sigma_i L_i^T) <= (x) c_i = c``,
* squared privacy profile ``b^T Sigma^-1 b = prod_i b_i^T Sigma_i^-1 b_i`` (mixed product
  rule), so squared cost ``prod_i p_i``.

It is optimal: the weak-duality bound of
:func:`~dpdask.strategy.fitness._terms.nuclear_bound` with product multipliers
``u = (x) u_i``, ``v = (x) v_i`` is ``||(x) diag(v_i / c_i)^{1/2} W_i diag(u_i)^{1/2}||_*^2
= prod_i LB_i`` because singular values of a Kronecker product are the products of the
factors' singular values. At the factors' optimal multipliers ``LB_i = p_i``, so no
mechanism for the product does better than ``prod_i p_i``. The certified lower bound of
a :class:`~dpdask.strategy.fitness._solution.KronFitnessSolution` is this product. (The
privacy *profile* of the product need not be the lexicographically smallest one of
Problem 1's tie-breaking rule; the cost is exact.)

**Unions (approximate).** For ``W = [W_1; W_2; ...]`` each part is solved on its own
(factor by factor when it is a product with factored targets) and measured with
independent noise. Each part meets its targets; the squared privacy profile of the
whole is the sum of the parts' (the budget is split between the parts in proportion
to their squared costs), so its squared cost is at most ``sum_k p_k``. The optimum
for the union is at least ``max_k p_k``: the approximation costs at most a factor of
the number of parts, and the reported lower bound says how much it actually costs.

Factor problems are independent Dask tasks named ``optimize-factor-<attribute>-<token>``
(identical factor problems, such as the repeated identities and totals of a marginal
workload, are solved once); parts of a union that are not products with factored
targets are tasks ``optimize-part-<token>``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from dask.base import compute, tokenize
from dask.delayed import delayed

from dpdask.errors import ShapeError
from dpdask.linalg import Kron, LinearQuery, Scaled, VStack
from dpdask.strategy.fitness._dense import solve_dense
from dpdask.strategy.fitness._smii import SMIIOptions
from dpdask.strategy.fitness._solution import (
    FitnessResult,
    FitnessSolution,
    KronFitnessSolution,
    UnionFitnessSolution,
)

__all__ = ["factor_targets", "solve_kron", "solve_union"]

_WORD = re.compile(r"^[A-Za-z]+$")
# Relative tolerance of the test that a target vector is a Kronecker product.
_FACTOR_RTOL = 1e-9


def factor_targets(targets: np.ndarray, shape: Sequence[int]) -> list[np.ndarray] | None:
    """Split ``c`` into ``c_1 (x) ... (x) c_k`` over ``shape``, or ``None`` if it does not factor.

    Positive targets factor exactly when their logarithms are a sum of per-axis terms.
    The common scale goes to the first factor.
    """
    c = np.asarray(targets, dtype=float)
    if c.size != int(np.prod(shape)) or (c <= 0).any():
        return None
    T = np.log(c).reshape(tuple(shape))
    k = T.ndim
    mean = float(T.mean())
    parts = [T.mean(axis=tuple(j for j in range(k) if j != i)) - mean for i in range(k)]
    approx = np.full(T.shape, mean)
    for i, p in enumerate(parts):
        approx = approx + p.reshape([-1 if j == i else 1 for j in range(k)])
    if np.abs(T - approx).max() > _FACTOR_RTOL * max(1.0, np.abs(T).max()):
        return None
    parts[0] = parts[0] + mean
    return [np.exp(p) for p in parts]


def _task_key(kind: str, name: str | None, token: str) -> str:
    if name is not None and _WORD.match(name):
        return f"optimize-{kind}-{name}-{token}"
    return f"optimize-{kind}-{token}"


class _Batch:
    """Factor problems collected across parts, solved once each as Dask tasks."""

    def __init__(self, options: SMIIOptions | None):
        self.options = options
        self.tasks: dict[str, Any] = {}

    def add(
        self, W: LinearQuery, c: np.ndarray, basis: Any, name: str | None, kind: str = "factor"
    ) -> str:
        token = tokenize(W, c, basis, self.options)
        if token not in self.tasks:
            self.tasks[token] = delayed(solve_dense, pure=True)(
                W, c, basis, None, self.options, dask_key_name=_task_key(kind, name, token)
            )
        return token

    def compute(self) -> dict[str, FitnessSolution]:
        keys = list(self.tasks)
        values = compute(*(self.tasks[k] for k in keys))  # type: ignore[no-untyped-call]
        return dict(zip(keys, values, strict=True))


def _kron_plan(
    batch: _Batch,
    W: Kron,
    targets: Sequence[Any],
    bases: Sequence[Any] | None,
    names: Sequence[str] | None,
) -> list[str]:
    if len(targets) != len(W.factors):
        raise ShapeError(f"{len(targets)} factor targets for {len(W.factors)} factors")
    if bases is not None and len(bases) != len(W.factors):
        raise ShapeError(f"{len(bases)} factor bases for {len(W.factors)} factors")
    if names is not None and len(names) != len(W.factors):
        raise ShapeError(f"{len(names)} names for {len(W.factors)} factors")
    tokens = []
    for i, f in enumerate(W.factors):
        c = np.broadcast_to(np.asarray(targets[i], dtype=float), (f.shape[0],)).copy()
        b = None if bases is None else bases[i]
        tokens.append(batch.add(f, c, b, None if names is None else names[i]))
    return tokens


def solve_kron(
    W: Kron,
    targets: Sequence[Any],
    bases: Sequence[Any] | None = None,
    names: Sequence[str] | None = None,
    options: SMIIOptions | None = None,
) -> KronFitnessSolution:
    """Problem 1 for ``W = (x) W_i`` and ``c = (x) c_i``, one Dask task per distinct factor.

    Parameters
    ----------
    W : Kron
    targets : sequence
        One target vector (or scalar) per factor.
    bases : sequence, optional
        One basis per factor (default: each factor's canonical basis).
    names : sequence of str, optional
        Attribute names, used in the task keys.
    options : SMIIOptions, optional
    """
    batch = _Batch(options)
    tokens = _kron_plan(batch, W, targets, bases, names)
    solved = batch.compute()
    return KronFitnessSolution([solved[t] for t in tokens], names)


def _weighted_part(part: LinearQuery, weight: float) -> LinearQuery:
    if weight == 1:
        return part
    if isinstance(part, Kron):
        return Kron([Scaled(part.factors[0], weight), *part.factors[1:]])
    return Scaled(part, weight)


def solve_union(
    W: VStack,
    targets: np.ndarray,
    names: Sequence[str] | None = None,
    options: SMIIOptions | None = None,
) -> UnionFitnessSolution:
    """Each part of ``W`` solved on its own (by factors where it is a product), budget split.

    Parameters
    ----------
    W : VStack
    targets : numpy.ndarray
        Targets of all of ``W``'s rows.
    names : sequence of str, optional
        Attribute names of the Kronecker parts' factors (for task keys).
    options : SMIIOptions, optional
    """
    batch = _Batch(options)
    plans: list[tuple[str, Any]] = []
    for part, w, sl in zip(W.parts, W.weights, W.part_slices(), strict=True):
        P = _weighted_part(part, float(w))
        c = np.asarray(targets[sl], dtype=float)
        split = factor_targets(c, P.out_shape) if isinstance(P, Kron) else None
        if split is not None and isinstance(P, Kron) and len(P.factors) > 1:
            plans.append(("kron", _kron_plan(batch, P, split, None, names)))
        else:
            plans.append(("dense", batch.add(P, c, None, None, kind="part")))
    solved = batch.compute()
    parts: list[FitnessResult] = []
    for kind, tok in plans:
        if kind == "kron":
            parts.append(KronFitnessSolution([solved[t] for t in tok], names))
        else:
            parts.append(solved[tok])
    return UnionFitnessSolution(parts, W)
