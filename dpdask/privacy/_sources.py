"""One budget authority: a registered dataset's source, recorded once on the ledger.

A dataset registered with a lifetime budget (``dpdask ledger dataset``, or
``privacy.dataset`` in a spec) has its source's content fingerprint recorded (a
``source`` entry) when its first release runs. The same source under another dataset
id is then refused on that ledger: renaming ``data.id`` cannot restart a lifetime
budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpdask.errors import LedgerConflictError, LedgerPermissionError
from dpdask.privacy._chain import Entry
from dpdask.privacy._pg import ServerChain
from dpdask.privacy._records import check_name

if TYPE_CHECKING:
    from dpdask.privacy._ledger import Ledger

__all__ = ["bind_source", "check_source", "hold_dataset", "source_dataset"]


def _sources(entries: list[Entry]) -> dict[str, str]:
    """``{fingerprint: dataset}`` of every ``source`` entry."""
    return {e.body["fingerprint"]: e.body["dataset"] for e in entries if e.kind == "source"}


def source_dataset(ledger: Ledger, fingerprint: str) -> str | None:
    """The registered dataset whose source has ``fingerprint`` on ``ledger``, if any."""
    return _sources(ledger.entries()).get(fingerprint)


def check_source(ledger: Ledger, dataset: str, fingerprint: str) -> None:
    """Raise if a release of ``dataset`` from a source with ``fingerprint`` cannot charge
    ``ledger``: the source is another dataset's (:class:`LedgerConflictError`), or the
    ledger is a server's and the role may not append, or is an operator and finds
    ``dataset`` unregistered (:class:`LedgerPermissionError`). Made before any data is
    read or budget charged.
    """
    _refuse_other(ledger, source_dataset(ledger, fingerprint), dataset)
    chain = ledger._chain
    if not isinstance(chain, ServerChain):
        return
    if not chain.may("INSERT"):
        raise LedgerPermissionError(
            f"the role of {ledger.path} has no grant to append to the ledger: it cannot "
            "charge; its administrator grants it with `dpdask ledger init ... "
            "--operator-role ROLE`"
        )
    if ledger.dataset_total(dataset) is None and not chain.is_administrator():
        raise LedgerPermissionError(
            f"dataset {dataset!r} is not registered on {ledger.path}; its administrator "
            f"registers it with its lifetime budget (`dpdask ledger dataset URL {dataset} "
            "--zcdp RHO`)"
        )


def _refuse_other(ledger: Ledger, other: str | None, dataset: str) -> None:
    if other is not None and other != dataset:
        raise LedgerConflictError(
            f"data: this input is the source of dataset {other!r} on {ledger.path}; it "
            f"cannot be charged as {dataset!r} too (one lifetime budget per dataset): "
            f"use data.id: {other}"
        )


def bind_source(ledger: Ledger, dataset: str, fingerprint: str) -> bool:
    """Record ``fingerprint`` as the source of registered ``dataset`` (first release only).

    Returns whether an entry was written; does nothing for a dataset without a lifetime
    total on the ledger or with a source already recorded.

    Raises
    ------
    LedgerConflictError
        If ``fingerprint`` is the source of another dataset.
    """
    check_name(dataset, "dataset")
    check_name(fingerprint, "source fingerprint")
    with ledger._chain.transaction() as (entries, append):
        sources = _sources(entries)
        _refuse_other(ledger, sources.get(fingerprint), dataset)
        registered = any(e.kind == "dataset" and e.body["dataset"] == dataset for e in entries)
        if not registered or dataset in sources.values():
            return False
        append("source", {"dataset": dataset, "fingerprint": fingerprint})
        return True


def hold_dataset(ledger: Ledger, dataset: str) -> None:
    """On a server ledger, hold ``dataset`` against other jobs from before this job
    checks its budget until its charge is committed, so that of jobs racing for the
    last of a lifetime budget the losers are refused by the check, before they read
    any data (:meth:`ServerChain.hold`). Nothing to hold in a SQLite file."""
    chain = ledger._chain
    if isinstance(chain, ServerChain):
        chain.hold(dataset)
