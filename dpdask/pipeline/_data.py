"""The input of a release spec: its fingerprint, its dataset id, and its data as a store.

Inputs that need converting (P.L. 94-171 files, the Rhode Island 2010 block file,
person records, synthetic data) are converted into the run's private work folder under
a name keyed to the source's fingerprint; :mod:`dpdask.pipeline.run` uses these. A
P.L. 94-171 file's store carries its blocks' housing units and group-quarters
population, synthetic blocks' their housing units, facilities and group-quarters
population, as public unit attributes (:meth:`dpdask.store.DataStore.unit_attribute`).
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from dpdask.census import pl94_full_domain
from dpdask.domain import Geography
from dpdask.pipeline._spec_fields import synthetic_blocks_options
from dpdask.pipeline.spec import ReleaseSpec, SpecError
from dpdask.store import (
    DataStore,
    SourcePrint,
    fingerprint_options,
    fingerprint_path,
    open_store,
    private_dir,
    read_pl94_file,
    read_ri2010,
    write_store,
)

__all__ = [
    "check_input",
    "data_geography",
    "data_path",
    "dataset_id",
    "generated_geography",
    "load_data",
    "plan_geography",
    "source_print",
    "synthetic_geography",
]


def synthetic_geography(n_units: int, n_states: int) -> Geography:
    """A state > county hierarchy with ``n_units`` counties in ``n_states`` contiguous states."""
    n_states = max(1, min(n_states, n_units))
    sizes = np.diff(np.linspace(0, n_units, n_states + 1).round().astype(int))
    parent = np.repeat(np.arange(n_states), sizes)
    states = tuple(f"{s + 1:02d}" for s in range(n_states))
    counties = tuple(f"{states[p]}{i:04d}" for i, p in enumerate(parent))
    return Geography(levels=("state", "county"), ids=(states, counties), parents=(parent,))


def source_print(spec: ReleaseSpec) -> SourcePrint:
    """The fingerprint of the spec's input (its files' bytes, or the synthetic options)."""
    if spec.data.format.startswith("synthetic"):
        return fingerprint_options(
            spec.data.format, {**spec.data.options, "domain": spec.domain.to_dict()}
        )
    if spec.data.path is None or not spec.data.path.exists():
        raise SpecError(f"data.path: {spec.data.path} does not exist")
    return fingerprint_path(spec.data.path)


def data_path(spec: ReleaseSpec) -> pathlib.Path:
    """The spec's ``data.path``, which every format but ``synthetic`` requires."""
    if spec.data.path is None:
        raise SpecError(f"data.path: required for format {spec.data.format!r}")
    return spec.data.path


def check_input(spec: ReleaseSpec) -> None:
    """Refuse a spec whose input is missing, or synthetic blocks on another domain than
    ``pl94-full``, before a cluster starts or a ledger opens."""
    fmt = spec.data.format
    if not fmt.startswith("synthetic") and (spec.data.path is None or not spec.data.path.exists()):
        raise SpecError(f"data.path: {spec.data.path} does not exist")
    if fmt == "synthetic-blocks" and spec.domain != pl94_full_domain():
        raise SpecError(
            f"domain: data of format 'synthetic-blocks' is on the pl94-full domain, not "
            f"{spec.domain}"
        )


def generated_geography(spec: ReleaseSpec) -> Geography | None:
    """The geography of generated data (``synthetic``, ``synthetic-blocks``) from the
    spec's options alone, without drawing anything; ``None`` for other formats."""
    from dpdask.store import block_geography

    fmt = spec.data.format
    if fmt == "synthetic":
        n = int(spec.data.options.get("geographies", 50))
        return synthetic_geography(n, int(spec.data.options.get("states", max(1, round(n / 60)))))
    if fmt == "synthetic-blocks":
        check_input(spec)
        return block_geography(synthetic_blocks_options(spec.data.options)["blocks"])
    return None


def plan_geography(spec: ReleaseSpec) -> Geography | None:
    """The spec's geography when it is known without reading counts: synthetic data's
    (from the spec's options), a store's (its metadata) or a P.L. 94-171 file's (its
    geographic header, public); ``None`` otherwise, or when the input is not there."""
    generated = generated_geography(spec)
    if generated is not None:
        return generated
    path = spec.data.path
    if path is None or not path.exists():
        return None
    if spec.data.format == "store":
        from dpdask.store import open_store

        return open_store(path).geography
    if spec.data.format == "pl94":
        from dpdask.store import pl94_geography

        return pl94_geography(path)
    return None


def data_geography(
    spec: ReleaseSpec, work: pathlib.Path, source: SourcePrint | None = None
) -> tuple[Geography, tuple[str, ...]]:
    """The geography of the spec's data and the unit attributes it carries, as
    ``validate`` checks them: generated geographies without drawing the data, P.L. 94-171
    files read (and checked) in memory, other inputs converted into ``work``."""
    from dpdask.store import read_pl94_file

    fmt = spec.data.format
    generated = generated_geography(spec)
    if generated is not None:
        if fmt == "synthetic-blocks":
            return generated, ("gq_facilities", "gq_population", "housing_units")
        return generated, ()
    if fmt == "pl94":
        pl = read_pl94_file(data_path(spec))
        if pl.domain != spec.domain:
            raise SpecError(f"domain: the spec says {spec.domain} but the data has {pl.domain}")
        return pl.geography, tuple(sorted(pl.unit_attributes))
    store = load_data(spec, work, source)
    return store.geography, store.unit_attribute_names


def dataset_id(spec: ReleaseSpec, source: SourcePrint | None = None) -> str:
    """The dataset a spec's releases are charged to: ``data.id``, or the content
    fingerprint of the input."""
    return spec.data.id or (source or source_print(spec)).dataset_id


def load_data(
    spec: ReleaseSpec, work: pathlib.Path, source: SourcePrint | None = None
) -> DataStore:
    """Open the spec's data as a store; inputs that need converting (P.L. 94-171 files,
    the Rhode Island 2010 block file, records, synthetic data) are converted into the
    private folder ``work``, under a name keyed to the source's fingerprint (a changed
    source is converted again).
    """
    fmt = spec.data.format
    layout = str(spec.data.options.get("layout", "auto"))
    if fmt == "store":
        store = open_store(data_path(spec))
    else:
        source = source or source_print(spec)
        cached = private_dir(work) / source.cache_name
        if cached.exists():
            store = open_store(cached)
        elif fmt == "pl94":  # P1-P4 as counts, H1 and P5 as public block attributes
            pl = read_pl94_file(data_path(spec))
            store = write_store(
                cached, pl.counts, pl.domain, pl.geography, layout=layout,
                source=f"P.L. 94-171 ({pl.vintage} format) {spec.data.path}",
                unit_attributes=pl.unit_attributes,
            )  # fmt: skip
        elif fmt == "ri2010":
            counts, domain, geo = read_ri2010(data_path(spec))
            origin = f"RI 2010 blocks (ALARM Project, CC BY-SA 4.0) {spec.data.path}"
            store = write_store(cached, counts, domain, geo, source=origin, layout=layout)
        elif fmt == "synthetic":
            store = _synthetic_store(spec, cached)
        elif fmt == "synthetic-blocks":
            from dpdask.store import synthetic_blocks_store

            check_input(spec)
            sizes = synthetic_blocks_options(spec.data.options)
            store = synthetic_blocks_store(
                cached, sizes["blocks"], sizes["persons"], seed=sizes["seed"]
            )
        elif fmt == "records":
            from dpdask.store import ingest_records

            opts = dict(spec.data.options)
            for key in ("geography_column", "geographies"):  # parse_spec names the fix
                if key not in opts:
                    raise SpecError(f"data.{key}: required for format 'records'")
            store = ingest_records(spec.data.path, spec.domain, store=cached, **opts)
        else:  # pragma: no cover - parse_spec refuses other formats
            raise SpecError(f"data.format: {fmt!r}")
        _owner_only(cached)
    if store.domain != spec.domain:
        raise SpecError(f"domain: the spec says {spec.domain} but the data has {store.domain}")
    return store


def _owner_only(path: pathlib.Path) -> None:
    """Close a converted copy of the input to everyone but its owner (folders 0700,
    files 0600), whatever the umask it was written under."""
    for root, _dirs, files in os.walk(path):
        os.chmod(root, 0o700)
        for name in files:
            f = os.path.join(root, name)
            if not os.path.islink(f):
                os.chmod(f, 0o600)


def _synthetic_store(spec: ReleaseSpec, path: pathlib.Path) -> DataStore:
    """The spec's synthetic data (:func:`dpdask.store.synthetic_store`) in the layout
    ``data.layout`` names; ``auto`` is the smaller for the drawn populations (a unit
    fills at most as many cells as it has persons)."""
    from dpdask.datasets import draw_populations
    from dpdask.store import prefer_dense, synthetic_store

    opts = dict(spec.data.options)
    n = int(opts.get("geographies", 50))
    geo = synthetic_geography(n, int(opts.get("states", max(1, round(n / 60)))))
    seed, median = int(opts.get("seed", 0)), float(opts.get("population", 25_000))
    layout = str(opts.get("layout", "auto"))
    if layout == "auto":
        most = int(np.minimum(draw_populations(n, seed, median), spec.domain.size).sum())
        layout = "dense" if prefer_dense(most, n, spec.domain.size, 4) else "sparse"
    return synthetic_store(path, spec.domain, geo, seed=seed, population=median, layout=layout)
