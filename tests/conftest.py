"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
from hypothesis import settings

from dpdask import Domain, Geography
from dpdask.noise import _samplers
from dpdask.store import write_store
from tests.helpers import DOMAIN

# Property tests draw the same examples on every run, so that CI is reproducible (a
# random draw once found a case outside what the oracles can check).
# HYPOTHESIS_PROFILE=explore draws fresh examples, to look for new failures.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator for test data (never for noise)."""
    return np.random.default_rng(20261122)


@pytest.fixture
def cph_domain() -> Domain:
    """The Census CPH person domain: 492,660 cells."""
    return Domain(sex=2, hisp=2, race=63, relation=17, age=115)


@pytest.fixture
def small_domain() -> Domain:
    return Domain(a=2, b=3, c=4)


@pytest.fixture
def no_float(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every floating-point noise sampler raises: what runs must use the exact ones."""

    def boom(*args, **kwargs):
        raise AssertionError("a floating-point sampler was called")

    for name in ("laplace", "gaussian", "correlated_gaussian"):
        monkeypatch.setattr(_samplers, name, boom)


@pytest.fixture
def store(tmp_path: pathlib.Path, rng: np.random.Generator):
    """A three-level data store (state, county, tract) of the 2 x 3 domain, and its counts."""
    parents_county = np.zeros(3, dtype=int)
    parents_tract = np.array([0, 0, 1, 2, 2, 2, 2])
    geo = Geography(
        levels=("state", "county", "tract"),
        ids=(("s",), ("c0", "c1", "c2"), tuple(f"t{i}" for i in range(7))),
        parents=(parents_county, parents_tract),
    )
    counts = rng.integers(0, 50, size=(7, 2, 3))
    return write_store(tmp_path / "in.zarr", counts, DOMAIN, geo, geo_chunk=2), counts


@pytest.fixture(scope="session")
def pg_server():
    """A throwaway PostgreSQL cluster for the session (``tests/pg_server.py``); the
    PostgreSQL tests skip, saying why, where none can be started."""
    from tests import pg_server as pg

    why = pg.unavailable()
    if why:
        pytest.skip(f"no PostgreSQL server for the ledger tests: {why}")
    server = pg.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_ledger(pg_server):
    """``(admin URL, operator URL, operator role)`` of a fresh, empty database."""
    return pg_server.new_ledger_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_location(request, tmp_path) -> str:
    """Where a new ledger goes, once per backend: a SQLite file, or a fresh database on
    the session's PostgreSQL server (its administrator's URL)."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.sqlite")
    admin, _operator, _role = request.getfixturevalue("pg_ledger")
    return admin
