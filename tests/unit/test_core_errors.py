"""The errors of the base packages (linalg, domain, census, specs, workloads, datasets):
each refusal is the specific :mod:`dpdask.errors` class, keeps its message, and still
derives from the built-in it was before (``except ValueError`` / ``except TypeError``
keep working)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpdask import census
from dpdask.datasets import synthetic_persons
from dpdask.domain import Domain, Geography
from dpdask.errors import (
    ArgumentError,
    ArgumentTypeError,
    DomainError,
    DPDaskError,
    ShapeError,
)
from dpdask.linalg import (
    Dense,
    Diagonal,
    Identity,
    Kron,
    Ones,
    RangeQueries,
    Sum,
    VStack,
    from_dict,
    gamma,
    to_dict,
    tree_intervals,
)
from dpdask.specs import schema_problems
from dpdask.workloads import indicator, product, random_ranges
from dpdask.workloads.named import named

D = Domain(sex=2, age=5)

# (what is called, the class raised, a fragment of its message, the built-in it was)
CASES: list[tuple[str, Callable[[], Any], type[DPDaskError], str, type[Exception]]] = [
    ("matvec", lambda: Identity(3) @ np.ones(4), ShapeError, "shape mismatch", ValueError),
    ("compose", lambda: Identity(3) @ Identity(4), ShapeError, "shape mismatch", ValueError),
    ("apply", lambda: Ones(4).apply(np.ones((2, 3))), ShapeError, "4 columns", ValueError),
    (
        "object",
        lambda: Identity(2) @ np.array([1, "a"], dtype=object),
        ArgumentTypeError,
        "object array",
        TypeError,
    ),
    ("p", lambda: Identity(2).sensitivity(3), ArgumentError, "p = 3", ValueError),
    ("size", lambda: Identity(0), ArgumentError, "positive integer size", ValueError),
    ("sum", lambda: Sum([Identity(2), Ones(2)]), ShapeError, "different shapes", ValueError),
    ("vstack", lambda: VStack([Identity(2), Identity(3)]), ShapeError, "columns", ValueError),
    (
        "weights",
        lambda: VStack([Identity(2)], weights=[np.inf]),
        ArgumentError,
        "finite",
        ValueError,
    ),
    ("kron", lambda: Kron([Identity(2), "x"]), ArgumentTypeError, "LinearQuery", TypeError),
    ("dense", lambda: Dense(np.ones(3)), ShapeError, "2-D", ValueError),
    ("ranges", lambda: RangeQueries(3, [0, 2], [1, 3]), ArgumentError, "lo <= hi < 3", ValueError),
    ("diagonal", lambda: Diagonal([]), ArgumentError, "at least one entry", ValueError),
    ("tree", lambda: tree_intervals(8, 1), ArgumentError, "branching", ValueError),
    ("gamma", lambda: gamma(2**52), ArgumentError, "not a useful error bound", ValueError),
    (
        "load",
        lambda: from_dict({"type": "Nope"}),
        ArgumentError,
        "unknown operator type",
        ValueError,
    ),
    ("save", lambda: to_dict(_Unregistered()), ArgumentTypeError, "no serialisation", TypeError),
    ("attribute", lambda: D["race"], DomainError, "unknown attribute 'race'", ValueError),
    ("attr size", lambda: Domain(a=0), ArgumentError, "sizes are integers >= 1", ValueError),
    (
        "level",
        lambda: Geography.flat(["1", "2"]).level_index("tract"),
        DomainError,
        "unknown geography level",
        ValueError,
    ),
    (
        "geoids",
        lambda: Geography.from_geoids(["441", "4410"], {"state": 2, "county": 3}),
        ArgumentError,
        "has 4 characters",
        ValueError,
    ),
    ("race", lambda: census.race_index(["martian"]), DomainError, "unknown race", ValueError),
    (
        "relation",
        lambda: census.relation_index("cousin"),
        DomainError,
        "unknown relationship",
        ValueError,
    ),
    (
        "schema",
        lambda: list(schema_problems(1, {"frobnicate": 1})),
        ArgumentError,
        "unsupported keyword",
        ValueError,
    ),
    ("workload", lambda: named("nope", D), ArgumentError, "unknown workload", ValueError),
    ("option", lambda: named("marginals", D, q=1), ArgumentError, "bad options", ValueError),
    ("pl94", lambda: named("pl94", D), DomainError, "unknown attribute 'hisp'", ValueError),
    ("factor", lambda: product(D, {"age": Identity(4)}), ShapeError, "has 4 columns", ValueError),
    ("indicator", lambda: indicator(3, [[0, 3]]), ArgumentError, "outside 0..2", ValueError),
    (
        "rng",
        lambda: random_ranges(5, 2, rng=0),
        ArgumentTypeError,
        "numpy.random.Generator",
        TypeError,
    ),
    (
        "synthetic",
        lambda: synthetic_persons({"a": 2}, 3),
        ArgumentTypeError,
        "must be a dpdask.Domain",
        ValueError,
    ),
    ("seed", lambda: synthetic_persons(D, 3, seed=-1), ArgumentError, "non-negative", ValueError),
]


class _Unregistered(Identity):
    """An operator class no serialiser knows."""

    def __init__(self) -> None:
        super().__init__(2)


@pytest.mark.parametrize(
    ("call", "cls", "message", "builtin"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_refusal_is_the_specific_error(
    call: Callable[[], Any], cls: type[DPDaskError], message: str, builtin: type[Exception]
) -> None:
    with pytest.raises(DPDaskError, match=re.escape(message)) as info:
        call()
    assert info.type is cls, f"{info.type.__name__}: {info.value}"
    assert isinstance(info.value, builtin)
    assert "\n" not in str(info.value)
