"""Local-model specs: plan a collection (write the devices' strategy), then aggregate it.

A local spec is a YAML mapping with ``model: local``; ``dpdask plan`` / ``dpdask run``
dispatch such a spec here (:func:`plan_spec`, :func:`run_spec`; also
``python -m dpdask.ldp.local_spec plan|run SPEC``). Example (``examples/ldp/spec.yaml``)::

    model: local
    release: survey-prefix
    domain: {age: 8}                   # or n: 8
    workload: prefix                   # or {name: marginals, k: 1}
    privacy: {epsilon: 1}              # pure DP only: each person is epsilon-LDP
    strategy: {seed: 0, starts: 1}     # options of dpdask.ldp.optimize
    strategy_file: strategy.json       # written by plan, read by run and by the devices
    responses: responses.parquet       # columns response, geography (Parquet or CSV)
    reconstruct: ls                    # or wnnls (appendix A)
    output: estimates.csv              # one row per geography: x_hat, or W x for answers

Relative paths are relative to the spec file. The spec is read as every spec is
(:mod:`dpdask.specs`: strict YAML, the one id rule for ``release``, the one budget
parser); unknown keys and bad values are :class:`~dpdask.errors.SpecError` naming the
field.

Both files a local spec writes go through the release path's output check
(:func:`dpdask.publish.check_output`): never the responses, the spec, a ledger or any
other file that is not an earlier dpdask artefact, never through a symbolic link, and
an earlier artefact only with ``overwrite`` (``--overwrite``), replaced atomically once
the new file is complete. An earlier ``strategy_file`` is recognised by its own format
(it begins ``{"format":"dpdask-ldp-strategy/``); an earlier ``output`` (CSV or Parquet)
by its sidecar ``<output>.dpdask.json``, which holds the SHA-256 of the file dpdask wrote
(:func:`dpdask.publish.publish_file`). The local model keeps no ledger (each device
randomises its own answer), so it has no run id and no periods.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
from typing import Any

import numpy as np
import pandas as pd

from dpdask.errors import SpecError
from dpdask.ldp.aggregate import aggregate
from dpdask.ldp.local_plan import LdpPlan, select_local
from dpdask.ldp.strategy import FORMAT, LocalStrategy
from dpdask.linalg import LinearQuery
from dpdask.privacy import PureDP
from dpdask.specs import check_id, check_keys, parse_budget, read_spec

__all__ = [
    "SPEC_KEYS",
    "load_spec",
    "main",
    "output_of",
    "plan_spec",
    "run_spec",
    "validate_spec",
]

SPEC_KEYS = (
    "model",
    "release",
    "domain",
    "n",
    "workload",
    "privacy",
    "strategy",
    "strategy_file",
    "responses",
    "response_column",
    "geography_column",
    "reconstruct",
    "output",
    "alpha",
)
_RECONSTRUCT = ("ls", "wnnls")
_STRATEGY_PREFIX = ('{"format":"' + FORMAT.split("/")[0] + "/").encode()


def load_spec(path: str | os.PathLike[str]) -> tuple[dict[str, Any], pathlib.Path]:
    """Read and check a local spec; returns it and its folder.

    Raises
    ------
    SpecError
        If it is not ``model: local``, has an unknown key, lacks a required one or has
        a bad value (the message names the field).
    """
    p = pathlib.Path(path)
    doc = read_spec(p)
    if not isinstance(doc, dict) or doc.get("model") != "local":
        raise SpecError(f"{p}: not a local spec (model: local)")
    check_keys(doc, SPEC_KEYS, "spec")
    for key in ("workload", "privacy", "strategy_file"):
        if doc.get(key) is None:
            raise SpecError(f"spec: missing required field {key!r}")
    if "release" in doc:
        check_id(doc["release"], "release")
    for key in ("strategy_file", "responses", "output"):
        if key in doc and (not isinstance(doc[key], str) or not doc[key]):
            raise SpecError(f"{key}: expected a path, got {doc[key]!r}")
    for key in ("response_column", "geography_column"):
        value = doc.get(key, key.split("_")[0])
        if key == "geography_column" and value is None:
            continue  # no geography: one total
        if not isinstance(value, str) or (key == "response_column" and not value):
            raise SpecError(f"{key}: expected a column name, got {value!r}")
    if doc.get("reconstruct", "ls") not in _RECONSTRUCT:
        raise SpecError(f"reconstruct: ls or wnnls, got {doc['reconstruct']!r}")
    alpha = doc.get("alpha", 0.01)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise SpecError(f"alpha: a number strictly between 0 and 1, got {alpha!r}")
    if not isinstance(doc.get("strategy", {}), dict):
        raise SpecError(
            f"strategy: a mapping of dpdask.ldp.optimize options, got {doc['strategy']!r}"
        )
    _privacy(doc)
    _workload(doc)
    return doc, p.parent


def _workload(doc: dict[str, Any]) -> LinearQuery:
    from dpdask.domain import Domain
    from dpdask.workloads.named import named

    w = doc["workload"]
    if isinstance(w, dict):
        if not isinstance(w.get("name"), str):
            raise SpecError(f"workload.name: a workload name is required, got {w!r}")
        name, opts = w["name"], {k: v for k, v in w.items() if k != "name"}
    elif isinstance(w, str):
        name, opts = w, {}
    else:
        raise SpecError(f"workload: a name or {{name: ..., options}}, got {w!r}")
    if "domain" in doc and not isinstance(doc["domain"], dict):
        raise SpecError(f"domain: expected a mapping of attribute sizes, got {doc['domain']!r}")
    try:
        domain = Domain(**doc["domain"]) if "domain" in doc else None
    except (TypeError, ValueError) as exc:
        raise SpecError(f"domain: {exc}") from None
    if "n" in doc:
        n = doc["n"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SpecError(f"n: a positive integer, got {n!r}")
        opts.setdefault("n", n)
    try:
        return named(name, domain, **opts)
    except (TypeError, ValueError, KeyError) as exc:
        raise SpecError(f"workload: {exc}") from None


def _privacy(doc: dict[str, Any]) -> PureDP:
    budget = parse_budget(doc["privacy"], "privacy", ("epsilon",))  # pure DP: epsilon-LDP
    if not isinstance(budget, PureDP):  # pragma: no cover - only epsilon is allowed
        raise SpecError("privacy: the local model takes exactly {epsilon: ...} (pure DP)")
    return budget


def _path(base: pathlib.Path, p: str) -> pathlib.Path:
    q = pathlib.Path(os.path.expanduser(p))
    return q if q.is_absolute() else base / q


def output_of(doc: dict[str, Any], base: pathlib.Path) -> pathlib.Path:
    """Where ``run`` writes (unchecked: :func:`run_spec` checks it).

    Raises
    ------
    SpecError
        If the spec names no ``output``.
    """
    if "output" not in doc:
        raise SpecError("output: run needs 'responses' and 'output'")
    return _path(base, doc["output"])


def _is_strategy_file(path: pathlib.Path) -> bool:
    """Whether ``path`` is a strategy file dpdask wrote (it names its format first)."""
    if not path.is_file() or path.is_symlink():
        return False
    try:
        with path.open("rb") as f:
            return f.read(len(_STRATEGY_PREFIX)) == _STRATEGY_PREFIX
    except OSError:
        return False


def _strategy_target(
    doc: dict[str, Any], base: pathlib.Path, path: str | os.PathLike[str], overwrite: bool
) -> tuple[pathlib.Path, list[tuple[str, pathlib.Path]]]:
    """The checked ``strategy_file`` path: never an input, the spec or the output."""
    from dpdask.publish import check_output

    protected = [("release spec", pathlib.Path(path))]
    protected += [(k, _path(base, doc[k])) for k in ("responses", "output") if k in doc]
    target = check_output(_path(base, doc["strategy_file"]), overwrite, protected,
                          artefact=_is_strategy_file)  # fmt: skip
    return target, protected


def plan_spec(path: str | os.PathLike[str], *, overwrite: bool = False) -> LdpPlan:
    """Optimise the strategy of a local spec and write its ``strategy_file``.

    The strategy file is checked before the optimisation (module notes): an earlier
    strategy file is replaced only with ``overwrite``, atomically.

    Raises
    ------
    SpecError
        For a bad spec (or strategy options ``dpdask.ldp.optimize`` does not take).
    dpdask.publish.UnsafeOutputError, dpdask.publish.StoreExistsError
        For a ``strategy_file`` that is not safe to write.
    """
    from dpdask.publish import publish_file

    doc, base = load_spec(path)
    target, protected = _strategy_target(doc, base, path, overwrite)
    try:
        plan = select_local(
            _workload(doc), _privacy(doc), alpha=float(doc.get("alpha", 0.01)),
            **doc.get("strategy", {}),
        )  # fmt: skip
    except TypeError as exc:
        raise SpecError(f"strategy: {exc}") from None
    publish_file(target, plan.save_strategy, overwrite, protected=protected,
                 artefact=_is_strategy_file)  # fmt: skip
    return plan


def _columns(responses: pathlib.Path, doc: dict[str, Any]) -> tuple[str, str | None]:
    """The response and geography columns, checked to exist in the responses."""
    from dpdask.ldp.aggregate import read_responses

    response = doc.get("response_column", "response")
    geography = doc.get("geography_column", "geography") or None
    try:
        have = list(read_responses(str(responses)).columns)
    except (OSError, ValueError) as exc:
        raise SpecError(f"responses: {responses} cannot be read: {exc}") from None
    for field, col in (("response_column", response), ("geography_column", geography)):
        if col is not None and col not in have:
            raise SpecError(
                f"{field}: no column {col!r} in {responses.name} (it has {have}); name the "
                f"column with {field}:"
                + (" or write geography_column: '' for one total" if field[0] == "g" else "")
            )
    return response, geography


def _run_inputs(
    doc: dict[str, Any], base: pathlib.Path, path: Any, overwrite: bool
) -> tuple[Any, ...]:
    """What a run reads, checked: the workload, the strategy (keeping the spec's epsilon
    and fitting the workload), the method, the responses and their columns, and the
    output path (checked as every release's output is)."""
    from dpdask.publish import check_output

    for key in ("responses", "output"):
        if key not in doc:
            raise SpecError(f"{key}: run needs 'responses' and 'output'")
    W = _workload(doc)
    eps = _privacy(doc).epsilon
    sfile = _path(base, doc["strategy_file"])
    if not sfile.is_file():
        raise SpecError(f"strategy_file: {sfile} does not exist (run `dpdask plan` first)")
    try:
        S = LocalStrategy.from_json(sfile.read_text())
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"strategy_file: {sfile} is not a strategy file: {exc}") from None
    if S.epsilon > eps:
        raise SpecError(f"strategy_file: the strategy is {S.epsilon}-LDP, the spec allows {eps}")
    if S.Q.shape[1] != W.shape[1]:
        raise SpecError(
            f"strategy_file: the strategy is for {S.Q.shape[1]} types; the workload has "
            f"{W.shape[1]}"
        )
    responses = _path(base, doc["responses"])
    if not responses.exists():
        raise SpecError(f"responses: {responses} does not exist")
    protected = [
        ("responses", responses),
        ("strategy file", sfile),
        ("release spec", pathlib.Path(path)),
    ]
    target = check_output(_path(base, doc["output"]), overwrite, protected)
    columns = _columns(responses, doc)
    return W, S, doc.get("reconstruct", "ls"), responses, target, protected, columns


def validate_spec(path: str | os.PathLike[str], *, overwrite: bool = False) -> dict[str, Any]:
    """Check a local spec, its strategy file, its output and every response as ``run``
    would; write nothing.

    Raises
    ------
    SpecError
        On any problem ``run`` would raise for (a bad spec, a strategy file that does not
        keep the spec's epsilon or fit its workload, a missing column).
    DataError
        A missing or out-of-range response.
    dpdask.publish.UnsafeOutputError, dpdask.publish.StoreExistsError
        An output ``run`` would refuse.
    """
    from dpdask.ldp.aggregate import count_responses

    doc, base = load_spec(path)
    _, S, method, responses, target, _, (response, geography) = _run_inputs(
        doc, base, path, overwrite
    )
    geos, counts = count_responses(str(responses), S.Q.shape[0], response=response,
                                   geography=geography)  # fmt: skip
    return {
        "ok": True,
        "release": doc.get("release"),
        "output": str(target),
        "geographies": len(geos),
        "people": int(counts.sum()),
        "reconstruct": method,
        "epsilon": str(S.epsilon),
    }


def run_spec(path: str | os.PathLike[str], *, overwrite: bool = False) -> dict[str, Any]:
    """Aggregate the responses of a local spec with its strategy file; write ``output``
    (with its sidecar, atomically; module notes).

    Raises
    ------
    SpecError
        If the spec or its strategy file is bad (the strategy does not keep the spec's
        epsilon), or a column is missing.
    DataError
        If responses are invalid.
    dpdask.publish.UnsafeOutputError, dpdask.publish.StoreExistsError
        If the output is not safe to write (before anything is read).
    """
    from dpdask.publish import publish_file

    doc, base = load_spec(path)
    W, S, method, responses, target, protected, (response, geography) = _run_inputs(
        doc, base, path, overwrite
    )
    est = aggregate(str(responses), S, W, response=response, geography=geography,
                    wnnls=method == "wnnls")  # fmt: skip
    answers = est.answers(nonnegative=method == "wnnls")
    out = pd.DataFrame(answers, columns=[f"q{i}" for i in range(answers.shape[1])])
    out.insert(0, "people", est.people)
    out.insert(0, "geography", est.geographies)

    def write(tmp: pathlib.Path) -> None:
        if target.name.endswith(".csv"):
            out.to_csv(tmp, index=False)
        else:
            out.to_parquet(tmp, index=False)

    record = {
        "kind": "local-estimates",
        "release": doc.get("release"),
        "created": datetime.datetime.now(datetime.UTC).isoformat(),
        "epsilon": str(S.epsilon),
        "reconstruct": method,
    }
    publish_file(target, write, overwrite, record, protected=protected)
    return {
        "release": doc.get("release"),
        "output": str(target),
        "geographies": len(est.geographies),
        "people": int(est.people.sum()),
        "reconstruct": method,
        "worst_variance_per_person": S.worst_variance(W),
        "expected_error_worst_case": float(np.sum(est.people) * S.worst_variance(W)),
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m dpdask.ldp.local_spec plan|run SPEC [--json] [--overwrite]``."""
    ap = argparse.ArgumentParser(prog="dpdask.ldp.local_spec")
    ap.add_argument("command", choices=["plan", "run"])
    ap.add_argument("spec")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--overwrite", action="store_true", help="replace an earlier dpdask file")
    args = ap.parse_args(argv)
    if args.command == "plan":
        plan = plan_spec(args.spec, overwrite=args.overwrite)
        print(json.dumps(plan.summary(as_dict=True)) if args.json else plan.summary())
    else:
        out = run_spec(args.spec, overwrite=args.overwrite)
        print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
