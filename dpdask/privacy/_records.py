"""What the ledger records: charges and runs, the state folded from its entries, and the
budget arithmetic of the accounting rules (see :mod:`dpdask.privacy._ledger`)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from dpdask.errors import (
    ArgumentError,
    ArgumentTypeError,
    BudgetExceededError,
    BudgetTypeError,
    LedgerConflictError,
    NoiseKeyError,
    PlanError,
    RunStateError,
)
from dpdask.privacy._budget import Budget
from dpdask.privacy._chain import Entry
from dpdask.privacy._mechanisms import MECHANISM_NORM
from dpdask.privacy.neighbours import ADD_REMOVE, NEIGHBOURS

__all__ = [
    "RUN_STATES",
    "BudgetExceededError",
    "Charge",
    "LedgerConflictError",
    "Run",
    "RunBinding",
    "RunStateError",
    "check_name",
    "check_run_id",
]

RUN_STATES = ("open", "measuring", "published", "abandoned")
_LIVE = ("open", "measuring")
_RUN_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # \Z: no trailing newline


def check_run_id(run_id: object) -> str:
    """A run id: 1-128 characters of ``[A-Za-z0-9_.-]``, starting with a letter or digit.

    Raises
    ------
    ValueError
        Naming what is wrong.
    """
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ArgumentError(
            f"run id {run_id!r} must be 1-128 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )
    return run_id


_PUBLISHED = ("level", "measurement", "mechanism", "sensitivity", "noise_scale", "privacy")


@dataclass(frozen=True)
class Charge:
    """One measurement's privacy charge.

    Parameters
    ----------
    release, run_id, level, measurement : str
        The identity of the charge (the geography chunk is deliberately absent:
        chunks of one level compose in parallel).
    mechanism : str
        ``"laplace"``, ``"gaussian"``, ``"discrete_laplace"`` or ``"discrete_gaussian"``.
    sensitivity : float
        The strategy's sensitivity in the mechanism's norm (L1 or L2).
    noise_scale : float
        Laplace scale or Gaussian sigma.
    privacy : Budget
        What the measurement costs (the plan's per-measurement budget).
    key_fingerprint : str or None
        :meth:`dpdask.noise.SecretKey.fingerprint` of the key that draws the noise;
        the ledger refuses a charge without one.
    """

    release: str
    run_id: str
    level: str
    measurement: str
    mechanism: str
    sensitivity: float
    noise_scale: float
    privacy: Budget
    key_fingerprint: str | None = None

    def __post_init__(self) -> None:
        for name in ("release", "run_id", "level", "measurement"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ArgumentError(f"charge {name} must be a non-empty string, got {value!r}")
        if self.mechanism not in MECHANISM_NORM:
            raise PlanError(f"unknown mechanism {self.mechanism!r}")
        for name in ("sensitivity", "noise_scale"):
            value = float(getattr(self, name))
            if not math.isfinite(value) or value < 0 or (name == "noise_scale" and value == 0):
                raise PlanError(f"charge {name} must be finite and positive, got {value!r}")
            object.__setattr__(self, name, value)
        if not isinstance(self.privacy, Budget):
            raise BudgetTypeError(f"charge privacy must be a Budget, got {self.privacy!r}")
        if self.key_fingerprint is not None and not (
            isinstance(self.key_fingerprint, str) and self.key_fingerprint
        ):
            raise NoiseKeyError(
                f"charge key_fingerprint must be a string, got {self.key_fingerprint!r}"
            )

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.release, self.run_id, self.level, self.measurement)

    def same_as(self, other: Charge) -> bool:
        """Whether ``other`` charges the same: mechanism, sensitivity, noise scale and
        privacy (the identity and the key fingerprint are compared separately)."""
        return (
            self.mechanism == other.mechanism
            and self.sensitivity == other.sensitivity
            and self.noise_scale == other.noise_scale
            and self.privacy == other.privacy
        )

    _same_as = same_as  # the name before it was public

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe record of the charge."""
        return {
            "release": self.release,
            "run_id": self.run_id,
            "level": self.level,
            "measurement": self.measurement,
            "mechanism": self.mechanism,
            "sensitivity": self.sensitivity,
            "noise_scale": self.noise_scale,
            "privacy": self.privacy.to_dict(),
            "key_fingerprint": self.key_fingerprint,
        }

    def published(self) -> dict[str, Any]:
        """The part of the record a published release states (no run or key)."""
        d = self.to_dict()
        return {k: d[k] for k in _PUBLISHED}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Charge:
        return cls(**{**d, "privacy": Budget.from_dict(d["privacy"])})


_STATEMENT_KEYS = {"invariants", "constraints", "attributes", "exact"}


@dataclass(frozen=True)
class RunBinding:
    """What a run measures and where it publishes, recorded with the run when it is
    first charged: a resume must match it, whatever its work folder says.

    Parameters
    ----------
    source : str
        The content hash of the input the run measures.
    spec : str
        The hash of everything in the spec that decides what the run measures and
        publishes.
    output : str
        The absolute, resolved path the run publishes to (it publishes nowhere else).
    neighbours : str
        The neighbour relation the run's spec states its budget in
        (:mod:`dpdask.privacy.neighbours`); its charges are add/remove budgets either
        way. Recorded only when it is not ``"add-remove"``, so that entries written
        before relations were recorded read (and hash) as they were.
    invariants : dict, optional
        What the run publishes without noise and the constraints its estimates keep
        (``{"invariants": {level: [names]}, "constraints": {...}, "attributes": [...]}``,
        :meth:`dpdask.pipeline._spec_invariants.Invariants.statement`). Recorded only
        when the spec states any, so that earlier entries read as they were.
    passes : dict, optional
        The multi-pass top-down's passes and slack as the spec states them
        (``{"passes": "default" or [[group, ...], ...], "slack": s}``). Recorded only
        when the spec states them, likewise.
    """

    source: str
    spec: str
    output: str
    neighbours: str = ADD_REMOVE.name
    invariants: dict[str, Any] | None = None
    passes: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("source", "spec", "output"):
            check_name(getattr(self, name), f"run binding {name}")
        if self.neighbours not in NEIGHBOURS:
            raise ArgumentError(
                f"run binding neighbours {self.neighbours!r} is not one of {sorted(NEIGHBOURS)}"
            )
        inv = self.invariants
        if inv is not None and (
            not isinstance(inv, dict)
            or not inv
            or set(inv) - _STATEMENT_KEYS
            or not all(isinstance(inv.get(k, {}), dict) for k in ("invariants", "constraints"))
        ):
            raise ArgumentError(
                f"run binding invariants {inv!r}: expected a mapping of {sorted(_STATEMENT_KEYS)}"
            )
        ps = self.passes
        if ps is not None and (not isinstance(ps, dict) or set(ps) != {"passes", "slack"}):
            raise ArgumentError(f"run binding passes {ps!r}: expected a mapping of passes, slack")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source, "spec": self.spec, "output": self.output}
        if self.neighbours != ADD_REMOVE.name:
            d["neighbours"] = self.neighbours
        if self.invariants is not None:
            d["invariants"] = self.invariants
        if self.passes is not None:
            d["passes"] = self.passes
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunBinding:
        return cls(
            d["source"], d["spec"], d["output"], d.get("neighbours", ADD_REMOVE.name),
            d.get("invariants"), d.get("passes"),
        )  # fmt: skip

    @staticmethod
    def check(value: object) -> RunBinding:
        """``value`` if it is a :class:`RunBinding`, else :class:`ArgumentTypeError`."""
        if not isinstance(value, RunBinding):
            raise ArgumentTypeError(f"expected a RunBinding, got {value!r}")
        return value


@dataclass(frozen=True)
class Run:
    """A run of a release: its key fingerprint, state, the output it was published at,
    what it is bound to (``None`` for runs recorded before runs were bound) and the
    ledger it charged, as it was named when the run opened: a SQLite file's absolute
    path or a server's URL without its password (``None`` for runs recorded before
    runs said so)."""

    release: str
    run_id: str
    key_fingerprint: str
    state: str
    output: str | None = None
    binding: RunBinding | None = None
    ledger: str | None = None


@dataclass
class _State:
    """The ledger's contents, folded from its entries."""

    datasets: dict[str, Budget] = field(default_factory=dict)
    releases: dict[str, tuple[Budget, str | None]] = field(default_factory=dict)
    runs: dict[tuple[str, str], Run] = field(default_factory=dict)
    charges: dict[tuple[str, str, str, str], Charge] = field(default_factory=dict)

    @classmethod
    def fold(cls, entries: Sequence[Entry]) -> _State:
        st = cls()
        for e in entries:
            b = e.body
            if e.kind == "dataset":
                st.datasets[b["dataset"]] = Budget.from_dict(b["total"])
            elif e.kind == "release":
                st.releases[b["release"]] = (Budget.from_dict(b["budget"]), b["dataset"])
            elif e.kind == "run":
                bound = b.get("binding")
                st.runs[(b["release"], b["run_id"])] = Run(
                    b["release"], b["run_id"], b["key_fingerprint"], "open",
                    binding=None if bound is None else RunBinding.from_dict(bound),
                    ledger=b.get("ledger"),
                )  # fmt: skip
            elif e.kind == "state":
                run = st.runs[(b["release"], b["run_id"])]
                st.runs[run.release, run.run_id] = replace(
                    run, state=b["state"], output=b.get("output")
                )
            elif e.kind == "charge":
                c = Charge.from_dict({k: v for k, v in b.items() if k != "time"})
                st.charges[c.key] = c
        return st

    def release(self, release: str) -> tuple[Budget, str | None]:
        if release not in self.releases:
            raise LedgerConflictError(
                f"release {release!r} is not open in the ledger; call open_release first"
            )
        return self.releases[release]

    def of_release(self, release: str) -> list[Budget]:
        return [c.privacy for c in self.charges.values() if c.release == release]

    def of_dataset(self, dataset: str) -> list[Budget]:
        mine = {r for r, (_, d) in self.releases.items() if d == dataset}
        return [c.privacy for c in self.charges.values() if c.release in mine]


def _check_run(run: Run, key_fingerprint: str) -> None:
    if run.state not in _LIVE:
        raise RunStateError(
            f"run {run.run_id!r} of release {run.release!r} is {run.state}"
            + (f" (at {run.output})" if run.output else "")
            + "; it cannot be resumed or re-published. A new run id is a new run: it draws "
            "new noise and is charged again"
        )
    if run.key_fingerprint != key_fingerprint:
        raise RunStateError(
            f"run {run.run_id!r} of release {run.release!r} is bound to another key (fingerprint "
            f"{run.key_fingerprint}); its noise can only be drawn with that key. If that key is "
            "lost, abandon the run (`dpdask ledger abandon`) and start a new run id, which is "
            "charged again"
        )


def check_binding(run: Run, binding: RunBinding) -> None:
    """A run resumes (is charged or published) only on the input, with the spec and to
    the output it is bound to in the ledger.

    Raises
    ------
    RunStateError
        If the run was recorded without a binding (by an older dpdask) or with another
        one, naming what changed.
    """
    name = f"run {run.run_id!r} of release {run.release!r}"
    fresh = "Abandon it (`dpdask ledger abandon`) and start a new run id (a new charge)"
    if run.binding is None:
        raise RunStateError(
            f"{name} was charged by an older dpdask that did not record its input and spec in "
            f"the ledger; it cannot be resumed safely. {fresh}"
        )
    if run.binding.source != binding.source:
        raise RunStateError(
            f"the input changed since {name} started (the ledger binds the run to the input "
            f"it measures); resuming would add its noise to other data. {fresh}"
        )
    if run.binding.spec != binding.spec:
        raise RunStateError(
            f"the spec changed since {name} started (its data options, domain, levels, "
            "workload, budget, strategy or reconstruction); resuming would publish what it "
            f"measured for one plan as another's. Restore the spec, or: {fresh}"
        )
    if run.binding.output != binding.output:
        raise RunStateError(
            f"{name} publishes to {run.binding.output}, not {binding.output}: a run's noise "
            f"is published once, at one place. {fresh}"
        )


def dedupe(charges: Charge | Iterable[Charge]) -> list[Charge]:
    """``charges`` without repeats; two different charges under one identity are refused."""
    items = [charges] if isinstance(charges, Charge) else list(charges)
    seen: dict[tuple[str, str, str, str], Charge] = {}
    for c in items:
        if not isinstance(c, Charge):
            raise ArgumentTypeError(f"expected a Charge, got {type(c).__name__}")
        if c.key in seen and not (
            seen[c.key].same_as(c) and seen[c.key].key_fingerprint == c.key_fingerprint
        ):
            raise LedgerConflictError(f"two different charges share the identity {c.key}")
        seen[c.key] = c
    return list(seen.values())


def run_body(
    release: str, run_id: str, key_fingerprint: str, binding: RunBinding | None,
    ledger: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The ledger entry that opens a run (``ledger``: where it is charged, never a
    password)."""
    body: dict[str, Any] = {"release": release, "run_id": run_id,
                            "key_fingerprint": key_fingerprint}  # fmt: skip
    if binding is not None:
        body["binding"] = binding.to_dict()
    if ledger is not None:
        body["ledger"] = ledger
    return body


def check_publication(run: Run, output: str) -> None:
    """A run is published once, and a bound run only at the output it is bound to."""
    where = os.path.realpath(output)
    name = f"run {run.run_id!r} of release {run.release!r}"
    if run.state == "published" and run.output is not None and run.output != output:
        raise RunStateError(
            f"{name} is already published at {run.output}; its noise is never published "
            f"again (at {output}). A new run id is a new run, drawing new noise and charged "
            "again"
        )
    if run.binding is not None and run.binding.output != where:
        raise RunStateError(
            f"{name} is bound to the output {run.binding.output}; it cannot be published at {where}"
        )


def _check_fits(st: _State, todo: Sequence[Charge]) -> None:
    by_release: dict[str, list[Charge]] = {}
    for c in todo:
        by_release.setdefault(c.release, []).append(c)
    by_dataset: dict[str, list[Charge]] = {}
    for release, cs in by_release.items():
        budget, dataset = st.release(release)
        spent = _total(budget, st.of_release(release))
        _require_fits(budget, spent, [c.privacy for c in cs], f"release {release!r}")
        if dataset is not None:
            by_dataset.setdefault(dataset, []).extend(cs)
    for dataset, cs in by_dataset.items():
        total = st.datasets.get(dataset)
        if total is None:
            continue
        spent = _total(total, st.of_dataset(dataset))
        _require_fits(total, spent, [c.privacy for c in cs], f"dataset {dataset!r}")


def check_name(value: object, what: str) -> str:
    """``value`` if it is a non-empty string (a release, run, level, measurement or
    dataset name); raises ``ValueError`` naming ``what`` otherwise."""
    if not isinstance(value, str) or not value:
        raise ArgumentError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _check_budget(value: object, what: str) -> None:
    if not isinstance(value, Budget):
        raise BudgetTypeError(f"{what} must be a PureDP, ApproxDP or zCDP budget, got {value!r}")


def _as_kind(budget: Budget, charge: Budget) -> Budget:
    """``charge`` in ``budget``'s definition, or a clear error."""
    try:
        return budget._coerce(charge)
    except TypeError:
        raise LedgerConflictError(
            f"a charge of {charge!r} cannot be accounted in a {type(budget).__name__} budget"
        ) from None


def _total(budget: Budget, charges: Iterable[Budget]) -> Budget:
    out = budget.zero()
    for c in charges:
        out = out + _as_kind(budget, c)
    return out


def _left(budget: Budget, spent: Budget) -> Budget:
    values = [
        max(a - b, Fraction(0)) for a, b in zip(budget._values(), spent._values(), strict=True)
    ]
    return budget._new(values)


def _require_fits(budget: Budget, spent: Budget, new: Sequence[Budget], what: str) -> None:
    asked = _total(budget, new)
    if not (spent + asked <= budget):
        raise BudgetExceededError(
            f"{what}: the new charges total {asked!r} but only {_left(budget, spent)!r} "
            f"of its {budget!r} is left"
        )
