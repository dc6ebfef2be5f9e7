"""Writing synthetic per-geography person histograms to zarr, chunk by chunk.

Each geography ``g`` is drawn from its own generator,
``np.random.Generator(np.random.PCG64([seed, 1, g]))``, and the populations from
``PCG64([seed, 0])``: a chunk's bytes depend only on the seed and the geographies
in it, so chunks can be written in parallel, in any order, with any chunk size,
and a run with fewer geographies is a prefix of a run with more. This is test
data, never noise: the seed is explicit and public.

A geography with population ``n`` and group mix ``w`` (Dirichlet around the RI
shares) gets ``counts ~ Multinomial(n, w @ bases)``, drawn exactly in two stages:
group sizes ``Multinomial(n, w)``, then each group's persons from its cell
distribution, by inverse-CDF sampling (``searchsorted`` of sorted uniforms on the
cumulative probabilities) when the group has fewer persons than the domain has
cells, or by NumPy's sequential-binomial multinomial when it has more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
import zarr.errors
import zarr.storage
from dask.base import compute, tokenize
from dask.delayed import delayed

from dpdask.datasets import _constants as C
from dpdask.datasets._model import PersonModel
from dpdask.domain import Domain, Geography
from dpdask.errors import ArgumentError, ArgumentTypeError, ShapeError

__all__ = ["SyntheticPersons", "draw_populations", "synthetic_block", "synthetic_persons"]

DTYPE = np.dtype(np.int32)
_POPULATION_STREAM = 0
_GEOGRAPHY_STREAM = 1
_CHUNK_BYTES = 64 * 2**20
_SEARCH_FRACTION = 1.0  # below K persons, inverse-CDF sampling beats the multinomial
_LOCAL_SCHEDULERS = ("sequential", "threads", "threading", "sync", "synchronous", "single-threaded")


@dataclass(frozen=True, eq=False)
class SyntheticPersons:
    """The result of :func:`synthetic_persons`.

    Attributes
    ----------
    array : zarr.Array
        Counts of shape ``(n_geographies, *domain.shape)``, int32, chunked along
        the geography axis only.
    geography : Geography
        A flat geography (level ``"county"``) whose ids are zero-padded indices.
    population : ndarray
        ``(n_geographies,)`` int64, the persons of each geography: the exact sum
        of its counts.
    """

    array: zarr.Array[Any]
    geography: Geography
    population: np.ndarray

    @property
    def domain(self) -> Domain:
        """The domain of the histograms."""
        meta: Any = self.array.attrs["dpdask"]
        return Domain(meta["domain"])


@dataclass(frozen=True, eq=False)
class _Spec:
    model: PersonModel
    cumulative: np.ndarray  # (8, K) cumulative sums of model.bases
    last: np.ndarray  # (8,) index of the last cell with positive probability
    population: np.ndarray
    seed: int
    concentration: float | None
    chunk: int


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ArgumentError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def _check_concentration(concentration: float | None) -> float | None:
    if concentration is None:
        return None
    if not float(concentration) > 0 or not np.isfinite(concentration):
        raise ArgumentError(
            f"concentration must be positive and finite, or None; got {concentration!r}"
        )
    return float(concentration)


def draw_populations(
    n_geographies: int,
    seed: int = 0,
    population: float | Sequence[int] | np.ndarray = C.POPULATION_MEDIAN,
) -> np.ndarray:
    """Populations of the geographies: lognormal like US counties, or given.

    Parameters
    ----------
    n_geographies : int
        Number of geographies.
    seed : int
        Non-negative seed; the populations come from ``PCG64([seed, 0])``.
    population : float or sequence of int
        A number is the median of the lognormal (log-sd 1.66, capped at 400 times
        the median; 25,000 gives US-county-like sizes up to 10 million). A sequence
        gives every geography's population exactly.

    Returns
    -------
    ndarray
        ``(n_geographies,)`` int64.

    Raises
    ------
    ArgumentError
        If a given population is negative, not an integer, of the wrong length, or
        could overflow an int32 count (``ShapeError`` for the wrong length).
    """
    seed = _check_seed(seed)
    limit = np.iinfo(DTYPE).max
    if np.ndim(population) == 0:
        median = float(population)  # type: ignore[arg-type]
        if not median > 0 or median * C.POPULATION_CAP > limit:
            raise ArgumentError(
                f"population median must be in (0, {limit / C.POPULATION_CAP:,.0f}], got {median!r}"
            )
        rng = np.random.Generator(np.random.PCG64([seed, _POPULATION_STREAM]))
        z = rng.standard_normal(n_geographies)
        sizes = np.minimum(median * np.exp(C.POPULATION_SIGMA * z), C.POPULATION_CAP * median)
        return np.rint(sizes).astype(np.int64)
    given = np.asarray(population)
    if given.shape != (n_geographies,):
        raise ShapeError(f"{n_geographies} geographies but {given.shape} populations")
    if given.size and not np.issubdtype(given.dtype, np.integer):
        if not np.all(np.mod(given, 1) == 0):
            raise ArgumentError("populations must be whole numbers")
    given = given.astype(np.int64)
    if given.size and (given.min() < 0 or given.max() > limit):
        raise ArgumentError(f"populations must lie in 0..{limit:,} (int32 counts)")
    return given


def _build_spec(
    domain: Domain, population: np.ndarray, seed: int, concentration: float | None, chunk: int
) -> _Spec:
    model = PersonModel.build(domain)
    cumulative = np.cumsum(model.bases, axis=1)
    positive = model.bases > 0
    last = model.bases.shape[1] - 1 - np.argmax(positive[:, ::-1], axis=1)
    return _Spec(model, cumulative, last, population, seed, concentration, chunk)


def _geography_counts(spec: _Spec, g: int, out: np.ndarray) -> None:
    """Add the persons of geography ``g`` into the flat int32 row ``out``."""
    rng = np.random.Generator(np.random.PCG64([spec.seed, _GEOGRAPHY_STREAM, g]))
    n = int(spec.population[g])
    shares = spec.model.shares
    if spec.concentration is None:
        mix = shares
    else:
        mix = rng.dirichlet(spec.concentration * shares)
    sizes = rng.multinomial(n, mix)
    n_cells = out.size
    for k in np.flatnonzero(sizes):
        m = int(sizes[k])
        if m < _SEARCH_FRACTION * n_cells:
            # Inverse CDF at m sorted uniforms: the normalised partial sums of m + 1
            # exponentials are distributed as the order statistics of m uniforms, and
            # sorted keys make the search cache-friendly and the counting a run-length.
            cum = spec.cumulative[k]
            sums = np.cumsum(rng.standard_exponential(m + 1))
            idx = np.searchsorted(cum, sums[:-1] * (cum[-1] / sums[-1]), side="right")
            np.minimum(idx, spec.last[k], out=idx)
            starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
            out[idx[starts]] += np.diff(np.r_[starts, m]).astype(DTYPE)
        else:
            # NumPy's multinomial gives the last category the remainder; put the most
            # likely cell last so that rounding in its running remainder stays harmless.
            p = spec.model.bases[k].copy()
            top = int(np.argmax(p))
            p[[top, -1]] = p[[-1, top]]
            drawn = rng.multinomial(m, p)
            drawn[[top, -1]] = drawn[[-1, top]]
            out += drawn.astype(DTYPE)


def _block(spec: _Spec, lo: int, hi: int) -> np.ndarray:
    """The counts of geographies ``lo..hi-1``: ``(hi - lo, K)`` int32."""
    block = np.zeros((hi - lo, spec.model.domain.size), dtype=DTYPE)
    for row, g in enumerate(range(lo, hi)):
        _geography_counts(spec, g, block[row])
    return block


def synthetic_block(
    domain: Domain,
    start: int,
    stop: int,
    *,
    seed: int = 0,
    population: float | Sequence[int] | np.ndarray = C.POPULATION_MEDIAN,
    concentration: float | None = C.CONCENTRATION,
) -> np.ndarray:
    """Geographies ``start..stop-1`` of :func:`synthetic_persons`, in memory.

    The result equals ``synthetic_persons(domain, n, seed=seed, ...).array[start:stop]``
    for any ``n >= stop`` with the same ``population`` and ``concentration``: it
    lets a caller generate any slab, in any order, without a store.

    Parameters
    ----------
    domain : Domain
        The histogram domain.
    start, stop : int
        The geographies, ``0 <= start <= stop``.
    seed, population, concentration
        As in :func:`synthetic_persons`; a population sequence must cover ``stop``.

    Returns
    -------
    ndarray
        ``(stop - start, *domain.shape)`` int32 counts.
    """
    if not 0 <= start <= stop:
        raise ArgumentError(f"need 0 <= start <= stop, got start={start}, stop={stop}")
    if np.ndim(population) == 0:
        pops = draw_populations(stop, seed, population)
    else:
        pops = draw_populations(len(population), seed, population)  # type: ignore[arg-type]
        if pops.size < stop:
            raise ShapeError(f"populations are given for {pops.size} geographies, need {stop}")
    concentration = _check_concentration(concentration)
    spec = _build_spec(domain, pops, _check_seed(seed), concentration, max(stop - start, 1))
    return _block(spec, start, stop).reshape((stop - start, *domain.shape))


def _write_chunk(array: zarr.Array[Any], spec: _Spec, index: int) -> int:
    lo = index * spec.chunk
    block = _block(spec, lo, min(lo + spec.chunk, spec.population.size))
    array[lo : lo + block.shape[0]] = block.reshape((block.shape[0], *spec.model.domain.shape))
    return int(block.sum(dtype=np.int64))


def _create_array(
    store: Any,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    attrs: dict[str, Any],
    overwrite: bool,
) -> zarr.Array[Any]:
    if store is None:
        store = zarr.storage.MemoryStore()
    try:
        return zarr.create_array(
            store,
            shape=shape,
            chunks=chunks,
            dtype=DTYPE,
            fill_value=0,
            attributes=attrs,
            overwrite=overwrite,
        )
    except (zarr.errors.ContainsArrayError, zarr.errors.ContainsGroupError) as exc:
        raise FileExistsError(
            f"the store {store!s} already holds zarr data; pass overwrite=True to replace it"
        ) from exc


def synthetic_persons(
    domain: Domain,
    n_geographies: int,
    store: Any = None,
    *,
    seed: int = 0,
    chunk: int | None = None,
    population: float | Sequence[int] | np.ndarray = C.POPULATION_MEDIAN,
    concentration: float | None = C.CONCENTRATION,
    scheduler: Any = "threads",
    overwrite: bool = False,
) -> SyntheticPersons:
    """Census-like person histograms of many geographies, written straight to zarr.

    Every geography's histogram on ``domain`` is a multinomial sample of its
    population over the synthetic person model of :mod:`dpdask.datasets._model`:
    an age pyramid over single years 0..114, a sex ratio by age, Hispanic origin
    and race from Rhode Island 2010 (the 63 race combinations coded as in
    :mod:`dpdask.census`), the 17 relationship categories fitted to age,
    and a race/ethnicity mix that varies between geographies. Attributes are
    matched by name (``sex``, ``hisp``, ``race``, ``relation``, ``age``,
    ``votingage``); other attributes are uniform, known ones of another size are
    top-coded or zero-extended. Geography sizes are lognormal like US counties.

    Memory stays bounded: each task holds one chunk (``chunk x domain.size`` int32)
    and at most ``num_workers`` tasks run at once, besides the model's two
    ``8 x domain.size`` float64 tables (63 MB on the CPH domain).

    Parameters
    ----------
    domain : Domain
        The histogram domain, e.g. the CPH domain (2 x 2 x 63 x 17 x 115).
    n_geographies : int
        Number of geographies (the leading axis).
    store : str, pathlib.Path, zarr store or None
        Where to write the array (its root); ``None`` for a new in-memory store.
    seed : int
        Non-negative seed. Same seed, same bytes, whatever the chunking, the
        scheduler or the order chunks are written in.
    chunk : int, optional
        Geographies per zarr chunk (and per task); by default about 64 MiB of
        int32 counts per chunk.
    population : float or sequence of int
        The median of the lognormal geography sizes (default 25,000), or every
        geography's population exactly.
    concentration : float or None
        Dirichlet concentration of each geography's race/ethnicity mix around the
        RI shares (default 10); ``None`` gives every geography the RI mix.
    scheduler : str or object
        ``"sequential"`` for a plain loop without Dask, otherwise passed to
        :func:`dask.compute` (default ``"threads"``, one task per chunk). An
        in-memory store needs a local scheduler (``"threads"``, ``"sync"``).
    overwrite : bool
        Replace zarr data already in ``store``; by default that is an error.

    Returns
    -------
    SyntheticPersons
        The zarr array (int32 counts; metadata under ``attrs["dpdask"]``), the
        geography and the population of each geography.

    Raises
    ------
    ArgumentError
        On a bad argument (the message names it); ``ArgumentTypeError`` for a
        ``domain`` that is not a :class:`~dpdask.Domain` or a non-integer ``n_geographies``.
    FileExistsError
        If ``store`` holds zarr data and ``overwrite`` is false.

    Notes
    -----
    Counts are int32: a cell holds at most one geography's population, far
    below 2**31 - 1, and signed counts subtract without wrapping around (noisy
    minus true, differences between releases), which unsigned counts would not.

    Examples
    --------
    >>> from dpdask import Domain
    >>> out = synthetic_persons(Domain(sex=2, age=115), 4, population=[10, 0, 250, 3], seed=7)
    >>> out.array.shape, str(out.array.dtype)
    ((4, 2, 115), 'int32')
    >>> out.array[:].sum(axis=(1, 2)).tolist()
    [10, 0, 250, 3]
    """
    if not isinstance(domain, Domain):
        raise ArgumentTypeError(f"domain must be a dpdask.Domain, got {type(domain).__name__}")
    if isinstance(n_geographies, bool) or not isinstance(n_geographies, int | np.integer):
        raise ArgumentTypeError(f"n_geographies must be an integer, got {n_geographies!r}")
    if n_geographies < 1:
        raise ArgumentError(f"n_geographies must be at least 1, got {n_geographies}")
    seed = _check_seed(seed)
    concentration = _check_concentration(concentration)
    if chunk is None:
        chunk = max(1, _CHUNK_BYTES // (domain.size * DTYPE.itemsize))
    if isinstance(chunk, bool) or not isinstance(chunk, int | np.integer) or chunk < 1:
        raise ArgumentError(f"chunk must be a positive integer, got {chunk!r}")
    chunk = int(min(chunk, n_geographies))
    in_memory = store is None or isinstance(store, zarr.storage.MemoryStore)
    if in_memory and scheduler not in _LOCAL_SCHEDULERS:
        raise ArgumentError(
            f"an in-memory store needs a local scheduler {_LOCAL_SCHEDULERS}, got {scheduler!r}"
        )
    pops = draw_populations(int(n_geographies), seed, population)
    attrs = {
        "dpdask": {
            "kind": "synthetic-persons",
            "domain": domain.to_dict(),
            "seed": seed,
            "concentration": concentration,
            "population_total": int(pops.sum()),
            "model": "dpdask.datasets ri2010 v1",
        }
    }
    array = _create_array(
        store, (int(n_geographies), *domain.shape), (chunk, *domain.shape), attrs, overwrite
    )
    spec = _build_spec(domain, pops, seed, concentration, chunk)
    n_chunks = -(-int(n_geographies) // chunk)
    if scheduler == "sequential":
        written = [_write_chunk(array, spec, i) for i in range(n_chunks)]
    else:
        token = tokenize(domain, pops, seed, concentration, chunk, str(array.store))
        spec_node = delayed(spec, name=f"synthetic-person-model-{token}")
        write = delayed(_write_chunk, pure=True)
        name = f"synthesize-persons-{token}"
        tasks = [write(array, spec_node, i, dask_key_name=(name, i)) for i in range(n_chunks)]
        written = list(compute(*tasks, scheduler=scheduler))  # type: ignore[no-untyped-call]
    if sum(written) != int(pops.sum()):  # pragma: no cover - a multinomial always sums to n
        raise RuntimeError(f"wrote {sum(written):,} persons, expected {int(pops.sum()):,}")
    width = max(6, len(str(int(n_geographies) - 1)))
    geography = Geography.flat([f"{g:0{width}d}" for g in range(n_geographies)], level="county")
    return SyntheticPersons(array=array, geography=geography, population=pops)
