"""The ``dpdask`` command line: plan, run, validate and benchmark releases."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from dpdask import __version__
from dpdask.bench import BENCHES

__all__ = ["main"]


def _bench(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="dpdask bench", description="Run a benchmark.")
    parser.add_argument("name", choices=sorted(BENCHES), help="which benchmark")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    known, rest = parser.parse_known_args(argv)
    module = importlib.import_module(BENCHES[known.name])
    sub = argparse.ArgumentParser(prog=f"dpdask bench {known.name}")
    module.add_arguments(sub)
    args = sub.parse_args(rest)
    result = module.run(args)
    if known.json:
        print(json.dumps(result))
    else:
        from dpdask.bench._common import format_report

        print(format_report(known.name, result))
    return 0


COMMANDS = {
    "bench": (_bench, "run a benchmark: dpdask bench NAME [--json] [options]"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpdask`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="dpdask",
        description="Differentially private release of linear counting queries on Dask.",
        epilog="\n".join(f"  {k:<10} {v[1]}" for k, v in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpdask {__version__}")
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to do")
    if not argv or argv[0] in ("-h", "--help", "--version"):
        parser.parse_args(argv)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        parser.parse_args([command])  # prints the error and exits 2
    try:
        return COMMANDS[command][0](rest)
    except (ValueError, FileNotFoundError, MemoryError) as exc:
        print(f"dpdask {command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
