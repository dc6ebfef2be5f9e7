"""No float noise on the release path: whole releases on the lattice.

The float samplers are replaced by ones that raise (the ``no_float`` fixture) and a
whole release runs, with a real key and ledger, on an integral and a fractional
strategy under both mechanisms (the lattice itself: ``tests/unit/test_lattice.py``).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import zarr

from dpdask import Geography
from dpdask.graph import release
from dpdask.noise import new_key
from dpdask.privacy import Ledger
from dpdask.store import write_store
from tests.unit.test_lattice import DOMAIN, FRACTIONAL, INTEGRAL, _plan


def _store(tmp_path: pathlib.Path, counts: np.ndarray):
    geo = Geography(
        levels=("state", "county"),
        ids=(("s",), ("c0", "c1", "c2", "c3")),
        parents=(np.zeros(4, dtype=int),),
    )
    return write_store(tmp_path / "in.zarr", counts, DOMAIN, geo, geo_chunk=2)


@pytest.mark.parametrize(
    "A, mechanism, dtype",
    [
        (INTEGRAL, "gaussian", np.int64),
        (FRACTIONAL, "gaussian", np.int64),
        (FRACTIONAL, "laplace", np.int64),
        (INTEGRAL, "laplace", np.int64),
    ],
    ids=["integral-gaussian", "fractional-gaussian", "fractional-laplace", "integral-laplace"],
)
@pytest.mark.usefixtures("no_float")
def test_release_never_calls_a_float_sampler(tmp_path, A, mechanism, dtype):
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 40, size=(4, 2, 3)).astype(dtype)
    st = _store(tmp_path, counts)
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    plan = _plan(A, mechanism)
    r = release(plan, st, release_id="rel", run_id="one", ledger=ledger, key=new_key())
    g = zarr.open_group(str(r.to_zarr(tmp_path / "out.zarr")), mode="r")
    est = g["county"]["estimate"][:]
    assert est.shape == (4, 2, 3) and np.isfinite(est).all()
    assert len(ledger.charges("rel")) == 2
