"""A release level as a long table (one row per geography and query), and its export.

:func:`release_table` reads one level into a :class:`pandas.DataFrame` with the
columns :data:`COLUMNS`; :func:`export_release` (``dpdask export``) writes it, in
batches of units, to Parquet or CSV:

``geography``, ``parent``
    The unit's id and its parent's id (missing at the top level).
``query``
    The workload row (``race-single_003``) or P.L. 94-171 cell (``P1_001``).
``label``
    What it counts, in words: the workload row's ``query_description``
    (``"votingage=18 years and over"``, categories by name) or the Census's line label
    (``"18 years and over: Not Hispanic or Latino: White alone"``).
``answer``, ``variance``, ``moe90``
    The published answer, its variance and 90% margin of error (``1.645 * sqrt``).

Geography ids in CSV
    Ids such as ``"010000"`` look like numbers, and :func:`pandas.read_csv` infers a
    column's type from its values whether or not they are quoted, so with no options
    it would read ``10000``. A CSV export therefore writes ``geography`` and ``parent``
    as ``<level>:<id>`` (``tract:44007000101``, parent ``county:44007``): never
    numeric, read back as strings by any tool, the id after the first ``:``
    (``df.geography.str.split(":", n=1).str[1]``). ``ids="plain"`` writes the bare
    ids, to be read with ``dtype={"geography": str, "parent": str}``. Parquet stores
    them as strings, bare.

Provenance
    The release, run id, budget, dataset, the release's and the exporter's dpdask
    versions, the ledger's head and id, the level and the levels (coarsest first) go
    into the Parquet file's key-value metadata (``pyarrow.parquet.read_schema(path)
    .metadata``: key ``dpdask`` holds them all as JSON; ``release``, ``run_id``,
    ``budget``, ``dpdask_version`` and ``ledger_head`` are also keys of their own) and,
    for CSV, into a sidecar ``OUT.csv-metadata.json`` (the W3C "CSV on the Web"
    metadata name and vocabulary: columns, their types and descriptions, and the
    provenance under ``dpdask``).
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dpdask.errors import ArgumentError, DomainError, StoreExistsError
from dpdask.publish._labels import QUERY_DIM

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "COLUMNS",
    "MOE90_Z",
    "check_release",
    "export_release",
    "provenance",
    "query_spaces",
    "release_table",
    "sidecar_path",
]

MOE90_Z = 1.645
"""Normal quantile of a 90% margin of error: ``moe90 = 1.645 * sqrt(variance)`` (as ACS)."""

COLUMNS: tuple[str, ...] = (
    "geography", "parent", "query", "label", "answer", "variance", "moe90",
)  # fmt: skip
"""Columns of :func:`release_table` and of ``dpdask export``."""

_DESCRIPTIONS = {
    "geography": "the geography unit's id",
    "parent": "the id of the unit's parent (empty at the top level)",
    "query": "the query: a workload row ({part}_{row:03d}) or a P.L. 94-171 cell (P1_001)",
    "label": "what the query counts",
    "answer": "the published answer (persons)",
    "variance": "the published variance (persons^2) of the estimator uncertainty_of names",
    "moe90": "its 90% margin of error, 1.645 * sqrt(variance) (persons)",
}
_ROWS_PER_BATCH = 1_000_000  # rows of the long table built in memory at once
_OLD_QUERY = "query"  # the workload's label array in releases written before


def check_release(path: str | os.PathLike[str]) -> pathlib.Path:
    """``path`` as a path, if a dpdask release is there.

    Raises
    ------
    FileNotFoundError
        If nothing is at ``path``.
    dpdask.errors.ArgumentError
        If ``path`` is not a dpdask release (a ``ValueError``).
    """
    from dpdask.publish._safety import release_attributes

    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no release at {path}")
    if release_attributes(path) is None:
        raise ArgumentError(f"{path} is not a dpdask release (no dpdask release attributes)")
    return path


def provenance(path: str | os.PathLike[str], level: str | None = None) -> dict[str, Any]:
    """Where an export's numbers come from: the release's record, for file metadata.

    Parameters
    ----------
    path : str or path-like
        The release.
    level : str, optional
        The level exported.

    Returns
    -------
    dict
        ``release``, ``run_id``, ``dataset``, ``budget`` (as the ledger writes it),
        ``workload`` (its name, if recognised), ``test_mode``, ``created``,
        ``dpdask_version`` (that wrote the release), ``export_dpdask_version``,
        ``exported``, ``ledger_head``, ``ledger_id``, ``level``, ``levels`` (coarsest
        first), ``source`` (the release's path) and ``uncertainty_of`` (what the
        variances and margins are of: :mod:`dpdask.graph`'s label of the estimator).
    """
    from dpdask import __version__
    from dpdask.publish._safety import release_attributes

    meta = release_attributes(check_release(path)) or {}
    ledger = meta.get("ledger") or {}
    workload = meta.get("workload") or {}
    return {
        "release": meta.get("release"),
        "run_id": meta.get("run_id"),
        "dataset": meta.get("dataset"),
        "budget": meta.get("budget"),
        "workload": workload.get("name") if isinstance(workload, dict) else None,
        "test_mode": meta.get("test_mode"),
        "created": meta.get("created"),
        "dpdask_version": meta.get("dpdask_version"),
        "export_dpdask_version": __version__,
        "exported": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "ledger_head": ledger.get("head"),
        "ledger_id": ledger.get("id"),
        "level": level,
        "levels": [lv.get("level") for lv in meta.get("levels") or [] if isinstance(lv, dict)],
        "source": str(pathlib.Path(path).resolve()),
        "uncertainty_of": meta.get("uncertainty_of"),
    }


def _labels(group: Any, name: str) -> np.ndarray:
    if name not in group:
        return np.array([], dtype=str)
    return np.array(np.asarray(group[name][:]).tolist(), dtype=str)  # from numpy's StringDType


def _select(
    wanted: Sequence[str] | None, available: Sequence[np.ndarray], what: str
) -> list[np.ndarray]:
    """Indices into each label array of the labels wanted (all if ``None``), in their order."""
    if wanted is None:
        return [np.arange(a.size) for a in available]
    picks: list[list[int]] = [[] for _ in available]
    where: dict[str, tuple[int, int]] = {}
    for k, a in enumerate(available):
        for i, lab in enumerate(a.tolist()):
            where.setdefault(lab, (k, i))
    missing = [w for w in wanted if w not in where]
    if missing:
        raise ArgumentError(f"unknown {what}(s) {missing[:5]}")
    for w in dict.fromkeys(wanted):
        k, i = where[w]
        picks[k].append(i)
    return [np.asarray(p, dtype=np.int64) for p in picks]


def query_spaces(g: Any) -> list[tuple[str, str, str, str, str]]:
    """The arrays of a published level's queries, workload rows first, then Census
    table cells (their labels never overlap).

    Parameters
    ----------
    g : zarr.Group
        The level's group.

    Returns
    -------
    list of (labels, descriptions, answers, variances, kind)
        Array names; ``kind`` is ``"part"`` (the workload: labels ``workload_query``,
        or ``query`` in releases written before) or ``"table"`` (``table_query``).
    """
    label = QUERY_DIM if QUERY_DIM in g else _OLD_QUERY
    spaces = [
        (label, "query_description", "answers", "variance", "part"),
        ("table_query", "table_description", "table_answers", "table_variance", "table"),
    ]
    return [s for s in spaces if s[0] in g and s[2] in g]


def _batches(
    path: str | os.PathLike[str],
    level: str,
    queries: Sequence[str] | None,
    geographies: Sequence[str] | None,
) -> Iterator[pd.DataFrame]:
    import pandas as pd
    import zarr

    from dpdask.publish.reader import level_order

    path = check_release(path)
    root = zarr.open_group(str(path), mode="r")
    levels = level_order(dict(root.attrs), [name for name, _ in root.groups()])
    if level not in levels:
        raise DomainError(f"the release has no level {level!r}; its levels are {levels}")
    g: Any = root[level]  # a zarr.Group
    ids = _labels(g, "ids")
    parent = _labels(g, "parent_id") if "parent_id" in g else None
    spaces = [s[:4] for s in query_spaces(g)]
    picks = _select(queries, [_labels(g, s[0]) for s in spaces], "query label")
    (units,) = _select(geographies, [ids], f"{level} id")
    n_q = sum(p.size for p in picks)
    step = max(1, _ROWS_PER_BATCH // max(1, n_q))
    texts = []
    for (_, desc, _, _), q in zip(spaces, picks, strict=True):
        d = _labels(g, desc)
        texts.append(d[q] if d.size else np.full(q.size, "", dtype=str))
    for start in range(0, units.size, step):
        u = units[start : start + step]
        frames = []
        for (label, _, ans, var), q, text in zip(spaces, picks, texts, strict=True):
            if not q.size:
                continue
            a = np.asarray(g[ans].get_orthogonal_selection((u, q)))
            if g[var].ndim == 1:  # one variance per query for every unit of the level
                v = np.broadcast_to(np.asarray(g[var].get_orthogonal_selection((q,))), a.shape)
            else:
                v = np.asarray(g[var].get_orthogonal_selection((u, q)))
            frames.append(
                pd.DataFrame(
                    {
                        "geography": np.repeat(ids[u], q.size),
                        "parent": np.repeat(parent[u], q.size) if parent is not None else None,
                        "query": np.tile(_labels(g, label)[q], u.size),
                        "label": np.tile(text, u.size),
                        "answer": a.ravel(),
                        "variance": v.ravel(),
                        "moe90": MOE90_Z * np.sqrt(v.ravel()),
                    }
                )
            )
        if frames:
            df = pd.concat(frames, ignore_index=True)
            # unit by unit, queries in the order asked (workload rows before table cells)
            yield df.sort_values("geography", kind="stable", key=_order(ids[u]))


def _order(ids: np.ndarray) -> Callable[[pd.Series], pd.Series]:
    rank = {v: i for i, v in enumerate(ids.tolist())}
    return lambda s: s.map(rank)


def release_table(
    path: str | os.PathLike[str],
    level: str,
    *,
    queries: Sequence[str] | None = None,
    geographies: Sequence[str] | None = None,
) -> pd.DataFrame:
    """A level's answers as a long table: one row per geography unit and query.

    Parameters
    ----------
    path : str or path-like
        The release.
    level : str
        The geography level (a group of the release).
    queries : sequence of str, optional
        Query labels (workload rows such as ``race-single_003``, or P.L. 94-171 cells
        such as ``P1_001``); default every workload row and table cell.
    geographies : sequence of str, optional
        Unit ids of the level; default all.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS` (module notes): ``geography`` (id), ``parent`` (the
        parent's id; missing at the top level), ``query``, ``label``, ``answer``,
        ``variance`` and ``moe90`` (``1.645 * sqrt(variance)``, the 90% margin of error).

    Raises
    ------
    dpdask.errors.ArgumentError
        If the level (:class:`~dpdask.errors.DomainError`), a query label or a
        geography id is unknown, or ``path`` is not a dpdask release (a ``ValueError``).
    """
    import pandas as pd

    frames = list(_batches(path, level, queries, geographies))
    if not frames:
        return pd.DataFrame({c: [] for c in COLUMNS})
    return pd.concat(frames, ignore_index=True)[list(COLUMNS)]


def sidecar_path(out: str | os.PathLike[str]) -> pathlib.Path:
    """The CSV export's metadata file: ``OUT.csv`` -> ``OUT.csv-metadata.json``."""
    out = pathlib.Path(out)
    return out.with_name(f"{out.name}-metadata.json")


def _marked(df: pd.DataFrame, level: str, parent_level: str | None) -> pd.DataFrame:
    """CSV ids as ``<level>:<id>`` (module notes)."""
    df = df.copy()
    df["geography"] = f"{level}:" + df["geography"].astype(str)
    if parent_level is not None:
        df["parent"] = f"{parent_level}:" + df["parent"].astype(str)
    return df


def _sidecar(out: pathlib.Path, prov: dict[str, Any], ids: str, rows: int) -> dict[str, Any]:
    level, parent = prov["level"], prov.get("parent_level")
    marked = ids == "level"
    types = {"answer": "double", "variance": "double", "moe90": "double"}
    columns = []
    for c in COLUMNS:
        col: dict[str, Any] = {
            "name": c, "titles": c, "datatype": types.get(c, "string"),
            "dc:description": _DESCRIPTIONS[c],
        }  # fmt: skip
        if c == "parent":
            col["null"] = ""
        if marked and c in ("geography", "parent") and (c == "geography" or parent):
            col["dc:description"] += f"; written as '{level if c == 'geography' else parent}:<id>'"
        columns.append(col)
    return {
        "@context": "http://www.w3.org/ns/csvw",
        "url": out.name,
        "dc:title": f"dpdask release {prov['release']}, level {level}",
        "dc:source": prov["source"],
        "tableSchema": {"columns": columns},
        "dpdask": {
            **prov,
            "rows": rows,
            "ids": (
                "geography and parent are '<level>:<id>' so that they are never read as "
                "numbers: the id is the text after the first ':'"
                if marked
                else "geography and parent are the bare ids: read them as strings, "
                "pandas.read_csv(path, dtype={'geography': str, 'parent': str})"
            ),
        },
    }


def export_release(
    path: str | os.PathLike[str],
    level: str,
    out: str | os.PathLike[str],
    format: str = "parquet",
    *,
    queries: Sequence[str] | None = None,
    geographies: Sequence[str] | None = None,
    overwrite: bool = False,
    ids: str = "level",
) -> int:
    """Write :func:`release_table` to a Parquet or CSV file, in batches of units.

    Parameters
    ----------
    path : str or path-like
        The release.
    level : str
        The geography level.
    out : str or path-like
        The file to write (written under a temporary name and renamed when complete);
        ``"-"`` writes CSV to standard output (without the metadata file).
    format : {"parquet", "csv"}
        The file format; Parquet carries the provenance in its key-value metadata, CSV
        in ``OUT.csv-metadata.json`` beside it (module notes).
    queries, geographies : sequence of str, optional
        As :func:`release_table`.
    overwrite : bool
        Replace an existing ``out`` (and its metadata file).
    ids : {"level", "plain"}
        How CSV writes ``geography`` and ``parent``: ``<level>:<id>`` (default; read
        back as strings by :func:`pandas.read_csv` with no options) or bare.

    Returns
    -------
    int
        The number of rows written.

    Raises
    ------
    dpdask.errors.ArgumentError
        For an unknown format, id style, level (:class:`~dpdask.errors.DomainError`),
        query or geography (a ``ValueError``; nothing is written).
    dpdask.store.StoreExistsError
        If ``out`` (or its metadata file) exists and ``overwrite`` is false (a
        ``FileExistsError`` and a ``ValueError``).
    """
    import sys

    if format not in ("parquet", "csv"):
        raise ArgumentError(f"format {format!r} is not one of parquet, csv")
    if ids not in ("level", "plain"):
        raise ArgumentError(f"ids {ids!r} is not one of level, plain")
    if str(out) == "-" and format != "csv":
        raise ArgumentError("only csv can be written to standard output")
    prov = provenance(path, level)
    levels = prov["levels"]
    k = levels.index(level) if level in levels else -1
    prov["parent_level"] = levels[k - 1] if k > 0 else None
    batches = _batches(path, level, queries, geographies)
    first = next(batches, None)  # checks the level, queries and ids before writing

    def rows() -> Iterator[pd.DataFrame]:
        for df in itertools.chain([] if first is None else [first], batches):
            df = df[list(COLUMNS)]
            if format == "csv" and ids == "level":
                df = _marked(df, level, prov["parent_level"])
            yield df

    if str(out) == "-":
        n, header = 0, True
        for df in rows():
            df.to_csv(sys.stdout, index=False, header=header)
            n, header = n + len(df), False
        if header:
            print(",".join(COLUMNS))
        return n
    target = pathlib.Path(out)
    side = sidecar_path(target) if format == "csv" else None
    for existing in (target, side):
        if existing is not None and existing.exists() and not overwrite:
            raise StoreExistsError(f"{existing} exists; choose another --out (or --overwrite)")
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    side_tmp = None if side is None else side.with_name(f".{side.name}.partial-{os.getpid()}")
    try:
        n = _write_parquet(tmp, rows(), prov) if format == "parquet" else _write_csv(tmp, rows())
        if side is not None and side_tmp is not None:
            side_tmp.write_text(json.dumps(_sidecar(target, prov, ids, n), indent=2) + "\n")
            os.replace(side_tmp, side)
        os.replace(tmp, target)
    finally:
        for partial in (tmp, side_tmp):
            if partial is not None and partial.exists():
                partial.unlink()
    return n


def _write_csv(tmp: pathlib.Path, frames: Iterator[pd.DataFrame]) -> int:
    n = 0
    with open(tmp, "w", newline="") as f:
        f.write(",".join(COLUMNS) + "\n")
        for df in frames:
            df.to_csv(f, index=False, header=False)
            n += len(df)
    return n


def _write_parquet(tmp: pathlib.Path, frames: Iterator[pd.DataFrame], prov: dict[str, Any]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = [(c, pa.float64() if c in ("answer", "variance", "moe90") else pa.string())
              for c in COLUMNS]  # fmt: skip
    meta = {
        "dpdask": json.dumps(prov),
        **{k: json.dumps(prov[k]) if k == "budget" else str(prov[k] or "")
           for k in ("release", "run_id", "budget", "dpdask_version", "ledger_head")},
    }  # fmt: skip
    schema = pa.schema(fields, metadata=meta)
    n = 0
    with pq.ParquetWriter(tmp, schema) as writer:
        for df in frames:
            table = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
            writer.write_table(table)
            n += len(df)
    return n
