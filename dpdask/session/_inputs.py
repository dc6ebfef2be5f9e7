"""A session's data as the input of a release spec, written into a private folder.

:class:`~dpdask.session.Session` runs every release through the spec door
(:func:`dpdask.pipeline.run.run_spec`), so its in-memory data becomes what a spec reads:

* a pandas DataFrame of person records -> ``records.csv`` (the geography column and the
  attribute columns only, nothing else of the frame) and ``geographies.csv`` (the
  declared public universe, one column per level), a ``format: records`` input;
* numpy counts or an xarray DataArray with a :class:`~dpdask.Geography` -> a data store
  ``counts.zarr``, a ``format: store`` input;
* the path of a data store -> that store, read in place.

The folder is the caller's (``0700``); files written here are ``0600``. The domain is
public, so it is never inferred from the values: integer-coded columns need their sizes,
categorical columns carry theirs in their dtype.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import pandas as pd

from dpdask.domain import Domain, Geography
from dpdask.errors import DataError, SpecError

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr

__all__ = [
    "SessionData",
    "SessionGeographies",
    "SessionInput",
    "UnknownGeography",
    "counts_dataset_id",
    "prepare_input",
    "universe_table",
]

#: a session's data: person records, counts ``(finest units, *domain)``, a DataArray of
#: counts, or the path of a data store
SessionData: TypeAlias = "pd.DataFrame | np.ndarray | xr.DataArray | str | os.PathLike[str]"
#: the public universe of units, as :func:`dpdask.store.geography_universe` takes it
SessionGeographies: TypeAlias = (
    Geography | Mapping[str, Sequence[str]] | pd.DataFrame | str | os.PathLike[str] | Sequence[str]
)
#: what to do with records outside the universe
UnknownGeography: TypeAlias = Literal["refuse", "drop"]

RECORDS_FILE = "records.csv"
UNIVERSE_FILE = "geographies.csv"
COUNTS_STORE = "counts.zarr"


@dataclass(frozen=True)
class SessionInput:
    """What a spec needs of a session's data.

    Attributes
    ----------
    data : dict
        The spec's ``data`` mapping (paths relative to the session's private folder).
    domain : Domain
        The attributes counted.
    geography : Geography
        The public universe: the units every release publishes, and its levels.
    """

    data: dict[str, Any]
    domain: Domain
    geography: Geography


def universe_table(geo: Geography) -> pd.DataFrame:
    """The parent table of ``geo``: one column per level (coarsest first), one row per
    finest unit with its ancestor at every level.

    Examples
    --------
    >>> from dpdask import Geography
    >>> geo = Geography.from_geoids(["0101", "0102", "0201"], {"state": 2, "county": 4})
    >>> universe_table(geo).to_dict("list")
    {'state': ['01', '01', '02'], 'county': ['0101', '0102', '0201']}
    """
    return pd.DataFrame(
        {
            lv: np.asarray(geo.ids[i], dtype=object)[geo.ancestor_index(lv)]
            for i, lv in enumerate(geo.levels)
        }
    )


def counts_dataset_id(counts: np.ndarray, domain: Domain, geo: Geography) -> str:
    """The default dataset id of in-memory counts: ``sha256-`` and 16 hex digits of a
    hash of the counts (as int64), the domain and the geography. The same counts are
    the same dataset, whichever session holds them (a store written from them records
    its creation time, so its bytes cannot name the dataset).

    Examples
    --------
    >>> from dpdask import Domain, Geography
    >>> geo, dom = Geography.flat(["a", "b"]), Domain(sex=2)
    >>> x = np.array([[1, 2], [3, 4]])
    >>> counts_dataset_id(x, dom, geo) == counts_dataset_id(x.astype("int32"), dom, geo)
    True
    >>> counts_dataset_id(x, dom, geo) == counts_dataset_id(x + 1, dom, geo)
    False
    """
    h = hashlib.sha256()
    meta = {
        "shape": list(counts.shape),
        "domain": domain.to_dict(),
        "levels": list(geo.levels),
        "ids": [list(map(str, ids)) for ids in geo.ids],
        "parents": [np.asarray(p).tolist() for p in geo.parents],
    }
    h.update(json.dumps(meta, sort_keys=True).encode() + b"\0")
    h.update(np.ascontiguousarray(counts, dtype="<i8").tobytes())
    return f"sha256-{h.hexdigest()[:16]}"


def _owner_file(path: pathlib.Path) -> None:
    os.chmod(path, 0o600)


def _domain_of(given: Domain | Mapping[str, int] | None) -> dict[str, int]:
    if given is None:
        return {}
    try:
        return dict(Domain(dict(given)).to_dict())
    except (TypeError, ValueError) as exc:
        raise SpecError(f"domain: {exc}") from None


def _records(
    frame: pd.DataFrame,
    folder: pathlib.Path,
    *,
    geography_column: str | None,
    geographies: SessionGeographies | None,
    levels: Mapping[str, int] | None,
    domain: Domain | Mapping[str, int] | None,
    attributes: Sequence[str] | None,
    unknown_geography: UnknownGeography,
) -> SessionInput:
    from dpdask.store import geography_universe

    if geography_column is None or geography_column not in frame.columns:
        raise SpecError(
            f"geography_column: name the records' geography column (one of {list(frame.columns)})"
        )
    if geographies is None:
        raise SpecError(
            "geographies: declare the public universe of units (a list of finest ids, "
            "{level: ids}, a parent table, a CSV path or a Geography); the units a release "
            "publishes never come from the records"
        )
    geo_col = frame[geography_column]
    if not (pd.api.types.is_object_dtype(geo_col) or pd.api.types.is_string_dtype(geo_col)) or (
        len(geo_col) and pd.api.types.infer_dtype(geo_col, skipna=True) not in ("string", "empty")
    ):
        raise DataError(
            f"column {geography_column!r}: geography ids must be text (numbers lose leading "
            "zeros); convert it with .astype(str) after padding"
        )
    attrs = (
        [c for c in frame.columns if c != geography_column]
        if attributes is None
        else list(attributes)
    )
    missing = [a for a in attrs if a not in frame.columns]
    if missing or not attrs:
        raise SpecError(f"attributes: {missing or 'none'} not among the columns")
    sizes, given = {}, _domain_of(domain)
    categories: dict[str, list[str]] = {}
    for a in attrs:
        col = frame[a]
        if isinstance(col.dtype, pd.CategoricalDtype):
            labels = [str(c) for c in col.cat.categories]
            if a in given and given[a] != len(labels):
                raise SpecError(
                    f"domain.{a}: {given[a]} but the column's categorical dtype has "
                    f"{len(labels)} categories"
                )
            sizes[a], categories[a] = len(labels), labels
        elif pd.api.types.is_integer_dtype(col):
            if a not in given:
                raise SpecError(
                    f"domain.{a}: give the size of integer-coded column {a!r} (the domain is "
                    "public: it is never read from the values), or make it categorical"
                )
            sizes[a] = given[a]
        else:
            raise DataError(
                f"column {a!r}: attributes are integer codes or pandas categoricals, not "
                f"{col.dtype}"
            )
    extra = sorted(set(given) - set(attrs))
    if extra:
        raise SpecError(f"domain: {extra} are not attribute columns {attrs}")
    try:
        geo = geography_universe(geographies, levels, level=geography_column)
    except (ValueError, FileNotFoundError) as exc:
        raise SpecError(str(exc)) from None
    out = frame[[geography_column, *attrs]].copy()
    for a in categories:  # labels, compared as text by the reader
        out[a] = out[a].astype(object).map(lambda v: "" if pd.isna(v) else str(v))
    path = folder / RECORDS_FILE
    out.to_csv(path, index=False, lineterminator="\n")
    _owner_file(path)
    table = folder / UNIVERSE_FILE
    universe_table(geo).to_csv(table, index=False, lineterminator="\n")
    _owner_file(table)
    data: dict[str, Any] = {
        "format": "records",
        "path": RECORDS_FILE,
        "geography_column": geography_column,
        "geographies": UNIVERSE_FILE,
        "unknown_geography": unknown_geography,
    }
    if levels is not None:
        data["levels"] = {str(k): int(v) for k, v in levels.items()}
    if categories:
        data["categories"] = categories
    return SessionInput(data, Domain(sizes), geo)


def _counts(
    values: Any,  # numpy counts, or an xarray DataArray (duck-typed: its dims)
    folder: pathlib.Path,
    *,
    geographies: SessionGeographies | None,
    domain: Domain | Mapping[str, int] | None,
    dataset: str | None,
) -> SessionInput:
    from dpdask.store import geography_universe, write_store

    if geographies is None:
        raise SpecError("geographies: counts need their Geography (one row per finest unit)")
    try:
        geo = geography_universe(geographies)
    except (ValueError, FileNotFoundError) as exc:
        raise SpecError(str(exc)) from None
    given = _domain_of(domain)
    if hasattr(values, "dims") and hasattr(values, "values"):  # an xarray DataArray
        dims = [str(d) for d in values.dims[1:]]
        sizes = dict(zip(dims, values.shape[1:], strict=True))
        if given and given != sizes:
            raise SpecError(f"domain: {given} but the array's dimensions are {sizes}")
        given = sizes
        first = values.dims[0]
        if first in values.coords:
            ids = [str(v) for v in np.asarray(values.coords[first])]
            if ids != list(geo.ids[-1]):
                raise SpecError(
                    f"geographies: the array's {first!r} coordinate is not the finest units "
                    "of the universe, in its order"
                )
        values = values.values
    if not given:
        raise SpecError("domain: give the attributes' sizes of numpy counts")
    dom = Domain(given)
    counts = np.asarray(values)
    if counts.ndim == 2 and counts.shape[1] == dom.size:
        counts = counts.reshape(counts.shape[0], *dom.shape)
    if counts.shape != (geo.n_units(), *dom.shape):
        raise SpecError(
            f"counts: shape {counts.shape} is not (finest units, *domain) = "
            f"{(geo.n_units(), *dom.shape)}"
        )
    write_store(folder / COUNTS_STORE, counts, dom, geo, source="dpdask.Session counts")
    data = {
        "format": "store",
        "path": COUNTS_STORE,
        "id": dataset or counts_dataset_id(counts, dom, geo),
    }
    return SessionInput(data, dom, geo)


def prepare_input(
    data: SessionData,
    folder: pathlib.Path,
    *,
    geography_column: str | None = None,
    geographies: SessionGeographies | None = None,
    levels: Mapping[str, int] | None = None,
    domain: Domain | Mapping[str, int] | None = None,
    attributes: Sequence[str] | None = None,
    dataset: str | None = None,
    unknown_geography: UnknownGeography = "refuse",
) -> SessionInput:
    """Write ``data`` into the private ``folder`` as a spec's input (module notes).

    Raises
    ------
    SpecError
        For a missing or inconsistent argument (named), before anything is written.
    DataError
        For a column of the wrong kind (its name, never its values).
    """
    from dpdask.store import open_store

    if isinstance(data, pd.DataFrame):
        found = _records(
            data, folder, geography_column=geography_column, geographies=geographies,
            levels=levels, domain=domain, attributes=attributes,
            unknown_geography=unknown_geography,
        )  # fmt: skip
    elif isinstance(data, str | os.PathLike):
        store = open_store(data)
        found = SessionInput(
            {"format": "store", "path": str(pathlib.Path(data).absolute())},
            store.domain,
            store.geography,
        )
    elif isinstance(data, np.ndarray) or hasattr(data, "dims"):
        found = _counts(data, folder, geographies=geographies, domain=domain, dataset=dataset)
    else:
        raise SpecError(
            "data: expected a pandas DataFrame of records, numpy counts, an xarray DataArray "
            f"or a data store's path, got {type(data).__name__}"
        )
    if dataset is not None:
        found.data["id"] = dataset
    return found
