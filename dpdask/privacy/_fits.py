"""Whether a release may open on a ledger: its budget and its dataset's lifetime budget.

Shared by count releases (:mod:`dpdask.pipeline.run`) and sum releases
(:mod:`dpdask.sums`), which check before any data is read.
"""

from __future__ import annotations

from dpdask.errors import SpecError
from dpdask.privacy._budget import Budget
from dpdask.privacy._ledger import BudgetExceededError, Ledger, LedgerConflictError

__all__ = ["check_dataset_fits", "check_lifetime_covers", "check_release_opening"]


def check_lifetime_covers(release: str, budget: Budget, lifetime: Budget | None) -> None:
    """Refuse a spec whose dataset lifetime budget (``privacy.dataset``) cannot hold even
    this one release: before any ledger is opened or created.

    Raises
    ------
    dpdask.errors.SpecError
        Naming ``privacy.dataset``, if ``lifetime`` is smaller than ``budget`` or of
        another kind.
    """
    if lifetime is None:
        return
    try:
        fits = lifetime._coerce(budget) <= lifetime  # in the lifetime's terms, as the ledger
    except TypeError as exc:
        raise SpecError(f"privacy.dataset: {lifetime!r} and the release's budget: {exc}") from None
    if not fits:
        raise SpecError(
            f"privacy.dataset: the dataset's lifetime budget {lifetime!r} is smaller than "
            f"release {release!r}'s budget {budget!r}; the release can never run"
        )


def check_release_opening(
    ledger: Ledger, release: str, budget: Budget, dataset: str, lifetime: Budget | None
) -> tuple[Budget | None, Budget | None]:
    """Raise if ``release`` cannot open with ``budget`` on ``dataset``.

    Parameters
    ----------
    ledger : Ledger
        The (verified) ledger.
    release, dataset : str
        The release id and the dataset it draws on.
    budget : Budget
        The release's budget.
    lifetime : Budget, optional
        The dataset's lifetime total as the spec states it.

    Returns
    -------
    opened : Budget or None
        The budget the release is already open with (``None`` if it is new).
    total : Budget or None
        The dataset's lifetime total in force: the ledger's, else ``lifetime``.

    Raises
    ------
    LedgerConflictError
        If the spec states another lifetime total than the ledger's, or the release is
        open with another budget or on another dataset.
    """
    total = ledger.dataset_total(dataset)
    if lifetime is not None and total is not None and total != lifetime:
        raise LedgerConflictError(
            f"privacy.dataset: dataset {dataset!r} has lifetime total {total!r} in "
            f"{ledger.path}; the ledger cannot change it to {lifetime!r}"
        )
    try:
        opened, on = ledger.budget(release), ledger.dataset(release)
    except LedgerConflictError:  # not open yet
        opened, on = None, dataset
    if opened is not None and (opened != budget or on != dataset):
        raise LedgerConflictError(
            f"release {release!r} is already open with budget {opened!r} on dataset "
            f"{on!r}; this spec asks for {budget!r} on {dataset!r} (a changed budget or "
            "changed data needs a new release id)"
        )
    return opened, total if total is not None else lifetime


def check_dataset_fits(
    ledger: Ledger, release: str, budget: Budget, dataset: str, total: Budget | None
) -> None:
    """Raise :class:`BudgetExceededError` if ``budget`` does not fit what is left of the
    dataset's lifetime ``total`` (nothing to check without one)."""
    if total is None:
        return
    left = ledger.dataset_remaining(dataset) if ledger.dataset_total(dataset) else total
    if left is None or not total._coerce(budget) <= left:
        raise BudgetExceededError(
            f"privacy.dataset: dataset {dataset!r} has {left!r} of its lifetime "
            f"{total!r} left; release {release!r} asks for {budget!r}"
        )
