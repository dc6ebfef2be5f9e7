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
import json
import math
import os
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import PlanError
from dpdask.linalg import Kron, LinearQuery, VStack, from_dict, to_dict
from dpdask.noise import draw_variance
from dpdask.privacy import Budget, PureDP, calibrate, mechanism_for, noise_scale, zCDP
from dpdask.privacy.neighbours import ADD_REMOVE, CHANGE_ONE, convert
from dpdask.strategy.analysis import ErrorAnalysis, svd_bound

__all__ = ["Plan", "mechanism_of"]

_FORMAT = "dpdask-plan"
_VERSION = 1
_MAX_VARIANCE_ROWS = 10_000_000
_MAX_GRAM_CELLS = 4096  # a factor's Gram is checked densely up to this many columns


def _gram_nonnegative(A: LinearQuery) -> bool:
    """Whether ``A^T A`` has no negative entry (checked per Kronecker factor and part;
    ``False`` when it cannot be told cheaply)."""
    if isinstance(A, Kron):
        return all(_gram_nonnegative(f) for f in A.factors)
    if isinstance(A, VStack):
        return all(_gram_nonnegative(p) for p in A.parts)
    if A.shape[1] > _MAX_GRAM_CELLS or A.shape[0] * A.shape[1] > 50_000_000:
        return False
    M = A.dense()
    return bool((M.T @ M).min() >= -1e-12)


def _neighbour_budgets(privacy: Budget, strategy: LinearQuery) -> dict:
    """The plan's budget in both neighbour relations (:mod:`dpdask.privacy.neighbours`)."""
    out: dict[str, Any] = {ADD_REMOVE.name: privacy.to_dict(), CHANGE_ONE.name: None}
    if isinstance(privacy, PureDP | zCDP):
        nonneg = _gram_nonnegative(strategy)
        out[CHANGE_ONE.name] = convert(
            privacy, ADD_REMOVE, CHANGE_ONE, nonnegative_gram=nonneg
        ).to_dict()
        out["gram_nonnegative"] = nonneg
    return out


def mechanism_of(privacy: Any) -> str:
    """``"laplace"`` for pure DP, ``"gaussian"`` for zCDP and approximate DP
    (:func:`dpdask.privacy.mechanism_for`, the one mapping)."""
    return mechanism_for(privacy)


class Plan:
    """A data-independent release plan (see the module docstring for the attributes).

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

    def __init__(
        self,
        workload: LinearQuery,
        strategy: LinearQuery,
        privacy: Budget,
        *,
        domain: Domain | None = None,
        groups: Sequence[Sequence[int]] | None = None,
        template: str = "custom",
        info: dict | None = None,
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
        self.mechanism = self.calibration.mechanism
        self.sensitivity = self.calibration.sensitivity
        self.noise_scale = self.calibration.scale
        self._analysis_cache: ErrorAnalysis | None = None

    # -- noise -------------------------------------------------------------
    def at(self, budget: Budget) -> Plan:
        """This plan's strategy and workload measured with ``budget`` instead: a copy
        recalibrated (:meth:`dpdask.privacy.Calibration.at`, the one calibration), for a
        level's share of a release budget or an audit's control.

        Raises
        ------
        dpdask.errors.PlanError
            If ``budget`` cannot be spent with this plan's mechanism (a Gaussian
            strategy's sensitivity is not a Laplace one's).
        """
        cal = self.calibration.at(budget)
        new = copy.copy(self)
        new.privacy, new.calibration, new.noise_scale = budget, cal, cal.scale
        new._analysis_cache = self._analysis_cache  # the same strategy and workload
        return new

    @property
    def noise_variance(self) -> float:
        """Nominal variance of the noise on each measured row: ``2 b^2`` or ``sigma^2``
        (what the measure step draws is :class:`dpdask.measure.Lattice`'s)."""
        return self.calibration.variance

    def _unit_variance(self) -> float:
        """Noise variance per row at sensitivity 1 under this budget."""
        return draw_variance(self.mechanism, noise_scale(self.mechanism, 1.0, self.privacy))

    def __getstate__(self) -> dict:
        # the error analysis is a cache (tens of MiB on the CPH domain): recomputed where
        # needed, never shipped to the scheduler inside every task that carries the plan
        return {**self.__dict__, "_analysis_cache": None}

    # -- error analytics ---------------------------------------------------
    @property
    def analysis(self) -> ErrorAnalysis:
        """The implicit error analysis of the strategy on the workload (cached)."""
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
    def summary(self, as_dict: bool = False) -> str | dict:
        """A readable table of the plan (or, with ``as_dict=True``, a JSON-safe dict)."""
        d = self._summary_dict()
        return d if as_dict else _format_summary(d)

    def _summary_dict(self) -> dict:
        terms = self.analysis.terms
        by_term = self.error_by_term()
        m = self.workload.shape[0]
        total = float(by_term.sum())
        bound = self.svd_bound()
        ident = self.identity_error()
        parts: dict[str, dict] = {}
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
            "neighbours": _neighbour_budgets(self.privacy, self.strategy),
        }

    def __repr__(self) -> str:
        return (
            f"Plan(template={self.template!r}, mechanism={self.mechanism!r}, "
            f"noise_scale={self.noise_scale:.6g}, strategy={self.strategy!r})"
        )

    # -- persistence -------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
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
            np.savez_compressed(f, **{"plan.json": np.array(text)}, **arrays)

    def _save_extra(self, arrays: dict[str, np.ndarray]) -> dict:
        """Entries a subclass adds to the saved document (and arrays); none here."""
        return {}

    @classmethod
    def _from_saved(cls, doc: dict, arrays: dict[str, np.ndarray], **kwargs: Any) -> Plan:
        """Rebuild a plan of this kind from its saved document."""
        return cls(kwargs.pop("workload"), kwargs.pop("strategy"), kwargs.pop("privacy"), **kwargs)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
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


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _format_summary(d: dict) -> str:
    priv = ", ".join(f"{k}={v}" for k, v in d["privacy"].items() if k != "type")
    nb = d.get("neighbours") or {}
    co = nb.get("change-one")
    relation = "budget for add/remove-one-person neighbours"
    if co:
        co_priv = ", ".join(f"{k}={float(Fraction(v)):.6g}" for k, v in co.items() if k != "type")
        relation += f"; change-one-record: {co['type']}({co_priv}) (an upper bound)"
    lines = [
        f"plan: {d['template']}  ({d['mechanism']} noise, {d['privacy']['type']}({priv}))",
        f"  ({relation})",
        f"workload: {d['queries']:,} queries over {d['cells']:,} cells"
        + (f"  domain {d['domain']}" if d["domain"] else ""),
        f"strategy: {d['strategy_rows']:,} rows, sensitivity {_fmt(d['sensitivity'])}, "
        f"noise scale {_fmt(d['noise_scale'])} per row",
        f"expected total squared error: {_fmt(d['expected_total_squared_error'])}"
        + ("  (upper bound: block reconstruction)" if d["error_is_upper_bound"] else ""),
        f"RMSE per query: {_fmt(d['rmse_per_query'])}",
        f"identity strategy: total squared error {_fmt(d['identity_total_squared_error'])}, "
        f"RMSE ratio {_fmt(d['identity_rmse_ratio'])}",
        f"SVD bound: {_fmt(d['svd_bound'])}  (ratio {_fmt(d['ratio_to_svd_bound'])})",
    ]
    cols = ["part", "queries", "squared_error", "rmse", "max_variance"]
    rows = [[_fmt(p[c]) for c in cols] for p in d["parts"]]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines.append("")
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    return "\n".join(lines)
