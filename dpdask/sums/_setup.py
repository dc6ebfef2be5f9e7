"""What a sum spec's run, validation and plan share: the workload, the threshold, the checks."""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from dpdask.domain import Domain
from dpdask.errors import SpecError
from dpdask.linalg import RangeQueries
from dpdask.sums.bins import NumericBins
from dpdask.sums.thresholds import ThresholdResult, svt_truncation_bound
from dpdask.workloads.sums import SumWorkload

__all__ = [
    "BETA",
    "THRESHOLD_LEVEL",
    "Setup",
    "bias_record",
    "binding",
    "check_budget",
    "dataset_of",
    "finite",
    "preflight",
    "probe",
    "register",
    "setup",
    "threshold",
]

BETA = 0.05  # failure probability of the published SVT bound on truncated records
THRESHOLD_LEVEL = "all"


@dataclass
class Setup:
    """The bins, the domain ``(*by, value)``, the sums and every query's value range."""

    bins: NumericBins
    domain: Domain
    sums: SumWorkload
    queries: RangeQueries  # the workload on the value attribute
    lower: np.ndarray  # every query covers the values (lower, upper]
    upper: np.ndarray
    by: dict[str, list[str]]

    @property
    def group_shape(self) -> tuple[int, ...]:
        return tuple(len(c) for c in self.by.values())

    @property
    def m(self) -> int:
        """Queries on the value attribute (per group)."""
        return int(self.queries.shape[0])

    def threshold_runs(self, mechanism: str) -> int:
        """SQM draws one threshold per query on the attribute; the others one."""
        return self.m if mechanism == "SQM" else 1

    def per_bin(self, x: np.ndarray) -> np.ndarray:
        """The counts of all records over the bins (the thresholds' histogram)."""
        k = self.bins.size
        counts: np.ndarray = np.asarray(x).reshape(-1, k).sum(axis=0)
        return counts

    def thetas(self, result: ThresholdResult | None, mechanism: str) -> Any:
        """The threshold(s) a mechanism is built with (SQM: one per row, tiled over groups)."""
        if result is None:
            return None
        if mechanism == "SQM":
            return np.tile(result.theta, int(np.prod(self.group_shape, dtype=np.int64)))
        return result.value


def setup(spec: dict[str, Any]) -> Setup:
    """The :class:`Setup` of a parsed spec (no data)."""
    low, high, k = spec["bins"]
    bins = NumericBins.uniform(float(low), float(high), k)
    w = spec["workload"]
    if w["name"] == "prefix":
        queries = bins.prefixes(w["every"])
    else:
        try:
            queries = bins.ranges(w["low"], w["high"])
        except ValueError as err:
            raise SpecError(f"workload.ranges: {err}") from err
    attr = spec["value_column"]
    by: dict[str, list[Any]] = dict(spec.get("by", {}))
    try:
        domain = Domain([*((b, len(c)) for b, c in by.items()), (attr, k)])
    except ValueError as err:
        raise SpecError(f"by / data.value_column: {err}") from err
    sums = SumWorkload(domain, attr, bins.values, queries, by=list(by))
    lo = np.asarray(queries.lo)
    lower = bins.edges[lo]
    upper = bins.values[np.asarray(queries.hi)]
    return Setup(bins, domain, sums, queries, lower, upper, by)


def threshold(
    spec: dict[str, Any], counts: np.ndarray, values: np.ndarray, eps: Any, rng: Any, runs: int
) -> ThresholdResult:
    """The spec's threshold mechanism (``runs`` independent runs of ``eps`` each)."""
    from dpdask.sums.thresholds import recursive_threshold, svt_threshold

    opts = dict(spec["threshold_options"])
    width = float(values[0])  # the first representative value: the smallest candidate
    if spec["threshold"] == "svt":
        opts.setdefault("s", width)
        return svt_threshold(counts, values, eps, rng, size=runs, **opts)
    opts.setdefault("theta0", width)
    return recursive_threshold(counts, values, eps, rng, size=runs, **opts)


def bias_record(result: ThresholdResult | None) -> dict[str, Any]:
    """The published statement on the truncation bias (module notes of :mod:`.spec`)."""
    if result is None:
        return {"kind": "exact", "bound": 0.0, "text": "no truncation: the sums are unbiased"}
    if not np.isfinite(result.theta).any():
        return {"kind": "exact", "bound": 0.0, "text": "SVT chose no threshold: unbiased"}
    if result.method != "svt":
        return _recursive_record(result)
    runs = int(result.theta.size)
    frac, additive = svt_truncation_bound(result, BETA / runs)
    r = Fraction(result.params["r"])
    alpha = additive * r.denominator
    each = "" if runs == 1 else f" (for all {runs} thresholds at once: beta / {runs} each)"
    return {
        "kind": "high_probability",
        "probability": 1 - BETA,
        "truncated_records_fraction_of_N": frac,
        "truncated_records_additive": additive,
        "text": (
            f"with probability >= {1 - BETA}{each}, -bias_i <= ((1 - r) N + alpha / q) * "
            "bias_per_record_i, N the (unreleased) number of records, r = p / q = "
            f"{r}, alpha = 8 max(p, q - p) / eps_threshold * ln(4 K / beta) = {alpha:.6g}; "
            "the bias is never positive (see dpdask.sums.sum_spec)"
        ),
    }


def _recursive_record(result: ThresholdResult) -> dict[str, Any]:
    """The published bound for recursive thresholds (:func:`recursive_truncation_bound`)."""
    from dpdask.sums.thresholds import recursive_truncation_bound

    runs = int(result.theta.size)
    bounds, fail = recursive_truncation_bound(result, BETA / runs)
    total = min(1.0, fail * runs)
    each = "" if runs == 1 else f" (for all {runs} thresholds at once: a union bound)"
    if total >= 1:
        return {
            "kind": "unavailable",
            "text": (
                f"the recursive threshold's bound on truncated records fails with probability "
                f"{fail:.3g} per threshold, {runs} thresholds: no useful joint bound (raise "
                "threshold.mu); |bias_i| <= n_trunc * bias_per_record_i, n_trunc not released"
            ),
        }
    listed = [int(b) for b in bounds.tolist()]
    return {
        "kind": "high_probability",
        "probability": 1 - total,
        "truncated_records": listed[0] if runs == 1 else listed,
        "text": (
            f"with probability >= {1 - total:.6g}{each}, at most truncated_records records "
            "lie above the threshold and -bias_i <= truncated_records * bias_per_record_i; "
            "truncated_records = floor((ln(theta / theta0) - mu) / beta + shift) from the "
            "published threshold (see dpdask.sums.recursive_truncation_bound); the bias is "
            "never positive"
        ),
    }


def preflight(
    spec: dict[str, Any], overwrite: bool, run_id: str | None, *, create: bool
) -> tuple[pathlib.Path, Any, str]:
    """The output path, the ledger (verified; created only if ``create``) and the run id.

    Raises as a run would, before any data is read: an unsafe or taken output, a missing
    ledger without ``ledger.create``, a run id the ledger has seen. With ``create=False``
    and no ledger yet (``ledger.create: true``) the ledger is ``None``.
    """
    from dpdask.privacy import (
        PureDP,
        RunStateError,
        check_lifetime_covers,
        check_run_id,
        ledger_files,
    )
    from dpdask.publish import check_output, check_replaced, new_run_id, open_ledger

    budget = PureDP(spec["epsilon"])
    check_lifetime_covers(spec["release"], budget, spec.get("dataset_budget"))

    location = spec["ledger"]  # a SQLite file's path or a server's URL
    protected = [("input data", spec["data"]), *ledger_files(location)]
    output = check_output(spec["output"], overwrite, [*protected, ("release spec", spec["source"])])
    ledger = open_ledger(location, create=spec["ledger_create"], outputs=[output], dry=not create)
    if overwrite:
        check_replaced(output, ledger)
    rid = check_run_id(run_id) if run_id is not None else new_run_id()
    if ledger is not None and ledger.run(spec["release"], rid) is not None:
        raise RunStateError(
            f"run {rid!r} of release {spec['release']!r} is in the ledger; sum runs cannot "
            "resume (their key is not kept): abandon it and start a new run id"
        )
    return output, ledger, rid


def probe(
    spec: dict[str, Any], st: Setup, run_id: str, key: Any, eps_t: Any, eps_m: Any
) -> tuple[list[Any], ThresholdResult | None]:
    """The charges a run will make (data-free), and the threshold's dry run that prices them."""
    from dpdask.noise import KeyedRNG
    from dpdask.privacy import Charge
    from dpdask.sums.accounting import threshold_charge

    release, level = spec["release"], spec["geography_column"]
    charges = [
        Charge(release, run_id, level, "sums", "laplace", 1.0, 1.0, eps_m, key.fingerprint())
    ]
    dry = None
    if spec["threshold"] != "none":
        runs = st.threshold_runs(spec["mechanism"])
        test_rng = KeyedRNG.for_testing(0, identity="dry")  # parameters only, no data
        zeros = np.zeros(st.bins.size, np.int64)
        dry = threshold(spec, zeros, st.bins.values, eps_t.epsilon / runs, test_rng, runs)
        charges.append(threshold_charge(dry, release, run_id, THRESHOLD_LEVEL, "threshold", key))
    return charges, dry


def binding(spec: dict[str, Any], output: pathlib.Path) -> Any:
    """What the ledger binds a sum run to: the records' content hash, the spec's hash
    (every field but the output and ledger) and the resolved output."""
    import hashlib
    import json
    import os

    from dpdask.privacy import RunBinding
    from dpdask.store import fingerprint_path

    ignored = ("output", "ledger", "ledger_create", "source")
    fields = {k: v for k, v in spec.items() if k not in ignored}
    text = json.dumps(fields, sort_keys=True, default=str)
    return RunBinding(
        fingerprint_path(spec["data"]).content,
        hashlib.sha256(text.encode()).hexdigest(),
        os.path.realpath(output),
    )


def dataset_of(spec: dict[str, Any]) -> str:
    """The dataset a sum release is charged to: ``data.id``, or by default the same
    content hash of the records file a count release of that file is charged to."""
    from dpdask.store import fingerprint_path

    if spec.get("dataset_id"):
        return str(spec["dataset_id"])
    if not spec["data"].exists():
        raise SpecError(f"data.path: {spec['data']} does not exist")
    return fingerprint_path(spec["data"]).dataset_id


def check_budget(
    spec: dict[str, Any], ledger: Any, charges: list[Any], dataset: str, *, hold: bool = False
) -> Any:
    """What the release has left, raising as a run would if the charges do not fit the
    release's budget or the dataset's lifetime budget, or the records are another
    dataset's source or (as a server's operator) an unregistered one: all checked before
    data is read. ``hold`` (a run): on a server ledger, hold the dataset against other
    jobs from before the check until this run's charge commits, so that a job losing the
    race for the last of a lifetime budget is refused here (:func:`~dpdask.privacy.hold_dataset`).
    """
    from dpdask.privacy import (
        PureDP,
        check_dataset_fits,
        check_release_opening,
        check_source,
        hold_dataset,
    )
    from dpdask.store import fingerprint_path

    budget = PureDP(spec["epsilon"])
    if ledger is None:
        return budget
    if hold:
        hold_dataset(ledger, dataset)
    release = spec["release"]
    opened, total = check_release_opening(
        ledger, release, budget, dataset, spec.get("dataset_budget")
    )
    check_dataset_fits(ledger, release, budget, dataset, total)
    check_source(ledger, dataset, fingerprint_path(spec["data"]).content)  # one authority
    if opened is None:
        return budget
    ledger.check(charges)
    return ledger.remaining(release)


def register(spec: dict[str, Any], ledger: Any, dataset: str) -> None:
    """Record the dataset's lifetime budget (``privacy.dataset``) and, on its first
    release, its source's fingerprint (the ledger's one budget authority)."""
    from dpdask.privacy import bind_source
    from dpdask.store import fingerprint_path

    if spec["dataset_budget"] is not None:
        ledger.set_dataset_total(dataset, spec["dataset_budget"])
    bind_source(ledger, dataset, fingerprint_path(spec["data"]).content)


def finite(theta: Any) -> Any:
    """``None`` for no truncation, else the threshold (JSON-safe)."""
    return None if theta is None or not math.isfinite(float(theta)) else float(theta)
