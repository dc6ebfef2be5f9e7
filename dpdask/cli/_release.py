"""The release verbs: ``dpdask run``, ``dpdask validate`` and ``dpdask plan``.

Every verb takes one path: :func:`model_of` reads the spec strictly and finds its model
in :data:`MODELS` (counts, ``model: local``, ``model: sums``), :meth:`Model.check`
refuses every option the model does not honour for that verb, and the model's verb
runs. The count model's verbs live here; the others in :mod:`dpdask.cli._models`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from dpdask.cli._common import QUIET, log, print_result, spec_parser
from dpdask.cli._models import LOCAL, SUMS, Model, Result, lines
from dpdask.errors import SpecError

if TYPE_CHECKING:
    from dpdask.strategy import Plan

__all__ = ["MODELS", "cmd_plan", "cmd_run", "cmd_validate", "model_of"]


def cmd_run(argv: Sequence[str]) -> int:
    parser = spec_parser("run", "Run a release: select, measure, reconstruct, publish.")
    parser.add_argument(
        "--run-id",
        help="name the run; the same id resumes an interrupted run (same key and noise, no new "
        "charge); a published or abandoned id is refused (count and sum releases)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier dpdask release at the output, once the new one is complete",
    )
    parser.add_argument(
        "--scheduler", help="scheduler address (over the spec's cluster and env; count releases)"
    )
    parser.add_argument(
        "--no-progress", action="store_true",
        help="no progress on standard error (a bar on a terminal, else a line per step and "
        "tenth of it)",
    )  # fmt: skip
    parser.add_argument("--dashboard-address", help="the started cluster's dashboard (127.0.0.1)")
    args = parser.parse_args(argv)
    return _dispatch("run", args)


def _counts_run(args: argparse.Namespace) -> Result:
    from dpdask.pipeline.cluster import connect
    from dpdask.pipeline.run import check_input, run_spec
    from dpdask.pipeline.spec import load_spec

    spec = load_spec(args.spec, period=args.period)
    check_input(spec)  # before a cluster starts
    with connect(spec.cluster, scheduler=args.scheduler,
                 dashboard_address=args.dashboard_address) as client:  # fmt: skip
        summary = run_spec(
            spec, client=client, run_id=args.run_id, overwrite=args.overwrite,
            progress=not (args.no_progress or QUIET[0]),  # on standard error
            on_start=lambda rid, link: log.warning(
                "run %s: run id %s, dashboard at %s (resume an interrupted run with "
                "--run-id %s)", spec.release, rid, link, rid),
        )  # fmt: skip
    return summary, _release_table


def cmd_validate(argv: Sequence[str]) -> int:
    parser = spec_parser("validate", "Check a spec and its data; spends no budget.")
    parser.add_argument("--run-id", help="check that this run id may be run (or resumed)")
    parser.add_argument("--overwrite", action="store_true", help="as dpdask run --overwrite")
    args = parser.parse_args(argv)
    return _dispatch("validate", args)


def _counts_validate(args: argparse.Namespace) -> Result:
    from dpdask.pipeline.run import validate_spec
    from dpdask.pipeline.spec import load_spec

    spec = load_spec(args.spec, period=args.period)
    return validate_spec(spec, run_id=args.run_id, overwrite=args.overwrite), lines


def cmd_plan(argv: Sequence[str]) -> int:
    from dpdask.workloads.named import WORKLOAD_ALIASES, WORKLOAD_NAMES

    parser = spec_parser(
        "plan",
        "Select the strategy and show the expected error before any data is read: per "
        "level for a release spec, or for a named workload (--workload, without a spec).",
    )
    parser.set_defaults(spec=None)
    parser._actions[1].nargs = "?"  # the spec is optional when --workload is given
    parser.add_argument("--save", metavar="PATH", help="also write the plan to PATH (.npz)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier file dpdask wrote: a local-model spec's strategy_file, or "
        "the plan file of --save",
    )
    parser.add_argument(
        "--compare", choices=("tda-2020",),
        help="beside each level's query groups, the Census Bureau's 2020 strategy at its "
        "production shares of the same budget (a pl94-full spec of the Bureau's levels)",
    )  # fmt: skip
    parser.add_argument(
        "--fanout", metavar="N|LEVEL=N,...",
        help="mean units per unit of the level above, for the reconstructed figures (default: "
        "the spec's geography where known without reading counts: synthetic data, a store, or "
        "a P.L. 94-171 file's geographic header)",
    )  # fmt: skip
    named = parser.add_argument_group("a named workload instead of a spec")
    named.add_argument(
        "--workload", choices=(*WORKLOAD_NAMES, *WORKLOAD_ALIASES), help="the workload's name"
    )
    named.add_argument("--domain", help="pl94, cph, or sizes like sex=2,age=115")
    budget = named.add_mutually_exclusive_group()
    budget.add_argument("--epsilon", help="pure DP budget (Laplace noise)")
    budget.add_argument("--rho", help="zCDP budget (Gaussian noise)")
    named.add_argument("--strategy", default="hdmm", help="hdmm (default) or a baseline name")
    named.add_argument("--n", type=int, help="domain size of prefix and allrange")
    named.add_argument("--k", type=int, help="marginal order of marginals")
    named.add_argument("--attrs", help="attributes of marginal, comma-separated")
    named.add_argument("--restarts", type=int, default=3, help="random starts per template")
    named.add_argument("--seed", type=int, default=0, help="seed of the random starts")
    args = parser.parse_args(argv)
    if (args.spec is None) == (args.workload is None):
        parser.error("give a release spec or --workload NAME (not both)")
    if args.spec is not None:
        return _dispatch("plan", args)
    if args.compare is not None or args.fanout is not None:
        parser.error("--compare and --fanout need a release spec")
    plan = _plan_workload(args, parser)
    if args.save:
        _save_plan(plan, args.save, args.overwrite)
    summary: Any = plan.summary(as_dict=True)  # a dict (its type says str | dict)
    print_result(summary, args.json, lambda r: str(plan.summary()))
    return 0


def _counts_plan(args: argparse.Namespace) -> Result:
    from dpdask.cli._plan_groups import add_groups, check_compare, groups_tables, parse_fanout
    from dpdask.pipeline.run import plan_spec_levels
    from dpdask.pipeline.spec import load_spec

    spec = load_spec(args.spec, period=args.period)
    if args.compare is not None:  # before anything is planned or written
        check_compare(spec, args.compare)
    fanout = None if args.fanout is None else parse_fanout(args.fanout, spec.levels or ())
    plan, report, level_plans = plan_spec_levels(spec)
    per_level = plan if isinstance(plan, dict) else None
    add_groups(report, spec, level_plans, args.compare, fanout)  # all figures, then --save
    if args.save:
        from dpdask.privacy import ledger_files

        protected = [
            ("input data", spec.data.path),
            *ledger_files(spec.ledger),
            ("release spec", pathlib.Path(args.spec)),
            ("output", spec.output),
        ]
        if per_level is None:
            _save_plan(plan, args.save, args.overwrite, protected)
        else:  # one file per level: PATH-<level>.npz
            base = pathlib.Path(args.save)
            for lv, p in per_level.items():
                path = base.with_name(f"{base.stem}-{lv}{base.suffix or '.npz'}")
                _save_plan(p, path, args.overwrite, protected)
    first = plan if per_level is None else next(iter(per_level.values()))
    return report, lambda r: "\n\n".join(
        t for t in (first.summary(), _levels_table(r), groups_tables(r)) if t
    )


def _is_plan_file(path: pathlib.Path) -> bool:
    """Whether ``path`` holds a plan dpdask saved (it names its format)."""
    from dpdask.strategy import Plan

    try:
        Plan.load(path)
    except Exception:  # anything unreadable as a plan is not dpdask's to replace
        return False
    return True


def _save_plan(
    plan: Any,
    path: str | os.PathLike[str],
    overwrite: bool,
    protected: Iterable[tuple[str, str | os.PathLike[str] | None]] = (),
) -> None:
    """``--save``: through the one output check (never an input, the ledger, the spec
    or a link; an existing file only with ``--overwrite`` and only a plan dpdask saved),
    written atomically."""
    from dpdask.publish import check_output, publish_file

    target = check_output(path, overwrite, protected, artefact=_is_plan_file)
    publish_file(target, plan.save, overwrite, protected=protected, artefact=_is_plan_file)


#: the registry of models: a spec's ``model:`` (absent: counts) -> its verbs and options
MODELS: dict[str | None, Model] = {
    None: Model(
        "count release",
        run=_counts_run,
        validate=_counts_validate,
        plan=_counts_plan,
        honours={
            "run": frozenset({"run_id", "period", "overwrite", "scheduler"}),
            "validate": frozenset({"run_id", "period", "overwrite"}),
            "plan": frozenset({"period", "save", "overwrite", "compare", "fanout"}),
        },
    ),
    "local": LOCAL,
    "sums": SUMS,
}


def model_of(path: str) -> Model:
    """The :class:`Model` of the spec at ``path``, read strictly
    (:func:`dpdask.specs.read_spec`: an alias bomb fails here, at its first anchor).

    Raises
    ------
    FileNotFoundError
        If there is no spec at ``path``.
    SpecError
        If the file is not strict YAML or names an unknown model.
    """
    from dpdask.specs import read_spec, spec_model

    name = spec_model(read_spec(path))
    if name not in MODELS:
        known = ", ".join(str(k) for k in MODELS if k is not None)
        raise SpecError(f"model: {name!r} is not one of {known} (or absent: a count release)")
    return MODELS[name]


def _dispatch(verb: str, args: argparse.Namespace) -> int:
    """The one path of every verb: the spec's model, its options checked, its verb."""
    model = model_of(args.spec)
    model.check(verb, args)
    if verb == "validate":  # the shipped schema first, as an editor or CI would lint it
        from dpdask.specs import check_schema, read_spec

        check_schema(read_spec(args.spec))
    result, render = getattr(model, verb)(args)
    print_result(result, args.json, render)
    return 0


def _plan_workload(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Plan:
    """``dpdask plan --workload NAME``: the plan of a named workload (no spec, no data)."""
    from dpdask.domain import Domain
    from dpdask.pipeline.spec import SpecError, parse_domain
    from dpdask.privacy import PureDP, zCDP
    from dpdask.strategy import select
    from dpdask.workloads.named import canonical_name, default_domain, named

    args.workload = canonical_name(args.workload)
    if args.epsilon is None and args.rho is None:
        parser.error("--workload needs a budget: --epsilon E or --rho R")
    privacy = PureDP(args.epsilon) if args.epsilon is not None else zCDP(args.rho)
    domain = default_domain(args.workload)
    if args.domain is not None:
        text = args.domain
        if text not in ("pl94", "cph"):
            try:
                text = {k: int(v) for k, v in (p.split("=") for p in args.domain.split(","))}
            except ValueError:
                parser.error(f"--domain {args.domain!r}: use pl94, cph or sizes like sex=2,age=5")
        try:
            domain = parse_domain(text)
        except SpecError as exc:
            parser.error(f"--domain: {exc}")
    options = {}
    if args.n is not None:
        options["n"] = args.n
    if args.k is not None:
        options["k"] = args.k
    if args.attrs is not None:
        options["attrs"] = args.attrs.split(",")
    if domain is None and args.workload in ("prefix", "allrange") and args.n is None:
        parser.error(f"--workload {args.workload} needs --n (or --domain)")
    if domain is None and args.workload not in ("prefix", "allrange"):
        parser.error(f"--workload {args.workload} needs --domain")
    W = named(args.workload, domain, **options)
    if domain is None:
        domain = Domain(x=W.shape[1])
    return select(W, privacy, args.strategy, domain=domain, restarts=args.restarts,
                  seed=args.seed)  # fmt: skip


def _levels_table(report: dict[str, Any]) -> str:
    """Per level: the budget, the nominal noise scale of the plan's calibration and the
    scale the measure step will draw (``nominal`` when the data's dtype is unknown)."""
    lines = [*_relations_lines(report), *_invariants_lines(report), *_passes_lines(report)]
    lines.append(
        f"{'level':<14}{'add-remove budget':>22}{'nominal':>12}{'drawn':>12}"
        f"{'rmse/query':>14}{'max sd':>10}"
    )
    for lv in report["levels"]:
        budget = ", ".join(f"{k}={v}" for k, v in lv["budget"].items() if k != "type")
        workload = f"  {lv['workload']}" if "workload" in lv else ""
        nominal = lv.get("nominal_noise_scale", lv["noise_scale"])
        drawn = f"{lv['noise_scale']:>12.4g}" if lv.get("noise") == "drawn" else f"{'nominal':>12}"
        lines.append(
            f"{lv['level']:<14}{budget:>22}{nominal:>12.4g}{drawn}"
            f"{lv['rmse_per_query']:>14.4g}{lv['max_query_stddev']:>10.4g}{workload}"
        )
    lines.append(
        "noise: the scale per measured row; 'drawn' is what the measure step samples (on "
        "its lattice), and the errors are of that noise"
    )
    return "\n".join([*lines, *_spine_lines(report)])


def _spine_lines(report: dict[str, Any]) -> list[str]:
    """Per level, the units reusing their parent's estimate and where a budget moved."""
    lines = [f"spine: {report['spine']}"] if isinstance(report.get("spine"), str) else []
    for lv in report["levels"]:
        s = lv.get("spine")
        if s is None:
            continue
        moved = [f"budget moved to {s['budget_moved_to']}"] if not s["measured"] else []
        if s["budget_received_from"]:
            moved.append(f"budget of {', '.join(s['budget_received_from'])} received")
        parts = ["measured" if s["measured"] else "not measured", *moved]
        lines.append(
            f"spine: {lv['level']}: {s['units_reusing_parent']} units reuse their parent's "
            f"estimate ({s['share_reusing_parent']:.0%}); {'; '.join(parts)}"
        )
    return lines


def _invariants_lines(report: dict[str, Any]) -> list[str]:
    """The counts published without noise, and the constraints the estimates keep."""
    st = report.get("invariants")
    if not st:
        return []
    exact = "; ".join(f"{lv}: {', '.join(n)}" for lv, n in st["invariants"].items()) or "none"
    shown = []
    for name, value in st["constraints"].items():
        if name == "cells":
            shown += [
                f"cells[{i}] {c['level']} "
                + " ".join(f"{a}={codes}" for a, codes in c["mask"].items())
                + f" in [{c.get('lower', 0)}, {c.get('upper', 'inf')}]"
                for i, c in enumerate(value)
            ]
        else:
            opts = (
                ", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else ""
            )
            shown.append(f"{name} ({opts})" if opts else name)
    levels = report.get("levels") or [{}]
    top, lattice = levels[0].get("level"), any(lv.get("noise") == "drawn" for lv in levels)
    bound = (
        [f"lattice: the run sizes it for the published {top} total (max_total, not the "
         "default bound), so the noise it draws is at most the 'drawn' figures below"]
        if lattice and "total" in st["invariants"].get(top, ()) else []
    )  # fmt: skip
    return [
        f"published exactly (invariants, no noise, at their level and above): {exact}",
        f"constraints: {'; '.join(shown) or 'none'}",
        f"public unit attributes read: {', '.join(st['attributes']) or 'none'}",
        *bound,
        "",
    ]


def _passes_lines(report: dict[str, Any]) -> list[str]:
    """The multi-pass top-down's passes: as the spec states them, and each level's."""
    st = report.get("passes")
    if not st:
        return []
    given = st["passes"]
    shown = given if isinstance(given, str) else " then ".join("+".join(p) for p in given)
    return [
        f"passes (multi-pass top-down, slack {st['slack']:g}): {shown}",
        *(f"  {lv}: {' -> '.join(names)}" for lv, names in st["levels"].items()),
        "",
    ]


def _relations_lines(report: dict[str, Any]) -> list[str]:
    """The total budget in both neighbour relations (the same noise), the spec's marked."""
    if "budgets" not in report:
        return []

    def show(b: dict[str, str] | None) -> str:
        if b is None:
            return "no exact conversion"
        return ", ".join(f"{k}={v} ({float(Fraction(v)):.6g})" for k, v in b.items() if k != "type")

    lines = []
    for name, b in report["budgets"].items():
        mark = "  <- the spec's relation" if name == report.get("neighbours") else ""
        charged = ", charged" if name == "add-remove" else ""
        lines.append(f"budget ({name}{charged}): {show(b)}{mark}")
    return [*lines, ""]


def _release_table(summary: dict[str, Any]) -> str:
    lines = [
        f"published {summary['release']} (run {summary['run_id']}) to {summary['output']}",
        f"ledger: {summary['ledger']}",
        f"{'level':<14}{'units':>8}{'chunks':>8}{'noise':>12}{'rmse/query':>14}",
    ]
    expected = {e["level"]: e for e in summary.get("expected", [])}
    for lv in summary["levels"]:
        e = expected.get(lv["level"], {})
        lines.append(
            f"{lv['level']:<14}{lv['units']:>8}{lv['chunks']:>8}{lv['noise_scale']:>12.4g}"
            f"{e.get('rmse_per_query', float('nan')):>14.4g}"
        )
    bad = summary.get("not_converged") or []
    if bad:
        lines.append(f"WARNING: {len(bad)} chunk(s) did not converge ({summary['reconstruct']}):")
        lines.extend(f"  {r['level']} chunk {r['chunk']}: {r}" for r in bad)
    return "\n".join(lines)
