"""Benchmarks and end-to-end checks: ``dpdask bench``, ``dpdask audit``, ``dpdask faults``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from dpdask.cli._common import print_result, spec_parser

__all__ = ["BENCH_GROUP", "benches", "cmd_audit", "cmd_bench", "cmd_faults", "format_report"]

#: The entry-point group benchmarks register under (the ``dpdask-benchmarks``
#: distribution in ``benchmarks/`` registers every ``dpdask bench NAME``).
BENCH_GROUP = "dpdask.benchmarks"


def benches() -> dict[str, Any]:
    """The installed benchmarks, ``{name: entry point}``: each loads a module with
    ``add_arguments(parser)`` and ``run(args) -> dict`` (JSON-safe figures)."""
    return {ep.name: ep for ep in entry_points(group=BENCH_GROUP)}


def cmd_bench(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="dpdask bench",
        description="Run a benchmark; `dpdask bench NAME --help` lists its options.",
    )
    found = benches()
    if not found:
        from dpdask.errors import ArgumentError

        raise ArgumentError(
            "no benchmark is installed: they ship apart from the package, install them "
            "from a checkout with `pip install -e benchmarks`"
        )
    parser.add_argument("name", choices=sorted(found), help="which benchmark")
    if not argv or argv[0] not in found:
        parser.parse_args(argv)  # prints the usage (or the error) and exits
    name = argv[0]
    module = found[name].load()
    doc = (module.__doc__ or "").strip().splitlines()
    sub = argparse.ArgumentParser(prog=f"dpdask bench {name}", description=doc[0] if doc else None)
    sub.add_argument("--json", action="store_true", help="print one JSON object")
    module.add_arguments(sub)
    args = sub.parse_args(argv[1:])
    result = module.run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print(format_report(name, result))
    return 0


def cmd_audit(argv: Sequence[str]) -> int:
    from dpdask.pipeline.spec import load_spec
    from dpdask.testing.audit import audit_spec

    parser = spec_parser(
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
    print_result(result.to_dict(), args.json, lambda r: result.report())
    return 1 if result.flagged else 0


def cmd_faults(argv: Sequence[str]) -> int:
    from dpdask.testing.fault_injection import format_summary, run_trials

    parser = spec_parser(
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
    print_result(summary, args.json, format_summary)
    return 1 if summary["failures"] else 0


def format_report(name: str, result: dict[str, Any]) -> str:
    """A readable rendering of a benchmark's result dictionary."""
    lines = [f"dpdask bench {name}"]
    for key, value in result.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            cols = list(value[0])
            rows = [[_fmt(r.get(c)) for c in cols] for r in value]
            widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
            lines.append(f"\n{key}:")
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
            for r in rows:
                lines.append("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
        else:
            lines.append(f"{key}: {_fmt(value)}")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
