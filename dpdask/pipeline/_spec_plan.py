"""The workload, strategy and reconstruction fields of a release spec
(:mod:`dpdask.pipeline.spec`): a workload and strategy for every level, or one per
released level (``{levels: {level: ...}}``); the reconstruction, with the multi-pass
top-down's passes (:func:`reconstruction_passes`, :func:`level_passes`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpdask.errors import SpecError
from dpdask.pipeline._spec_fields import check_keys, keywords

__all__ = [
    "RECONSTRUCTIONS",
    "STRATEGIES",
    "PassGroups",
    "check_pass_groups",
    "level_passes",
    "passes_option",
    "passes_statement",
    "reconstruction",
    "reconstruction_passes",
    "strategies",
    "workloads",
]

RECONSTRUCTIONS = ("ls", "wls", "nnls", "wnnls", "admm-l1", "admm-enet", "topdown")

STRATEGIES = (
    "hdmm", "identity", "workload", "hierarchical", "wavelet", "convex", "fitness", "tda-2020",
    "residual",
)  # fmt: skip


def workloads(raw: Any, levels: tuple[str, ...] | None) -> dict[str, Any]:
    """One workload for every level, or ``{levels: {level: workload, ...}}``: one per
    released level, each selected and measured with the level's share of the budget."""
    if not (isinstance(raw, Mapping) and "levels" in raw):
        return _workload(raw)
    check_keys(raw, ["levels"], "workload")
    per_level = raw["levels"]
    if not isinstance(per_level, Mapping) or not per_level:
        raise SpecError("workload.levels: expected a mapping of level to workload")
    if levels is None:
        raise SpecError("workload.levels: per-level workloads need the spec's levels: list")
    if set(per_level) != set(levels):
        raise SpecError(
            f"workload.levels: give one workload per released level {list(levels)}; "
            f"got {sorted(per_level, key=str)}"
        )
    return {"levels": {lv: _workload(per_level[lv]) for lv in levels}}  # in levels' order


def _marginals(raw: Any) -> dict[str, Any]:
    """``{marginals: {k: K}}`` (all K-way marginals; ``attributes: [...]``: of those
    attributes only) or ``{marginals: [sets]}``, each set
    a list of attribute names or ``{attributes: [...], weight: w}``."""
    check_keys(raw, ["marginals"], "workload")
    m = raw["marginals"]
    if isinstance(m, Mapping):
        check_keys(m, ["k", "attributes"], "workload.marginals")
        k = m.get("k")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise SpecError(f"workload.marginals.k: expected a non-negative integer, got {k!r}")
        among = m.get("attributes")
        if among is None:
            return {"name": "marginals", "k": k}
        ok = isinstance(among, list) and all(isinstance(a, str) for a in among)
        if not ok or len(set(among)) != len(among) or len(among) < k:
            raise SpecError(
                f"workload.marginals.attributes: expected at least {k} distinct attribute names"
            )
        sets = [list(c) for c in itertools.combinations(among, k)]
        return {"name": "marginal-sets", "sets": sets, "weights": [1.0] * len(sets)}
    if not isinstance(m, list) or not m:
        raise SpecError("workload.marginals: expected {k: K} or a non-empty list of sets")
    sets, weights = [], []
    for j, item in enumerate(m):
        where = f"workload.marginals[{j}]"
        weight: Any = 1
        if isinstance(item, Mapping):
            check_keys(item, ["attributes", "weight"], where)
            weight = item.get("weight", 1)
            item = item.get("attributes")
        ok = isinstance(item, list) and all(isinstance(a, str) for a in item)
        if not ok or len(set(item)) != len(item):
            raise SpecError(f"{where}: expected a list of distinct attribute names")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise SpecError(f"{where}.weight: expected a positive number, got {weight!r}")
        sets.append(list(item))
        weights.append(float(weight))
    return {"name": "marginal-sets", "sets": sets, "weights": weights}


def _workload(raw: Any) -> dict[str, Any]:
    from dpdask.workloads.named import workload_options

    if isinstance(raw, Mapping) and "marginals" in raw:
        return _marginals(raw)
    if isinstance(raw, str):
        workload: dict[str, Any] = {"name": raw}
    elif isinstance(raw, Mapping):
        workload = dict(raw)
    else:
        raise SpecError("workload: expected a name or a mapping with 'name'")
    name = workload.get("name")
    if not isinstance(name, str):
        raise SpecError("workload: expected a name or a mapping with 'name'")
    try:
        allowed = workload_options(name)
    except ValueError as exc:
        raise SpecError(f"workload.name: {exc}") from None
    if allowed is not None:
        check_keys(workload, ["name", *allowed], "workload")
    return workload


def _residual_options(objective: str = "sum") -> None:
    """The options of ``strategy: residual`` (``objective``: sum or max)."""


def _strategy_keys(name: str) -> list[str]:
    """The options :func:`dpdask.strategy.select` uses for strategy ``name``."""
    from dpdask.strategy import baselines, select, tda2020
    from dpdask.strategy.convex import ca_solve
    from dpdask.strategy.fitness import fitness_plan, solve

    given = ("workload", "privacy", "strategy", "domain", "client")  # plan_spec passes these
    used: dict[str, list[tuple[Callable[..., Any], tuple[str, ...]]]] = {
        "hdmm": [(select, given)],
        "residual": [(_residual_options, ())],
        "hierarchical": [(baselines.hierarchical, ("n_or_domain",))],
        "convex": [(baselines.convex_ca, ("W",)), (ca_solve, ("W", "weights"))],
        "fitness": [
            (fitness_plan, given),
            (solve, ("W", "targets", "basis", "budget")),
            (tda2020.fitness_plan, given),  # targets: tda-2020, level, persons
        ],
        "tda-2020": [(tda2020.tda2020_plan, given)],  # level
    }
    return list(dict.fromkeys(k for fn, skip in used.get(name, []) for k in keywords(fn, skip)))


def strategies(
    raw: Any, levels: tuple[str, ...] | None
) -> tuple[str, dict[str, Any], dict[str, tuple[str, dict[str, Any]]] | None]:
    """One strategy (name and options), or ``{levels: {level: strategy}}``: one per
    released level, each selected for that level's workload and share of the budget."""
    if not (isinstance(raw, Mapping) and "levels" in raw):
        return (*_strategy(raw), None)
    check_keys(raw, ["levels"], "strategy")
    per_level = raw["levels"]
    if not isinstance(per_level, Mapping) or not per_level:
        raise SpecError("strategy.levels: expected a mapping of level to strategy")
    if levels is None:
        raise SpecError("strategy.levels: per-level strategies need the spec's levels: list")
    if set(per_level) != set(levels):
        raise SpecError(
            f"strategy.levels: give one strategy per released level {list(levels)}; "
            f"got {sorted(per_level, key=str)}"
        )
    out = {}
    for lv in levels:
        try:
            out[lv] = _strategy(per_level[lv])
        except SpecError as exc:
            raise SpecError(str(exc).replace("strategy", f"strategy.levels.{lv}", 1)) from None
    names = {name for name, _ in out.values()}
    return (names.pop() if len(names) == 1 else "per-level"), {}, out


def _strategy(raw: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(raw, Mapping):
        name = raw.get("name", "hdmm")
        options = {k: v for k, v in raw.items() if k != "name"}
    else:
        name, options = raw, {}
    if name not in STRATEGIES:
        raise SpecError(f"strategy: {name!r} is not one of {STRATEGIES}")
    if options:
        check_keys(raw, ["name", *_strategy_keys(name)], "strategy")
    return name, options


_RECONSTRUCT_KEYS = ("method", "integer", "simulate", "spine", "passes", "slack")
#: ``reconstruct.passes``: ``"default"`` or, per pass, the workload query groups it fits
PassGroups = str | tuple[tuple[str, ...], ...]


def reconstruction(raw: Any) -> tuple[str, bool, int | None, bool]:
    """``reconstruct: ls`` or ``reconstruct: {method: topdown, integer: true, simulate: K,
    spine: true}``: the method, ``integer``, ``simulate`` and ``spine``
    (:mod:`dpdask.graph._spine`; and ``passes``, ``slack``: :func:`reconstruction_passes`)."""
    simulate, spine = None, False
    if isinstance(raw, Mapping):
        unknown = sorted(set(raw) - set(_RECONSTRUCT_KEYS), key=str)
        if unknown:
            known = sorted(_RECONSTRUCT_KEYS)
            raise SpecError(f"reconstruct: unknown key(s) {unknown}; known: {known}")
        method, integer = raw.get("method", "ls"), raw.get("integer", False)
        simulate, spine = raw.get("simulate"), raw.get("spine", False)
    else:
        method, integer = raw, False
    if simulate is not None and (
        isinstance(simulate, bool) or not isinstance(simulate, int) or simulate < 0
    ):
        raise SpecError(f"reconstruct.simulate: a number of trials >= 0, got {simulate!r}")
    if simulate is not None and method in ("ls", "wls"):
        raise SpecError(f"reconstruct.simulate: least squares ({method}) publishes its exact error")
    if method not in RECONSTRUCTIONS:
        raise SpecError(f"reconstruct: {method!r} is not one of {RECONSTRUCTIONS}")
    if not isinstance(integer, bool):
        raise SpecError(f"reconstruct.integer: must be true or false, got {integer!r}")
    if integer and method != "topdown":
        raise SpecError("reconstruct.integer: integer estimates need method: topdown")
    if not isinstance(spine, bool):
        raise SpecError(f"reconstruct.spine: must be true or false, got {spine!r}")
    if spine and method != "topdown":
        raise SpecError("reconstruct.spine: reusing a parent's estimate needs method: topdown")
    return method, integer, simulate, spine


def reconstruction_passes(raw: Any) -> tuple[PassGroups | None, float]:
    """``reconstruct: {method: topdown, passes: ..., slack: s}``: the multi-pass top-down
    (:func:`dpdask.graph.release`'s ``passes`` and ``slack``). ``passes`` is ``default``
    (the total, then every cell) or a list of passes, each a query group of the workload
    or a list of them (the group names are checked against the workload once it is
    built); ``slack`` (default 0) how far a later pass may move an earlier pass's
    answers. ``(None, 0.0)`` for a spec without passes.

    Raises
    ------
    SpecError
        Naming ``reconstruct.passes`` or ``reconstruct.slack``; for passes with a method
        other than ``topdown``, or a slack without passes.
    """
    if not isinstance(raw, Mapping) or ("passes" not in raw and "slack" not in raw):
        return None, 0.0
    if "passes" not in raw:
        raise SpecError("reconstruct.slack: a slack goes with passes (reconstruct.passes)")
    method = raw.get("method", "ls")
    if method != "topdown":
        raise SpecError(f"reconstruct.passes: only method: topdown fits by passes, not {method!r}")
    slack = raw.get("slack", 0)
    if (
        isinstance(slack, bool)
        or not isinstance(slack, int | float)
        or not (math.isfinite(slack) and slack >= 0)
    ):
        raise SpecError(f"reconstruct.slack: a number >= 0, got {slack!r}")
    given = raw["passes"]
    if isinstance(given, str):
        if given != "default":
            raise SpecError(
                f"reconstruct.passes: 'default' or a list of query groups, got {given!r}"
            )
        return "default", float(slack)
    if not isinstance(given, list) or not given:
        raise SpecError(
            f"reconstruct.passes: 'default' or a non-empty list of query groups, got {given!r}"
        )
    out: list[tuple[str, ...]] = []
    for k, g in enumerate(given):
        names = [g] if isinstance(g, str) else g
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(x, str) and x for x in names)
        ):
            raise SpecError(
                f"reconstruct.passes[{k}]: a query group's name or a list of them, got {g!r}"
            )
        if len(set(names)) != len(names):
            raise SpecError(f"reconstruct.passes[{k}]: a group named twice in {names}")
        out.append(tuple(names))
    seen = [x for p in out for x in p]
    twice = sorted({x for x in seen if seen.count(x) > 1})
    if twice:
        raise SpecError(f"reconstruct.passes: groups {twice} are in more than one pass")
    return tuple(out), float(slack)


def check_pass_groups(passes: PassGroups | None, groups: Sequence[str], where: str) -> None:
    """Refuse a pass naming a query group the workload (``where``, e.g. ``workload pl94``)
    does not have: a :class:`SpecError` naming ``reconstruct.passes[k]``."""
    if passes is None or isinstance(passes, str):
        return
    for k, names in enumerate(passes):
        unknown = [x for x in names if x not in groups]
        if unknown:
            raise SpecError(
                f"reconstruct.passes[{k}]: {unknown} is not a query group of {where} "
                f"(its groups: {list(groups)})"
            )


def passes_option(passes: PassGroups | None) -> str | list[list[str]] | None:
    """``reconstruct.passes`` as :func:`dpdask.graph.release` takes it (None: none)."""
    if passes is None or isinstance(passes, str):
        return passes
    return [list(p) for p in passes]


def passes_statement(spec: Any) -> dict[str, Any] | None:
    """A spec's passes and slack, JSON-safe, as the plan, the ledger's run binding and
    the release attributes state them; None for a spec without passes."""
    if spec.passes is None:
        return None
    return {"passes": passes_option(spec.passes), "slack": spec.slack}


def level_passes(spec: Any, plans: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each level's passes by name, as a run fits them with ``plans`` (each level's:
    :func:`dpdask.graph.resolve_passes`); a group a level's workload lacks is refused
    (:func:`check_pass_groups`)."""
    from dpdask.graph import group_rows, resolve_passes

    for lv, p in plans.items():
        names = [g for g, _rows in group_rows(p.workload)]
        check_pass_groups(spec.passes, names, f"the workload of level {lv!r}")
    resolved = resolve_passes(passes_option(spec.passes), spec.slack, plans, bool(spec.invariants))
    return {lv: [p.name for p in ps] for lv, ps in (resolved or {}).items()}
