"""The verbs that read a published release: ``dpdask export`` and ``dpdask report``."""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence

from dpdask.cli._common import print_result

__all__ = ["cmd_export", "cmd_report"]


def cmd_export(argv: Sequence[str]) -> int:
    from dpdask.publish.reader import export_release

    parser = argparse.ArgumentParser(
        prog="dpdask export",
        description="Write one level of a published release as a long table: geography, "
        "parent, query, label (what the query counts), answer, variance and moe90 (the 90% "
        "margin of error, 1.645 standard deviations, as ACS publishes them) of the estimator "
        "the provenance's uncertainty_of names (for top-down, NNLS or ADMM releases least "
        "squares, not the published answer: see the release's simulated_rmse). Parquet keeps "
        "the provenance (release, run id, budget, dpdask version, ledger head) in its "
        "key-value metadata; CSV in OUT.csv-metadata.json beside it (CSV on the Web).",
    )
    parser.add_argument("release", help="the published release (a .zarr folder)")
    parser.add_argument("--level", required=True, help="the geography level, e.g. tract")
    parser.add_argument(
        "--format", choices=("parquet", "csv"), default="parquet",
        help="the table's file format (default parquet)",
    )  # fmt: skip
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
    parser.add_argument(
        "--ids", choices=("level", "plain"), default="level",
        help="how CSV writes geography and parent ids: LEVEL:ID (default; never read as "
        "numbers, so pandas.read_csv keeps leading zeros) or plain (read with dtype=str)",
    )  # fmt: skip
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    parser.add_argument(
        "--json", action="store_true",
        help="print one JSON object: the rows written and where, or the error",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.json and args.out == "-":
        parser.error("--json prints the result on standard output: give --out FILE")
    release = args.release.rstrip("/")
    out = args.out or str(pathlib.Path(release).with_suffix("")) + f"-{args.level}.{args.format}"
    n = export_release(
        release, args.level, out, args.format, queries=args.query,
        geographies=args.geography, overwrite=args.overwrite, ids=args.ids,
    )  # fmt: skip
    if out != "-":
        result = {"rows": n, "level": args.level, "out": out, "format": args.format}
        print_result(result, args.json, lambda r: f"wrote {n} rows of {args.level} to {out}")
    return 0


def cmd_report(argv: Sequence[str]) -> int:
    from dpdask.report import default_output, workload_spec, write_report

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
    parser.add_argument(
        "--workload", metavar="NAME",
        help="the workload whose tables to compare with the truth: a named workload (pl94, "
        "ri2010, sf1-persons, identity, marginals, ...) or one with options as a spec "
        "writes it, '{name: marginals, k: 2}'; default: the release's, recognised; another "
        "workload on the release's domain is answered from the published estimates",
    )  # fmt: skip
    parser.add_argument("--ledger", help="the ledger file, if it moved since the release")
    args = parser.parse_args(argv)
    workload = None if args.workload is None else workload_spec(args.workload)
    out = write_report(
        args.release, args.out or default_output(args.release), truth=args.truth,
        ledger=args.ledger, workload=workload,
    )  # fmt: skip
    print(f"wrote {out}")
    return 0
