"""Data and truth of ``dpdask bench topdown``: hierarchies, populations, streaming errors.

* :func:`hierarchy`: a synthetic geography of any depth from the finest units' count
  and the children per parent of each level; ids are zero-padded and GEOID-like
  (each unit's id is its parent's followed by its rank among its siblings), so units
  sort with the children of a parent contiguous;
* :func:`spread_populations`: finest-unit populations adding up exactly to a total;
* :func:`parse_workload`: ``NAME[:k=v,...]`` (or a JSON object) as a workload spec;
* :func:`level_errors`: the squared errors of published workload answers against the
  truth, level by level and chunk by chunk (``truth-<level>`` tasks): the true counts
  of a chunk are read sparse from the store (:meth:`~dpdask.store.DataStore.to_sparse`)
  or summed from the level below (:func:`~dpdask.store.aggregate_sparse`), the
  level's workload is applied to them (:func:`~dpdask.linalg.apply_rows`) and compared
  with the same rows of each release's ``answers``. No level's truth is ever held
  whole: memory grows with a chunk's entries (about four million).
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import dask
import numpy as np
import zarr
from dask.base import tokenize

from dpdask.domain import Geography
from dpdask.linalg import LinearQuery, apply_rows
from dpdask.store import DataStore, SparseCounts, aggregate_sparse, level_key

__all__ = [
    "TRUTH_ANSWER_CELLS",
    "TRUTH_ENTRIES",
    "hierarchy",
    "level_errors",
    "parse_fanout",
    "parse_workload",
    "spread_populations",
]

TRUTH_ENTRIES = 2**22
"""Entries (or dense cells) of true counts per truth task, about 100 MiB as COO."""
TRUTH_ANSWER_CELLS = 2**23
"""Workload answers per truth task (rows x queries), 64 MiB of float64."""


def parse_fanout(text: str | None, n_levels: int) -> list[float | None]:
    """Children per parent of each level below the top, from ``--fanout``.

    Parameters
    ----------
    text : str or None
        Comma-separated numbers (decimals are averages: ``61.6`` counties per
        state), the first of which may be ``*``: a single top unit. ``None`` gives
        ``*`` and then 10 per parent (one state, ten tracts per county).
    n_levels : int
        The number of levels (the list has one entry fewer).

    Returns
    -------
    list
        A float (at least 1) per level below the top; ``None`` for ``*``.

    Raises
    ------
    ValueError
        For the wrong number of entries or an entry below 1 (the message names it).

    Examples
    --------
    >>> parse_fanout(None, 3), parse_fanout("61.6,23", 3)
    ([None, 10.0], [61.6, 23.0])
    """
    if text is None:
        return [None, *[10.0] * (n_levels - 2)] if n_levels > 1 else []
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if len(parts) != n_levels - 1:
        raise ValueError(
            f"--fanout: {len(parts)} entries for {n_levels} levels; give one per level "
            "below the top"
        )
    out: list[float | None] = []
    for i, p in enumerate(parts):
        if p == "*" and i == 0:
            out.append(None)
            continue
        try:
            f = float(p)
        except ValueError:
            f = float("nan")
        if not f >= 1 or not np.isfinite(f):
            raise ValueError(f"--fanout: {p!r} is not a number >= 1 (only the first may be *)")
        out.append(f)
    return out


def _ids(parent_ids: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each unit's id: its parent's, then its 1-based rank among its siblings, zero-padded."""
    first = np.searchsorted(parent, parent, side="left")
    rank = np.arange(parent.size) - first + 1
    width = len(str(int(rank.max()) if rank.size else 1))
    return np.char.add(parent_ids[parent], np.char.zfill(rank.astype(str), width))


def hierarchy(levels: Sequence[str], fanout: Sequence[float | None], n_finest: int) -> Geography:
    """A synthetic hierarchy of ``n_finest`` finest units under ``levels``.

    Counts are worked out from the bottom: a level has ``round(n_below / fanout)``
    units (at least one, at most ``n_below``; one for a ``None`` fanout), and the
    units below are shared out evenly and in order (parent of child ``i`` is
    ``floor(i * n / n_below)``), so every parent has a child and children are
    contiguous.

    Parameters
    ----------
    levels : sequence of str
        Level names, top first.
    fanout : sequence of float or None
        Children per parent of each level below the top (:func:`parse_fanout`).
    n_finest : int
        Units of the finest level.

    Returns
    -------
    Geography

    Examples
    --------
    >>> g = hierarchy(["state", "county", "tract"], [None, 10.0], 25)
    >>> g
    Geography(state=1, county=3, tract=25)
    >>> g.ids[1], g.ids[2][:2], g.ids[2][-1]
    (('011', '012', '013'), ('0111', '0112'), '0138')
    """
    levels = list(levels)
    if len(fanout) != len(levels) - 1:
        raise ValueError(f"{len(fanout)} fanouts for {len(levels)} levels")
    if isinstance(n_finest, bool) or int(n_finest) != n_finest or n_finest < 1:
        raise ValueError(f"--geographies must be a positive integer, got {n_finest!r}")
    counts = [int(n_finest)]
    for f in reversed(fanout):
        below = counts[0]
        n = 1 if f is None else min(below, max(1, int(np.floor(below / f + 0.5))))
        counts.insert(0, n)
    width = max(2, len(str(counts[0])))
    ids = [np.char.zfill(np.arange(1, counts[0] + 1).astype(str), width)]
    parents = []
    for n_above, n in itertools.pairwise(counts):
        parent = (np.arange(n, dtype=np.int64) * n_above) // n
        parents.append(parent)
        ids.append(_ids(ids[-1], parent))
    return Geography(
        levels=tuple(levels),
        ids=tuple(tuple(x.tolist()) for x in ids),
        parents=tuple(parents),
    )


def spread_populations(
    n: int, total: int, *, sigma: float = 0.5, empty: float = 0.0, seed: int = 0
) -> np.ndarray:
    """Populations of ``n`` units adding up to exactly ``total``.

    A fraction ``empty`` of the units (drawn at random, never all) have no one; the
    others get ``total`` in proportion to lognormal weights of log-sd ``sigma``,
    rounded by largest remainders.

    Returns
    -------
    ndarray
        ``(n,)`` int64, summing to ``total``.

    Examples
    --------
    >>> p = spread_populations(1000, 40_000, sigma=1.0, empty=0.3, seed=1)
    >>> int(p.sum()), bool(0.25 < (p == 0).mean() < 0.35)
    (40000, True)
    """
    if isinstance(total, bool) or int(total) != total or total < 0:
        raise ValueError(f"--persons must be a non-negative integer, got {total!r}")
    if not 0 <= empty < 1:
        raise ValueError(f"--empty must be in [0, 1), got {empty!r}")
    if not sigma >= 0:
        raise ValueError(f"--spread must be non-negative, got {sigma!r}")
    rng = np.random.default_rng([int(seed), 0x70D0])
    weights = np.exp(sigma * rng.standard_normal(n))
    off = rng.random(n) < empty
    off[int(np.argmax(weights))] = False
    weights[off] = 0.0
    share = weights / weights.sum() * int(total)
    pops = np.floor(share).astype(np.int64)
    short = int(total) - int(pops.sum())
    if short:
        pops[np.argsort(pops - share, kind="stable")[:short]] += 1
    return pops


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_workload(text: str) -> dict[str, Any]:
    """A workload spec from ``NAME[:k=v,...]`` or a JSON object.

    Examples
    --------
    >>> parse_workload("marginals:k=2"), parse_workload('{"name": "pl94"}')
    ({'name': 'marginals', 'k': 2}, {'name': 'pl94'})
    """
    text = str(text).strip()
    if text.startswith("{"):
        spec = json.loads(text)
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValueError(f"workload {text!r}: a JSON workload needs a string 'name'")
        return spec
    name, _, rest = text.partition(":")
    if not name:
        raise ValueError(f"workload {text!r} has no name")
    spec: dict[str, Any] = {"name": name}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        k, eq, v = item.partition("=")
        if not eq or not k:
            raise ValueError(f"workload {text!r}: option {item!r} is not key=value")
        spec[k] = _value(v)
    return spec


def _chunks(weight: np.ndarray) -> tuple[int, ...]:
    """Consecutive chunks of units whose weights add up to about 1 (a heavier unit alone)."""
    if weight.size == 0:
        return ()
    ends = np.cumsum(weight)
    ids = np.floor(ends - weight + 1e-12).astype(np.int64)
    sizes = np.bincount(ids - ids[0])
    return tuple(int(s) for s in sizes[sizes > 0])


def _level_weights(store: DataStore, n_queries: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Per unit of each level: its share of a truth task (entries, answers)."""
    geo, cells = store.geography, store.domain.size
    if isinstance(store.counts, SparseCounts):
        finest = np.diff(store.counts.all_offsets).astype(np.float64)
    else:
        finest = np.full(geo.n_units(), float(cells))
    out = {}
    for lv in geo.levels:
        idx = geo.ancestor_index(lv)
        entries = np.minimum(np.bincount(idx, weights=finest, minlength=geo.n_units(lv)), cells)
        out[lv] = np.maximum(entries / TRUTH_ENTRIES, n_queries[lv] / TRUTH_ANSWER_CELLS)
    return out


def _block_errors(
    block: Any, W: LinearQuery, answers: Sequence[str], lo: int, hi: int
) -> tuple[np.ndarray, int]:
    """Sum of squared errors of each release's ``answers[lo:hi]`` on this block's truth."""
    truth = apply_rows(W, block)
    sse = np.empty(len(answers))
    for i, path in enumerate(answers):
        got = np.asarray(zarr.open_array(path, mode="r")[lo:hi], dtype=np.float64)
        sse[i] = float(np.sum((got - truth) ** 2))
    nnz = block.nnz if hasattr(block, "nnz") else np.count_nonzero(block)
    return sse, int(nnz)


def level_errors(
    store: DataStore,
    workloads: Mapping[str, LinearQuery],
    outputs: Mapping[str, str | os.PathLike],
) -> dict[str, dict[str, Any]]:
    """Squared errors of released workload answers against the store's truth, streaming.

    Parameters
    ----------
    store : DataStore
        The release's input (dense or sparse).
    workloads : mapping of level to LinearQuery
        The workload each level's ``answers`` answer.
    outputs : mapping of name to path
        Published releases of ``store`` (e.g. one per estimator), read at
        ``<path>/<level>/answers``.

    Returns
    -------
    dict
        Per level: ``sse`` (name -> sum of squared errors), ``values`` (answers
        compared: units x queries) and ``entries`` (non-zero true counts of the level).
        Computed with Dask's current scheduler.

    Raises
    ------
    ValueError
        If a release's answers do not have the level's units x queries.
    """
    geo = store.geography
    names = list(outputs)
    m = {lv: int(workloads[lv].shape[0]) for lv in geo.levels}
    paths = {lv: [str(pathlib.Path(outputs[k]) / lv / "answers") for k in names] for lv in m}
    for lv, ps in paths.items():
        for p in ps:
            shape = zarr.open_array(p, mode="r").shape
            if tuple(shape) != (geo.n_units(lv), m[lv]):
                raise ValueError(f"{p}: shape {shape}, expected ({geo.n_units(lv)}, {m[lv]})")
    weights = _level_weights(store, m)
    finest = geo.levels[-1]
    x = store.to_sparse(_chunks(weights[finest]))
    tasks = []
    token = tokenize(str(store.path), store.attrs.get("created"), names, paths)
    for depth in range(len(geo.levels) - 1, -1, -1):
        lv = geo.levels[depth]
        if lv != finest:
            chunks = _chunks(weights[lv])
            x = aggregate_sparse(x, geo.parents[depth], chunks, f"truth-{level_key(lv)}")
        W = dask.delayed(
            workloads[lv], name=f"truth-workload-{level_key(lv)}-{token}", traverse=False
        )
        bounds = np.cumsum((0, *x.chunks[0]))
        fn = dask.delayed(_block_errors, pure=True)
        key = f"truth-errors-{level_key(lv)}-{token}"
        for j, block in enumerate(x.to_delayed(optimize_graph=False).ravel()):
            lo, hi = int(bounds[j]), int(bounds[j + 1])
            tasks.append((lv, fn(block, W, paths[lv], lo, hi, dask_key_name=(key, j))))
    results = dask.compute(*(t for _, t in tasks))
    out: dict[str, dict[str, Any]] = {
        lv: {"sse": dict.fromkeys(names, 0.0), "values": geo.n_units(lv) * m[lv], "entries": 0}
        for lv in geo.levels
    }
    for (lv, _), (sse, nnz) in zip(tasks, results, strict=True):
        for k, v in zip(names, sse, strict=True):
            out[lv]["sse"][k] += float(v)
        out[lv]["entries"] += nnz
    return out
