"""Where a ledger's chain is stored: a SQLite file (with its head file) or a PostgreSQL
server (which keeps the head). :class:`ChainStore` is what :class:`~dpdask.privacy.Ledger`
asks of either; :func:`open_store` chooses by the location's form."""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from dpdask.errors import LedgerError, LedgerMissingError
from dpdask.privacy._chain import Chain, Entry, Head, _Appender
from dpdask.privacy._pg import ServerChain, is_server_url, redact

__all__ = ["ChainStore", "create_store", "is_server_url", "open_store", "redact", "shown"]


class ChainStore(Protocol):
    """The storage of one ledger's hash chain (:class:`Chain`, :class:`ServerChain`)."""

    ledger_id: str

    @property
    def head_file(self) -> Path | None: ...

    def read(self, con: Any = None, *, check_head: bool = True) -> list[Entry]: ...

    def transaction(self) -> AbstractContextManager[tuple[list[Entry], _Appender]]: ...

    def reanchor(self, heads: Iterable[Head] = ()) -> Head: ...


def open_store(
    location: str | os.PathLike[str], *, create: bool = False, check_head: bool = True
) -> ChainStore:
    """Open (verifying) the chain at ``location``, a SQLite file's path or a server URL;
    ``create`` a missing one."""
    if is_server_url(location):
        url = str(location)
        try:
            return ServerChain(url, check_head=check_head)
        except LedgerMissingError:
            if not create:
                raise
            return ServerChain.create(url)
    try:
        return Chain(location, check_head=check_head)
    except LedgerMissingError:
        if not create:
            raise
        return Chain.create(location)


def create_store(location: str | os.PathLike[str], operator_role: str | None = None) -> None:
    """Create a new ledger at ``location`` (``dpdask ledger init``)."""
    if is_server_url(location):
        ServerChain.create(str(location), operator_role)
        return
    if operator_role is not None:
        raise LedgerError(
            "--operator-role: roles separate duties on a server ledger (postgresql://...); "
            "a SQLite file has none"
        )
    Chain.create(location)


def shown(location: str | os.PathLike[str]) -> str | Path:
    """How the ledger at ``location`` is named in messages and records: a path, or the
    server URL without its password."""
    return redact(str(location)) if is_server_url(location) else Path(location)
