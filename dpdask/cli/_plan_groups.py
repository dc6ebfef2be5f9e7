"""``dpdask plan``: the standard deviations per level and query group, and ``--compare``.

The figures are :func:`dpdask.strategy.group_errors.group_errors`'s; this module reads
the options, takes the levels' mean fan-outs from the spec's geography where it is known
without reading counts (:func:`dpdask.pipeline.run.plan_geography`) and formats the tables.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpdask.errors import ArgumentError

if TYPE_CHECKING:
    from dpdask.pipeline import ReleaseSpec
    from dpdask.strategy import Plan
    from dpdask.strategy.group_errors import LevelErrors

__all__ = ["COMPARE", "add_groups", "check_compare", "groups_tables", "parse_fanout"]

#: the baselines ``--compare`` knows
COMPARE = ("tda-2020",)

_STATISTIC = "sd = sqrt(mean variance over the group's queries)"
_RECONSTRUCTED = (
    "consistent least squares (GLS) from every level's measurements, on a balanced tree with "
    "each level's mean fan-out"
)


def check_compare(spec: ReleaseSpec, compare: str) -> None:
    """Refuse ``--compare`` where the baseline does not apply, before anything is planned.

    Raises
    ------
    ArgumentError
        For an unknown baseline, or a spec that is not a ``pl94-full`` release of
        the Bureau's levels with a zCDP budget.
    """
    from dpdask import census
    from dpdask.privacy import zCDP
    from dpdask.strategy.tda2020 import LEVELS
    from dpdask.workloads.named import canonical_name

    if compare not in COMPARE:
        raise ArgumentError(f"--compare: {compare!r} is not one of {list(COMPARE)}")

    def name(workload: Mapping[str, Any]) -> str:
        try:
            return canonical_name(str(workload.get("name")))
        except ArgumentError:  # a kind of release without a named workload
            return str(workload.get("name"))

    names = sorted({name(w) for w in spec.workloads()})
    if names != ["pl94-full"] or spec.domain != census.pl94_full_domain():
        raise ArgumentError(
            f"--compare {compare}: the Bureau's strategy answers the pl94-full workload on the "
            f"pl94-full domain (2,016 cells); this spec has workload {', '.join(names)} on "
            f"{spec.domain.size:,} cells"
        )
    levels = list(spec.levels or ())
    other = [lv for lv in levels if lv not in LEVELS]
    if not levels or other:
        raise ArgumentError(
            f"--compare {compare}: the spec's levels must be among the Bureau's {list(LEVELS)}"
            + (f"; {other} are not" if other else "; it names none")
        )
    if not isinstance(spec.privacy, zCDP):
        raise ArgumentError(f"--compare {compare}: the Bureau's budget is zCDP; this spec's is not")


def parse_fanout(text: str, levels: Sequence[str]) -> float | dict[str, float]:
    """``--fanout``: one number for every level, or ``LEVEL=N,...`` for ``levels`` (the
    released ones) below the top.

    Raises
    ------
    ArgumentError
        Unless every value is a number of at least 1 and every level named is released
        below the top.
    """

    def number(value: str) -> float:
        try:
            f = float(value)
        except ValueError:
            f = math.nan
        if not math.isfinite(f) or f < 1:
            raise ArgumentError(f"--fanout: {value!r} is not a number of children (at least 1)")
        return f

    if "=" not in text:
        return number(text)
    out: dict[str, float] = {}
    for item in text.split(","):
        level, _, value = item.partition("=")
        if not level.strip() or not value:
            raise ArgumentError(f"--fanout: {item!r} is not LEVEL=N")
        out[level.strip()] = number(value)
    unknown = sorted(set(out) - set(levels[1:]))
    if unknown:
        raise ArgumentError(
            f"--fanout: {unknown} are not released levels below the top {list(levels)}"
        )
    return out


def _fanouts(
    spec: ReleaseSpec, levels: list[str], option: float | dict[str, float] | None
) -> tuple[dict[str, float] | None, str]:
    """Every level's mean fan-out below the top (``--fanout`` first, else the geography's)."""
    from dpdask.pipeline.run import plan_geography

    if isinstance(option, float):
        return {lv: option for lv in levels[1:]}, "--fanout"
    given = dict(option or {})
    geo = plan_geography(spec) if any(lv not in given for lv in levels[1:]) else None
    out = dict(given)
    for above, lv in itertools.pairwise(levels):
        if lv not in out and geo is not None and {above, lv} <= set(geo.levels):
            out[lv] = geo.n_units(lv) / geo.n_units(above)
    known = all(lv in out for lv in levels[1:])
    source = "--fanout" if geo is None else "the spec's geography"
    if len(levels) == 1:
        source = "one level: its own measurements"
    return (out if known else None), (source if known else "fan-outs unknown")


def add_groups(
    report: dict[str, Any],
    spec: ReleaseSpec,
    plans: Mapping[str, Plan],
    compare: str | None = None,
    fanout: float | dict[str, float] | None = None,
) -> None:
    """Add to ``report`` (:func:`dpdask.pipeline.run.plan_spec`'s) each level's groups.

    Every row of ``report["levels"]`` gets ``fanout``, ``reconstructed_note`` and
    ``groups``: ``[{"group", "queries", "sd_measured", "sd_reconstructed"}]``, with
    ``sd_measured_tda``, ``sd_reconstructed_tda`` and the ratios when ``compare`` is
    given; ``report["groups"]`` says what the figures are.
    """
    from dpdask.strategy.group_errors import group_errors, tda2020_level_plans

    levels = list(plans)
    if not levels:
        return
    fanouts, source = _fanouts(spec, levels, fanout)
    # a spine level is not measured (its units reuse their parent's estimate)
    unmeasured = {
        r["level"] for r in report["levels"] if r.get("spine", {}).get("measured") is False
    }
    ours = group_errors(plans, fanouts, unmeasured)
    theirs: list[LevelErrors] | None = None
    about: dict[str, Any] = {
        "statistic": _STATISTIC,
        "measured": "the level's own measurements, at the noise drawn",
        "reconstructed": _RECONSTRUCTED,
        "fanout_source": source,
    }
    if compare is not None:
        from dpdask.privacy import zCDP
        from dpdask.strategy.tda2020 import LEVEL_SHARES

        budget = spec.privacy
        if not isinstance(budget, zCDP):  # check_compare refused it already
            raise ArgumentError(f"--compare {compare}: the spec's budget is not zCDP")
        tda = tda2020_level_plans(budget, levels, domain=spec.domain)
        theirs = group_errors(tda, fanouts)
        shares = sum(LEVEL_SHARES[lv] for lv in levels)
        about["compare"] = {
            "baseline": compare,
            "persons_budget": (budget * (1 / shares)).to_dict(),
            "level_budgets": {lv: p.privacy.to_dict() for lv, p in tda.items()},
            "noise": "nominal (the Bureau measures integer counts with the discrete Gaussian)",
            "ratio": "this plan's sd over tda-2020's",
        }
    report["groups"] = about
    rows = {row["level"]: row for row in report["levels"]}
    for i, le in enumerate(ours):
        row = rows[le.level]
        row["fanout"] = le.fanout
        row["reconstructed_note"] = le.note
        base = {} if theirs is None else {t.group: t for t in theirs[i].groups}
        groups: list[dict[str, Any]] = []
        for g in le.groups:
            entry: dict[str, Any] = {
                "group": g.group, "queries": g.queries, "sd_measured": g.sd_measured,
                "sd_reconstructed": g.sd_reconstructed,
            }  # fmt: skip
            if theirs is not None:
                t = base[g.group]
                entry["sd_measured_tda"] = t.sd_measured
                entry["sd_reconstructed_tda"] = t.sd_reconstructed
                entry["ratio_measured"] = _ratio(g.sd_measured, t.sd_measured)
                entry["ratio_reconstructed"] = _ratio(g.sd_reconstructed, t.sd_reconstructed)
            groups.append(entry)
        if theirs is not None:
            row["reconstructed_note_tda"] = theirs[i].note
        row["groups"] = groups


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _cell(v: float | None, width: int) -> str:
    return f"{'n/a':>{width}}" if v is None else f"{v:>{width}.4g}"


def groups_tables(report: dict[str, Any]) -> str:
    """One aligned table per level of :func:`add_groups`' figures ('' without them)."""
    about = report.get("groups")
    if about is None:
        return ""
    compare = about.get("compare")
    lines = [
        f"per level and query group ({about['statistic']}):",
        f"  measured: {about['measured']}",
        f"  reconstructed: {about['reconstructed']} (from {about['fanout_source']})",
    ]
    if compare is not None:
        persons = ", ".join(
            f"{k}={v} ({float(Fraction(v)):.6g})"
            for k, v in compare["persons_budget"].items()
            if k != "type"
        )
        lines.append(
            f"  {compare['baseline']}: the Bureau's strategy at its production shares of the same "
            f"total (persons {persons}, add/remove); noise {compare['noise']}"
        )
        lines.append(f"  ratio: {compare['ratio']}")
    for i, row in enumerate(report["levels"]):
        if "groups" not in row:
            continue
        fan = row.get("fanout")
        where = "top level" if i == 0 else "fan-out unknown"
        if fan is not None:
            where = f"mean fan-out {fan:.4g}"
        recon = all(g["sd_reconstructed"] is not None for g in row["groups"])
        both = compare is not None and recon and row.get("reconstructed_note_tda") is None
        head = f"{'group':<28}{'queries':>8}{'measured':>11}{'reconstructed':>15}"
        if compare is not None:
            which = "reconstructed" if both else "measured"
            head += f"{'tda measured':>14}{'tda reconstr.':>15}{'ratio (' + which + ')':>24}"
        lines += ["", f"level {row['level']} ({where})", head]
        for g in row["groups"]:
            line = (
                f"{g['group']:<28}{g['queries']:>8}{_cell(g['sd_measured'], 11)}"
                f"{_cell(g['sd_reconstructed'], 15)}"
            )
            if compare is not None:
                ratio = g["ratio_reconstructed"] if both else g["ratio_measured"]
                line += (
                    f"{_cell(g['sd_measured_tda'], 14)}{_cell(g['sd_reconstructed_tda'], 15)}"
                    f"{_cell(ratio, 24)}"
                )
            lines.append(line)
        if row.get("reconstructed_note"):
            lines.append(f"reconstructed {row['reconstructed_note']}")
    return "\n".join(lines)
