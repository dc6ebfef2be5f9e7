"""A plan's readable summary: its budget in both neighbour relations, and the table.

:meth:`dpdask.strategy.Plan.summary` builds the figures; this module states the
budget for change-one-record neighbours (:mod:`dpdask.privacy.neighbours`) and lays
the figures out as text.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpdask.linalg import Kron, LinearQuery, VStack
from dpdask.privacy import Budget, PureDP, zCDP
from dpdask.privacy.neighbours import ADD_REMOVE, CHANGE_ONE, convert

__all__ = ["format_summary", "neighbour_budgets"]

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


def neighbour_budgets(privacy: Budget, strategy: LinearQuery) -> dict[str, Any]:
    """The plan's budget in both neighbour relations (:mod:`dpdask.privacy.neighbours`)."""
    out: dict[str, Any] = {ADD_REMOVE.name: privacy.to_dict(), CHANGE_ONE.name: None}
    if isinstance(privacy, PureDP | zCDP):
        nonneg = _gram_nonnegative(strategy)
        out[CHANGE_ONE.name] = convert(
            privacy, ADD_REMOVE, CHANGE_ONE, nonnegative_gram=nonneg
        ).to_dict()
        out["gram_nonnegative"] = nonneg
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_summary(d: dict[str, Any]) -> str:
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
