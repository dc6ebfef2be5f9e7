"""Local-model specs: plan a collection (write the devices' strategy), then aggregate it.

A local spec is a YAML mapping with ``model: local``; ``dpdask plan`` / ``dpdask run``
dispatch such a spec here (:func:`plan_spec`, :func:`run_spec`; also
``python -m dpdask.ldp.spec plan|run SPEC``). Example (``examples/ldp/spec.yaml``)::

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

Relative paths are relative to the spec file. Unknown keys are errors.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from dpdask.ldp.aggregate import aggregate
from dpdask.ldp.plan import LdpPlan, select_local
from dpdask.ldp.strategy import LocalStrategy
from dpdask.privacy import PureDP

__all__ = ["SPEC_KEYS", "load_spec", "main", "plan_spec", "run_spec", "validate_spec"]

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


def load_spec(path: str | os.PathLike) -> tuple[dict[str, Any], pathlib.Path]:
    """Read and check a local spec; returns it and its folder.

    Raises
    ------
    ValueError
        If it is not ``model: local``, has an unknown key or lacks a required one.
    """
    import yaml

    p = pathlib.Path(path)
    doc = yaml.safe_load(p.read_text())
    if not isinstance(doc, dict) or doc.get("model") != "local":
        raise ValueError(f"{p}: not a local spec (model: local)")
    unknown = sorted(set(doc) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"{p}: unknown key(s) {unknown}; allowed: {', '.join(SPEC_KEYS)}")
    for key in ("workload", "privacy", "strategy_file"):
        if key not in doc:
            raise ValueError(f"{p}: missing {key!r}")
    return doc, p.parent


def _workload(doc: dict[str, Any]):
    from dpdask.domain import Domain
    from dpdask.workloads.named import named

    w = doc["workload"]
    name, opts = (
        (w, {}) if isinstance(w, str) else (w["name"], {k: v for k, v in w.items() if k != "name"})
    )
    domain = Domain(**doc["domain"]) if "domain" in doc else None
    if "n" in doc:
        opts.setdefault("n", int(doc["n"]))
    return named(name, domain, **opts)


def _privacy(doc: dict[str, Any]) -> PureDP:
    priv = doc["privacy"]
    if not isinstance(priv, dict) or set(priv) != {"epsilon"}:
        raise ValueError("privacy: the local model takes exactly {epsilon: ...} (pure DP)")
    return PureDP(Fraction(str(priv["epsilon"])))


def _path(base: pathlib.Path, p: str) -> pathlib.Path:
    q = pathlib.Path(p)
    return q if q.is_absolute() else base / q


def plan_spec(path: str | os.PathLike) -> LdpPlan:
    """Optimise the strategy of a local spec and write its ``strategy_file``."""
    doc, base = load_spec(path)
    plan = select_local(
        _workload(doc),
        _privacy(doc),
        alpha=float(doc.get("alpha", 0.01)),
        **doc.get("strategy", {}),
    )
    plan.save_strategy(_path(base, doc["strategy_file"]))
    return plan


def _run_inputs(doc: dict[str, Any], base: pathlib.Path, path: Any) -> tuple[Any, ...]:
    """What a run reads, checked: the workload, the strategy (keeping the spec's epsilon
    and fitting the workload), the method, the responses and a safe output path."""
    if "responses" not in doc or "output" not in doc:
        raise ValueError("run needs 'responses' and 'output'")
    W = _workload(doc)
    eps = _privacy(doc).epsilon
    sfile = _path(base, doc["strategy_file"])
    if not sfile.exists():
        raise ValueError(f"strategy_file: {sfile} does not exist (run `dpdask plan` first)")
    S = LocalStrategy.from_json(sfile.read_text())
    if S.epsilon > eps:
        raise ValueError(f"the strategy file is {S.epsilon}-LDP, the spec allows {eps}")
    if S.Q.shape[1] != W.shape[1]:
        raise ValueError(
            f"the strategy file is for {S.Q.shape[1]} types; the workload has {W.shape[1]}"
        )
    method = doc.get("reconstruct", "ls")
    if method not in ("ls", "wnnls"):
        raise ValueError("reconstruct: ls or wnnls")
    responses = _path(base, doc["responses"])
    if not responses.exists():
        raise ValueError(f"responses: {responses} does not exist")
    target = _path(base, doc["output"])
    for what, other in (
        ("responses", responses),
        ("strategy_file", sfile),
        ("spec", pathlib.Path(path)),
    ):
        if target.resolve() == other.resolve():
            raise ValueError(f"output: {target} is the {what}; refusing to overwrite it")
    return W, S, method, responses, target


def validate_spec(path: str | os.PathLike) -> dict[str, Any]:
    """Check a local spec, its strategy file and every response as ``run`` would; write
    nothing.

    Raises
    ------
    ValueError
        On any problem ``run`` would raise for (a bad spec, a strategy file that does not
        keep the spec's epsilon or fit its workload, a missing or out-of-range response,
        an output that is one of the inputs).
    """
    from dpdask.ldp.aggregate import count_responses

    doc, base = load_spec(path)
    _, S, method, responses, target = _run_inputs(doc, base, path)
    geos, counts = count_responses(
        str(responses),
        S.Q.shape[0],
        response=doc.get("response_column", "response"),
        geography=doc.get("geography_column", "geography"),
    )
    return {
        "ok": True,
        "release": doc.get("release"),
        "output": str(target),
        "geographies": len(geos),
        "people": int(counts.sum()),
        "reconstruct": method,
        "epsilon": str(S.epsilon),
    }


def run_spec(path: str | os.PathLike) -> dict[str, Any]:
    """Aggregate the responses of a local spec with its strategy file; write ``output``.

    Raises
    ------
    ValueError
        If the strategy file does not keep the spec's epsilon, or responses are invalid.
    """
    doc, base = load_spec(path)
    W, S, method, responses, target = _run_inputs(doc, base, path)
    est = aggregate(
        str(responses),
        S,
        W,
        response=doc.get("response_column", "response"),
        geography=doc.get("geography_column", "geography"),
        wnnls=method == "wnnls",
    )
    answers = est.answers(nonnegative=method == "wnnls")
    out = pd.DataFrame(answers, columns=[f"q{i}" for i in range(answers.shape[1])])
    out.insert(0, "people", est.people)
    out.insert(0, "geography", est.geographies)
    if str(target).endswith(".csv"):
        out.to_csv(target, index=False)
    else:
        out.to_parquet(target, index=False)
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
    """``python -m dpdask.ldp.spec plan|run SPEC [--json]``."""
    ap = argparse.ArgumentParser(prog="dpdask.ldp.spec")
    ap.add_argument("command", choices=["plan", "run"])
    ap.add_argument("spec")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.command == "plan":
        plan = plan_spec(args.spec)
        print(json.dumps(plan.summary(as_dict=True)) if args.json else plan.summary())
    else:
        print(json.dumps(run_spec(args.spec), indent=None if args.json else 2))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
