"""The YAML release spec: what to release, from which data, under which budget.

A spec names the data source, the domain, the geography levels, the workload, the
privacy budget and its split over levels, the strategy, the reconstruction, the
output, the ledger and, optionally, a cluster. Relative paths are relative to the
spec file. Specs are strict: an unknown key at any depth is an error naming it and
the keys allowed there, and a budget has exactly one form. Every problem is
reported as a one-line :class:`SpecError` naming the (dotted) field, before any
data is read or any budget is spent.

Example (``pipelines/pl94-providence.yaml``)::

    release: pl94-providence
    data:
      format: pl94                 # pl94 | ri2010 | store | records | synthetic
      path: ../examples/data/pl94_providence
      id: ri-2018-e2e-providence   # optional: names the dataset
    domain: pl94                   # pl94 | ri2010 | cph | {attr: size, ...}
    levels: [state, county, tract, block_group, block]   # a list: order matters
    workload: pl94                 # or {name: marginals, k: 2}
    privacy:
      zcdp: 1                      # or rho: 1, epsilon: 1 (pure DP), or epsilon + delta
      split: {state: 1, county: 1, tract: 1, block_group: 1, block: 2}
      # dataset: {zcdp: 2}         # optional: the dataset's total budget
      # neighbours: change-one     # optional: the relation the budgets are stated in
    strategy: hdmm                 # or {name: hdmm, restarts: 5}
    #   or per level: {levels: {state: {name: hdmm, restarts: 5}, county: hdmm, ...}}
    reconstruct: ls                # or {method: topdown, passes: default, slack: 0}
    output: ../out/pl94-providence.zarr
    ledger: {path: ../out/ledger.sqlite, create: true}   # or just the path
    # or a shared ledger on a server: postgresql://operator@db.example/ledger?sslmode=verify-full
    #   (or {url: ...}); the password from PGPASSWORD, PGPASSFILE or ?passfile=...
    # cluster: tcp://scheduler:8786   # or {address: ..., tls: {ca_file, cert, key}}
    #                                 # or {n_workers: 2, threads_per_worker: 1, ...}

A records release names its units from public input, never from the records (one
person living in a unit would publish it)::

    data:
      format: records
      path: people.csv
      geography_column: geoid
      levels: {state: 2, county: 5}  # GEOID prefix lengths
      geographies: geographies.csv    # columns state,county: every unit is published
      unknown_geography: refuse       # or drop: records outside are left out

The keys allowed in each mapping:

============  ====================================================================
``data``      ``format``, ``path``, ``id`` (for ``ri2010`` the CSV file or its folder,
              :func:`dpdask.store.read_ri2010`); for ``synthetic`` also ``geographies``,
              ``states``, ``seed``, ``population``; for ``records`` the options of
              :func:`dpdask.store.ingest_records`: ``geography_column`` (required),
              ``geographies`` (required: the public universe of units, a CSV file with
              one column per level, coarsest first, and one row per finest unit; or
              ``[id, ...]``, the finest ids; or ``{level: [ids]}``, the table inline;
              quote ids), ``levels`` (``{level: GEOID prefix length}``),
              ``unknown_geography`` (``refuse``, the default, or ``drop``: records
              outside the universe are left out, and how many is never reported),
              ``attribute_columns``, ``categories``, ``blocksize``, ...;
              for converted inputs ``layout`` (``auto``, ``dense`` or ``sparse``: how
              the converted counts are stored; ``auto`` picks the smaller)
``privacy``   one of ``zcdp``, ``rho``, ``epsilon`` (``delta`` only with
              ``epsilon``; ``delta: 0`` is pure DP), and ``split``, ``dataset`` (a
              budget mapping of the same form, without ``split`` or ``dataset``),
              ``neighbours`` (``add-remove``, the default: one person's record added
              or removed; or ``change-one``: one record changed, the Census Bureau's
              relation). Change-one budgets are charged and calibrated as the
              add/remove budget of the same noise: ``rho / 2``, ``epsilon / 2`` for
              counting queries; an ``(epsilon, delta)`` budget has no exact
              conversion and is refused
``workload``  ``name`` and the options of that workload
              (:func:`dpdask.workloads.named.workload_options`)
``strategy``  ``name`` and the options :func:`dpdask.strategy.select` uses for it, or
              ``levels``: one such strategy per released level
``ledger``    ``path`` and ``create`` (permission to create a missing ledger file), or
              ``url`` (``postgresql://...``: a ledger on a PostgreSQL server, created
              by its administrator with ``dpdask ledger init URL --operator-role ROLE``)
``invariants`` level -> the counts published exactly (``total``, ``housing_units``,
              ``gq_facilities``, ``gq_population``); ``constraints``: ``empty_units``,
              ``nursing_minors``, ``gq_bounds``, ``cells``
              (:mod:`dpdask.pipeline._spec_invariants`)
``cluster``   ``address``, ``insecure``, ``tls`` (``ca_file``, ``cert``, ``key``) for
              a remote scheduler (``insecure`` or ``tls`` alone apply to the address
              of ``--scheduler`` or ``DASK_SCHEDULER_ADDRESS``), or the LocalCluster
              options ``n_workers``, ``threads_per_worker``, ``processes``,
              ``memory_limit``, ``dashboard_address``, or ``slurm`` (SLURMCluster
              options of dask-jobqueue, with ``insecure`` only)
============  ====================================================================
"""

from __future__ import annotations

import datetime
import os
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dpdask.domain import Domain
from dpdask.errors import SpecError
from dpdask.pipeline._spec_cluster import parse_cluster
from dpdask.pipeline._spec_fields import as_bool, as_mapping, as_path, check_keys, keywords, require
from dpdask.pipeline._spec_invariants import NO_INVARIANTS, Invariants, parse_invariants
from dpdask.pipeline._spec_plan import (
    RECONSTRUCTIONS,
    PassGroups,
    reconstruction,
    reconstruction_passes,
    strategies,
    workloads,
)
from dpdask.pipeline._spec_privacy import (
    PRIVACY_KEYS,
    charged_budget,
    parse_budget,
    parse_neighbours,
    parse_split,
)
from dpdask.pipeline._spec_records import records_options
from dpdask.privacy import Budget, is_server_url, split_levels
from dpdask.privacy.neighbours import ADD_REMOVE, Neighbours
from dpdask.specs import ID_RULE as _ID  # the one id rule of every kind of spec
from dpdask.specs import read_spec

__all__ = [
    "PRIVACY_KEYS",
    "RECONSTRUCTIONS",
    "DataSpec",
    "ReleaseSpec",
    "SpecError",
    "load_spec",
    "parse_domain",
    "parse_spec",
]


DATA_FORMATS = ("pl94", "ri2010", "store", "records", "synthetic", "synthetic-blocks")
_DATA_KEYS = ("format", "path", "id")
_SYNTHETIC_KEYS = ("geographies", "states", "seed", "population", "layout")
_CONVERTED_KEYS = ("layout",)  # pl94 and ri2010 files, converted into a store
_SYNTHETIC_BLOCKS_KEYS = ("blocks", "persons", "seed")  # _spec_fields.SYNTHETIC_BLOCKS
_LEDGER_KEYS = ("path", "create", "url")
#: the keys of a count spec, and those it must have
SPEC_KEYS = (
    "release", "data", "domain", "levels", "workload", "privacy", "strategy", "reconstruct",
    "output", "ledger", "cluster", "invariants", "constraints",
)  # fmt: skip
REQUIRED_KEYS = ("release", "data", "domain", "workload", "privacy", "output")


@dataclass(frozen=True)
class DataSpec:
    """Where the sensitive data comes from.

    ``format`` is one of :data:`DATA_FORMATS`; ``path`` the file or folder (absolute);
    ``id`` an optional name of the dataset (same form as release ids); ``options``
    the format's further keys (synthetic sizes, :func:`~dpdask.store.ingest_records`
    options).
    """

    format: str
    path: pathlib.Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class ReleaseSpec:
    """A validated release spec (see the module docstring for the YAML form).

    ``ledger`` is the ledger file (or a ``postgresql://`` URL) and ``ledger_create``
    whether the spec allows it to be created when missing (``ledger: {path: ...,
    create: true}``). ``cluster`` is a scheduler address, a mapping (``address`` with
    ``insecure`` or ``tls``, or LocalCluster options) or ``None`` for the default local
    cluster.

    ``privacy`` and ``dataset_budget`` are add/remove budgets, what the run charges and
    calibrates with; ``neighbours`` is the relation the spec stated them in and
    ``stated_privacy`` the budget as the spec gave it (``privacy`` itself under
    add/remove).
    """

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
    ledger: pathlib.Path | str  # str: a server ledger's URL
    dataset_budget: Budget | None = None
    cluster: str | dict[str, Any] | None = None
    source: pathlib.Path | None = None
    ledger_create: bool = False
    period: str | None = None
    integer: bool = False  # reconstruct: {method: topdown, integer: true}
    simulate: int | None = None  # reconstruct: {method: topdown, simulate: K} (default 1)
    spine: bool = False  # reconstruct: {method: topdown, spine: true} (graph._spine)
    # strategy: {levels: {level: strategy}}: each level's (name, options)
    strategy_levels: dict[str, tuple[str, dict[str, Any]]] | None = None
    neighbours: Neighbours = ADD_REMOVE
    stated_privacy: Budget | None = None  # None: privacy, as given (add/remove)
    invariants: Invariants = NO_INVARIANTS  # invariants: and constraints: (_spec_invariants)
    # reconstruct: {method: topdown, passes: ..., slack: s} (_spec_plan.reconstruction_passes)
    passes: PassGroups | None = None
    slack: float = 0.0

    @property
    def stated(self) -> Budget:
        """The total budget as the spec states it, in :attr:`neighbours` terms."""
        return self.privacy if self.stated_privacy is None else self.stated_privacy

    @property
    def per_level(self) -> bool:
        """Whether each level gets its own plan: its own workload (``workload: {levels:
        ...}``) or its own strategy (``strategy: {levels: ...}``)."""
        return "levels" in self.workload or self.strategy_levels is not None

    def level_strategy(self, level: str) -> tuple[str, dict[str, Any]]:
        """The strategy name and options of ``level`` (the spec's one strategy unless it
        gives one per level)."""
        if self.strategy_levels is None:
            return self.strategy, self.strategy_options
        return self.strategy_levels[level]

    def level_workload(self, level: str | None = None) -> dict[str, Any]:
        """The workload of ``level`` (the one workload of a spec without per-level ones)."""
        if "levels" not in self.workload:
            return self.workload
        if level is None:
            raise SpecError("workload: this spec has one workload per level; name the level")
        return dict(self.workload["levels"][level])

    def workloads(self) -> list[dict[str, Any]]:
        """Every workload the spec names (one, or one per level)."""
        if "levels" in self.workload:
            return list(self.workload["levels"].values())
        return [self.workload]

    def level_budgets(self, levels: tuple[str, ...]) -> dict[str, Budget]:
        """The budget of each released level: the exact split of the total.

        Parameters
        ----------
        levels : tuple of str
            The released levels.

        Returns
        -------
        dict of str to Budget
            As :func:`dpdask.privacy.split_levels` (even when the spec has no split).

        Raises
        ------
        SpecError
            Naming ``privacy.split``, when the split does not match the levels.
        """
        try:
            return split_levels(self.privacy, tuple(levels), self.split)
        except ValueError as exc:
            raise SpecError(f"privacy.split: {exc}") from None


# -- data -----------------------------------------------------------------------------------
def _records_keys() -> list[str]:
    from dpdask.store import ingest_records

    return keywords(ingest_records, ("source", "domain", "store"))


def _data(raw: Any, base: pathlib.Path) -> DataSpec:
    d = as_mapping(raw, "data", "a mapping with 'format' and 'path'")
    fmt = require(d, "format", "data")
    if fmt not in DATA_FORMATS:
        raise SpecError(f"data.format: {fmt!r} is not one of {DATA_FORMATS}")
    extra = {
        "synthetic": _SYNTHETIC_KEYS, "records": None, "pl94": _CONVERTED_KEYS,
        "ri2010": _CONVERTED_KEYS, "synthetic-blocks": _SYNTHETIC_BLOCKS_KEYS,
    }.get(fmt, ())  # fmt: skip
    check_keys(d, [*_DATA_KEYS, *(_records_keys() if extra is None else extra)], "data")
    dpath = as_path(d["path"], base, "data.path") if d.get("path") else None
    if not fmt.startswith("synthetic") and dpath is None:
        raise SpecError(f"data.path: required for format {fmt!r}")
    if fmt == "synthetic-blocks":  # pl94-full blocks with their attributes
        from dpdask.pipeline._spec_fields import synthetic_blocks_options as check_blocks

        check_blocks(d)
    if fmt == "ri2010" and dpath is not None:
        from dpdask.store import ri2010_csv

        dpath = ri2010_csv(dpath)  # a folder names its block file: only that file is read
    if d.get("layout", "auto") not in ("auto", "dense", "sparse"):
        raise SpecError(f"data.layout: {d['layout']!r} is not one of auto, dense, sparse")
    data_id = d.get("id")
    if data_id is not None and (not isinstance(data_id, str) or not _ID.match(data_id)):
        raise SpecError(f"data.id: {data_id!r} must start with a letter and use [A-Za-z0-9_.-]")
    options = {k: v for k, v in d.items() if k not in _DATA_KEYS}
    if fmt == "records":
        options = records_options(d, base, _DATA_KEYS)
    return DataSpec(fmt, dpath, options, data_id)


# -- ledger -----------------------------------------------------------------------------------
def _ledger(raw: Any, output: pathlib.Path, base: pathlib.Path) -> tuple[pathlib.Path | str, bool]:
    if raw is None:
        return as_path(str(output) + ".ledger.sqlite", base, "ledger"), False
    if is_server_url(raw):
        return str(raw), False
    if isinstance(raw, Mapping):
        check_keys(raw, _LEDGER_KEYS, "ledger")
        if "url" in raw:
            if "path" in raw or not is_server_url(raw["url"]):
                raise SpecError(
                    "ledger.url: give a postgresql://... URL, and either url or path, not both"
                )
            return str(raw["url"]), as_bool(raw.get("create", False), "ledger.create")
        path = as_path(require(raw, "path", "ledger"), base, "ledger.path")
        return path, as_bool(raw.get("create", False), "ledger.create")
    if not isinstance(raw, str | os.PathLike):
        raise SpecError(f"ledger: expected a path or {{path: ..., create: true}}, got {raw!r}")
    return as_path(raw, base, "ledger"), False


# -- the spec -------------------------------------------------------------------------------
#: the domains a spec may name, each with the function that builds it
NAMED_DOMAINS: dict[str, str] = {
    "pl94": "dpdask.census:pl94_domain",
    "pl94-full": "dpdask.census:pl94_full_domain",
    "ri2010": "dpdask.workloads:ri2010_domain",
    "cph": "dpdask.census:cph_domain",
}


def parse_domain(value: Any) -> Domain:
    """The domain a spec (or ``dpdask plan --domain``) names: one of
    :data:`NAMED_DOMAINS` or a mapping of attribute sizes; a :class:`SpecError` naming
    ``domain`` otherwise."""
    import importlib

    if isinstance(value, str) and value in NAMED_DOMAINS:
        module, name = NAMED_DOMAINS[value].split(":")
        return getattr(importlib.import_module(module), name)()  # type: ignore[no-any-return]
    if isinstance(value, Mapping):
        try:
            return Domain({str(k): v for k, v in value.items()})
        except ValueError as exc:
            raise SpecError(f"domain: {exc}") from None
    names = ", ".join(repr(n) for n in NAMED_DOMAINS)
    raise SpecError(f"domain: expected {names} or a mapping of attribute sizes, got {value!r}")


def _levels(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        raise SpecError("levels: expected a list of level names (coarsest first), not a mapping")
    if not isinstance(value, list) or not value or not all(isinstance(x, str) for x in value):
        raise SpecError("levels: expected a non-empty list of level names")
    repeated = sorted({x for x in value if value.count(x) > 1})
    if repeated:
        raise SpecError(f"levels: {repeated} repeated")
    return tuple(value)


_PERIOD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _with_period(release: str, output: Any, period: str | None) -> tuple[str, Any, str | None]:
    """Put the period into ``{period}`` in the release id and the output path.

    A spec whose release id names ``{period}`` is a scheduled release: each period is a
    release of its own (its own budget, charged under the dataset's lifetime budget).
    The period defaults to today's UTC date (``YYYY-MM-DD``).
    """
    placeholder = "{period}"
    if placeholder not in release:
        if period is not None:
            raise SpecError(
                f"release: {release!r} has no {placeholder} placeholder, so a period "
                f"({period!r}) cannot name it; write e.g. release: {release}-{placeholder}"
            )
        if isinstance(output, str) and placeholder in output:
            raise SpecError(f"output: names {placeholder} but the release id does not")
        return release, output, None
    if period is None:
        period = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    if not isinstance(period, str) or not _PERIOD.match(period):
        raise SpecError(
            f"period: {period!r} must be 1-64 characters of [A-Za-z0-9_.-], e.g. 2026-11"
        )
    if not (isinstance(output, str) and placeholder in output):
        raise SpecError(
            f"output: a scheduled release ({release!r}) needs {placeholder} in its output "
            "path too, so that each period publishes to its own place"
        )
    return release.replace(placeholder, period), output.replace(placeholder, period), period


def parse_spec(
    raw: Mapping[str, Any], base: str | os.PathLike[str] = ".", period: str | None = None
) -> ReleaseSpec:
    """Validate a spec given as a mapping; relative paths resolve against ``base``.

    Parameters
    ----------
    raw : mapping
        The spec, as read from YAML (see the module docstring).
    base : path-like
        The folder relative paths are relative to (the spec file's).

    Returns
    -------
    ReleaseSpec

    Raises
    ------
    SpecError
        For the first problem found, naming its dotted field (``privacy.dataset``) and,
        for an unknown key, the keys allowed there.
    """
    base = pathlib.Path(base).resolve()
    if not isinstance(raw, Mapping):
        raise SpecError("a release spec is a YAML mapping")
    known = set(SPEC_KEYS)
    unknown = sorted(set(raw) - known, key=str)
    if unknown:
        raise SpecError(f"unknown field(s) {unknown}; known fields are {sorted(known)}")
    release = str(require(raw, "release", "spec"))
    raw_output = require(raw, "output", "spec")
    release, output_text, period = _with_period(release, raw_output, period)
    if not _ID.match(release):
        raise SpecError(f"release: {release!r} must start with a letter and use [A-Za-z0-9_.-]")

    data = _data(require(raw, "data", "spec"), base)
    domain = parse_domain(require(raw, "domain", "spec"))
    levels = _levels(raw.get("levels"))
    workload = workloads(require(raw, "workload", "spec"), levels)

    pr = require(raw, "privacy", "spec")
    stated = parse_budget(pr, "privacy", PRIVACY_KEYS)
    neighbours = parse_neighbours(pr.get("neighbours"))
    privacy = charged_budget(stated, neighbours, "privacy")  # add/remove: what is charged
    split = parse_split(pr["split"], levels, privacy) if pr.get("split") is not None else None
    dataset_budget = None
    if pr.get("dataset") is not None:
        dataset_budget = charged_budget(
            parse_budget(pr["dataset"], "privacy.dataset"), neighbours, "privacy.dataset"
        )

    strategy, strategy_options, strategy_levels = strategies(raw.get("strategy", "hdmm"), levels)
    rec, integer, simulate, spine = reconstruction(raw.get("reconstruct", "ls"))
    passes, slack = reconstruction_passes(raw.get("reconstruct", "ls"))
    inv = parse_invariants(
        raw.get("invariants"), raw.get("constraints"), levels, domain, data.format
    )
    if spine and (strategy_levels is not None or "levels" in workload):
        raise SpecError(
            "reconstruct.spine: not with a workload or strategy per level (a spine level's "
            "budget moves to the level above, which needs one plan the levels split)"
        )
    output = as_path(output_text, base, "output")
    ledger, ledger_create = _ledger(raw.get("ledger"), output, base)
    cluster = parse_cluster(raw.get("cluster"), base)
    return ReleaseSpec(
        release=release, data=data, domain=domain, levels=levels, workload=workload,
        privacy=privacy, split=split, strategy=strategy, strategy_options=strategy_options,
        strategy_levels=strategy_levels, reconstruct=rec, integer=integer, simulate=simulate,
        spine=spine, output=output,
        ledger=ledger, dataset_budget=dataset_budget, cluster=cluster, ledger_create=ledger_create,
        period=period, neighbours=neighbours,
        stated_privacy=None if neighbours == ADD_REMOVE else stated, invariants=inv,
        passes=passes, slack=slack,
    )  # fmt: skip


def load_spec(path: str | os.PathLike[str], period: str | None = None) -> ReleaseSpec:
    """Read and validate a YAML release spec (for a scheduled one, of ``period``).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    SpecError
        If the YAML is malformed or not strict (:func:`dpdask.specs.read_spec`) or a
        field is invalid (the message names it).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no release spec at {path}")
    raw = read_spec(path)  # strict YAML: no repeated keys, anchors or aliases; size-capped
    spec = parse_spec(raw, base=path.parent, period=period)
    return ReleaseSpec(**{**spec.__dict__, "source": path.resolve()})
