"""The ledger verbs: ``dpdask ledger init|show|verify|abandon|anchor`` (and the
administrator's ``dataset|migrate``, :mod:`dpdask.cli._ledger_admin`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dpdask.cli._common import print_result
from dpdask.cli._ledger_admin import add_admin_verbs, run_admin_verb
from dpdask.errors import ArgumentError

if TYPE_CHECKING:
    from dpdask.privacy import Head, Ledger

__all__ = ["cmd_ledger"]


def _heads(p: argparse.ArgumentParser, release_help: str, head_help: str) -> None:
    """The repeatable ``--release OUT.zarr`` and ``--head COUNT:HASH`` options."""
    p.add_argument("--release", action="append", default=[], metavar="OUT.zarr",
                   help=release_help)  # fmt: skip
    p.add_argument("--head", action="append", default=[], metavar="COUNT:HASH", help=head_help)


def cmd_ledger(argv: Sequence[str]) -> int:
    from dpdask.privacy import Ledger, LedgerTamperedError

    parser = argparse.ArgumentParser(
        prog="dpdask ledger",
        description="Create, inspect and verify a privacy ledger.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("init", help="create a new, empty ledger (never over an old one)")
    p.add_argument("path", help="the ledger file (SQLite), or postgresql://ADMIN@HOST/DB")
    p.add_argument("--operator-role", metavar="ROLE", help="on a server: the role release "
                   "jobs use, which may then only read and append")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = verbs.add_parser("show", help="spent and remaining budget per dataset and release")
    p.add_argument("path", help="the ledger file (SQLite), or postgresql://USER@HOST/DB")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = verbs.add_parser(
        "verify", help="check the hash chain, and that each release's recorded head is in it"
    )
    p.add_argument("path", help="the ledger file (SQLite), or postgresql://USER@HOST/DB")
    _heads(
        p,
        "a published release whose ledger head must be in this ledger",
        "a head copied elsewhere earlier (dpdask ledger show) to check",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = verbs.add_parser(
        "abandon", help="give up a run (its key is lost): it can never charge or publish again"
    )
    p.add_argument("path", help="the ledger file (SQLite), or postgresql://USER@HOST/DB")
    p.add_argument("release", help="the release id the run belongs to")
    p.add_argument("run_id", help="the run to abandon (dpdask ledger show lists them)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p = verbs.add_parser(
        "anchor",
        help="rewrite a lost head file from the chain, after checking that the chain holds "
        "each given release's head and each kept head; every release the ledger records "
        "as published must be given, and without a head file at least one release or head "
        "(a server keeps its own head: only the given heads are checked, nothing written)",
    )
    p.add_argument("path", help="the ledger file (SQLite), or postgresql://USER@HOST/DB")
    _heads(
        p,
        "a release published from this ledger whose head must be in the chain (give every one)",
        "a head kept elsewhere that must be in the chain",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_admin_verbs(verbs)
    args = parser.parse_args(argv)  # fmt: skip
    done = run_admin_verb(args)
    if done is not None:
        return done
    if args.verb == "init":
        ledger = Ledger.init(args.path, args.operator_role)
        made = {"ledger": str(ledger.path), "head": str(ledger.head())}
        print_result(made, args.json, lambda r: f"created ledger {r['ledger']} (head {r['head']})")
        return 0
    if args.verb == "anchor":  # the head file is lost: the chain is checked, not the head
        ledger = Ledger(args.path, check_head=False)
        heads = _given_heads(ledger, args.release, args.head)
        if ledger.head_file is None:  # a server keeps its head: check the heads, write nothing
            head = ledger.anchor(h for _, h in heads)
            print(f"nothing to anchor: the server keeps the head of {ledger.path} (head {head}), "
                  "there is no head file to rewrite" + "".join(
                      f"\n  {w}: in the ledger" for w, _ in heads))  # fmt: skip
            return 0
        _check_vouched(ledger, args.release, heads)
        anchored = {"ledger": str(ledger.path), "head": str(ledger.anchor(h for _, h in heads))}
        print_result(anchored, args.json, lambda r: f"head file rewritten: {r['head']}")
        return 0
    ledger = Ledger(args.path)  # verifies the chain and the head file
    if args.verb == "show":
        print_result(ledger.report(), args.json, _ledger_table)
    elif args.verb == "verify":
        heads = _given_heads(ledger, args.release, args.head)
        for what, head in heads:
            if not ledger.contains(head):
                raise LedgerTamperedError(
                    f"{what}: head {head} is not in {ledger.path}: the ledger was rewritten or "
                    "rolled back since"
                )
        result = {"ok": True, "ledger": str(ledger.path), "head": str(ledger.head()),
                  "checked": [w for w, _ in heads]}  # fmt: skip
        print_result(result, args.json, lambda r: f"ok: {r['ledger']} verifies (head {r['head']})"
               + "".join(f"\n  {w}: in the ledger" for w in r["checked"]))  # fmt: skip
    else:
        ledger.abandon(args.release, args.run_id)
        gone = {"ledger": str(ledger.path), "release": args.release, "run_id": args.run_id}
        print_result(gone, args.json, lambda r: f"run {r['run_id']} of {r['release']} abandoned; "
                     "what it charged stays spent")  # fmt: skip
    return 0


def _given_heads(
    ledger: Ledger, releases: Sequence[str], kept: Sequence[str]
) -> list[tuple[str, Head]]:
    """``(what, Head)`` for each ``--head`` and each ``--release``'s recorded head."""
    from dpdask.privacy import Head, LedgerTamperedError
    from dpdask.publish import release_attributes

    heads = [(f"--head {h}", Head.parse(h)) for h in kept]
    for out in releases:
        attrs = release_attributes(out)
        recorded = (attrs or {}).get("ledger") or {}
        if not recorded.get("head"):
            raise ArgumentError(f"{out} is not a dpdask release that records a ledger head")
        if recorded.get("id") != ledger.ledger_id:
            raise LedgerTamperedError(
                f"{out} was charged to another ledger (id {recorded.get('id')}), not "
                f"{ledger.path} (id {ledger.ledger_id})"
            )
        heads.append((out, Head.parse(recorded["head"])))
    return heads


def _check_vouched(ledger: Ledger, releases: Sequence[str], heads: Sequence[object]) -> None:
    """Re-anchor only with a witness outside the chain: every release the ledger records
    as published (that still holds a release of this ledger) must be given, and without
    a head file at least one release or kept head (a ledger rolled back behind its head
    file looks intact once that file is gone)."""
    import os

    from dpdask.privacy import LedgerTamperedError
    from dpdask.publish import release_attributes

    given = {os.path.realpath(r) for r in releases}
    missing = []
    for run in ledger.published_runs():
        if run.output is None:
            continue
        recorded = (release_attributes(run.output) or {}).get("ledger") or {}
        if recorded.get("id") == ledger.ledger_id and os.path.realpath(run.output) not in given:
            missing.append(run.output)
    if missing:
        raise LedgerTamperedError(
            f"{ledger.path} records releases published at {', '.join(sorted(set(missing)))}; "
            "give each with --release, so that the chain is checked against them; it is not "
            "re-anchored"
        )
    head_file = ledger.head_file  # a file ledger's: a server's returned before
    if not heads and (head_file is None or not head_file.exists()):
        raise LedgerTamperedError(
            f"nothing vouches for {ledger.path}: without its head file a ledger rolled back "
            "to an earlier state looks intact. Give every release published from it with "
            "--release (or a head kept earlier with --head); it is not re-anchored"
        )


def _ledger_table(report: dict[str, Any]) -> str:
    def show(b: dict[str, Any]) -> str:
        return ", ".join(f"{k}={v}" for k, v in b.items() if k != "type")

    lines = [f"ledger {report['ledger']}", f"head {report['head']}", ""]
    if report["datasets"]:
        lines.append(f"{'dataset':<28}{'total':>16}{'spent':>16}{'remaining':>16}")
        for d, r in report["datasets"].items():
            lines.append(
                f"{d:<28}{show(r['total']):>16}{show(r['spent']):>16}{show(r['remaining']):>16}"
            )
        lines.append("")
    lines.append(
        f"{'release':<28}{'budget':>16}{'spent':>16}{'remaining':>16}  dataset"
        "  (budgets add/remove)"
    )
    for name, r in report["releases"].items():
        lines.append(
            f"{name:<28}{show(r['budget']):>16}{show(r['spent']):>16}"
            f"{show(r['remaining']):>16}  {r['dataset']}"
        )
        for run in r["runs"]:
            where = f" -> {run['output']}" if run["output"] else ""
            lines.append(
                f"    run {run['run_id']}: {run['state']}, {run['charges']} charges, "
                f"budget stated {(run['binding'] or {}).get('neighbours', 'add-remove')}{where}"
            )
            lines.extend(_invariants_line((run["binding"] or {}).get("invariants")))
            lines.extend(_passes_line((run["binding"] or {}).get("passes")))
    return "\n".join(lines)


def _invariants_line(st: dict[str, Any] | None) -> list[str]:
    """A run's invariants (published without noise) and constraints, as its binding
    records them; nothing for a run that stated none."""
    if not st:
        return []
    exact = "; ".join(f"{lv}: {', '.join(n)}" for lv, n in st.get("invariants", {}).items())
    constraints = ", ".join(st.get("constraints", {})) or "none"
    return [f"      invariants {exact or 'none'}; constraints {constraints}"]


def _passes_line(st: dict[str, Any] | None) -> list[str]:
    """A run's passes (multi-pass top-down) as its binding records them; nothing for a
    run that stated none."""
    if not st:
        return []
    given = st["passes"]
    shown = given if isinstance(given, str) else " then ".join("+".join(p) for p in given)
    return [f"      passes {shown}; slack {st['slack']:g}"]
