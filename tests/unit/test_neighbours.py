"""Neighbour relations: a change-one budget's add/remove equivalent against a dense
oracle of the change-one sensitivity, and the spec field that states the relation."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from dpdask.errors import PlanError, SpecError
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Prefix, Total, VStack
from dpdask.pipeline.spec import parse_spec
from dpdask.privacy import ApproxDP, PureDP, calibrate, zCDP
from dpdask.privacy.neighbours import (
    ADD_REMOVE,
    CHANGE_ONE,
    check_same_noise,
    convert,
    gram_nonnegative,
)


class _ChangeOne:
    """The dense oracle: a strategy's change-one sensitivity, max over pairs of cells
    ``i != j`` of ``||A (e_i - e_j)||_p``, for :func:`dpdask.privacy.calibrate`."""

    def __init__(self, strategy: LinearQuery) -> None:
        self.A = strategy.dense()

    def sensitivity(self, p: float = 1) -> float:
        n = self.A.shape[1]
        return max(
            float(np.linalg.norm(self.A[:, i] - self.A[:, j], ord=p))
            for i, j in itertools.combinations(range(n), 2)
        )


COUNTING = {
    "identity": Identity(5),
    "prefix": Prefix(4),
    "kron": Kron([Identity(3), Prefix(3)]),
    "identity-and-total": VStack([Identity(4), Total(4)]),
    "kron-of-stacks": Kron([VStack([Identity(2), Total(2)]), Identity(3)]),
}


@pytest.mark.parametrize("name", sorted(COUNTING))
@pytest.mark.parametrize("budget", [zCDP("2.5562"), zCDP(1), PureDP(2), PureDP("0.3")])
def test_converted_budget_calibrates_at_least_the_change_one_noise(name, budget) -> None:
    """Noise calibrated with the converted add/remove budget is at least the noise the
    change-one budget asks for, by the dense change-one sensitivity."""
    A = COUNTING[name]
    assert gram_nonnegative(A)
    converted = convert(budget, CHANGE_ONE, ADD_REMOVE)
    used = calibrate(converted, A).scale
    needed = calibrate(budget, _ChangeOne(A)).scale
    assert used >= needed * (1 - 1e-12)


@pytest.mark.parametrize("budget", [zCDP("2.5562"), PureDP(2)])
def test_conversion_is_exact_for_disjoint_counts(budget) -> None:
    """For a strategy with two maximal columns of disjoint support (identity queries),
    the factor is attained: the same noise, not more."""
    for A in (Identity(6), Kron([Identity(2), Identity(3)])):
        used = calibrate(convert(budget, CHANGE_ONE, ADD_REMOVE), A).scale
        needed = calibrate(budget, _ChangeOne(A)).scale
        assert used == pytest.approx(needed, rel=1e-12)


def test_the_factors_match_the_issue_figures() -> None:
    # issue 32: the Bureau's 2.5562 (change-one) is 1.2781 (add/remove)
    assert convert(zCDP("2.5562"), "change-one", "add-remove") == zCDP("1.2781")
    assert convert(PureDP(2), "change-one", "add-remove") == PureDP(1)
    with pytest.raises(PlanError, match="epsilon, delta"):
        convert(ApproxDP(1, Fraction(1, 10**9)), "change-one", "add-remove")


def test_negative_gram_strategies_are_refused_under_change_one() -> None:
    """A difference query moves by twice its column norm under change-one: the
    counting factor would give too little noise, and the oracle shows it."""
    A = Dense(np.array([[1.0, -1.0, 0.0], [0.0, 1.0, 1.0]]))
    assert not gram_nonnegative(A)
    used = calibrate(convert(zCDP(1), CHANGE_ONE, ADD_REMOVE), A).scale
    needed = calibrate(zCDP(1), _ChangeOne(A)).scale
    assert used < needed  # why it is refused
    with pytest.raises(PlanError, match="neighbours"):
        check_same_noise(A, "change-one")
    check_same_noise(A, "add-remove")  # add/remove needs no conversion
    check_same_noise(Kron([Identity(2), Prefix(3)]), "change-one")


# -- the spec field ---------------------------------------------------------------------
GOOD = {
    "release": "demo",
    "data": {"format": "synthetic", "geographies": 10},
    "domain": {"sex": 2, "age": 5},
    "levels": ["state", "county"],
    "workload": {"name": "marginals", "k": 1},
    "privacy": {"zcdp": "2.5562", "split": {"state": 1, "county": 3}},
    "output": "out/demo.zarr",
}


def _privacy(**changes) -> dict:
    return {**GOOD, "privacy": {**GOOD["privacy"], **changes}}


def test_spec_default_is_add_remove(tmp_path) -> None:
    spec = parse_spec(GOOD, tmp_path)
    assert spec.neighbours is ADD_REMOVE
    assert spec.privacy == spec.stated == zCDP("2.5562")


def test_spec_change_one_charges_the_add_remove_budget(tmp_path) -> None:
    spec = parse_spec(_privacy(neighbours="change-one", dataset={"zcdp": 10}), tmp_path)
    assert spec.neighbours is CHANGE_ONE
    assert spec.stated == zCDP("2.5562")
    assert spec.privacy == zCDP("1.2781")
    assert spec.dataset_budget == zCDP(5)
    shares = spec.level_budgets(("state", "county"))
    assert shares == {"state": zCDP("1.2781") / 4, "county": zCDP("1.2781") * Fraction(3, 4)}
    pure = parse_spec({**GOOD, "privacy": {"epsilon": 3, "neighbours": "change-one"}}, tmp_path)
    assert pure.privacy == PureDP("1.5")


@pytest.mark.parametrize(
    ("privacy", "fragment"),
    [
        ({"zcdp": 1, "neighbours": "change-two"}, "privacy.neighbours"),
        ({"zcdp": 1, "neighbours": 2}, "privacy.neighbours"),
        ({"epsilon": 1, "delta": 1e-9, "neighbours": "change-one"}, "privacy:"),
    ],
)
def test_spec_bad_relations_name_the_field(tmp_path, privacy, fragment) -> None:
    with pytest.raises(SpecError, match=fragment):
        parse_spec({**GOOD, "privacy": privacy}, tmp_path)
