"""The plan of a release: which strategy is measured, with how much noise, at what error.

A :class:`Plan` is data-independent. It is built from the workload, the strategy
and the budget alone, can be reviewed (:meth:`Plan.summary`), saved and loaded
(:meth:`Plan.save`, :meth:`Plan.load`) before any data is touched, and is what the
measure step and the release dataflow consume:

``plan.workload``
    the queries to answer (:class:`~dpdask.linalg.LinearQuery`);
``plan.strategy``
    ``A``, the rows actually measured, weights included;
``plan.mechanism``
    ``"laplace"`` (pure DP) or ``"gaussian"`` (zCDP, approximate DP);
``plan.noise_scale``
    the Laplace scale ``b`` or Gaussian ``sigma`` added to every row of ``A x``,
    calibrated by the budget to ``A``'s L1 or L2 sensitivity;
``plan.privacy``, ``plan.domain``
    the budget and the domain (or ``None``);
``plan.calibration``
    the one calibration (:func:`dpdask.privacy.calibrate`): mechanism, norm,
    sensitivity, scale;
``plan.base``, ``plan.drawn``
    for a level's plan (:meth:`Plan.at`), the plan it was made from; once
    :meth:`Plan.realise` fixed it, the noise the measure step draws (its
    ``row_variance`` and error figures are then of that noise);
``plan.groups``
    ``None`` (answer the workload by least squares on all of ``A``) or, for a
    union strategy, the workload terms each part of ``A`` answers on its own; the
    error figures are then exact for that block reconstruction and upper bounds
    for least squares over the whole union.

File format (:meth:`Plan.save`): one ``.npz`` archive holding the arrays of the
operators and an entry ``plan.json``, a JSON document with the operators as
nested dictionaries (:func:`dpdask.linalg.to_dict`) that refer to those arrays,
the budget as exact fractions, the domain, the groups and the selection record.
Loading needs no pickle and recomputes the noise scale from the strategy and the
budget, refusing a file whose recorded noise does not match.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

from dpdask.domain import Domain
from dpdask.errors import PlanError
from dpdask.linalg import (
    Kron,
    LinearQuery,
    evaluation_error,
    from_dict,
    gram_root,
    has_integer_entries,
    to_dict,
)
from dpdask.noise import DEFAULT_MAX_TOTAL, grid_rule
from dpdask.privacy import Budget, Calibration, calibrate, mechanism_for
from dpdask.strategy._plan_summary import format_summary, neighbour_budgets
from dpdask.strategy.analysis import ErrorAnalysis, svd_bound

__all__ = ["DrawnNoise", "Plan"]

_T = TypeVar("_T")
_MAX_ROOT_CELLS = 4096  # a Gram root is formed (per factor) up to this many columns


class DrawnNoise(Protocol):
    """How the measure step draws a plan's noise (:class:`dpdask.measure.Lattice`
    satisfies it): the scale and the variance of one draw, in data units."""

    @property
    def noise_scale(self) -> float: ...

    @property
    def variance(self) -> float: ...


_FORMAT = "dpdask-plan"
_VERSION = 1
_MAX_VARIANCE_ROWS = 10_000_000


def _compact(A: LinearQuery, mechanism: str) -> LinearQuery:
    """What is measured for strategy ``A``: for Gaussian noise, a root of its Gram
    (same privacy, same least-squares error, at most ``n`` rows; see
    :func:`dpdask.linalg.gram_root`) when that is cheap to form; ``A`` otherwise."""
    if mechanism != "gaussian" or A.shape[0] <= A.shape[1]:
        return A
    if isinstance(A, Kron) and all(f.shape[1] <= _MAX_ROOT_CELLS for f in A.factors):
        return gram_root(A)
    if A.shape[1] <= _MAX_ROOT_CELLS:
        return gram_root(A)
    return A


def _grid_sensitivity(A: LinearQuery, cal: Calibration) -> float:
    """The sensitivity the measure step calibrates ``A``'s noise to on integer counts:
    exact for integer entries, else on the lattice its floating-point evaluation error
    allows (:func:`dpdask.noise.grid_rule`, with the default bound on a total). Of two
    strategies with one Gram (same least-squares error) the lower one draws less noise."""
    if has_integer_entries(A):
        return float(cal.sensitivity)
    err = evaluation_error(A) * DEFAULT_MAX_TOTAL
    return grid_rule(A.shape[0], cal.norm, cal.sensitivity, cal.scale, err)[1]


class Plan:
    """A data-independent release plan (see the module docstring for the attributes).

    A level's plan (:meth:`at`) keeps the plan it was made from as :attr:`base`, and a
    plan whose noise was fixed as drawn (:meth:`realise`) holds it as :attr:`drawn`;
    both return new plans, leaving this one as it was.

    Parameters
    ----------
    workload : LinearQuery
        The workload ``W``.
    strategy : LinearQuery
        The strategy ``A`` as measured.
    privacy : PureDP, zCDP or ApproxDP
        The budget of the measurement.
    domain : Domain, optional
        The data domain; its size must match the operators' columns.
    groups : sequence of sequence of int, optional
        Block reconstruction of a union strategy (see the module docstring).
    template : str
        How the strategy was chosen (``"hdmm-kron"``, ``"identity"``, ...).
    info : dict, optional
        JSON-safe record of the selection (losses per template, restarts, times).
    sizes : sequence of int, optional
        Attribute sizes when there is no domain (default: read from the workload).

    Raises
    ------
    PlanError
        If the shapes disagree or the strategy has zero sensitivity (a ValueError).
    """

    # class defaults, for subclasses that set their own fields (ResidualPlan)
    base: Plan | None = None
    drawn: DrawnNoise | None = None

    def __init__(
        self,
        workload: LinearQuery,
        strategy: LinearQuery,
        privacy: Budget,
        *,
        domain: Domain | None = None,
        groups: Sequence[Sequence[int]] | None = None,
        template: str = "custom",
        info: dict[str, Any] | None = None,
        sizes: Sequence[int] | None = None,
    ):
        if workload.shape[1] != strategy.shape[1]:
            raise PlanError(
                f"workload has {workload.shape[1]} columns but the strategy has {strategy.shape[1]}"
            )
        if domain is not None:
            if domain.size != workload.shape[1]:
                raise PlanError(
                    f"the domain has {domain.size} cells but the workload has "
                    f"{workload.shape[1]} columns"
                )
            sizes = domain.shape
        self.workload = workload
        self.strategy = strategy
        self.privacy = privacy
        self.domain = domain
        self.groups = None if groups is None else [[int(j) for j in g] for g in groups]
        self.template = str(template)
        self.info = dict(info or {})
        self.sizes = tuple(int(s) for s in sizes) if sizes is not None else None
        self.calibration = calibrate(privacy, strategy)
        self.base = None
        self.drawn = None
        self.mechanism = self.calibration.mechanism
        self.sensitivity = self.calibration.sensitivity
        self.noise_scale = self.calibration.scale
        self._analysis_cache: ErrorAnalysis | None = None

    # -- noise -------------------------------------------------------------
    def at(self, budget: Budget, *, operator: bool = False) -> Plan:
        """This plan measured with ``budget`` instead: a level's plan, for a level's share
        of a release budget (or an audit's control).

        The workload, domain and error analysis are this plan's (its :attr:`base`'s);
        what is measured is, for Gaussian noise, a root of the strategy's Gram when that
        is cheap to form (same privacy, same least-squares error, at most ``n`` rows),
        computed once for every level plan of one base plan, as is anything
        :meth:`shared`; the noise is calibrated to ``budget`` on it
        (:meth:`dpdask.privacy.Calibration.at`, the one calibration). A new plan: this
        one is unchanged, and the new one describes the nominal noise until
        :meth:`realise` fixes the noise drawn.

        ``operator=True`` calibrates on the strategy operator's column norms (what a
        release of counts measures, and its charge checks) even where the plan knows its
        sensitivity in closed form (a residual plan measured from records).

        Raises
        ------
        dpdask.errors.PlanError
            If ``budget`` cannot be spent with this plan's mechanism (a Gaussian
            strategy's sensitivity is not a Laplace one's).
        dpdask.errors.BudgetTypeError
            If ``budget`` is not a budget.
        """
        mechanism = mechanism_for(budget)
        if mechanism != self.mechanism:
            raise PlanError(
                f"a {self.mechanism} plan cannot be measured with {budget!r} ({mechanism} "
                "noise); select a plan for that budget"
            )
        base = self if self.base is None else self.base
        measured, cal = base.shared(f"measured-{operator}", lambda: base._measured(operator))
        new = copy.copy(self)
        new.base, new.drawn = base, None
        # the level plans of one base plan share their structure (:meth:`shared`)
        new.__dict__["_structure"] = base.shared("levels", dict)
        if measured is not None:
            new.strategy = measured
        new.privacy, new.calibration = budget, cal.at(budget)
        new.sensitivity, new.noise_scale = new.calibration.sensitivity, new.calibration.scale
        new._analysis_cache = None  # the base's analysis is used (:attr:`analysis`)
        return new

    def _measured(self, operator: bool) -> tuple[LinearQuery | None, Calibration]:
        """What a level plan of this one measures (``None``: this strategy as it is) and
        its calibration at this plan's budget (on the operator: a plan's strategy is one)."""
        with threadpool_limits(limits=1, user_api="blas"):  # small matrices: 1 thread
            A = _compact(self.strategy, self.mechanism)
            if A is self.strategy:
                return None, self.calibration
            cal = calibrate(self.privacy, A)
            if _grid_sensitivity(self.strategy, self.calibration) < _grid_sensitivity(A, cal):
                return None, self.calibration  # the root's lattice would add noise
        return A, cal

    def shared(self, name: str, compute: Callable[[], _T]) -> _T:
        """A value derived from the measured strategy alone (a structured
        pseudo-inverse, its rank), computed once by ``compute`` for this plan and, for a
        level plan, every level plan :meth:`at` made from the same base plan."""
        cache: dict[str, Any] = self.__dict__.setdefault("_structure", {})
        if name not in cache:
            cache[name] = compute()
        value: _T = cache[name]
        return value

    def realise(self, drawn: DrawnNoise) -> Plan:
        """This plan with its noise as the measure step draws it (``drawn``, e.g.
        :func:`dpdask.measure.lattice` of this plan for the data's dtype and bound): a
        new plan whose :attr:`row_variance`, :attr:`noise_variance`, :attr:`drawn_scale`
        and error figures (:meth:`query_variances`, ...) are those of the noise drawn, not
        of the nominal continuous mechanism. The measurement itself still starts from
        the plan's calibration (:attr:`noise_scale`)."""
        new = copy.copy(self)
        new.drawn = drawn
        return new

    @property
    def drawn_scale(self) -> float:
        """The scale of the noise drawn (data units; the nominal :attr:`noise_scale`
        until :meth:`realise`)."""
        return self.noise_scale if self.drawn is None else float(self.drawn.noise_scale)

    @property
    def row_variance(self) -> float:
        """Variance of the noise on each measured row: of the law drawn once
        :meth:`realise` fixed it (the discrete sampler on its lattice), of the nominal
        mechanism (``2 b^2`` or ``sigma^2``, :attr:`calibration`) before."""
        if self.drawn is not None:
            return float(self.drawn.variance)
        return self.calibration.variance

    @property
    def noise_variance(self) -> float:
        """The :attr:`row_variance` every error figure of the plan is made of."""
        return self.row_variance

    def _unit_variance(self) -> float:
        """Noise variance per row at sensitivity 1 under this budget (nominal)."""
        return dataclasses.replace(self.calibration, sensitivity=1.0).at(self.privacy).variance

    def __getstate__(self) -> dict[str, Any]:
        # the error analysis is a cache (tens of MiB on the CPH domain): recomputed where
        # needed, never shipped to the scheduler inside every task that carries the plan
        return {**self.__dict__, "_analysis_cache": None}

    # -- error analytics ---------------------------------------------------
    @property
    def analysis(self) -> ErrorAnalysis:
        """The implicit error analysis of the strategy on the workload (cached; a level
        plan's is its base plan's: the measured Gram root has the same error)."""
        if self.base is not None:
            return self.base.analysis
        if self._analysis_cache is None:
            self._analysis_cache = ErrorAnalysis(
                self.workload, self.strategy, self.sizes, self.groups
            )
        return self._analysis_cache

    def expected_error(self) -> float:
        """Expected total squared error of the workload answers."""
        return self.noise_variance * self.analysis.total()

    def query_variances(self) -> np.ndarray:
        """Variance of every workload answer, in the workload's row order."""
        return self.noise_variance * self.analysis.variances()

    def error_by_term(self) -> np.ndarray:
        """Expected total squared error of each Kronecker term of the workload."""
        return self.noise_variance * self.analysis.by_term()

    def svd_bound(self) -> float | None:
        """The SVD lower bound on any strategy's expected total squared error.

        Exact for Gaussian noise; for Laplace noise a valid but loose bound (the L1
        sensitivity is at least the L2). ``None`` where it cannot be computed
        without dense matrices.
        """
        s = svd_bound(self.analysis.terms)
        return None if s is None else self._unit_variance() * s

    def identity_error(self) -> float:
        """Expected total squared error of measuring every cell under the same budget."""
        terms = self.analysis.terms
        total = sum(
            terms.weights[j] ** 2 * math.prod(terms.gram(j, i).trace() for i in range(terms.d))
            for j in range(terms.k)
        )
        return self._unit_variance() * float(total)

    # -- reporting ---------------------------------------------------------
    def summary(self, as_dict: bool = False) -> str | dict[str, Any]:
        """A readable table of the plan (or, with ``as_dict=True``, a JSON-safe dict)."""
        d = self._summary_dict()
        return d if as_dict else format_summary(d)

    def _summary_dict(self) -> dict[str, Any]:
        terms = self.analysis.terms
        by_term = self.error_by_term()
        m = self.workload.shape[0]
        total = float(by_term.sum())
        bound = self.svd_bound()
        ident = self.identity_error()
        parts: dict[str, dict[str, Any]] = {}
        for j in range(terms.k):
            rows = terms.rows(j)
            entry = parts.setdefault(
                terms.names[j],
                {"part": terms.names[j], "queries": 0, "squared_error": 0.0, "max_variance": 0.0},
            )
            entry["queries"] += rows
            entry["squared_error"] += float(by_term[j])
            if rows <= _MAX_VARIANCE_ROWS and entry["max_variance"] is not None:
                v = self.noise_variance * self.analysis.term_variances(j)
                entry["max_variance"] = max(entry["max_variance"], float(v.max()))
            else:
                entry["max_variance"] = None
        for e in parts.values():
            e["rmse"] = math.sqrt(e["squared_error"] / e["queries"])
        return {
            "template": self.template,
            "mechanism": self.mechanism,
            "privacy": self.privacy.to_dict(),
            "domain": self.domain.to_dict() if self.domain is not None else None,
            "queries": int(m),
            "cells": int(self.workload.shape[1]),
            "strategy_rows": int(self.strategy.shape[0]),
            "sensitivity": self.sensitivity,
            "noise_scale": self.noise_scale,
            "expected_total_squared_error": total,
            "rmse_per_query": math.sqrt(total / m),
            "error_is_upper_bound": self.groups is not None,
            "svd_bound": bound,
            "ratio_to_svd_bound": None if not bound else total / bound,
            "identity_total_squared_error": ident,
            "identity_rmse_ratio": math.sqrt(ident / total) if total > 0 else None,
            "parts": list(parts.values()),
            "selection": self.info,
            "neighbours": neighbour_budgets(self.privacy, self.strategy),
        }

    def __repr__(self) -> str:
        return (
            f"Plan(template={self.template!r}, mechanism={self.mechanism!r}, "
            f"noise_scale={self.noise_scale:.6g}, strategy={self.strategy!r})"
        )

    # -- persistence -------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan to ``path`` (an ``.npz`` archive; see the module docstring)."""
        arrays: dict[str, np.ndarray] = {}
        doc = {
            "format": _FORMAT,
            "version": _VERSION,
            "workload": to_dict(self.workload, arrays),
            "strategy": to_dict(self.strategy, arrays),
            "privacy": self.privacy.to_dict(),
            "domain": self.domain.to_dict() if self.domain is not None else None,
            "sizes": list(self.sizes) if self.sizes is not None else None,
            "groups": self.groups,
            "template": self.template,
            "info": self.info,
            "mechanism": self.mechanism,
            "noise_scale": self.noise_scale,
            **self._save_extra(arrays),
        }
        text = json.dumps(doc, allow_nan=False)
        with open(path, "wb") as f:
            np.savez_compressed(f, **{"plan.json": np.array(text)}, **arrays)  # type: ignore[arg-type]

    def _save_extra(self, arrays: dict[str, npt.NDArray[Any]]) -> dict[str, Any]:
        """Entries a subclass adds to the saved document (and arrays); none here."""
        return {}

    @classmethod
    def _from_saved(
        cls, doc: dict[str, Any], arrays: dict[str, npt.NDArray[Any]], **kwargs: Any
    ) -> Plan:
        """Rebuild a plan of this kind from its saved document."""
        return cls(kwargs.pop("workload"), kwargs.pop("strategy"), kwargs.pop("privacy"), **kwargs)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Plan:
        """Read a plan written by :meth:`save`.

        Raises
        ------
        PlanError
            If the file is not a dpdask plan, or its recorded noise disagrees with
            the noise its strategy and budget require.
        """
        with np.load(path, allow_pickle=False) as z:
            if "plan.json" not in z.files:
                raise PlanError(f"{path} is not a dpdask plan (no plan.json entry)")
            doc = json.loads(str(z["plan.json"]))
            if doc.get("format") != _FORMAT:
                raise PlanError(f"{path} is not a dpdask plan")
            if doc.get("version") != _VERSION:
                raise PlanError(f"{path}: unsupported plan version {doc.get('version')!r}")
            arrays = {k: z[k] for k in z.files if k != "plan.json"}
            workload = from_dict(doc["workload"], arrays)
            strategy = from_dict(doc["strategy"], arrays)
        privacy = Budget.from_dict(doc["privacy"])
        domain = Domain(doc["domain"]) if doc.get("domain") is not None else None
        kind: type[Plan] = Plan
        if doc.get("kind") == "fitness":
            from dpdask.strategy.fitness import FitnessPlan as kind
        elif doc.get("kind") == "residual":
            from dpdask.strategy.residual import ResidualPlan as kind
        plan = kind._from_saved(
            doc,
            arrays,
            workload=workload,
            strategy=strategy,
            privacy=privacy,
            domain=domain,
            groups=doc.get("groups"),
            template=doc.get("template", "custom"),
            info=doc.get("info"),
            sizes=doc.get("sizes"),
        )
        if plan.mechanism != doc.get("mechanism") or plan.noise_scale != doc.get("noise_scale"):
            raise PlanError(
                f"{path}: the recorded noise ({doc.get('mechanism')}, scale "
                f"{doc.get('noise_scale')}) does not match what the strategy and budget "
                f"require ({plan.mechanism}, {plan.noise_scale})"
            )
        return plan
