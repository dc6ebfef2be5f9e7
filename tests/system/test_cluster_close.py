"""A run's cluster closing badly (a timeout on a loaded machine, a connection already
gone) does not replace the run's outcome: its refusal stays the error, its release stays
published."""

from __future__ import annotations

import contextlib
import json
import logging

import distributed
import pytest

from dpdask.cli import main
from dpdask.pipeline import cluster
from dpdask.pipeline._clusters import outcome_kept
from tests.system.test_accounting import RECORDS, _write_spec


class _Closes:
    """A context manager whose exit raises ``error`` (after closing), or nothing."""

    def __init__(self, error: BaseException | None) -> None:
        self.error, self.closed = error, False

    def __enter__(self) -> _Closes:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.closed = True
        if self.error is not None:
            raise self.error
        return False


CLOSE_ERRORS = [
    TimeoutError("Timeout"),
    distributed.comm.CommClosedError("in <TCP (closed)>: Stream is closed"),
    ConnectionResetError("reset by peer"),
]


@pytest.mark.parametrize("error", CLOSE_ERRORS, ids=type)
def test_a_close_error_after_success_is_a_warning(error, caplog) -> None:
    resource = _Closes(error)
    with caplog.at_level(logging.WARNING, logger="dpdask"):
        with outcome_kept(resource, "the test cluster") as entered:
            assert entered is resource
    assert resource.closed
    (record,) = caplog.records
    assert "the test cluster did not close cleanly" in record.getMessage()
    assert type(error).__name__ in record.getMessage()


@pytest.mark.parametrize("error", CLOSE_ERRORS, ids=type)
@pytest.mark.parametrize("own", [ValueError("refused: budget"), OSError("disk full")], ids=type)
def test_a_close_error_does_not_replace_the_runs_own(error, own, caplog) -> None:
    resource = _Closes(error)
    with caplog.at_level(logging.WARNING, logger="dpdask"):
        with pytest.raises(type(own)) as info:
            with outcome_kept(resource, "the test cluster"):
                raise own
    assert info.value is own and resource.closed
    assert "did not close cleanly" in caplog.text


@pytest.mark.parametrize("own", [None, ValueError("refused")], ids=["ok", "refused"])
def test_a_clean_close_changes_nothing(own, caplog) -> None:
    resource = _Closes(None)
    with caplog.at_level(logging.WARNING, logger="dpdask"):
        if own is None:
            with outcome_kept(resource, "the test cluster"):
                pass
        else:
            with pytest.raises(ValueError) as info, outcome_kept(resource, "the test cluster"):
                raise own
            assert info.value is own
    assert resource.closed and caplog.records == []


def test_other_close_errors_are_not_hidden() -> None:
    """Only a close's I/O failures are tolerated: anything else is a defect, raised."""
    with pytest.raises(RuntimeError, match="bug"):
        with outcome_kept(_Closes(RuntimeError("bug")), "the test cluster"):
            pass


# -- through the CLI, on the embedded local cluster ------------------------------------
@pytest.fixture
def timing_out(monkeypatch) -> None:
    """The run's local cluster closes, then its close times out (as distributed's does on
    a loaded machine): the close's error is raised over whatever the run raised."""
    real = cluster.local_client

    @contextlib.contextmanager
    def closing_times_out(*args, **kwargs):
        try:
            with real(*args, **kwargs) as client:
                yield client
        finally:
            raise TimeoutError("Timeout")

    monkeypatch.setattr(cluster, "local_client", closing_times_out)


def test_a_timed_out_close_keeps_publication_and_refusal(tmp_path, timing_out, capsys) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "people.csv").write_text(RECORDS)
    spec = _write_spec(tmp_path)
    out = tmp_path / "out" / "tiny.zarr"
    args = ["run", str(spec), "--json", "--no-progress", "--run-id", "first"]
    assert main(args) == 0  # published: the close's timeout is only a warning
    printed = capsys.readouterr()
    assert json.loads(printed.out)["output"] == str(out) and out.is_dir()
    assert "the local cluster did not close cleanly (TimeoutError: Timeout)" in printed.err
    published = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert main(args) == 4  # the same run id again: refused, and the refusal is the error
    printed = capsys.readouterr()
    assert json.loads(printed.out)["error"] == "RunStateError"
    last = printed.err.strip().splitlines()[-1]
    assert last.startswith("dpdask run: error: run 'first'") and "is published" in last
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == published
