"""Top-down estimation: each parent's non-negative estimate split among its children.

The ``K`` children of one parent are fitted jointly (:func:`fit_children`): with
``G = A^T W A`` and ``C = A^T W Y^T`` the level's Gram and linear terms, they solve

    minimise  f(X) = 1/2 sum_c ||W^1/2 (A x_c - y_c)||^2
    subject to  X >= 0,  sum_c X[c, j] = p_j,  X[:, j] = 0 where p_j = 0,

``p`` the parent's final estimate. Only the cells of the parent's support ``S`` are
variables: the problem is built on ``G[S, S]`` and ``C[S]``
(:mod:`dpdask.reconstruct.topdown._level`: a dense submatrix when the level's Gram is
small, a product restricted to ``S`` for a Kronecker strategy of small factors or a
union of them, whose cost grows with ``|S|`` and the union's marginals rather than the
domain, any other strategy through the whole domain), in the Jacobi-scaled variables
``u_cj = x_cj / s_j``, ``s = diag(G)^-1/2`` (one scale per cell, shared by the children,
so every cell's feasible set stays a simplex, scaled to ``t_j = p_j / s_j``).

**Algorithms.** Three, ``method="auto"`` choosing by the level's Gram:

* projected Newton on the cells' simplices (:mod:`dpdask.reconstruct.topdown._newton`):
  free and binding children per cell, a Newton direction by conjugate residuals in the
  null space of the cells' sums with products restricted to each child's free cells, a
  projected arc search. It starts from the children's least-squares estimates
  projected onto the cells' simplices when they are given (``from_estimates``), else,
  for a Kronecker strategy, from a few ADMM iterations on the whole domain that use the
  factors' eigenvectors (:mod:`dpdask.reconstruct.topdown._admm`), otherwise from the
  better of the simple starts below. The method for a Kronecker Gram (whose products
  restricted to a sparse free set are cheap) and for the ``"full"`` one. Should its
  KKT residual stop shrinking (it must halve every 20 iterations), FISTA takes over
  from its iterate (``details["switched"]``).
* accelerated projected gradient (FISTA, :mod:`dpdask.reconstruct.topdown._fista`) with
  adaptive restart, one product with ``G[S, S]`` per iteration (float32 for a union
  Gram until the KKT residual is below ``1e-3``, then float64), from the best (in
  ``f``) of the even split ``p / K``, the projection of ``s C`` (one Jacobi step from
  zero), the projected least-squares estimates when given, and (for a union Gram, when
  the estimates are known) each cell's parent split in proportion to the children's
  estimates summed into the finest of the parts' marginals: the method for a dense Gram
  (a small domain such as P.L. 94's).
* active-set FISTA (:mod:`dpdask.reconstruct.topdown._active`), for a union Gram
  (HDMM's OPT_+ on the CPH domain): the same iteration on a *working set* of (child,
  cell) pairs (the positive ones and the most violating others, grown round by round
  from the whole family's exact gradient), the rest held at zero, with products and
  projections whose cost grows with the pairs rather than with ``K |S|`` (at the
  solution only a few children of each cell are positive), from the same starts.

**Stopping rule.** The KKT residual of the scaled problem, the root-mean-square
projected gradient ``||U - P(U - grad)|| / sqrt(K |S|)`` (``P`` the projection onto the
cells' simplices), is at most ``tol``: it is zero exactly at a KKT point (per cell a
multiplier ``nu_j`` with ``grad_cj >= nu_j``, with equality where ``u_cj > 0``). As in
:mod:`dpdask.reconstruct.nnls`, with inverse-variance weights its entries are in noise
units (each scaled gradient entry has variance one at the true data), so ``tol = 1e-2``
leaves a hundredth of the noise to optimise. Every method stops on it, the Newton method
from a float64 gradient, active-set FISTA from the whole family's. The report also gives
the Frank-Wolfe duality gap ``gap = <grad, X> - sum_j p_j min_c grad_cj >= f(X) - f*``
(``details["gap"]``), a certificate: then ``||W^1/2 A (X - X*)||_F^2 <= 2 gap`` for the
optimum ``X*``.

The returned children are exactly feasible: after the last step each cell's sum is made
exact by setting its largest child to ``p_j`` minus the others.

**Constraints, passes and constrained rounding** (Census-grade P.L. 94). A
:class:`Constraints` holds per-unit cell bounds (structural zeros), query bounds and
invariants (:func:`pl94_full_constraints`, :func:`pl94_constraints` build them from block
housing units and facilities; :func:`check_constraints`, :func:`check_family` and
:func:`check_hierarchy` name conflicts from public input, before any charge).
:func:`fit_constrained_children` is the family fit under them (a small interior-point QP,
:mod:`dpdask.reconstruct.topdown._qp`); :func:`fit_family_passes` fits a family pass by
pass (:class:`Pass`; default the total, then the rest), each pass's answers kept by the
next; :func:`round_constrained` rounds a family to integers keeping the parent, the
constraints and each pass's answers; :func:`passes_tree` runs all of it over a small
in-memory hierarchy. A pass with ``below`` also fits the levels below's estimate of each
unit's total (:func:`subtree_sums`, :func:`total_estimator`, :func:`known_totals`).
"""

from dpdask.reconstruct.topdown._census_constraints import (
    pl94_constraints,
    pl94_full_constraints,
)
from dpdask.reconstruct.topdown._constrained import Extra, fit_constrained_children, take_extra
from dpdask.reconstruct.topdown._constrained_rounding import round_constrained
from dpdask.reconstruct.topdown._constraints import (
    Constraints,
    check_constraints,
    check_family,
    check_hierarchy,
    unit_positions,
)
from dpdask.reconstruct.topdown._families import (
    KEEP_TOTALS_CELLS,
    ChildrenFitter,
    SupportEstimate,
    children_fitter,
    fit_children,
    round_children,
    round_top,
    topdown_tree,
)
from dpdask.reconstruct.topdown._packed import pack_binary, unpack
from dpdask.reconstruct.topdown._passes import (
    Pass,
    PassesEstimate,
    default_passes,
    fit_family_passes,
    passes_tree,
)
from dpdask.reconstruct.topdown._subtree import (
    known_totals,
    subtree_row,
    subtree_sums,
    total_estimator,
)

__all__ = [
    "KEEP_TOTALS_CELLS",
    "ChildrenFitter",
    "Constraints",
    "Extra",
    "Pass",
    "PassesEstimate",
    "SupportEstimate",
    "check_constraints",
    "check_family",
    "check_hierarchy",
    "children_fitter",
    "default_passes",
    "fit_children",
    "fit_constrained_children",
    "fit_family_passes",
    "known_totals",
    "pack_binary",
    "passes_tree",
    "pl94_constraints",
    "pl94_full_constraints",
    "round_children",
    "round_constrained",
    "round_top",
    "subtree_row",
    "subtree_sums",
    "take_extra",
    "topdown_tree",
    "total_estimator",
    "unit_positions",
    "unpack",
]
