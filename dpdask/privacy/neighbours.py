"""The neighbour relation a budget is stated in, and conversions between relations.

dpdask calibrates noise to **add/remove-one-person** neighbours (two datasets differ by
one person's record being present or absent): a strategy's sensitivity is its largest
column norm, and every budget in dpdask (specs, plans, the ledger) is in those terms
unless it says otherwise.

The Census Bureau states its 2020 budget for **change-one-record** neighbours (one
person's record replaced by another; the dataset size is fixed). Changing a record
from cell ``i`` to cell ``j`` moves the strategy's answers by ``A e_j - A e_i``, so
its change-one sensitivity is ``max_{i != j} ||A (e_j - e_i)||``:

* L1 (Laplace): at most ``2 Delta_1`` (triangle inequality), equal for counting
  queries; so ``epsilon_change = 2 epsilon_addremove`` for the same noise.
* L2 (Gaussian): ``||A (e_j - e_i)||^2 = G_ii + G_jj - 2 G_ij <= 2 Delta_2^2`` when
  the Gram matrix ``G = A^T A`` has no negative entry (counting queries: every
  person is counted with a non-negative weight), so ``rho_change = 2 rho_addremove``
  for the same noise (the Bureau's convention, ``../shared/design/tda-2020.md``);
  ``4 rho_addremove`` bounds it for any strategy.

:data:`ADD_REMOVE` and :data:`CHANGE_ONE` name the relations; :func:`convert` moves a
budget between them for the same noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dpdask.errors import PlanError
from dpdask.linalg import Kron, LinearQuery, VStack
from dpdask.privacy._budget import ApproxDP, Budget, PureDP, zCDP

__all__ = [
    "ADD_REMOVE",
    "CHANGE_ONE",
    "NEIGHBOURS",
    "Neighbours",
    "as_neighbours",
    "both_relations",
    "check_same_noise",
    "convert",
    "gram_nonnegative",
    "rho_factor",
]


@dataclass(frozen=True)
class Neighbours:
    """A neighbour relation: ``"add-remove"`` (one person) or ``"change-one"`` (record).

    Parameters
    ----------
    name : str
        ``"add-remove"`` or ``"change-one"``.
    description : str
        What two neighbouring datasets differ by.
    """

    name: str
    description: str

    def __str__(self) -> str:
        return self.name


ADD_REMOVE = Neighbours("add-remove", "one person's record added or removed")
"""dpdask's relation (the default everywhere)."""

CHANGE_ONE = Neighbours("change-one", "one person's record changed (the dataset size fixed)")
"""The Census Bureau's 2020 relation."""

NEIGHBOURS: dict[str, Neighbours] = {n.name: n for n in (ADD_REMOVE, CHANGE_ONE)}
"""The relations by name."""


def as_neighbours(value: str | Neighbours | None) -> Neighbours:
    """The relation called ``value`` (``None``: :data:`ADD_REMOVE`).

    Raises
    ------
    PlanError
        For an unknown name.

    Examples
    --------
    >>> as_neighbours("change-one") is CHANGE_ONE, as_neighbours(None) is ADD_REMOVE
    (True, True)
    """
    if value is None:
        return ADD_REMOVE
    if isinstance(value, Neighbours):
        return value
    if isinstance(value, str) and value in NEIGHBOURS:
        return NEIGHBOURS[value]
    raise PlanError(f"neighbours: {value!r} is not one of {sorted(NEIGHBOURS)}")


def rho_factor(nonnegative_gram: bool = True) -> Fraction:
    """``rho_change / rho_addremove`` for the same Gaussian noise (an upper bound).

    ``2`` when the strategy's Gram matrix has no negative entry (counting queries),
    ``4`` otherwise (module docstring).
    """
    return Fraction(2) if nonnegative_gram else Fraction(4)


def convert(
    budget: Budget,
    source: str | Neighbours | None,
    target: str | Neighbours | None,
    *,
    nonnegative_gram: bool = True,
) -> Budget:
    """The budget in relation ``target`` of the noise that spends ``budget`` in ``source``.

    Going from add/remove to change-one multiplies zCDP's ``rho`` by
    :func:`rho_factor` and pure DP's ``epsilon`` by 2 (an upper bound: the budget
    the same noise certainly satisfies); going back divides by the same factor (the
    noise a change-one budget asks for, calibrated in add/remove terms).

    Parameters
    ----------
    budget : PureDP or zCDP
        The budget, stated in ``source``.
    source, target : str or Neighbours or None
        The relations (``None``: add/remove).
    nonnegative_gram : bool
        Whether the strategy's Gram matrix has no negative entry (counting queries;
        the default); ``False`` takes the bound for any strategy.

    Raises
    ------
    PlanError
        For an (epsilon, delta) budget, which has no exact conversion (convert the
        Gaussian privacy cost instead: it scales by ``sqrt(rho_factor)``).

    Examples
    --------
    >>> convert(zCDP("1.2781"), "add-remove", "change-one")
    zCDP(rho=2.5562)
    >>> convert(PureDP(2), "change-one", "add-remove")
    PureDP(epsilon=1)
    """
    src, dst = as_neighbours(source), as_neighbours(target)
    if src == dst:
        return budget
    if isinstance(budget, ApproxDP):
        raise PlanError(
            "an (epsilon, delta) budget has no exact change-one conversion; state it in "
            "zCDP or convert the Gaussian privacy cost"
        )
    if isinstance(budget, PureDP):
        factor = Fraction(2)
    elif isinstance(budget, zCDP):
        factor = rho_factor(nonnegative_gram)
    else:
        raise PlanError(f"cannot convert {budget!r} between neighbour relations")
    return budget * factor if dst == CHANGE_ONE else budget / factor


def both_relations(budget: Budget) -> dict[str, dict[str, str] | None]:
    """An add/remove ``budget`` in each relation, as JSON-safe dicts (``None`` where it
    has no exact conversion: an (epsilon, delta) budget under change-one).

    Examples
    --------
    >>> both_relations(zCDP("1.2781"))["change-one"]
    {'type': 'zCDP', 'rho': '12781/5000'}
    """
    out: dict[str, dict[str, str] | None] = {}
    for name, relation in NEIGHBOURS.items():
        try:
            out[name] = convert(budget, ADD_REMOVE, relation).to_dict()
        except PlanError:
            out[name] = None
    return out


def gram_nonnegative(strategy: LinearQuery) -> bool:
    """Whether ``strategy``'s Gram matrix certainly has no negative entry.

    Factor by factor for a Kronecker product (a Kronecker product of non-negative
    matrices is non-negative), part by part for a stack (its Gram matrix is the
    weighted sum of its parts'), densely otherwise; ``False`` when that is too large
    to form (unverified is not non-negative).
    """
    if isinstance(strategy, Kron):
        return all(gram_nonnegative(f) for f in strategy.factors)
    if isinstance(strategy, VStack):
        return all(gram_nonnegative(part) for part in strategy.parts)
    try:
        gram = strategy.gram().dense()
    except MemoryError:
        return False
    return bool(gram.min(initial=0.0) >= 0.0)


def check_same_noise(strategy: LinearQuery, stated: str | Neighbours | None) -> None:
    """Refuse a strategy for which a budget ``stated`` in another relation than
    add/remove was not converted exactly.

    :func:`convert` (as a spec's ``privacy.neighbours`` uses it) takes the factor of
    counting queries, valid only when the strategy's Gram matrix has no negative
    entry; a strategy with negative entries there would get too little noise.

    Raises
    ------
    PlanError
        Under change-one, for a strategy whose Gram matrix may have a negative entry.
    """
    if as_neighbours(stated) == ADD_REMOVE or gram_nonnegative(strategy):
        return
    raise PlanError(
        "privacy.neighbours: change-one budgets are converted for counting strategies "
        "(no negative Gram entry); this strategy has one (or is too large to check): "
        "state the budget in add-remove terms (rho / 4 bounds it for any strategy)"
    )
