"""What the ``dpdask`` verbs share: the spec parser, printing."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["QUIET", "log", "print_result", "spec_parser"]

log = logging.getLogger("dpdask")

#: ``[True]`` once ``-q/--quiet`` was given (no progress bar)
QUIET = [False]


def spec_parser(verb: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"dpdask {verb}", description=description)
    parser.add_argument("spec", help="the YAML release spec (see pipelines/)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--period",
        help="for a scheduled count spec (release: name-{period}): the period this run "
        "releases, e.g. 2026-11 (default: today's UTC date); refused for other specs",
    )
    return parser


def print_result(
    result: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]
) -> None:
    """Print ``result`` as one JSON object (with ``"ok": true`` unless it says otherwise)
    or as ``render`` writes it."""
    if as_json:
        print(json.dumps({"ok": True, **result}, default=str))
    else:
        print(render(result))
