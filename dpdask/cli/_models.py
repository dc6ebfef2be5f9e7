"""The release models ``dpdask run / validate / plan`` dispatch to, and what they honour.

A spec's ``model:`` names its model (absent: a release of counts; the registry is
``dpdask.cli._release.MODELS``, with the count model beside its verbs). Each :class:`Model`
gives the three verbs as callables taking the parsed arguments and returning the
result and how to print it, and says which options each verb honours. An option a
model does not honour is refused with one line naming it (never accepted and
ignored): the local model keeps no ledger, so it has no run id and no periods; sum
releases have no periods and run without a cluster; only count releases read
``--save`` and ``--scheduler``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dpdask.errors import SpecError

__all__ = ["LOCAL", "OPTIONS", "SUMS", "Model", "Result", "lines"]

Result = tuple[dict[str, Any], Callable[[dict[str, Any]], str]]

#: every option a verb may be given, with its default (given: not the default)
OPTIONS = {
    "run_id": ("--run-id", None),
    "period": ("--period", None),
    "overwrite": ("--overwrite", False),
    "scheduler": ("--scheduler", None),
    "save": ("--save", None),
    "compare": ("--compare", None),
    "fanout": ("--fanout", None),
}


def lines(report: dict[str, Any]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in report.items())


def _indented(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)


@dataclass(frozen=True)
class Model:
    """A kind of release: its verbs and the options each honours.

    ``why`` says, per option (``run_id``, ``period``, ...), why the model does not
    honour it, for the one-line refusal.
    """

    name: str
    run: Callable[[argparse.Namespace], Result]
    validate: Callable[[argparse.Namespace], Result]
    plan: Callable[[argparse.Namespace], Result]
    honours: dict[str, frozenset[str]] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)

    def check(self, verb: str, args: argparse.Namespace) -> None:
        """Refuse every option given to ``verb`` that this model does not honour."""
        for dest, (flag, default) in OPTIONS.items():
            given = getattr(args, dest, default) not in (default, None)
            if given and dest not in self.honours.get(verb, frozenset()):
                raise SpecError(
                    f"{flag}: not used by `dpdask {verb}` of a {self.name} spec"
                    + (f": {self.why[dest]}" if dest in self.why else "")
                )
        if getattr(args, "run_id", None) is not None:  # an empty id is refused, not replaced
            from dpdask.privacy import check_run_id

            check_run_id(args.run_id)


# -- local model (ldp) ------------------------------------------------------------------------
def _local_run(args: argparse.Namespace) -> Result:
    from dpdask.ldp.local_spec import load_spec, output_of, run_spec
    from dpdask.publish import claim_output

    doc, base = load_spec(args.spec)
    with claim_output(output_of(doc, base)):  # as every release: one writer at a time
        return run_spec(args.spec, overwrite=args.overwrite), _indented


def _local_validate(args: argparse.Namespace) -> Result:
    from dpdask.ldp.local_spec import validate_spec

    return validate_spec(args.spec, overwrite=args.overwrite), lines


def _local_plan(args: argparse.Namespace) -> Result:
    from dpdask.ldp.local_spec import plan_spec

    plan = plan_spec(args.spec, overwrite=args.overwrite)  # writes the devices' strategy file
    summary: Any = plan.summary(as_dict=True)  # a dict (its type says str | dict)
    return summary, lambda r: str(plan.summary())


# -- sums -------------------------------------------------------------------------------------
def _sums_run(args: argparse.Namespace) -> Result:
    from dpdask.sums.sum_release import run_spec

    return run_spec(args.spec, overwrite=args.overwrite, run_id=args.run_id), _indented


def _sums_validate(args: argparse.Namespace) -> Result:
    from dpdask.sums.sum_plan import validate_spec

    return validate_spec(args.spec, run_id=args.run_id, overwrite=args.overwrite), lines


def _sums_plan(args: argparse.Namespace) -> Result:
    from dpdask.sums.sum_plan import format_plan, plan_spec

    return plan_spec(args.spec), format_plan


LOCAL = Model(
    "local-model (model: local)",
    _local_run,
    _local_validate,
    _local_plan,
    honours={
        "run": frozenset({"overwrite"}),
        "validate": frozenset({"overwrite"}),
        "plan": frozenset({"overwrite"}),
    },
    why={
        "run_id": "the local model keeps no ledger, so there is no run to name or resume",
        "period": "local specs have no {period} releases",
        "scheduler": "local responses are aggregated in this process",
        "save": "its plan is the strategy_file the spec names",
    },
)

SUMS = Model(
    "sum (model: sums)",
    _sums_run,
    _sums_validate,
    _sums_plan,
    honours={
        "run": frozenset({"run_id", "overwrite"}),
        "validate": frozenset({"run_id", "overwrite"}),
    },
    why={
        "period": "sum specs have no {period} releases",
        "scheduler": "sum releases run in this process, without a cluster",
        "save": "a sum plan depends on the threshold drawn at run time; it is not saved",
        "overwrite": "plan writes nothing",
        "run_id": "plan charges nothing and names no run",
    },
)
