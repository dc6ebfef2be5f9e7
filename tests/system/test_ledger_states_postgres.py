"""The run-state machine of ``test_ledger_states`` on the server ledger.

The same rules (runs, kills at every stage, resumes, overwrites, reused run ids,
deleted outputs) run as the operator role against a ledger on the session's
PostgreSQL server; tampering is the administrator's (the operator cannot: see
``test_ledger_postgres``): an entry edited behind the trigger, or one deleted from the
middle of the chain. The invariants are the same: no more distinct published draws
than charged runs, and ``verify`` fails exactly when the chain was tampered with.
"""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from dpdask.privacy import Ledger, zCDP
from tests.system.test_ledger_states import ReleaseMachine

_SERVER: list = []


@pytest.fixture(autouse=True)
def _server(pg_server):
    """The session's server, for the state machine (hypothesis builds it, not pytest)."""
    _SERVER[:] = [pg_server]


class ServerReleaseMachine(ReleaseMachine):
    def __init__(self) -> None:
        super().__init__()
        self.admin, operator, role = _SERVER[0].new_ledger_database()
        admin = Ledger.init(self.admin, operator_role=role)
        admin.set_dataset_total("people", zCDP(1000))
        self.ledger_path = operator  # what the invariants open: the operator's view

    def _after_write(self) -> None:
        pass  # no file to snapshot: the operator cannot restore the server

    @rule(kind=st.sampled_from(("edit", "delete-middle")))
    def tamper(self, kind: str) -> None:
        if self.tampered:
            return
        with psycopg.connect(self.admin, autocommit=True) as con:
            count = con.execute("SELECT count(*) FROM dpdask.entries").fetchone()[0]
            if count < 3:
                return
            con.execute("ALTER TABLE dpdask.entries DISABLE TRIGGER USER")
            if kind == "edit":
                con.execute("UPDATE dpdask.entries SET body = body || ' ' WHERE seq = 2")
            else:
                con.execute("DELETE FROM dpdask.entries WHERE seq = 2")
            con.execute("ALTER TABLE dpdask.entries ENABLE TRIGGER USER")
        self.tampered = True


ServerReleaseMachine.TestCase.settings = settings(
    max_examples=6,
    stateful_step_count=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestServerReleaseStates = pytest.mark.slow(ServerReleaseMachine.TestCase)
