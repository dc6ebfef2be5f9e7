"""The ``dpdask`` command line: plan, run, validate and benchmark releases."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import pathlib
import sys
from collections.abc import Sequence

from dpdask import __version__
from dpdask.bench import BENCHES

__all__ = ["main"]

log = logging.getLogger("dpdask")


def _bench(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dpdask bench",
        description="Run a benchmark; `dpdask bench NAME --help` lists its options.",
    )
    parser.add_argument("name", choices=sorted(BENCHES), help="which benchmark")
    if not argv or argv[0] not in BENCHES:
        parser.parse_args(argv)  # prints the usage (or the error) and exits
    name = argv[0]
    module = importlib.import_module(BENCHES[name])
    doc = (module.__doc__ or "").strip().splitlines()
    sub = argparse.ArgumentParser(prog=f"dpdask bench {name}", description=doc[0] if doc else None)
    sub.add_argument("--json", action="store_true", help="print one JSON object")
    module.add_arguments(sub)
    args = sub.parse_args(argv[1:])
    result = module.run(args)
    if args.json:
        print(json.dumps(result))
    else:
        from dpdask.bench._common import format_report

        print(format_report(name, result))
    return 0


def _spec_model(path: str) -> str | None:
    """The ``model:`` a YAML spec names (``local``: :mod:`dpdask.ldp.spec`; ``sums``:
    :mod:`dpdask.sums.spec`), or ``None`` for a release spec of counts."""
    import yaml

    try:
        doc = yaml.safe_load(pathlib.Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None  # the central spec reader reports the problem
    return doc.get("model") if isinstance(doc, dict) else None


def _spec_parser(verb: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"dpdask {verb}", description=description)
    parser.add_argument("spec", help="the YAML release spec (see pipelines/)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--period",
        help="for a scheduled spec (release: name-{period}): the period this run releases, "
        "e.g. 2026-11 (default: today's UTC date)",
    )
    return parser


def _run(argv: Sequence[str]) -> int:
    from dpdask.pipeline.cluster import connect
    from dpdask.pipeline.run import run_spec
    from dpdask.pipeline.spec import load_spec

    parser = _spec_parser("run", "Run a release: select, measure, reconstruct, publish.")
    parser.add_argument(
        "--run-id",
        help="name the run; the same id resumes an interrupted run (same key and noise, no new "
        "charge); a published or abandoned id is refused",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier dpdask release at the output, once the new one is complete",
    )
    parser.add_argument("--scheduler", help="scheduler address (over the spec's cluster and env)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    model = _spec_model(args.spec)
    if model == "local":  # aggregate people's randomised responses
        from dpdask.ldp.spec import run_spec as run_local

        _print(run_local(args.spec), args.json, lambda r: json.dumps(r, indent=2))
        return 0
    if model == "sums":  # sums of a numeric attribute per geography
        from dpdask.sums.spec import run_spec as run_sums

        summary = run_sums(args.spec, overwrite=args.overwrite, run_id=args.run_id)
        _print(summary, args.json, lambda r: json.dumps(r, indent=2))
        return 0
    spec = load_spec(args.spec, period=args.period)
    with connect(spec.cluster, scheduler=args.scheduler) as client:
        log.warning("run %s: dashboard at %s", spec.release, client.dashboard_link)
        summary = run_spec(
            spec, client=client, run_id=args.run_id, overwrite=args.overwrite,
            progress=not (args.no_progress or args.json or _QUIET[0]),
        )  # fmt: skip
    _print(summary, args.json, _release_table)
    return 0


def _faults(argv: Sequence[str]) -> int:
    from dpdask.testing.fault_injection import format_summary, run_trials

    parser = _spec_parser(
        "faults",
        "Kill workers and the client at random points of a release, resume it, and check "
        "that it publishes bit for bit what an uninterrupted run publishes, charged once "
        "per measurement. Every trial has its own output and ledger; the spec's are never "
        "touched.",
    )
    parser.add_argument("--trials", type=int, default=20, help="how many trials (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the faults (default 0)")
    parser.add_argument(
        "--reconstruct",
        help="another estimator for the trials (admm-l1, slower, widens the kill window)",
    )
    parser.add_argument(
        "--workdir", help="keep the trials' folders here (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    summary = run_trials(
        args.spec, trials=args.trials, seed=args.seed, workdir=args.workdir,
        reconstruct=args.reconstruct, period=args.period,
    )  # fmt: skip
    _print(summary, args.json, format_summary)
    return 1 if summary["failures"] else 0


def _export(argv: Sequence[str]) -> int:
    from dpdask.publish.reader import export_release

    parser = argparse.ArgumentParser(
        prog="dpdask export",
        description="Write one level of a published release as a long table: geography, "
        "parent, query, answer, variance and moe90 (the 90% margin of error, 1.645 standard "
        "deviations, as ACS publishes them).",
    )
    parser.add_argument("release", help="the published release (a .zarr folder)")
    parser.add_argument("--level", required=True, help="the geography level, e.g. tract")
    parser.add_argument("--format", choices=("parquet", "csv"), default="parquet")
    parser.add_argument(
        "--out", help="the file to write ('-': csv to standard output; default "
        "RELEASE-LEVEL.FORMAT beside the release)",
    )  # fmt: skip
    parser.add_argument(
        "--query", nargs="+", action="extend", metavar="LABEL",
        help="only these queries: workload rows (race-single_003) or P.L. 94-171 cells (P1_001)",
    )  # fmt: skip
    parser.add_argument(
        "--geography", nargs="+", action="extend", metavar="ID", help="only these unit ids"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    release = args.release.rstrip("/")
    out = args.out or str(pathlib.Path(release).with_suffix("")) + f"-{args.level}.{args.format}"
    n = export_release(
        release, args.level, out, args.format, queries=args.query,
        geographies=args.geography, overwrite=args.overwrite,
    )  # fmt: skip
    if out != "-":
        print(f"wrote {n} rows of {args.level} to {out}")
    return 0


def _validate(argv: Sequence[str]) -> int:
    from dpdask.pipeline.run import validate_spec
    from dpdask.pipeline.spec import load_spec

    parser = _spec_parser("validate", "Check a spec and its data; spends no budget.")
    parser.add_argument("--run-id", help="check that this run id may be run (or resumed)")
    parser.add_argument("--overwrite", action="store_true", help="as dpdask run --overwrite")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec, period=args.period)
    report = validate_spec(spec, run_id=args.run_id, overwrite=args.overwrite)
    _print(report, args.json, lambda r: "\n".join(f"{k}: {v}" for k, v in r.items()))
    return 0


def _plan(argv: Sequence[str]) -> int:
    from dpdask.workloads.named import WORKLOAD_ALIASES, WORKLOAD_NAMES

    parser = _spec_parser(
        "plan",
        "Select the strategy and show the expected error before any data is read: per "
        "level for a release spec, or for a named workload (--workload, without a spec).",
    )
    parser.set_defaults(spec=None)
    parser._actions[1].nargs = "?"  # the spec is optional when --workload is given
    parser.add_argument("--save", metavar="PATH", help="also write the plan to PATH (.npz)")
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
    if args.spec is not None and _spec_model(args.spec) == "local":
        from dpdask.ldp.spec import plan_spec as plan_local

        plan = plan_local(args.spec)  # writes the devices' strategy file
        _print(plan.summary(as_dict=True), args.json, lambda r: plan.summary())
        return 0
    if args.spec is not None:
        from dpdask.pipeline.run import plan_spec
        from dpdask.pipeline.spec import load_spec

        plan, report = plan_spec(load_spec(args.spec, period=args.period))
        if args.save:
            plan.save(args.save)
        _print(report, args.json, lambda r: plan.summary() + "\n\n" + _levels_table(r))
        return 0
    plan = _plan_workload(args, parser)
    if args.save:
        plan.save(args.save)
    _print(plan.summary(as_dict=True), args.json, lambda r: plan.summary())
    return 0


def _plan_workload(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """``dpdask plan --workload NAME``: the plan of a named workload (no spec, no data)."""
    from dpdask.domain import Domain
    from dpdask.pipeline.spec import SpecError, _domain
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
            domain = _domain(text)
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


def _ledger(argv: Sequence[str]) -> int:
    from dpdask.privacy import Head, Ledger, LedgerTamperedError
    from dpdask.publish import release_attributes

    parser = argparse.ArgumentParser(
        prog="dpdask ledger",
        description="Create, inspect and verify a privacy ledger.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("init", help="create a new, empty ledger (never over an old one)")
    p.add_argument("path")
    p = verbs.add_parser("show", help="spent and remaining budget per dataset and release")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = verbs.add_parser(
        "verify", help="check the hash chain, and that each release's recorded head is in it"
    )
    p.add_argument("path")
    p.add_argument(
        "--release",
        action="append",
        default=[],
        metavar="OUT.zarr",
        help="a published release whose ledger head must be in this ledger",
    )
    p.add_argument(
        "--head",
        action="append",
        default=[],
        metavar="COUNT:HASH",
        help="a head copied elsewhere earlier (dpdask ledger show) to check",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = verbs.add_parser(
        "abandon", help="give up a run (its key is lost): it can never charge or publish again"
    )
    p.add_argument("path")
    p.add_argument("release")
    p.add_argument("run_id")
    p = verbs.add_parser(
        "anchor", help="rewrite the head file from the chain, once you have checked the chain"
    )
    p.add_argument("path")
    args = parser.parse_args(argv)  # fmt: skip
    if args.verb == "init":
        ledger = Ledger.init(args.path)
        print(f"created ledger {ledger.path} (head {ledger.head()})")
        return 0
    ledger = Ledger(args.path)  # verifies the chain and the head file
    if args.verb == "show":
        _print(ledger.report(), args.json, _ledger_table)
    elif args.verb == "verify":
        heads = [(f"--head {h}", Head.parse(h)) for h in args.head]
        for out in args.release:
            attrs = release_attributes(out)
            recorded = (attrs or {}).get("ledger") or {}
            if not recorded.get("head"):
                raise ValueError(f"{out} is not a dpdask release that records a ledger head")
            if recorded.get("id") != ledger.ledger_id:
                raise LedgerTamperedError(
                    f"{out} was charged to another ledger (id {recorded.get('id')}), not "
                    f"{ledger.path} (id {ledger.ledger_id})"
                )
            heads.append((out, Head.parse(recorded["head"])))
        for what, head in heads:
            if not ledger.contains(head):
                raise LedgerTamperedError(
                    f"{what}: head {head} is not in {ledger.path}: the ledger was rewritten or "
                    "rolled back since"
                )
        result = {"ok": True, "ledger": str(ledger.path), "head": str(ledger.head()),
                  "checked": [w for w, _ in heads]}  # fmt: skip
        _print(result, args.json, lambda r: f"ok: {r['ledger']} verifies (head {r['head']})"
               + "".join(f"\n  {w}: in the ledger" for w in r["checked"]))  # fmt: skip
    elif args.verb == "abandon":
        ledger.abandon(args.release, args.run_id)
        print(f"run {args.run_id} of {args.release} abandoned; what it charged stays spent")
    else:
        print(f"head file rewritten: {ledger.anchor()}")
    return 0


def _audit(argv: Sequence[str]) -> int:
    from dpdask.pipeline.spec import load_spec
    from dpdask.testing.audit import audit_spec

    parser = _spec_parser(
        "audit",
        "Audit a release end to end: run it many times on neighbouring datasets (and a "
        "control with half the noise) and bound its epsilon from below. Charges only "
        "temporary ledgers; writes nothing to the spec's output.",
    )
    parser.add_argument("--trials", type=int, default=1000, help="trials per dataset")
    parser.add_argument("--batch", type=int, default=500, help="trials per dataset per release")
    parser.add_argument("--blocks", type=int, default=2, help="finest units per trial")
    parser.add_argument("--delta", type=float, help="compare a zCDP claim at this delta")
    parser.add_argument("--workdir", help="folder for the temporary releases")
    args = parser.parse_args(argv)
    result = audit_spec(
        load_spec(args.spec), trials=args.trials, batch=args.batch, blocks=args.blocks,
        delta=args.delta, workdir=args.workdir,
    )  # fmt: skip
    _print(result.to_dict(), args.json, lambda r: result.report())
    return 1 if result.flagged else 0


def _report(argv: Sequence[str]) -> int:
    from dpdask.report import default_output, write_report

    parser = argparse.ArgumentParser(
        prog="dpdask report",
        description="Write a release's report: one self-contained HTML page (plan, budget "
        "and ledger, predicted error per table and level, realised error against a truth, "
        "plots), viewable offline.",
    )
    parser.add_argument("release", help="the published release (OUT.zarr)")
    parser.add_argument(
        "--out", metavar="FILE.html", help="the page to write (default: OUT.report.html beside it)"
    )
    parser.add_argument(
        "--truth",
        metavar="STORE",
        help="a dpdask data store of the true counts per finest geography (same domain and "
        "levels): adds the realised errors",
    )
    parser.add_argument("--ledger", help="the ledger file, if it moved since the release")
    args = parser.parse_args(argv)
    out = write_report(
        args.release, args.out or default_output(args.release), truth=args.truth,
        ledger=args.ledger,
    )  # fmt: skip
    print(f"wrote {out}")
    return 0


def _ledger_table(report: dict) -> str:
    def show(b: dict) -> str:
        return ", ".join(f"{k}={v}" for k, v in b.items() if k != "type")

    lines = [f"ledger {report['ledger']}", f"head {report['head']}", ""]
    if report["datasets"]:
        lines.append(f"{'dataset':<28}{'total':>16}{'spent':>16}{'remaining':>16}")
        for d, r in report["datasets"].items():
            lines.append(
                f"{d:<28}{show(r['total']):>16}{show(r['spent']):>16}{show(r['remaining']):>16}"
            )
        lines.append("")
    lines.append(f"{'release':<28}{'budget':>16}{'spent':>16}{'remaining':>16}  dataset")
    for name, r in report["releases"].items():
        lines.append(
            f"{name:<28}{show(r['budget']):>16}{show(r['spent']):>16}"
            f"{show(r['remaining']):>16}  {r['dataset']}"
        )
        for run in r["runs"]:
            where = f" -> {run['output']}" if run["output"] else ""
            lines.append(
                f"    run {run['run_id']}: {run['state']}, {run['charges']} charges{where}"
            )
    return "\n".join(lines)


def _levels_table(report: dict) -> str:
    lines = [f"{'level':<14}{'budget':>22}{'noise':>12}{'rmse/query':>14}{'max sd':>10}"]
    for lv in report["levels"]:
        budget = ", ".join(f"{k}={v}" for k, v in lv["budget"].items() if k != "type")
        lines.append(
            f"{lv['level']:<14}{budget:>22}{lv['noise_scale']:>12.4g}"
            f"{lv['rmse_per_query']:>14.4g}{lv['max_query_stddev']:>10.4g}"
        )
    return "\n".join(lines)


def _release_table(summary: dict) -> str:
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


def _print(result: dict, as_json: bool, render) -> None:
    print(json.dumps(result, default=str) if as_json else render(result))


COMMANDS = {
    "bench": (_bench, "run a benchmark: dpdask bench NAME [--json] [options]"),
    "run": (_run, "run a release spec: dpdask run SPEC [--run-id ID] [--json]"),
    "ledger": (_ledger, "the privacy ledger: dpdask ledger init|show|verify|abandon|anchor PATH"),
    "export": (
        _export,
        "write a level of a release as a table: dpdask export OUT.zarr --level LEVEL "
        "--format parquet|csv [--out FILE] [--query LABEL ...] [--geography ID ...]",
    ),
    "report": (
        _report,
        "write a release's HTML report: dpdask report OUT.zarr [--out FILE.html] [--truth STORE]",
    ),
    "validate": (_validate, "check a spec and its data, spending nothing: dpdask validate SPEC"),
    "audit": (_audit, "bound a release's epsilon from below: dpdask audit SPEC --trials N"),
    "faults": (_faults, "kill workers and the client mid-release, then check: dpdask faults SPEC"),
    "plan": (
        lambda a: _plan(a),
        "plan a release before touching data: dpdask plan SPEC [--json] "
        "(or --workload NAME --epsilon E | --rho R)",
    ),
}


_QUIET = [False]


def _verbosity(argv: list[str]) -> tuple[list[str], int]:
    """Take ``-q/--quiet`` and ``-v/--verbose`` from anywhere in ``argv``."""
    quiet = sum(a in ("-q", "--quiet") for a in argv)
    verbose = sum(a in ("-v", "--verbose") for a in argv)
    rest = [a for a in argv if a not in ("-q", "--quiet", "-v", "--verbose")]
    level = logging.ERROR if quiet else logging.DEBUG if verbose > 1 else (
        logging.INFO if verbose else logging.WARNING
    )  # fmt: skip
    _QUIET[0] = bool(quiet)
    return rest, level


def _logging(level: int) -> None:
    """Messages go to standard error through :mod:`logging` (``dpdask``'s and Dask's)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False
    # Dask's own warnings with -v, its chatter with -vv, its errors always
    dask_level = {logging.INFO: logging.WARNING, logging.DEBUG: logging.INFO}
    logging.getLogger("distributed").setLevel(dask_level.get(level, logging.ERROR))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpdask`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="dpdask",
        description="Differentially private release of linear counting queries on Dask.",
        epilog="\n".join(f"  {k:<10} {v[1]}" for k, v in COMMANDS.items())
        + "\n\n-q/--quiet (errors only) and -v/--verbose (more, twice for Dask's own) go "
        "anywhere on the line.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpdask {__version__}")
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to do")
    if not argv or argv[0] in ("-h", "--help", "--version"):
        parser.parse_args(argv)
        return 0
    argv, level = _verbosity(argv)
    _logging(level)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        parser.parse_args([command])  # prints the error and exits 2
    try:
        return COMMANDS[command][0](rest)
    except (ValueError, FileNotFoundError, PermissionError, MemoryError, TypeError) as exc:
        print(f"dpdask {command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
