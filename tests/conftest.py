"""Fixtures shared by the test modules."""

from __future__ import annotations

import numpy as np
import pytest

from dpdask import Domain


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
