"""The YAML release spec: what to release, from which data, under which budget.

A spec names the data source, the domain, the geography levels, the workload, the
privacy budget and its split over levels, the strategy, the reconstruction, the
output and, optionally, a cluster. Relative paths are relative to the spec file.
Every problem is reported as a :class:`SpecError` naming the field, before any
data is read or any budget is spent.

Example (``pipelines/pl94-providence.yaml``)::

    release: pl94-providence
    data:
      format: pl94                 # pl94 | store | records | synthetic
      path: ../examples/data/pl94_providence
    domain: pl94                   # pl94 | cph | {attr: size, ...}
    levels: [state, county, tract, blockgroup, block]
    workload: pl94                 # or {name: marginals, k: 2}
    privacy:
      zcdp: 1                      # or epsilon: 1 (pure DP) or {epsilon: 1, delta: 1e-9}
      split: {state: 1, county: 1, tract: 1, blockgroup: 1, block: 1}
    strategy: hdmm
    reconstruct: ls
    output: ../out/pl94-providence.zarr
    ledger: ../out/ledger.sqlite
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import yaml

from dpdask.domain import Domain
from dpdask.privacy import ApproxDP, Budget, PureDP, as_fraction, zCDP

__all__ = ["DataSpec", "ReleaseSpec", "SpecError", "load_spec", "parse_spec"]

_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
DATA_FORMATS = ("pl94", "store", "records", "synthetic")
STRATEGIES = ("hdmm", "identity", "workload", "hierarchical", "wavelet", "convex", "fitness")
RECONSTRUCTIONS = ("ls", "wls", "nnls", "wnnls", "admm-l1", "admm-enet")


class SpecError(ValueError):
    """A release spec is invalid; the message names the field."""


@dataclass(frozen=True)
class DataSpec:
    """Where the sensitive data comes from."""

    format: str
    path: pathlib.Path | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReleaseSpec:
    """A validated release spec (see the module docstring for the YAML form)."""

    release: str
    data: DataSpec
    domain: Domain
    levels: tuple[str, ...] | None
    workload: dict[str, Any]
    privacy: Budget
    split: dict[str, Fraction] | None
    strategy: str
    strategy_options: dict[str, Any]
    reconstruct: str
    output: pathlib.Path
    ledger: pathlib.Path
    dataset_budget: Budget | None = None
    cluster: str | dict[str, Any] | None = None
    source: pathlib.Path | None = None

    def level_budgets(self, levels: tuple[str, ...]) -> dict[str, Budget]:
        """The budget of each released level: the split (exact) of the total."""
        if self.split is None:
            weights = [Fraction(1)] * len(levels)
        else:
            missing = [lv for lv in levels if lv not in self.split]
            if missing:
                raise SpecError(f"privacy.split: no share for level(s) {missing}")
            extra = sorted(set(self.split) - set(levels))
            if extra:
                raise SpecError(f"privacy.split: level(s) {extra} are not released")
            weights = [self.split[lv] for lv in levels]
        return dict(zip(levels, self.privacy.split(weights), strict=True))


def _require(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d or d[key] is None:
        raise SpecError(f"{where}: missing required field {key!r}")
    return d[key]


def _path(value: Any, base: pathlib.Path, where: str) -> pathlib.Path:
    if not isinstance(value, str | os.PathLike) or not str(value):
        raise SpecError(f"{where}: expected a path, got {value!r}")
    p = pathlib.Path(os.path.expandvars(os.path.expanduser(str(value))))
    return p if p.is_absolute() else (base / p).resolve()


def _budget(d: Any, where: str) -> Budget:
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: expected a mapping like {{zcdp: 1}} or {{epsilon: 1}}")
    try:
        if "zcdp" in d or "rho" in d:
            return zCDP(d.get("zcdp", d.get("rho")))
        if "epsilon" in d and d.get("delta") not in (None, 0):
            return ApproxDP(d["epsilon"], d["delta"])
        if "epsilon" in d:
            return PureDP(d["epsilon"])
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{where}: {exc}") from None
    raise SpecError(f"{where}: give one of zcdp, epsilon, or epsilon with delta")


def _domain(value: Any) -> Domain:
    from dpdask.workloads import census

    if value == "pl94":
        return census.pl94_domain()
    if value == "cph":
        return census.cph_domain()
    if isinstance(value, Mapping):
        try:
            return Domain({str(k): v for k, v in value.items()})
        except ValueError as exc:
            raise SpecError(f"domain: {exc}") from None
    raise SpecError(
        f"domain: expected 'pl94', 'cph' or a mapping of attribute sizes, got {value!r}"
    )


def parse_spec(raw: Mapping[str, Any], base: str | os.PathLike = ".") -> ReleaseSpec:
    """Validate a spec given as a mapping; relative paths resolve against ``base``."""
    base = pathlib.Path(base).resolve()
    if not isinstance(raw, Mapping):
        raise SpecError("a release spec is a YAML mapping")
    known = {
        "release", "data", "domain", "levels", "workload", "privacy", "strategy",
        "reconstruct", "output", "ledger", "cluster",
    }  # fmt: skip
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SpecError(f"unknown field(s) {unknown}; known fields are {sorted(known)}")
    release = str(_require(raw, "release", "spec"))
    if not _ID.match(release):
        raise SpecError(f"release: {release!r} must start with a letter and use [A-Za-z0-9_.-]")

    data_raw = _require(raw, "data", "spec")
    if not isinstance(data_raw, Mapping):
        raise SpecError("data: expected a mapping with 'format' and 'path'")
    fmt = _require(data_raw, "format", "data")
    if fmt not in DATA_FORMATS:
        raise SpecError(f"data.format: {fmt!r} is not one of {DATA_FORMATS}")
    dpath = _path(data_raw["path"], base, "data.path") if data_raw.get("path") else None
    if fmt != "synthetic" and dpath is None:
        raise SpecError(f"data.path: required for format {fmt!r}")
    options = {k: v for k, v in data_raw.items() if k not in ("format", "path")}
    data = DataSpec(fmt, dpath, options)

    domain = _domain(_require(raw, "domain", "spec"))
    levels = raw.get("levels")
    if levels is not None:
        if (
            not isinstance(levels, list)
            or not all(isinstance(x, str) for x in levels)
            or not levels
        ):
            raise SpecError("levels: expected a non-empty list of level names")
        levels = tuple(levels)

    wl = _require(raw, "workload", "spec")
    workload = (
        {"name": wl} if isinstance(wl, str) else dict(wl) if isinstance(wl, Mapping) else None
    )
    if workload is None or "name" not in workload:
        raise SpecError("workload: expected a name or a mapping with 'name'")

    pr = _require(raw, "privacy", "spec")
    privacy = _budget(pr, "privacy")
    split = None
    if isinstance(pr, Mapping) and pr.get("split") is not None:
        if not isinstance(pr["split"], Mapping):
            raise SpecError("privacy.split: expected a mapping of level to share")
        try:
            split = {str(k): as_fraction(v, f"share of {k}") for k, v in pr["split"].items()}
        except (TypeError, ValueError) as exc:
            raise SpecError(f"privacy.split: {exc}") from None
        if any(v <= 0 for v in split.values()):
            raise SpecError("privacy.split: shares must be positive")
        if levels is not None:
            extra = sorted(set(split) - set(levels))
            if extra:
                raise SpecError(f"privacy.split: level(s) {extra} are not in levels")
    dataset_budget = None
    if isinstance(pr, Mapping) and pr.get("dataset") is not None:
        dataset_budget = _budget(pr["dataset"], "privacy.dataset")

    st = raw.get("strategy", "hdmm")
    strategy_options: dict[str, Any] = {}
    if isinstance(st, Mapping):
        strategy_options = {k: v for k, v in st.items() if k != "name"}
        st = st.get("name", "hdmm")
    if st not in STRATEGIES:
        raise SpecError(f"strategy: {st!r} is not one of {STRATEGIES}")
    rec = raw.get("reconstruct", "ls")
    if rec not in RECONSTRUCTIONS:
        raise SpecError(f"reconstruct: {rec!r} is not one of {RECONSTRUCTIONS}")
    output = _path(_require(raw, "output", "spec"), base, "output")
    ledger = _path(raw.get("ledger", str(output) + ".ledger.sqlite"), base, "ledger")
    cluster = raw.get("cluster")
    if cluster is not None and not isinstance(cluster, str | Mapping):
        raise SpecError(
            "cluster: expected a scheduler address or a mapping of LocalCluster options"
        )
    return ReleaseSpec(
        release=release, data=data, domain=domain, levels=levels, workload=workload,
        privacy=privacy, split=split, strategy=st, strategy_options=strategy_options,
        reconstruct=rec, output=output, ledger=ledger, dataset_budget=dataset_budget,
        cluster=dict(cluster) if isinstance(cluster, Mapping) else cluster,
    )  # fmt: skip


def load_spec(path: str | os.PathLike) -> ReleaseSpec:
    """Read and validate a YAML release spec.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    SpecError
        If the YAML is malformed or a field is invalid (the message names it).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no release spec at {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    spec = parse_spec(raw, base=path.parent)
    return ReleaseSpec(**{**spec.__dict__, "source": path.resolve()})
