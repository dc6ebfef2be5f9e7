"""The task-time breakdown that ``dpdask bench release`` reports."""

from __future__ import annotations

import pytest
from dpdask_benchmarks.release import task_seconds


def _record(key, *spans, action="compute"):
    return {"key": key, "startstops": [{"action": action, "start": a, "stop": b} for a, b in spans]}


def test_task_seconds_sums_computation_by_prefix() -> None:
    token = "0f3e9a1b2c4d5e6f7a8b9c0d1e2f3a4b"
    records = [
        _record((f"nonnegative-county-{token}", 0, 0), (0.0, 2.0)),
        _record((f"nonnegative-county-{token}", 1, 0), (1.0, 1.5), (3.0, 3.25)),
        _record(f"answer-county-{token}", (0.0, 0.5)),
        _record((f"measure-county-{token}", 0), (0.0, 0.25)),
        _record((f"measure-county-{token}", 0), (5.0, 9.0), action="transfer"),
        _record((f"publish-county-{token}", 0), (0.0, 0.125)),
        _record((f"ingest-counts-{token}", 0), (0.0, 0.0625)),
    ]
    got = task_seconds(records, top=3)
    assert got == pytest.approx(
        {"nonnegative-county": 2.75, "answer-county": 0.5, "measure-county": 0.25, "other": 0.1875}
    )
    assert list(got)[:3] == ["nonnegative-county", "answer-county", "measure-county"]
    assert "other" not in task_seconds(records[:2])
