"""Fixtures shared by the test modules."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings

from dpdask import Domain

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
