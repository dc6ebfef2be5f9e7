"""``dpdask plan``: select a strategy for a named workload and print the plan.

Interim form, until release specs name their workloads::

    dpdask plan --workload NAME (--epsilon E | --rho R) [--strategy S] [--json]

Workloads: ``prefix`` and ``allrange`` (``--n``), ``marginals`` (``--sizes``,
``--k``), ``sf1`` (Census SF1 persons on the CPH domain), ``pl94``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from dpdask.domain import Domain
from dpdask.linalg import LinearQuery

__all__ = ["WORKLOADS", "build_workload", "plan_command"]

WORKLOADS = ("prefix", "allrange", "marginals", "sf1", "pl94")


def build_workload(name: str, args: argparse.Namespace) -> tuple[LinearQuery, Domain | None]:
    """The workload and domain named on the command line."""
    from dpdask.workloads.named import default_domain, named

    if name == "marginals":
        sizes = [int(s) for s in args.sizes.split(",")]
        domain = Domain({f"a{chr(97 + i)}": s for i, s in enumerate(sizes)})
        return named(name, domain, k=args.k), domain
    if name in ("prefix", "allrange"):
        return named(name, n=args.n), None
    domain = default_domain(name)
    return named(name, domain), domain


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dpdask plan", description="Select a strategy and print the release plan."
    )
    p.add_argument("--workload", required=True, choices=WORKLOADS, help="named workload")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--epsilon", help="pure DP budget (Laplace noise)")
    budget.add_argument("--rho", help="zCDP budget (Gaussian noise)")
    p.add_argument("--strategy", default="hdmm", help="hdmm (default) or a baseline name")
    p.add_argument("--n", type=int, default=256, help="domain size of prefix / allrange")
    p.add_argument("--sizes", default="75,16,5,2,20", help="attribute sizes for marginals")
    p.add_argument("--k", type=int, default=3, help="marginal order for marginals")
    p.add_argument("--restarts", type=int, default=3, help="random starts per template")
    p.add_argument("--seed", type=int, default=0, help="seed of the random starts")
    p.add_argument("--save", metavar="PATH", help="also write the plan to PATH (.npz)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def plan_command(argv: Sequence[str]) -> int:
    """Entry point of ``dpdask plan``."""
    from dpdask.privacy import PureDP, zCDP
    from dpdask.strategy.select import select

    args = _parser().parse_args(list(argv))
    privacy = PureDP(args.epsilon) if args.epsilon is not None else zCDP(args.rho)
    W, domain = build_workload(args.workload, args)
    plan = select(W, privacy, args.strategy, domain=domain, restarts=args.restarts, seed=args.seed)
    if args.save:
        plan.save(args.save)
    if args.json:
        print(json.dumps(plan.summary(as_dict=True)))
    else:
        print(plan.summary())
    return 0
