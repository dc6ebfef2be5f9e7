"""``dpdask bench topdown --families N``: constrained block families, fitted and rounded.

Times, per family, the multi-pass constrained fit of a block group's blocks
(:func:`~dpdask.reconstruct.topdown.fit_family_passes`: the default two passes, total
then detail, with the blocks' constraints from their housing units and facilities) and,
for integer output, its rounding (:func:`~dpdask.reconstruct.topdown.round_constrained`),
on synthetic blocks (:func:`~dpdask.datasets.synthetic_pl94_blocks`, about
``--block-persons`` persons per block) with the Census Bureau's production strategy at
the block (:func:`~dpdask.strategy.tda2020.tda2020_strategy`, its noise at the
production budget):

* ``pl94-full``: the 2,016-cell histogram, :func:`pl94_full_constraints`;
* ``pl94``: the 252-cell histogram (the Bureau's groups without hhgq), :func:`pl94_constraints`.

Each family's parent is the block group fitted on its own from its measurements
(the Bureau's block-group noise) under its blocks' constraints summed, rounded for
the integer case: so the parent's support is a fit's, not the truth's. The level's
passes, strategy rows and Gram are prepared once (``level_setup_s``, not in the
per-family times), as :func:`~dpdask.reconstruct.topdown.passes_tree` does. Families have
``--children`` blocks (a range ``lo,hi``, uniform). The whole set of families is fitted
``--repeats`` times (median reported), and with ``--baseline`` also by the earlier
path in the same run (each interior-point system by one sparse LU, each family's Gram
its own; not undone: the implied query bounds dropped), whose estimates the new
path's are compared with (``max_abs_diff``).
Reported per case: seconds per family and per block, the ratio baseline over new,
and ``extrapolated_700k_2_workers_s`` (seconds per block times 700,000 over 2
workers: the block level alone, no data movement).
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext
from typing import Any
from unittest import mock

import numpy as np

__all__ = ["add_family_arguments", "run_families"]


def _domains(text: str) -> str:
    names = [d.strip() for d in text.split(",") if d.strip()]
    if not names or any(d not in ("pl94-full", "pl94") for d in names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected pl94-full and/or pl94")
    return ",".join(names)


def add_family_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add(
        "--families", type=int, default=0,
        help="time N constrained block-group families instead of a release (module notes)",
    )  # fmt: skip
    add("--family-domain", type=_domains, default="pl94-full,pl94",
        help="pl94-full and/or pl94 (comma list)")  # fmt: skip
    add("--children", default="10,40", help="blocks per family: lo,hi (uniform)")
    add("--block-persons", type=float, default=40.0, help="mean persons per block")
    add("--repeats", type=int, default=3, help="runs over all families (median reported)")
    add("--baseline", action=argparse.BooleanOptionalAction, default=True,
        help="also time the sparse-LU path and compare estimates")  # fmt: skip


def _strategy(domain: str, level: str) -> np.ndarray:
    from dpdask import census
    from dpdask.linalg import Identity
    from dpdask.privacy import zCDP
    from dpdask.strategy.tda2020 import tda2020_plan, tda2020_strategy

    if domain == "pl94-full":
        return np.asarray(tda2020_strategy(level)[0].dense(), dtype=float)
    plan = tda2020_plan(Identity(252), zCDP(1), level=level, domain=census.pl94_domain())
    return np.asarray(plan.strategy.dense(), dtype=float)


def _sigma(level: str) -> float:
    from dpdask.strategy.tda2020 import LEVEL_SHARES, PERSONS_RHO_ADD_REMOVE

    return float((2 * PERSONS_RHO_ADD_REMOVE * LEVEL_SHARES[level]) ** -0.5)


def _cases(args: argparse.Namespace, domain: str) -> list[dict[str, Any]]:
    """The families: measurements, constraints and both parents (fractional, integer)."""
    from dpdask.datasets import synthetic_pl94_blocks
    from dpdask.reconstruct.topdown import (
        fit_family_passes,
        pl94_constraints,
        pl94_full_constraints,
        round_constrained,
    )

    lo, hi = (int(v) for v in str(args.children).split(","))
    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(lo, hi + 1, args.families)
    total = int(sizes.sum())
    b = synthetic_pl94_blocks(total, int(args.block_persons * total), seed=args.seed)
    counts = b.counts.reshape(total, -1).astype(float)
    if domain == "pl94":
        counts = counts.reshape(total, 8, 252).sum(axis=1)
        cons = pl94_constraints(b.housing_units, b.facilities)
    else:
        cons = pl94_full_constraints(b.housing_units, b.facilities)
    A, Ab = _strategy(domain, "block"), _strategy(domain, "block_group")
    out, start = [], 0
    for K in sizes:
        rows = np.arange(start, start + int(K))
        start += int(K)
        truth, c = counts[rows], cons.take(rows)
        Y = truth @ A.T + rng.normal(0, _sigma("block"), (int(K), A.shape[0]))
        pc = c.aggregate(np.zeros(int(K), dtype=np.int64))
        Yb = truth.sum(axis=0) @ Ab.T + rng.normal(0, _sigma("block_group"), Ab.shape[0])
        frac = fit_family_passes(Ab, Yb[None], None, pc).x
        integer = round_constrained(frac, None, pc)[0].astype(float)
        out.append({"Y": Y, "c": c, "frac": frac[0], "int": integer, "K": int(K)})
    return out


def _run(cases: list[dict[str, Any]], prep: Any, integer: bool) -> list[np.ndarray]:
    from dpdask.reconstruct.topdown import round_constrained
    from dpdask.reconstruct.topdown._passes import _fit_prepared

    xs = []
    for f in cases:
        parent = f["int"] if integer else f["frac"]
        est = _fit_prepared(prep, f["Y"], parent, f["c"], "the block group")
        x = est.x
        if integer:
            x = round_constrained(x, parent.astype(np.int64), f["c"])
        xs.append(np.asarray(x, dtype=float))
    return xs


def _old_path() -> Any:
    """The earlier path: every KKT system by one sparse LU, each family's Gram computed
    from the strategy."""
    from contextlib import ExitStack

    from dpdask.reconstruct.topdown import _qp

    stack = ExitStack()
    stack.enter_context(mock.patch.object(_qp, "_block_factor", lambda *a: None))
    return stack


def _without_gram(prep: Any) -> Any:
    """The level's preparation without its shared Gram (each family computes its own)."""
    import dataclasses

    return dataclasses.replace(prep, passes=[(*p[:5], None) for p in prep.passes])


def run_families(args: argparse.Namespace) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits

    from dpdask.reconstruct.topdown._passes import _prepare

    result: dict[str, Any] = {"families": args.families, "children": args.children,
                              "block_persons": args.block_persons, "repeats": args.repeats,
                              "cases": []}  # fmt: skip
    with threadpool_limits(1):  # one core per worker, as a release's tasks
        for domain in [d.strip() for d in str(args.family_domain).split(",") if d.strip()]:
            cases = _cases(args, domain)
            t0 = time.perf_counter()
            prep = _prepare(_strategy(domain, "block"), None, None)  # once per level
            prep_s = time.perf_counter() - t0
            blocks = sum(f["K"] for f in cases)
            for integer in (False, True):
                row: dict[str, Any] = {"domain": domain, "integer": integer, "blocks": blocks,
                                       "level_setup_s": prep_s}  # fmt: skip
                paths = ["new", "baseline"] if args.baseline else ["new"]
                got: dict[str, list[np.ndarray]] = {}
                for name in paths:
                    runs = []
                    for _ in range(max(1, args.repeats)):
                        t0 = time.perf_counter()
                        with nullcontext() if name == "new" else _old_path():
                            level = prep if name == "new" else _without_gram(prep)
                            got[name] = _run(cases, level, integer)
                        runs.append(time.perf_counter() - t0)
                    med = statistics.median(runs)
                    row[f"{name}_s"] = med
                    row[f"{name}_runs"] = runs
                    row[f"{name}_s_per_family"] = med / len(cases)
                    row[f"{name}_s_per_block"] = med / blocks
                    row[f"{name}_extrapolated_700k_2_workers_s"] = med / blocks * 700_000 / 2
                if "baseline" in got:
                    row["baseline_over_new"] = row["baseline_s"] / row["new_s"]
                    row["max_abs_diff"] = max(
                        float(np.abs(a - b).max(initial=0.0))
                        for a, b in zip(got["new"], got["baseline"], strict=True)
                    )
                result["cases"].append(row)
    return result
