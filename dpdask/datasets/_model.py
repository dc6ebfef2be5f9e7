"""The synthetic person model: cell probabilities of a Census-like population over a Domain.

A person belongs to one of eight race/ethnicity *groups*, the columns of the Rhode
Island 2010 block file (:data:`GROUPS`): Hispanic (any race) and non-Hispanic White,
Black, AIAN, Asian, NHPI, Some Other Race alone and two or more races. Given the
group, the model is

``P(sex, hisp, race, relation, age | group)
    = P(hisp, race | group) P(age | group) P(sex | age) P(relation | age)``

* ``P(hisp, race | group)`` (:func:`group_race`): the one-race groups sit on their
  single combination with ``hisp = 0``; "two or more" spreads over the 57
  multi-race combinations and "Hispanic" over all 63 (with ``hisp = 1``) in the
  proportions of the Providence 2018 test (see :mod:`dpdask.datasets._constants`).
  This is the one place where the RI groups are mapped onto the race coding of
  :mod:`dpdask.census`.
* ``P(age | group)`` (:func:`age_given_group`): the assumed pyramid shape
  (:func:`age_shape`), rescaled so that the share under 18 is the group's
  ``1 - vap / pop`` in the RI file.
* ``P(sex | age)`` (:func:`male_share`): the assumed sex ratio by age.
* ``P(relation | age)`` (:func:`relation_given_age`): iterative proportional
  fitting of an assumed age-compatibility table (:func:`relation_age_affinity`:
  no householder aged 5, parents of the householder are 35 or older, ...) to the
  age margin of the RI mix and :data:`~dpdask.datasets._constants.RELATION_SHARES`,
  so the relation margin of the whole population is exactly the assumed shares.

Attributes are matched by name. ``sex`` (2), ``hisp`` (2), ``race`` (63),
``relation`` (17), ``age`` (115, single years 0..114) and ``votingage`` (2,
derived from age: 0 under 18, 1 aged 18+) are *known*; a known attribute that is
absent from the domain is summed out. A known attribute of another size is cut or
extended: with fewer categories the last one collects the remaining probability
(for ``age`` this is top-coding, "k-1 years and over"), with more the extra
categories have probability 0. Any other attribute is *unknown* and uniform,
independent of everything else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from dpdask.census import RELATIONSHIPS, n_races, race_combinations, race_index
from dpdask.datasets import _constants as C
from dpdask.domain import Domain
from dpdask.errors import ArgumentError

__all__ = [
    "GROUPS",
    "KNOWN_ATTRIBUTES",
    "PersonModel",
    "age_given_group",
    "age_shape",
    "group_race",
    "group_shares",
    "male_share",
    "relation_age_affinity",
    "relation_given_age",
]

GROUPS: tuple[str, ...] = tuple(C.RI_2010_POP)
"""The eight RI race/ethnicity groups: ``hisp``, then non-Hispanic ``white`` ... ``two``."""

N_AGE = 115
KNOWN_ATTRIBUTES: dict[str, int] = {
    "sex": 2,
    "hisp": 2,
    "race": len(race_combinations()),
    "relation": len(RELATIONSHIPS),
    "age": N_AGE,
    "votingage": 2,
}
"""Attributes the model knows, with their standard sizes."""

_MAX_MODEL_CELLS = 2**23  # 8 groups x (probabilities + cumulative) x 8 bytes = 1 GiB here


def group_shares() -> np.ndarray:
    """Share of each of :data:`GROUPS` in Rhode Island 2010 (sums to 1)."""
    pop = np.array([C.RI_2010_POP[g] for g in GROUPS], dtype=np.float64)
    shares: np.ndarray = pop / pop.sum()
    return shares


@cache
def group_race() -> np.ndarray:
    """``P(hisp, race | group)``, shape ``(8, 2, 63)``: the RI groups on the race coding."""
    n_combo = KNOWN_ATTRIBUTES["race"]
    out = np.zeros((len(GROUPS), 2, n_combo))
    hisp = np.asarray(C.PROVIDENCE_2018_HISPANIC_RACE, dtype=np.float64) + C.RACE_PSEUDO_COUNT
    nonhisp = np.asarray(C.PROVIDENCE_2018_NOT_HISPANIC_RACE, dtype=np.float64)
    multi = np.where(n_races() > 1, nonhisp + C.RACE_PSEUDO_COUNT, 0.0)
    for k, group in enumerate(GROUPS):
        if group == "hisp":
            out[k, 1] = hisp / hisp.sum()
        elif group == "two":
            out[k, 0] = multi / multi.sum()
        else:
            out[k, 0, race_index([group])] = 1.0
    out.setflags(write=False)
    return out


def _bump(a: np.ndarray, centre: float, width: float) -> np.ndarray:
    return np.exp(-0.5 * ((a - centre) / width) ** 2)


@cache
def age_shape() -> np.ndarray:
    """The assumed age pyramid over single years 0..114 (sums to 1); see ``_constants``."""
    a = np.arange(N_AGE, dtype=np.float64)
    hazard = C.MAKEHAM_A * a + C.GOMPERTZ_B / C.GOMPERTZ_G * np.expm1(C.GOMPERTZ_G * a)
    cohort = (
        1.0
        + C.BOOM_HEIGHT * _bump(a, C.BOOM_AGE, C.BOOM_WIDTH)
        - C.DEPRESSION_DEPTH * _bump(a, C.DEPRESSION_AGE, C.DEPRESSION_WIDTH)
    )
    shape = np.exp(-hazard - C.GROWTH * a) * cohort
    shape /= shape.sum()
    shape.setflags(write=False)
    return shape


@cache
def age_given_group() -> np.ndarray:
    """``P(age | group)``, shape ``(8, 115)``: the pyramid with each group's RI share under 18."""
    shape = age_shape()
    child = np.arange(N_AGE) < C.ADULT_AGE
    under = np.array([1.0 - C.RI_2010_VAP[g] / C.RI_2010_POP[g] for g in GROUPS])
    kids = np.where(child, shape, 0.0) / shape[child].sum()
    adults = np.where(child, 0.0, shape) / shape[~child].sum()
    out: np.ndarray = under[:, None] * kids + (1.0 - under[:, None]) * adults
    out.setflags(write=False)
    return out


@cache
def male_share() -> np.ndarray:
    """``P(sex = male | age)`` for ages 0..114, interpolated from the assumed table."""
    ages, shares = zip(*C.MALE_SHARE_BY_AGE, strict=True)
    out: np.ndarray = np.interp(np.arange(N_AGE), ages, shares)
    out.setflags(write=False)
    return out


def relation_age_affinity() -> np.ndarray:
    """ASSUMED relative plausibility of each (age, relation), shape ``(115, 17)``.

    Only ratios within a column and zero patterns matter: the fitted joint is
    ``x[age] * y[relation] * affinity[age, relation]``. Householders, spouses and
    partners are adults (rarely 15-17); children, stepchildren and grandchildren
    are mostly under 18 with a tail of adult children at home; parents and
    parents-in-law of the householder are 35+; foster children are under 21;
    group quarters peak at college ages and in old age (nursing homes).
    """
    a = np.arange(N_AGE, dtype=np.float64)
    adult = a >= C.ADULT_AGE

    def ramp(lo: float, hi: float) -> np.ndarray:
        return np.clip((a - lo) / (hi - lo), 0.0, 1.0)

    def decay(start: float, scale: float) -> np.ndarray:
        return np.exp(-np.maximum(a - start, 0.0) / scale)

    teen = (a >= 15) & ~adult
    partner = np.where(adult, 0.05 + 0.95 * ramp(C.ADULT_AGE, 27), np.where(teen, 0.005, 0.0))
    child = np.where(adult, decay(C.ADULT_AGE, 10.0) + 0.02, 1.0)
    elder = ramp(35, 55)
    gq = np.select(
        [a < 10, ~adult, a < 25, a < 65],
        [0.02, 0.2, 8.0, 0.6],
        np.minimum(0.6 * np.exp((a - 65) / 12.0), 20.0),
    )
    columns = {
        "householder": partner,
        "spouse": partner * (0.3 + 0.7 * ramp(20, 25)),
        "biological child": child,
        "adopted child": child,
        "stepchild": np.where(adult, decay(C.ADULT_AGE, 6.0), 1.0),
        "sibling": decay(70, 10.0),
        "parent": elder,
        "grandchild": np.where(adult, decay(C.ADULT_AGE, 5.0), 1.0),
        "parent-in-law": elder,
        "child-in-law": np.where(adult, decay(60, 10.0), 0.0),
        "other relative": np.ones_like(a),
        "roomer or boarder": np.where(adult, decay(70, 10.0), np.where(teen, 0.1, 0.05)),
        "housemate or roommate": np.where(adult, decay(35, 20.0), 0.02),
        "unmarried partner": partner * decay(40, 20.0),
        "foster child": np.where(a < 21, np.where(adult, 0.3, 1.0), 0.0),
        "other nonrelative": np.where(adult, 1.0, 0.3),
        "group quarters": gq,
    }
    return np.stack([columns[name] for name in RELATIONSHIPS], axis=1)


@cache
def relation_given_age() -> np.ndarray:
    """``P(relation | age)``, shape ``(115, 17)``, by iterative proportional fitting.

    The joint ``affinity[age, rel] * x[age] * y[rel]`` is scaled until its age
    margin is the RI-mix pyramid and its relation margin is ``RELATION_SHARES``.

    Raises
    ------
    RuntimeError
        If the fit does not converge (the assumed tables would be inconsistent).
    """
    age = group_shares() @ age_given_group()
    rel = np.asarray(C.RELATION_SHARES)
    joint = relation_age_affinity() * age[:, None]
    for _ in range(10_000):
        joint *= (rel / joint.sum(axis=0))[None, :]
        joint *= (age / joint.sum(axis=1))[:, None]
        if np.abs(joint.sum(axis=0) - rel).max() < 1e-14:
            break
    else:  # pragma: no cover - the constants are fixed
        raise RuntimeError("relation-by-age fit did not converge; check the assumed tables")
    out: np.ndarray = joint / joint.sum(axis=1, keepdims=True)
    out.setflags(write=False)
    return out


def _resize(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    """Cut (last category collects the rest) or zero-extend ``x`` along ``axis`` to ``size``."""
    n = x.shape[axis]
    if size == n:
        return x
    if size > n:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, size - n)
        return np.pad(x, pad)
    head = np.take(x, np.arange(size - 1), axis=axis)
    tail = np.take(x, np.arange(size - 1, n), axis=axis).sum(axis=axis, keepdims=True)
    return np.concatenate([head, tail], axis=axis)


@dataclass(frozen=True, eq=False)
class PersonModel:
    """Cell probabilities of each race/ethnicity group over one domain.

    Attributes
    ----------
    domain : Domain
        The domain the probabilities are laid out on (flat C order).
    bases : ndarray
        ``(8, domain.size)`` float64; row ``k`` is ``P(cell | group k)`` and sums to 1.
    shares : ndarray
        ``(8,)`` the RI share of each group: the expected mix of a geography.
    """

    domain: Domain
    bases: np.ndarray
    shares: np.ndarray

    @classmethod
    def build(cls, domain: Domain) -> PersonModel:
        """The model on ``domain`` (attributes matched by name, see the module docstring).

        Raises
        ------
        ArgumentError
            If the domain has more than 2**23 cells (the model keeps two float64
            arrays of 8 x cells in memory).
        """
        if domain.size > _MAX_MODEL_CELLS:
            raise ArgumentError(
                f"the synthetic person model supports domains up to {_MAX_MODEL_CELLS:,} cells "
                f"per geography; {domain!r} has {domain.size:,}"
            )
        letter = dict(zip(KNOWN_ATTRIBUTES, "shreav", strict=True))
        known = [n for n in domain.attrs if n in KNOWN_ATTRIBUTES]
        v = (np.arange(N_AGE) >= C.ADULT_AGE).astype(np.float64)
        sex = male_share()
        factors = {
            "ghr": group_race(),
            "ga": age_given_group(),
            "as": np.stack([sex, 1.0 - sex], axis=1),
            "ae": relation_given_age(),
            "av": np.stack([1.0 - v, v], axis=1),
        }
        spec = ",".join(factors) + "->g" + "".join(letter[n] for n in known)
        joint = np.einsum(spec, *factors.values(), optimize=True)
        for axis, name in enumerate(known, start=1):
            joint = _resize(joint, axis, domain[name])
        for axis, name in enumerate(domain.attrs, start=1):
            if name not in KNOWN_ATTRIBUTES:
                joint = np.expand_dims(joint, axis)
        uniform = math.prod(s for n, s in domain.items() if n not in KNOWN_ATTRIBUTES)
        bases = np.array(np.broadcast_to(joint, (len(GROUPS), *domain.shape)))  # a copy
        bases = bases.reshape(len(GROUPS), -1)
        if uniform > 1:
            bases /= uniform
        bases /= bases.sum(axis=1, keepdims=True)
        bases.setflags(write=False)
        shares = group_shares()
        shares.setflags(write=False)
        return cls(domain=domain, bases=bases, shares=shares)

    def probabilities(self, mix: np.ndarray | None = None) -> np.ndarray:
        """Flat cell probabilities of a geography whose group mix is ``mix`` (default: RI)."""
        mix = self.shares if mix is None else np.asarray(mix, dtype=np.float64)
        probabilities: np.ndarray = mix @ self.bases
        return probabilities
