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

__all__ = [
    "ChainStore",
    "create_store",
    "is_server_url",
    "ledger_exists",
    "ledger_files",
    "migrate_ledger",
    "open_store",
    "redact",
    "shown",
]


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


def ledger_exists(location: str | os.PathLike[str]) -> bool:
    """Whether there may be a ledger at ``location`` without creating one: a SQLite file
    that exists, or any server URL (opening it connects and says if it has none)."""
    return is_server_url(location) or Path(location).exists()


def ledger_files(location: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """The local files of the ledger at ``location`` an output must not overwrite (the
    SQLite file and its head file; none for a server ledger)."""
    if is_server_url(location):
        return []
    path = Path(location)
    return [("ledger", path), ("ledger head file", path.with_name(path.name + ".head"))]


def migrate_ledger(
    source: str | os.PathLike[str], url: str, operator_role: str | None = None
) -> Head:
    """Copy the SQLite ledger at ``source`` (verified, with its head file) into a new
    ledger on the server at ``url`` (``dpdask ledger migrate``), keeping its identity
    and every entry, so its chain and the heads its releases recorded verify there.
    Returns the server's head."""
    if not is_server_url(url):
        raise LedgerError(f"--to: expected a postgresql://... URL, got {url!r}")
    if is_server_url(source):
        raise LedgerError("migrate copies a SQLite ledger file; the source is a server URL")
    chain = Chain(source)  # verifies the chain and the head file
    entries = chain.read()
    server = ServerChain.create(url, operator_role, entries, chain.ledger_id)
    copied = server.read()
    if [e.hash for e in copied] != [e.hash for e in entries]:  # pragma: no cover - a bug
        raise LedgerError(f"the copy on {server.path} differs from {source}")
    return Head(len(copied), copied[-1].hash)
