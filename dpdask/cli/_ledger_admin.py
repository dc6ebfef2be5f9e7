"""The administrator's ledger verbs: ``dpdask ledger dataset|migrate`` (and ``init
--operator-role``), for a shared ledger on a PostgreSQL server (they work on a SQLite
ledger too, where there are no roles)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from dpdask.errors import ArgumentError

if TYPE_CHECKING:
    from dpdask.privacy import Budget

__all__ = ["add_admin_verbs", "run_admin_verb"]


def add_admin_verbs(verbs: Any) -> None:
    """Add ``dataset`` and ``migrate`` to the ``dpdask ledger`` sub-parsers."""
    p = verbs.add_parser(
        "dataset",
        help="register a dataset with its lifetime budget (the administrator, once); its "
        "releases may then charge it, and its first release records its source",
    )
    p.add_argument("path", help="the ledger (a SQLite file or postgresql://ADMIN@HOST/DB)")
    p.add_argument("dataset", help="the dataset id (a spec's data.id)")
    form = p.add_mutually_exclusive_group(required=True)
    form.add_argument("--zcdp", "--rho", dest="zcdp", metavar="RHO", help="a zCDP budget")
    form.add_argument("--epsilon", metavar="EPS", help="pure DP (with --delta: approximate)")
    p.add_argument("--delta", metavar="DELTA", help="with --epsilon: (epsilon, delta)-DP")
    p = verbs.add_parser(
        "migrate",
        help="copy a verified SQLite ledger into a new ledger on a PostgreSQL server, "
        "keeping its chain (and the heads its releases recorded) verifiable",
    )
    p.add_argument("path", help="the SQLite ledger file (with its head file)")
    p.add_argument("--to", required=True, metavar="URL",
                   help="postgresql://ADMIN@HOST/DB, as the database's administrator")  # fmt: skip
    p.add_argument("--operator-role", metavar="ROLE",
                   help="the role release jobs use: it may only read and append")  # fmt: skip


def run_admin_verb(args: argparse.Namespace) -> int | None:
    """Run ``dataset`` or ``migrate``; ``None`` for the other verbs."""
    from dpdask.privacy import Ledger

    if args.verb == "dataset":
        from dpdask.privacy import ApproxDP, PureDP, as_fraction, zCDP

        if args.delta is not None and args.epsilon is None:
            raise ArgumentError("dpdask ledger dataset: --delta goes with --epsilon")
        if args.zcdp is not None:
            total: Budget = zCDP(args.zcdp)
        elif args.delta is None or as_fraction(args.delta, "--delta") == 0:
            total = PureDP(args.epsilon)
        else:
            total = ApproxDP(args.epsilon, args.delta)
        ledger = Ledger(args.path)
        ledger.set_dataset_total(args.dataset, total)
        print(f"dataset {args.dataset} registered on {ledger.path}: lifetime {total!r}")
        return 0
    if args.verb == "migrate":
        from dpdask.privacy import migrate_ledger

        head = migrate_ledger(args.path, args.to, args.operator_role)
        print(f"copied {args.path} to {Ledger(args.to).path} (head {head}); it verifies there. "
              "Point the specs' ledger: at the server and retire the file.")  # fmt: skip
        return 0
    return None
