"""The 2,016-cell P.L. 94 histogram and the Bureau's eleven query groups, against loops."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpdask import census
from dpdask.errors import SpecError
from dpdask.pipeline import parse_domain
from dpdask.workloads import PL94_FULL_GROUPS, pl94_full
from dpdask.workloads.named import default_domain, named


def test_domain_is_the_bureaus_histogram():
    d = census.pl94_full_domain()
    assert d.shape == (8, 2, 2, 63) and d.size == 2016
    assert len(census.HHGQ) == len(census.HHGQ_LABELS) == 8
    types = sorted(t for _, ts in census.HHINSTLEVELS for t in ts)
    assert types == list(range(8))
    assert parse_domain("pl94-full") == d
    assert default_domain("pl94-full") == d and default_domain("tda-2020") == d


def _dense_answers(x: np.ndarray) -> dict[str, list[float]]:
    """Every group's answers by explicit loops over the cells (facts sheet definitions)."""
    levels = {0: 0, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2, 7: 2}  # hhinstlevels
    out: dict[str, dict] = {g: {} for g in PL94_FULL_GROUPS}
    keys = {
        "total": lambda h, v, s, r: (),
        "cenrace": lambda h, v, s, r: (r,),
        "hispanic": lambda h, v, s, r: (s,),
        "votingage": lambda h, v, s, r: (v,),
        "hhinstlevels": lambda h, v, s, r: (levels[h],),
        "hhgq": lambda h, v, s, r: (h,),
        "hispanic*cenrace": lambda h, v, s, r: (s, r),
        "votingage*cenrace": lambda h, v, s, r: (v, r),
        "votingage*hispanic": lambda h, v, s, r: (v, s),
        "votingage*hispanic*cenrace": lambda h, v, s, r: (v, s, r),
        "detailed": lambda h, v, s, r: (h, v, s, r),
    }
    shapes = {
        "total": [()], "cenrace": [(r,) for r in range(63)], "hispanic": [(0,), (1,)],
        "votingage": [(0,), (1,)], "hhinstlevels": [(0,), (1,), (2,)],
        "hhgq": [(h,) for h in range(8)],
        "hispanic*cenrace": list(itertools.product(range(2), range(63))),
        "votingage*cenrace": list(itertools.product(range(2), range(63))),
        "votingage*hispanic": list(itertools.product(range(2), range(2))),
        "votingage*hispanic*cenrace": list(itertools.product(range(2), range(2), range(63))),
        "detailed": list(itertools.product(range(8), range(2), range(2), range(63))),
    }  # fmt: skip
    cell = 0
    for h, v, s, r in itertools.product(range(8), range(2), range(2), range(63)):
        for g in PL94_FULL_GROUPS:
            k = keys[g](h, v, s, r)
            out[g][k] = out[g].get(k, 0.0) + x[cell]
        cell += 1
    return {g: [out[g].get(k, 0.0) for k in shapes[g]] for g in PL94_FULL_GROUPS}


def test_answers_equal_a_dense_computation():
    rng = np.random.default_rng(7)
    x = rng.poisson(0.4, 2016).astype(float)
    W = pl94_full()
    assert W.names == PL94_FULL_GROUPS and W.shape == (2603, 2016)
    got = W @ x
    expected = _dense_answers(x)
    start = 0
    for g, part in zip(PL94_FULL_GROUPS, W.parts, strict=True):
        stop = start + part.shape[0]
        np.testing.assert_allclose(got[start:stop], expected[g], rtol=0, atol=1e-9, err_msg=g)
        start = stop
    assert got[0] == x.sum()


def test_named_and_wrong_domain():
    W = named("pl94-full", census.pl94_full_domain())
    assert W.shape == (2603, 2016)
    with pytest.raises(ValueError, match="pl94-full"):
        named("pl94-full", census.pl94_domain())
    with pytest.raises(SpecError, match="domain"):
        parse_domain("pl94-fll")


@pytest.mark.parametrize("seed", [0, 3])
def test_synthetic_blocks_are_consistent(seed):
    from dpdask.datasets import synthetic_pl94_blocks

    b = synthetic_pl94_blocks(400, 20_000, seed=seed)
    n = 400
    assert b.counts.shape == (n, 8, 2, 2, 63) and b.counts.min() >= 0
    assert int(b.population.sum()) == 20_000
    persons_by_type = b.counts.reshape(n, 8, -1).sum(axis=2)
    # household persons only where there are housing units
    assert np.all(b.housing_units[persons_by_type[:, 0] > 0] >= 1)
    # every GQ person's type has a facility; no more facilities than persons
    assert np.all(b.facilities[:, 0] == 0)
    gq = persons_by_type[:, 1:]
    fac = b.facilities[:, 1:]
    assert np.all(fac[gq > 0] >= 1) and np.all(fac <= gq)
    assert gq.sum() > 0  # some group quarters were drawn
    # nobody under 18 in nursing facilities
    assert b.counts[:, census.HHGQ.index("nursing"), 0].sum() == 0
    # deterministic from the seed
    again = synthetic_pl94_blocks(400, 20_000, seed=seed)
    np.testing.assert_array_equal(again.counts, b.counts)
    np.testing.assert_array_equal(again.facilities, b.facilities)
