"""The ``data`` keys of a ``format: records`` spec: the columns and the public universe.

The units a records release publishes are those of ``data.geographies``, read and
checked here, before any record is read (:func:`dpdask.store.geography_universe`);
the records are placed in it by :func:`dpdask.store.ingest_records`.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping
from typing import Any

from dpdask.errors import SpecError
from dpdask.pipeline._spec_fields import as_path

__all__ = ["records_options"]

_MIGRATION = (
    "data.geographies: required for format 'records': the units a release publishes must "
    "come from public input, never from the records (one person would add a unit). Add "
    "e.g. `geographies: geographies.csv` (one column per level, coarsest first, one row "
    "per finest unit) or `geographies: ['0101', '0102']` (the finest ids, their parents "
    "the prefixes of data.levels); records outside it are refused, or left out with "
    "`unknown_geography: drop`"
)


def _levels(value: Any) -> dict[str, int] | None:
    if value is None:
        return None
    ok = (
        isinstance(value, Mapping)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values())
    )
    if not ok:
        raise SpecError(
            "data.levels: expected {level: GEOID prefix length}, coarsest first (e.g. "
            "{state: 2, county: 5}); a parent table goes in data.geographies"
        )
    return {str(k): v for k, v in value.items()}


def records_options(
    d: Mapping[str, Any], base: pathlib.Path, skip: tuple[str, ...]
) -> dict[str, Any]:
    """The :func:`~dpdask.store.ingest_records` options of a records spec's ``data``
    (its keys already checked), with the universe read and checked.

    Parameters
    ----------
    d : mapping
        The spec's ``data`` mapping.
    base : pathlib.Path
        The folder a relative ``geographies`` path is relative to.
    skip : tuple of str
        The keys of ``data`` that are not ingestion options (``format``, ``path``, ``id``).

    Raises
    ------
    SpecError
        Naming ``data.geography_column``, ``data.levels``, ``data.geographies`` or
        ``data.unknown_geography``.
    """
    from dpdask.store import UNKNOWN_GEOGRAPHY, geography_universe

    opts = {k: v for k, v in d.items() if k not in skip}
    if opts.get("geography_column") is None:
        raise SpecError("data.geography_column: required for format 'records'")
    levels = _levels(opts.get("levels"))
    universe = opts.get("geographies")
    if universe is None:
        raise SpecError(_MIGRATION)
    if isinstance(universe, str):
        universe = opts["geographies"] = str(as_path(universe, base, "data.geographies"))
    elif not isinstance(universe, list | Mapping):
        raise SpecError(
            "data.geographies: expected a CSV file, a list of ids or {level: [ids]}, got "
            f"{universe!r}"
        )
    unknown = opts.get("unknown_geography", "refuse")
    if unknown not in UNKNOWN_GEOGRAPHY:
        raise SpecError(f"data.unknown_geography: {unknown!r} is not one of {UNKNOWN_GEOGRAPHY}")
    try:
        geography_universe(universe, levels)
    except (ValueError, FileNotFoundError) as exc:
        text = str(exc)
        rest = text[len("geographies") :] if text.startswith("geographies") else f": {text}"
        raise SpecError(f"data.geographies{rest}") from None
    return opts
