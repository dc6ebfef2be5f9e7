"""Any sequence of runs, kills, resumes, overwrites, deleted outputs and tampering.

A hypothesis state machine drives :func:`dpdask.pipeline.run.run_spec` (the real
key-file path, the local threaded scheduler) on tiny person records. Invariants,
checked after every step:

* the number of distinct noise draws ever published (distinct published estimates of
  the same data) never exceeds the number of runs the ledger has charged;
* ``Ledger.verify`` fails exactly when the ledger was tampered with, and a tampered
  ledger refuses every later run.
"""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import tempfile
from unittest import mock

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dpdask.dataflow.release import Release
from dpdask.pipeline.run import run_spec
from dpdask.pipeline.spec import parse_spec
from dpdask.privacy import Ledger, LedgerError
from dpdask.testing.ledger import TAMPER_KINDS, tamper_ledger

RECORDS = "geo,sex,age\n" + "".join(
    f"{g},{(i + j) % 2},{(i * 2 + j) % 3}\n"
    for j, g in enumerate(("0101", "0102", "0201"))
    for i in range(12)
)
OUTPUTS = ("a.zarr", "b.zarr")
RELEASES = ("r-one", "r-two")


class Killed(BaseException):
    """A simulated SIGKILL of the client (not an Exception: nothing may catch it)."""


def _die(*args, **kwargs):
    raise Killed()


class ReleaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="dpdask-states-"))
        (self.dir / "people.csv").write_text(RECORDS)
        self.ledger_path = self.dir / "ledger.sqlite"
        Ledger.init(self.ledger_path)
        self.snapshots = [self.ledger_path.read_bytes()]
        self.tampered = False
        self.charged_runs = 0
        self.draws: set[str] = set()
        self.killed: list[tuple[str, str, str]] = []  # (release, run id, output)
        self.published: list[tuple[str, str, str]] = []
        self.counter = 0

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------
    def _spec(self, release: str, output: str):
        return parse_spec(
            {
                "release": release,
                "data": {"format": "records", "path": "people.csv", "id": "people",
                         "geography_column": "geo", "levels": {"state": 2, "county": 4}},
                "domain": {"sex": 2, "age": 3},
                "workload": "identity",
                "strategy": "identity",
                "privacy": {"zcdp": 1},
                "output": output,
                "ledger": str(self.ledger_path),  # a server's URL in the postgres variant
            },
            base=self.dir,
        )  # fmt: skip

    def _run(self, release: str, run_id: str, output: str, overwrite: bool = False) -> bool:
        try:
            run_spec(self._spec(release, output), run_id=run_id, overwrite=overwrite,
                     progress=False)  # fmt: skip
        except (ValueError, FileNotFoundError):
            return False
        if self.tampered:
            raise AssertionError("a run published on a tampered ledger")
        self.published.append((release, run_id, output))
        return True

    def _new_id(self) -> str:
        self.counter += 1
        return f"run{self.counter}"

    def _release(self, release: str | None) -> str:
        """A named release (whose budget the first run spends) or a fresh one."""
        return release or f"fresh{self.counter}"

    def _after_write(self) -> None:
        if not self.tampered:
            self.snapshots.append(self.ledger_path.read_bytes())

    # -- rules ----------------------------------------------------------------------
    @rule(release=st.sampled_from((None, *RELEASES)), output=st.sampled_from(OUTPUTS))
    def run(self, release: str | None, output: str) -> None:
        run_id = self._new_id()
        self._run(self._release(release), run_id, output)
        self._after_write()

    @rule(release=st.sampled_from((None, *RELEASES)), output=st.sampled_from(OUTPUTS))
    def overwrite(self, release: str | None, output: str) -> None:
        run_id = self._new_id()
        self._run(self._release(release), run_id, output, overwrite=True)
        self._after_write()

    @rule(
        release=st.sampled_from((None, *RELEASES)),
        output=st.sampled_from(OUTPUTS),
        where=st.sampled_from(["_checkpoint", "_finish", "publish"]),
    )
    def kill(self, release: str | None, output: str, where: str) -> None:
        run_id = self._new_id()
        release = self._release(release)
        target = (Ledger, "publish") if where == "publish" else (Release, where)
        with mock.patch.object(*target, _die):
            try:
                self._run(release, run_id, output)
            except Killed:
                self.killed.append((release, run_id, output))
        self._after_write()

    @rule(data=st.data())
    def resume(self, data) -> None:
        if not self.killed:
            return
        release, run_id, output = data.draw(st.sampled_from(self.killed))
        self._run(release, run_id, output)
        self._after_write()

    @rule(data=st.data(), overwrite=st.booleans())
    def reuse_published_run_id(self, data, overwrite: bool) -> None:
        if not self.published:
            return
        release, run_id, output = data.draw(st.sampled_from(self.published))
        if self._run(release, run_id, output, overwrite=overwrite):
            raise AssertionError("a published run id was run again")

    @rule(output=st.sampled_from(OUTPUTS))
    def delete_output(self, output: str) -> None:
        shutil.rmtree(self.dir / output, ignore_errors=True)

    @rule(kind=st.sampled_from(TAMPER_KINDS))
    def tamper(self, kind: str) -> None:
        path = self.ledger_path
        if self.tampered or not path.exists():
            return
        snapshot = None
        if kind == "rollback":
            older = [s for s in self.snapshots if s != path.read_bytes()]
            if not older:
                return
            snapshot = self.dir / "older.sqlite"
            snapshot.write_bytes(older[0])
        tamper_ledger(path, kind, snapshot)
        self.tampered = True

    # -- invariants -------------------------------------------------------------------
    @invariant()
    def published_draws_never_exceed_charged_runs(self) -> None:
        for out in OUTPUTS:
            path = self.dir / out
            if path.exists():
                g = zarr.open_group(str(path), mode="r")
                arrays = [np.asarray(g[lv]["estimate"][:]) for lv in ("state", "county")]
                self.draws.add(hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest())
        if not self.tampered:
            ledger = Ledger(self.ledger_path)
            self.charged_runs = len({(c.release, c.run_id) for c in ledger.charges()})
        assert len(self.draws) <= self.charged_runs

    @invariant()
    def verify_fails_exactly_when_tampered(self) -> None:
        try:
            Ledger(self.ledger_path).verify()
        except LedgerError:
            assert self.tampered, "an intact ledger failed to verify"
        else:
            assert not self.tampered, "a tampered ledger verified"


ReleaseMachine.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestReleaseStates = pytest.mark.slow(ReleaseMachine.TestCase)
