"""Any sequence of runs, kills, resumes, overwrites, deleted outputs, tampering, edited
work folders and changed inputs.

A hypothesis state machine drives :func:`dpdask.pipeline.run.run_spec` (the real
key-file path, the local threaded scheduler) on tiny person records with an explicit
``data.id`` (so that the dataset does not change with the input). Invariants, checked
after every step:

* the number of distinct noise draws ever published (distinct published estimates)
  never exceeds the number of runs the ledger has charged;
* the same noise (one run of one release) is never published on two inputs, nor on
  another input than the one its run was charged on;
* ``Ledger.verify`` fails exactly when the ledger was tampered with, and a tampered
  ledger refuses every later run.

The work folder is untrusted: its ``source.json`` is deleted or forged, its chunk
markers dropped, or it is copied beside the other output (a second place to resume
the same run); the input changes by one person moving county.
"""

from __future__ import annotations

import contextlib
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
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dpdask.graph import _finish, _graph
from dpdask.pipeline.run import run_spec
from dpdask.pipeline.spec import parse_spec
from dpdask.privacy import Ledger, LedgerError
from dpdask.publish import release_attributes
from dpdask.testing.ledger import TAMPER_KINDS, tamper_ledger

RECORDS = "geo,sex,age\n" + "".join(
    f"{g},{(i + j) % 2},{(i * 2 + j) % 3}\n"
    for j, g in enumerate(("0101", "0102", "0201"))
    for i in range(12)
)
OUTPUTS = ("a.zarr", "b.zarr")
RELEASES = ("r-one", "r-two")
PICK = st.integers(0, 7)  # which earlier run a move acts on (modulo their number)
MOVED = RECORDS.replace("0101,", "0102,", 1)  # one person moved county
assert MOVED != RECORDS


class Killed(BaseException):
    """A simulated SIGKILL of the client (not an Exception: nothing may catch it)."""


def _die(*args, **kwargs):
    raise Killed()


def _nothing() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()


def _estimates_digest(path: pathlib.Path) -> str:
    g = zarr.open_group(str(path), mode="r")
    arrays = [np.asarray(g[lv]["estimate"][:]) for lv in ("state", "county")]
    return hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()


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
        self.input = RECORDS
        self.seen: set[str] = set()  # published estimates already attributed to an input
        self.noise_inputs: dict[tuple[str, str], set[str]] = {}  # run -> inputs published on
        self.charged_on: dict[tuple[str, str], str] = {}  # run -> the input it was charged on

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- helpers ---------------------------------------------------------------
    def _spec(self, release: str, output: str):
        return parse_spec(
            {
                "release": release,
                "data": {"format": "records", "path": "people.csv", "id": "people",
                         "geography_column": "geo", "levels": {"state": 2, "county": 4},
                         "geographies": ["0101", "0102", "0201"]},
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
        """After a run attempt: note the input each newly charged run was charged on, and
        attribute every newly published estimate to the run whose noise it carries and
        the input it was published on (the input now)."""
        if not self.tampered:
            for c in Ledger(self.ledger_path).charges():
                self.charged_on.setdefault((c.release, c.run_id), self.input)
        for out in OUTPUTS:
            attrs = release_attributes(self.dir / out)
            if attrs is None:
                continue
            digest = _estimates_digest(self.dir / out)
            if digest not in self.seen:
                self.seen.add(digest)
                noise = (attrs["release"], attrs["run_id"])
                self.noise_inputs.setdefault(noise, set()).add(self.input)
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
        target = {
            "publish": (Ledger, "publish"),
            "_checkpoint": (_graph, "measure_graph"),  # killed while measuring
            "_finish": (_finish, "finish"),  # killed after measuring, before publishing
        }[where]
        with mock.patch.object(*target, _die):
            try:
                self._run(release, run_id, output)
            except Killed:
                self.killed.append((release, run_id, output))
        self._after_write()

    @precondition(lambda self: bool(self.killed))
    @rule(pick=PICK, stop_at_publish=st.booleans(), overwrite=st.booleans())
    def resume(self, pick: int, stop_at_publish: bool, overwrite: bool) -> None:
        if not self.killed:
            return
        release, run_id, output = self.killed[pick % len(self.killed)]
        with mock.patch.object(Ledger, "publish", _die) if stop_at_publish else _nothing():
            try:
                if self._run(release, run_id, output, overwrite=overwrite):
                    self.killed.remove((release, run_id, output))
            except Killed:
                pass
        self._after_write()

    @precondition(lambda self: bool(self.killed))
    @rule(pick=PICK, how=st.sampled_from(["delete", "forge", "markers", "copy"]))
    def edit_work_folder(self, pick: int, how: str) -> None:
        """The work folder is storage nothing authenticates: edit it as an attacker would."""
        if not self.killed:
            return
        release, run_id, output = self.killed[pick % len(self.killed)]
        work = self.dir / f".{output}.run-{run_id}"
        if not work.exists():
            return
        if how == "delete":
            (work / "source.json").unlink(missing_ok=True)
        elif how == "forge":
            fake = hashlib.sha256(self.input.encode()).hexdigest()
            (work / "source.json").write_text(f'{{"content": "{fake}", "spec": "{fake}"}}')
        elif how == "markers":
            shutil.rmtree(work / "done", ignore_errors=True)
        else:  # beside the other output, to resume the same run there
            other = next(o for o in OUTPUTS if o != output)
            copy = self.dir / f".{other}.run-{run_id}"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(work, copy)
            (copy / "source.json").unlink(missing_ok=True)
            if (release, run_id, other) not in self.killed:
                self.killed.append((release, run_id, other))

    @rule(moved=st.booleans())
    def change_input(self, moved: bool) -> None:
        self.input = MOVED if moved else RECORDS
        (self.dir / "people.csv").write_text(self.input)

    @precondition(lambda self: bool(self.published))
    @rule(pick=PICK, overwrite=st.booleans())
    def reuse_published_run_id(self, pick: int, overwrite: bool) -> None:
        if not self.published:
            return
        release, run_id, output = self.published[pick % len(self.published)]
        if self._run(release, run_id, output, overwrite=overwrite):
            raise AssertionError("a published run id was run again")

    @rule(output=st.sampled_from(OUTPUTS))
    def delete_output(self, output: str) -> None:
        shutil.rmtree(self.dir / output, ignore_errors=True)

    @precondition(lambda self: not self.tampered)  # a tampered ledger refuses everything
    @rule(kind=st.sampled_from(TAMPER_KINDS))
    def tamper(self, kind: str) -> None:
        path = self.ledger_path
        if self.tampered or not path.exists():
            return
        if kind == "delete-charges" and not Ledger(path).charges():
            return  # nothing to delete: the ledger would be untouched
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
                self.draws.add(_estimates_digest(path))
        if not self.tampered:
            ledger = Ledger(self.ledger_path)
            self.charged_runs = len({(c.release, c.run_id) for c in ledger.charges()})
        assert len(self.draws) <= self.charged_runs

    @invariant()
    def the_same_noise_is_never_published_on_two_inputs(self) -> None:
        for noise, inputs in self.noise_inputs.items():
            assert len(inputs) <= 1, f"run {noise} published on {len(inputs)} inputs"
            # and only on the input it was charged on (the ledger binds the run to it)
            assert inputs <= {self.charged_on.get(noise)}, f"run {noise} on another input"

    @invariant()
    def verify_fails_exactly_when_tampered(self) -> None:
        try:
            Ledger(self.ledger_path).verify()
        except LedgerError:
            assert self.tampered, "an intact ledger failed to verify"
        else:
            assert not self.tampered, "a tampered ledger verified"


def test_a_copied_work_folder_resumed_on_moved_data() -> None:
    """The issue's attack as moves of the machine: killed after its charges, its work folder
    copied beside the other output, both resumed, one on data in which a person moved."""
    m = ReleaseMachine()
    try:
        m.kill(release="r-one", output="a.zarr", where="_checkpoint")
        m.edit_work_folder(pick=0, how="copy")
        assert m.killed[1] == (m.killed[0][0], m.killed[0][1], "b.zarr")
        m.change_input(moved=True)
        m.resume(pick=1, stop_at_publish=False, overwrite=False)  # b.zarr, moved data
        m.change_input(moved=False)
        m.resume(pick=0, stop_at_publish=False, overwrite=False)  # a.zarr, the data it began on
        m.published_draws_never_exceed_charged_runs()
        m.the_same_noise_is_never_published_on_two_inputs()
        assert m.published == [("r-one", "run1", "a.zarr")]
    finally:
        m.teardown()


ReleaseMachine.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestReleaseStates = pytest.mark.slow(ReleaseMachine.TestCase)
