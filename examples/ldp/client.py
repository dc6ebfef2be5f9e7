"""The client randomizer: what a person's device runs (standard library only).

One record in, one response out. The strategy file (written by
:meth:`dpdask.ldp.LocalStrategy.to_json`) holds, for every type ``u``, integer weights
``columns[u][o]`` summing exactly to ``denominator``; the device reports output ``o`` with
probability ``columns[u][o] / denominator``, drawing from the operating system's CSPRNG
(:mod:`secrets`), never from a seeded generator. Before use, a device that does not trust
the collector can check the promised ``epsilon`` itself with :func:`verify` (exact rational
arithmetic: every row's largest weight is at most ``e^epsilon`` times its smallest).

This file has no dependency beyond the standard library so that it can be copied to a
device as it is (``examples/ldp/client.py`` is a copy); what it refuses raises dpdask's
:class:`~dpdask.errors.PlanError` (the strategy file) or :class:`~dpdask.errors.DataError`
(the record), or plain :class:`ValueError` where dpdask is not installed. Run as a script::

    python client.py strategy.json TYPE [--epsilon EPS]
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from fractions import Fraction
from typing import Any

__all__ = ["load", "main", "respond", "verify"]

FORMAT = "dpdask-ldp-strategy/1"


def _errors() -> tuple[type[ValueError], type[ValueError]]:
    """dpdask's ``PlanError`` and ``DataError`` (both ``ValueError``), or ``ValueError``."""
    try:
        from dpdask.errors import DataError, PlanError
    except ImportError:  # pragma: no cover - a copy on a device without dpdask
        return ValueError, ValueError
    return PlanError, DataError


_StrategyError, _RecordError = _errors()


def load(text: str) -> dict[str, Any]:
    """Parse a strategy file and check its shape and column sums (fails closed).

    Raises
    ------
    ValueError
        If the format is unknown, a weight is not a non-negative integer, or a column does
        not sum exactly to the denominator.
    """
    doc: dict[str, Any] = json.loads(text)
    if doc.get("format") != FORMAT:
        raise _StrategyError(f"not a {FORMAT} strategy file")
    total = doc["denominator"]
    if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
        raise _StrategyError("the denominator must be a positive integer")
    cols = doc["columns"]
    if len(cols) != doc["n"] or any(len(c) != doc["m"] for c in cols):
        raise _StrategyError("columns do not match n and m")
    for u, col in enumerate(cols):
        if any(not isinstance(w, int) or isinstance(w, bool) or w < 0 for w in col):
            raise _StrategyError(f"column {u} has a weight that is not a non-negative integer")
        if sum(col) != total:
            raise _StrategyError(f"column {u} does not sum to the denominator")
    return doc


def _exp_lower(eps: Fraction) -> Fraction:
    total, term, k = Fraction(1), Fraction(1), 0
    while True:
        k += 1
        term = term * eps / k
        total += term
        if term * 2**72 < total and k > eps:
            return Fraction(math.floor(total * 2**64), 2**64)


def verify(doc: dict[str, Any], epsilon: str | int | Fraction | None = None) -> None:
    """Check exactly that the strategy is ``epsilon``-LDP (default: the file's own epsilon).

    Raises
    ------
    ValueError
        If a row's largest weight exceeds ``e^epsilon`` times its smallest.
    """
    eps = Fraction(doc["epsilon"] if epsilon is None else epsilon)
    if eps < 0:
        raise _StrategyError("epsilon must be >= 0")
    bound = _exp_lower(eps)
    cols = doc["columns"]
    for o in range(doc["m"]):
        row = [col[o] for col in cols]
        if max(row) * bound.denominator > min(row) * bound.numerator:
            raise _StrategyError(f"row {o} is not {eps}-LDP")


def respond(record: int, doc: dict[str, Any]) -> int:
    """The randomized response of one person of type ``record`` (secure randomness).

    Raises
    ------
    ValueError
        If ``record`` is not a type of the strategy.
    """
    if not isinstance(record, int) or isinstance(record, bool):
        raise _RecordError("the record is a type index (an int)")
    if not 0 <= record < doc["n"]:
        raise _RecordError(f"type {record} is not in 0..{doc['n'] - 1}")
    draw = secrets.randbelow(doc["denominator"])
    acc = 0
    for o, w in enumerate(doc["columns"][record]):
        acc += w
        if draw < acc:
            return o
    raise _StrategyError("the column does not sum to the denominator")  # load() rules this out


def main(argv: list[str] | None = None) -> int:
    """``client.py strategy.json TYPE [--epsilon EPS]``: print one response."""
    args = list(sys.argv[1:] if argv is None else argv)
    eps = None
    if "--epsilon" in args:
        i = args.index("--epsilon")
        eps = args[i + 1]
        del args[i : i + 2]
    if len(args) != 2:
        print("usage: client.py strategy.json TYPE [--epsilon EPS]", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as fh:
        doc = load(fh.read())
    verify(doc, eps)
    print(respond(int(args[1]), doc))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
