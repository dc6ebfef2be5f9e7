"""The sum mechanisms of paper 004 (Table 1): SQM, Identity, Workload, TiMM and TaMM.

Given the counting workload ``W``, the representative values ``D`` and a truncation
threshold ``theta`` (``T = diag(min(D, theta))``; ``inf`` means none), every mechanism
but SQM measures ``M x`` with Laplace noise of scale ``b = ||M||_1 / eps`` per row and
answers ``W T`` by least squares, ``y~ = W T M^+ (M x + b z)``, ``z`` i.i.d. Lap(1):

============  ==============  =====================================================
mechanism     measured ``M``  answers
============  ==============  =====================================================
Identity      ``I``           ``W T (x + b z)``
Workload      ``W T``         ``W T x + ||W T||_1 / eps z`` (full row rank)
TiMM          ``A T``         ``W (T x + ||A T||_1 / eps A^+ z)``, ``A`` chosen for ``W``
TaMM          ``A``           ``W T (x + ||A||_1 / eps A^+ z)``, ``A`` chosen for ``W T``
============  ==============  =====================================================

(TiMM: ``W T (A T)^+ = W A^+``, ``T`` being invertible, so measuring ``A T`` on ``x`` is
the paper's ``A`` on ``T x``.) The strategies ``A`` come from :func:`dpdask.select`
(``"hdmm"``, ``"hierarchical"``, ...), not fixed, for a selection workload set by the
*objective* (:func:`select_strategy`):

``"total"``
    the workload itself (``W`` for TiMM, ``W T`` for TaMM): :func:`dpdask.select` then
    minimises the total squared error, the objective of the paper's GreedyH;
``"relative"``
    its rows scaled by ``1 / sqrt(y'_i)``, ``y' = |W| v`` with ``v`` the representative
    values (truncated at ``theta`` for TaMM, untruncated for TiMM, which must not depend
    on ``T``): ``y'`` is the answers on a histogram of one record per bin, a public proxy
    of the answers (never the data). :func:`dpdask.select` then minimises
    ``sum_i var_i / y'_i``, and by Cauchy-Schwarz the sum of the relative standard
    deviations ``sum_i sd_i / y'_i <= sqrt(sum_i var_i / y'_i) sqrt(sum_i 1 / y'_i)``,
    the second factor being fixed: the paper's metric ``|y~ - y| / max(y, delta)`` with
    ``y'`` for ``y``. (Scaling by ``1 / y'_i`` instead, the squared relative error, trusts
    the proxy's uniform distribution more and does worse when every query is large.) The
    selected ``A`` still answers the unscaled ``W T`` by least squares.

The defaults (:data:`DEFAULT_OBJECTIVE`) are ``"relative"`` for TaMM and ``"total"`` for
TiMM (the paper's ``A`` chosen for ``W``).

Error (paper 004, appendix A.3 and A.4, and the analogues). For a fixed threshold the
answers are biased by ``W (T - D) x`` (never positive) and have variance
``2 b^2 diag(W T (M^T M)^+ T W^T)``, so the expected squared error of query ``i`` is

    ``E[(y~_i - (W D x)_i)^2] = (w_i (D - T) x)^2 + 2 b^2 (W T M^+)_i (W T M^+)_i^T``

which for TiMM is ``(w(D - T)x)^2 + 2 ||AT||_1^2 / eps^2 w (A^T A)^-1 w^T`` (A.3) and for
TaMM ``(w(D - T)x)^2 + 2 ||A||_1^2 / eps^2 w T (A^T A)^-1 T w^T`` (A.4). SQM answers
query ``i`` alone with budget ``eps / m`` and its own threshold ``theta_i``:
``Trunc_theta_i(q_i)(x) + Lap(m s_i / eps)`` with ``s_i = max_j |W_ij| min(d_j, theta_i)``;
its error is ``(w_i (D - T_i) x)^2 + 2 (m s_i / eps)^2``.

The variance is data-independent; the bias needs the data, so a plan reports the
variance and :meth:`SumMechanism.bias_bound`: one truncated record lowers query ``i``
by at most ``max_j |W_ij| (d_j - t_j)``, and ``n`` truncated records by ``n`` times that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpdask.errors import ArgumentError, BudgetTypeError, PlanError
from dpdask.linalg import Dense, Diagonal, Identity, LinearQuery
from dpdask.noise import KeyedRNG, draw_variance
from dpdask.privacy import PureDP
from dpdask.strategy.plan import Plan
from dpdask.sums.sqm import SQMechanism
from dpdask.workloads.sums import SumWorkload, sum_query

__all__ = [
    "DEFAULT_OBJECTIVE",
    "MECHANISMS",
    "OBJECTIVES",
    "SQMechanism",
    "SumMechanism",
    "relative_weights",
    "select_strategy",
    "sum_mechanism",
]

MECHANISMS = ("SQM", "Identity", "Workload", "TiMM", "TaMM")
OBJECTIVES = ("relative", "total")
DEFAULT_OBJECTIVE = {"TiMM": "total", "TaMM": "relative"}
_DENSE_LIMIT = 25_000_000  # entries of a dense strategy / reconstruction matrix


def _check_privacy(privacy: Any) -> PureDP:
    if not isinstance(privacy, PureDP):
        raise BudgetTypeError(
            f"sum mechanisms are pure DP (Laplace noise, paper 004); got {privacy!r}"
        )
    if privacy.epsilon <= 0:
        raise PlanError("the measurement budget must be positive")
    return privacy


def _check_theta(theta: Any) -> float:
    t = math.inf if theta is None else float(theta)
    if not t > 0:
        raise ArgumentError(f"the truncation threshold must be positive, got {theta!r}")
    return t


def _dense(op: LinearQuery) -> np.ndarray | None:
    if op.shape[0] * op.shape[1] > _DENSE_LIMIT:
        return None
    return np.asarray(op.dense(), dtype=float)


@dataclass
class SumMechanism:
    """One of Identity, Workload, TiMM, TaMM, fixed for a threshold (data-independent).

    Build with :func:`sum_mechanism`. Attributes: ``name``, ``sums`` (the
    :class:`~dpdask.workloads.sums.SumWorkload`), ``theta``, ``privacy`` (the measurement's
    budget), ``strategy`` (``M``, measured on ``x``), ``noise_scale`` (Laplace ``b``),
    ``template`` (how ``A`` was chosen) and ``info``.
    """

    name: str
    sums: SumWorkload
    theta: float
    privacy: PureDP
    strategy: LinearQuery
    noise_scale: float
    template: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    _recon: np.ndarray | None = field(default=None, repr=False)

    # -- structure -----------------------------------------------------------------
    @property
    def output(self) -> LinearQuery:
        """``W T``: what the answers estimate."""
        return self.sums.weighted(None if math.isinf(self.theta) else self.theta)

    @property
    def cell_weights(self) -> np.ndarray:
        """The diagonal of ``T`` over the domain."""
        return self.sums.cell_weights(None if math.isinf(self.theta) else self.theta)

    def reconstruction(self) -> np.ndarray:
        """The dense ``W T M^+`` (answers = this times the measurements)."""
        if self._recon is None:
            WT = _dense(self.output)
            if isinstance(self.strategy, Identity) and WT is not None:
                self._recon = WT
                return WT
            M = _dense(self.strategy)
            if M is None or WT is None:
                raise PlanError("the strategy is too large for a dense reconstruction")
            self._recon = WT @ np.linalg.pinv(M)
        return self._recon

    def plan(self) -> Plan:
        """The :class:`~dpdask.strategy.Plan` to measure (``W T`` answered from ``M``)."""
        return Plan(
            self.output,
            self.strategy,
            self.privacy,
            domain=self.sums.domain,
            template=f"sum-{self.name}",
            info={"theta": None if math.isinf(self.theta) else self.theta, **self.info},
        )

    # -- error -----------------------------------------------------------------------
    def query_variances(self) -> NDArray[np.float64]:
        """``2 b^2 diag(W T (M^T M)^+ T W^T)``: the variance of every answer under the
        plan's nominal Laplace noise (scale ``b``)."""
        return self.variances_at(draw_variance("laplace", self.noise_scale))

    def variances_at(self, row_variance: float) -> NDArray[np.float64]:
        """The variance of every answer when each row of ``M`` gets noise of variance
        ``row_variance`` (the noise drawn: :attr:`dpdask.measure.Lattice.variance`); for a
        strategy too large to reconstruct densely, the plan's variances rescaled to it."""
        try:
            R = self.reconstruction()
        except ValueError:
            nominal = draw_variance("laplace", self.noise_scale)
            plan_variances = np.asarray(self.plan().query_variances(), dtype=float)
            return plan_variances * (float(row_variance) / nominal)
        variances: NDArray[np.float64] = float(row_variance) * np.einsum("ij,ij->i", R, R)
        return variances

    def true_answers(self, x: np.ndarray) -> NDArray[np.float64]:
        """``W D x``, the untruncated sums."""
        answers: NDArray[np.float64] = self.sums.weighted() @ np.asarray(x, dtype=float)
        return answers

    def bias(self, x: np.ndarray) -> NDArray[np.float64]:
        """``W (T - D) x``: the truncation bias of every answer (needs the data; <= 0)."""
        x = np.asarray(x, dtype=float)
        diff = self.cell_weights - self.sums.weights
        bias: NDArray[np.float64] = self.sums.counting @ (diff * x)
        return bias

    def expected_squared_error(self, x: np.ndarray) -> NDArray[np.float64]:
        """``bias^2 + variance`` per query (appendix A.3 / A.4 for TiMM / TaMM)."""
        error: NDArray[np.float64] = self.bias(x) ** 2 + self.query_variances()
        return error

    def bias_per_record(self) -> np.ndarray:
        """``max_j |W_ij| (d_j - t_j)``: the most one truncated record lowers query ``i``."""
        return self.sums.support_max(self.sums.weights - self.cell_weights)

    def bias_bound(self, n_truncated: float) -> np.ndarray:
        """``|bias_i| <= n * bias_per_record()_i`` for ``n = n_truncated`` records above theta."""
        n = float(n_truncated)
        if not (n >= 0 and math.isfinite(n)):
            raise ArgumentError(f"n_truncated must be non-negative, got {n_truncated!r}")
        return n * self.bias_per_record()

    # -- answers ---------------------------------------------------------------------
    def answer(self, measurements: np.ndarray) -> NDArray[np.float64]:
        """``W T M^+ z`` for measurements ``z`` of shape ``(rows,)`` or ``(g, rows)``."""
        z = np.asarray(measurements, dtype=float)
        try:
            R = self.reconstruction()
        except ValueError:
            from dpdask.reconstruct.least_squares import least_squares

            xh = least_squares(self.strategy, z).x
            return self.output.apply(xh) if xh.ndim == 2 else self.output @ xh
        answers: NDArray[np.float64] = z @ R.T
        return answers

    def sample(self, x: np.ndarray, rng: KeyedRNG, size: int = 1) -> NDArray[np.float64]:
        """``size`` independent noisy answers (float Laplace; for simulation and benchmarks).

        Returns an array of shape ``(size, m)``. Uses ``rng.laplace(..., unsafe_float=True)``:
        a release measures with :func:`dpdask.measure.measure` on :meth:`plan` instead.
        """
        x = np.asarray(x, dtype=float)
        rows = self.strategy.shape[0]
        noise = rng.laplace(self.noise_scale, (int(size), rows), unsafe_float=True)
        exact = self.output @ x
        noisy: NDArray[np.float64] = exact[None, :] + self.answer(noise)
        return noisy


def relative_weights(sums: SumWorkload, theta: float | None = None) -> NDArray[np.float64]:
    """``1 / sqrt(|W| v)`` per query on ``attr``, ``v`` the values truncated at ``theta``.

    ``|W| v`` is every query's answer on a histogram of one record per bin, a public
    proxy of the answers (the module notes), computed from the bins and the threshold
    alone.

    Raises
    ------
    PlanError
        If a query's proxy is not positive (a query that covers no bin).
    """
    W = sums.attr_workload
    v = sums.truncated_values(theta)
    if W.shape[0] * W.shape[1] <= _DENSE_LIMIT:
        proxy = np.abs(np.asarray(W.dense(), dtype=float)) @ v
    else:  # large implicit workloads: 0/1 predicates (prefixes, ranges) are non-negative
        proxy = np.asarray(W @ v, dtype=float)
    if not (np.isfinite(proxy).all() and (proxy > 0).all()):
        raise PlanError("the relative objective needs every query to cover a bin")
    weights: NDArray[np.float64] = 1.0 / np.sqrt(proxy)
    return weights


def _objective(name: str, objective: str | None) -> str:
    obj = DEFAULT_OBJECTIVE.get(name, "total") if objective is None else objective
    if obj not in OBJECTIVES:
        raise ArgumentError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
    return obj


def select_strategy(
    name: str,
    sums: SumWorkload,
    theta: float | None,
    privacy: PureDP,
    strategy: str = "hdmm",
    objective: str | None = None,
    **select_options: Any,
) -> Plan:
    """:func:`dpdask.select`'s plan for TiMM's ``W`` or TaMM's ``W T``, rows per ``objective``.

    Parameters
    ----------
    name : {"TiMM", "TaMM"}
        TiMM's ``A`` is chosen for ``W`` (``theta`` is ignored), TaMM's for ``W T``.
    sums : SumWorkload
    theta : float or None
        TaMM's truncation threshold (``None`` / ``inf``: none).
    privacy : PureDP
    strategy : str
        :func:`dpdask.select`'s strategy (``"hdmm"``, ``"hierarchical"``, ...).
    objective : {"relative", "total"}, optional
        See the module notes; default :data:`DEFAULT_OBJECTIVE`.
    **select_options
        Passed to :func:`dpdask.select`.

    Returns
    -------
    Plan
        Its ``strategy`` is ``A``; its workload is the selection workload.
    """
    from dpdask.strategy.select import select

    if name not in DEFAULT_OBJECTIVE:
        raise ArgumentError(f"only TiMM and TaMM select a strategy, not {name!r}")
    obj = _objective(name, objective)
    t = None if theta is None or math.isinf(float(theta)) else float(theta)
    values = sums.truncated_values(t if name == "TaMM" else None)
    W = sums.attr_workload
    if obj == "relative":
        W = Diagonal(relative_weights(sums, t if name == "TaMM" else None)) @ W
    if name == "TiMM" and obj == "total":
        target: LinearQuery = sums.counting
    elif name == "TiMM":
        from dpdask.workloads.products import product

        by = {b: Identity(sums.domain[b]) for b in sums.by}
        target = product(sums.domain, {sums.attr: W, **by})
    else:
        target = sum_query(sums.domain, sums.attr, values, W, sums.by)
    return select(target, privacy, strategy, domain=sums.domain, **select_options)


def sum_mechanism(
    name: str,
    sums: SumWorkload,
    theta: float | np.ndarray | None,
    privacy: PureDP,
    *,
    strategy: str = "hdmm",
    objective: str | None = None,
    base: LinearQuery | None = None,
    **select_options: Any,
) -> SumMechanism | SQMechanism:
    """Build mechanism ``name`` (one of :data:`MECHANISMS`) for a threshold and budget.

    Parameters
    ----------
    name : str
        ``"SQM"``, ``"Identity"``, ``"Workload"``, ``"TiMM"`` or ``"TaMM"``.
    sums : SumWorkload
        The sums to answer.
    theta : float, array or None
        The truncation threshold (``None`` / ``inf``: none); for SQM one per query
        or one for all.
    privacy : PureDP
        The measurement's budget (``(1 - rho) epsilon``).
    strategy : str
        How :func:`dpdask.select` chooses ``A`` for TiMM and TaMM (``"hdmm"``,
        ``"hierarchical"``, ...).
    objective : {"relative", "total"}, optional
        What TiMM's and TaMM's selection minimises (:func:`select_strategy`; default
        :data:`DEFAULT_OBJECTIVE`); ignored by the other mechanisms.
    base : LinearQuery, optional
        TiMM's ``A`` if already chosen for ``W`` (it does not depend on theta).
    **select_options
        Passed to :func:`dpdask.select` (``restarts``, ``seed``, ...).

    Returns
    -------
    SumMechanism or SQMechanism

    Raises
    ------
    ArgumentError
        For an unknown mechanism or a bad threshold.
    BudgetTypeError
        If ``privacy`` is not pure DP.
    """
    privacy = _check_privacy(privacy)
    if name not in MECHANISMS:
        raise ArgumentError(f"unknown sum mechanism {name!r}; choose one of {MECHANISMS}")
    if name == "SQM":
        th = np.full(sums.shape[0], math.inf) if theta is None else np.asarray(theta, float)
        return SQMechanism(sums, th, privacy)
    t = _check_theta(theta)
    tt = None if math.isinf(t) else t
    n = sums.shape[1]
    template, info = name.lower(), {}
    if name in DEFAULT_OBJECTIVE:
        info["objective"] = _objective(name, objective)
    if name == "Identity":
        M: LinearQuery = Identity(n)
    elif name == "Workload":
        M = sums.weighted(tt)
    elif name == "TiMM":
        if base is None:
            p = select_strategy(name, sums, None, privacy, strategy, objective, **select_options)
            base, template, info = p.strategy, p.template, {**p.info, **info}
        else:
            template = "given"
        M = base @ Diagonal(sums.cell_weights(tt))
    else:  # TaMM
        p = select_strategy(name, sums, tt, privacy, strategy, objective, **select_options)
        M, template, info = p.strategy, p.template, {**p.info, **info}
    Md = _dense(M)
    if Md is not None:
        sens = float(np.abs(Md).sum(axis=0).max())
        M = Dense(Md) if name in ("TiMM", "Workload") else M
    else:
        sens = float(M.sensitivity(1))
    if not (sens > 0 and math.isfinite(sens)):
        raise PlanError(f"the strategy's L1 sensitivity is {sens}")
    scale = sens / float(privacy.epsilon)
    info = {k: v for k, v in info.items() if isinstance(v, int | float | str | bool | type(None))}
    return SumMechanism(name, sums, t, privacy, M, scale, template, info)
