"""Ways to tamper with a ledger file, for tests that check it is refused."""

from __future__ import annotations

import pathlib
import shutil
import sqlite3

from dpdask.errors import ArgumentError

__all__ = ["TAMPER_KINDS", "tamper_ledger"]

TAMPER_KINDS = ("truncate", "half", "delete", "rollback", "drop-last", "delete-charges", "edit")


def tamper_ledger(
    path: str | pathlib.Path, kind: str, snapshot: str | pathlib.Path | None = None
) -> None:
    """Tamper with the ledger at ``path`` as an attacker with write access would.

    ``truncate`` empties the file, ``half`` cuts it in two, ``delete`` removes it,
    ``rollback`` copies ``snapshot`` (an older copy) over it; the others drop the
    append-only triggers, change the entries and put the triggers back:
    ``drop-last`` deletes the last entry, ``delete-charges`` every charge, ``edit``
    rewrites every entry's body (making charges cheaper and the schema another).
    """
    path = pathlib.Path(path)
    if kind == "truncate":
        path.write_bytes(b"")
    elif kind == "half":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "delete":
        path.unlink()
    elif kind == "rollback":
        if snapshot is None:
            raise ArgumentError("rollback needs a snapshot of the ledger")
        shutil.copy(snapshot, path)
    elif kind in ("drop-last", "delete-charges", "edit"):
        con = sqlite3.connect(path)
        try:
            con.execute("DROP TRIGGER entries_no_delete")
            con.execute("DROP TRIGGER entries_no_update")
            if kind == "drop-last":
                con.execute("DELETE FROM entries WHERE seq = (SELECT MAX(seq) FROM entries)")
            elif kind == "delete-charges":
                con.execute("DELETE FROM entries WHERE kind = 'charge'")
            else:
                con.execute(
                    "UPDATE entries SET body = replace(replace(body, '1/2', '1/1000'), "
                    "'\"schema\"', '\"schemo\"')"
                )
            for op in ("delete", "update"):
                con.execute(
                    f"CREATE TRIGGER entries_no_{op} BEFORE {op.upper()} ON entries "
                    "BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END"
                )
            con.commit()
        finally:
            con.close()
    else:
        raise ArgumentError(f"unknown tampering {kind!r}; one of {TAMPER_KINDS}")
