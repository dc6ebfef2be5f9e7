"""Which ledger a release may be charged to, judged from the releases already published.

A release records the ledger it was charged to (its id, path and head). A ledger is
created (``ledger: {create: true}``) only where no release charged to another ledger is
published at the output or, for a scheduled spec, at another period's output: a deleted
ledger is never re-created silently. A release is overwritten only when the ledger it
names still holds the head it was charged under (:func:`check_replaced`).
"""

from __future__ import annotations

import glob
import logging
import os
import pathlib
from collections.abc import Iterable
from typing import Any

from dpdask.privacy import Head, Ledger, LedgerMissingError, LedgerTamperedError, is_server_url
from dpdask.publish._safety import release_attributes

__all__ = ["check_replaced", "open_ledger", "period_outputs"]

log = logging.getLogger("dpdask")


def period_outputs(output: str | os.PathLike[str], period: str | None) -> list[pathlib.Path]:
    """``output`` and, when it belongs to the period ``period`` of a scheduled spec,
    the outputs of the spec's other periods (``period`` in the path replaced by any
    text); a superset is harmless: every path found is only read."""
    out = pathlib.Path(os.path.abspath(output))
    if not period or period not in str(out):
        return [out]
    pattern = "*".join(glob.escape(part) for part in str(out).split(period))
    found = {pathlib.Path(p) for p in glob.glob(pattern)}
    return [out, *sorted(found - {out})]


def _charged_elsewhere(
    outputs: Iterable[pathlib.Path],
) -> tuple[pathlib.Path, dict[str, Any]] | None:
    """The first output holding a release charged to a ledger, with that record."""
    for out in outputs:
        recorded = (release_attributes(out) or {}).get("ledger")
        if isinstance(recorded, dict) and recorded.get("id"):
            return out, recorded
    return None


def open_ledger(
    path: str | os.PathLike[str],
    *,
    create: bool,
    outputs: Iterable[pathlib.Path],
    dry: bool = False,
) -> Ledger | None:
    """The ledger at ``path`` (verified), created only if ``create`` and no release of
    ``outputs`` was charged to a ledger; says on the ``dpdask`` logger that it did.

    ``dry``: check as creating would, but create nothing (``None`` for a ledger still
    to be created).

    Raises
    ------
    LedgerMissingError
        If there is no ledger at ``path`` and ``create`` is false, or a release of
        ``outputs`` was charged to a ledger (which may be the deleted one).
    """
    if is_server_url(path):  # the server says whether it holds a ledger; it keeps the head
        try:
            return Ledger(path)
        except LedgerMissingError:
            if not create or dry:
                if create:
                    return None
                raise
        return Ledger(path, create=True)
    path = pathlib.Path(path)
    head_file = path.with_name(path.name + ".head")
    if path.exists() or head_file.exists():  # a lost ledger with its head is refused
        return Ledger(path)
    if not create:
        raise LedgerMissingError(
            f"ledger: there is no ledger at {path}; create it with `dpdask ledger init {path}`, "
            "or write `ledger: {path: ..., create: true}` in the spec"
        )
    found = _charged_elsewhere(outputs)
    if found is not None:
        out, recorded = found
        raise LedgerMissingError(
            f"ledger: there is no ledger at {path}, but the release at {out} was charged to "
            f"ledger {recorded.get('id')} (at {recorded.get('path')}); a ledger is never "
            "re-created beside the releases of another: restore that ledger and its head "
            "file, or publish somewhere else"
        )
    if dry:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(path, create=True)
    log.warning("created a new, empty ledger at %s (ledger.create: true)", path)
    return ledger


def check_replaced(output: pathlib.Path, ledger: Ledger | None) -> None:
    """An earlier release at ``output`` is replaced only from the ledger it was charged
    to, and only while that ledger holds the head it was charged under.

    Raises
    ------
    LedgerTamperedError
        If the release was charged to another ledger (or to ``ledger`` at a head it no
        longer holds).
    """
    recorded = (release_attributes(output) or {}).get("ledger")
    if not isinstance(recorded, dict) or not recorded.get("head"):
        return  # nothing charged it (a release made without noise)
    if ledger is None or recorded.get("id") != ledger.ledger_id:
        mine = "a ledger still to be created" if ledger is None else f"{ledger.path}"
        raise LedgerTamperedError(
            f"the release at {output} was charged to ledger {recorded.get('id')} (at "
            f"{recorded.get('path')}), not to {mine}; it is replaced only by a release "
            "charged to the same ledger"
        )
    if not ledger.contains(Head.parse(recorded["head"])):
        raise LedgerTamperedError(
            f"the release at {output} was charged under ledger head {recorded['head']}, which "
            f"{ledger.path} no longer holds: the ledger was rewritten"
        )
