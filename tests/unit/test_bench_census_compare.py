"""The figures of ``dpdask bench census --part compare`` from its runs' rows.

Oracles: medians over keys and the verdict worked out by hand on made-up rows; the
option lists refused with the option named.
"""

from __future__ import annotations

import pytest
from dpdask_benchmarks._census_compare import _accuracy, _names, _summary

from dpdask.errors import ArgumentError

SD = {"tda-2020": {"state": 1.0, "block": 9.0}, "bureau": {"state": 1.1, "block": 9.5}}


def _row(method: str, key: int, state: float, block: float, **extra: float) -> dict:
    return {
        "plan": "tda-2020", "method": method, "key": key, "wall_s": 1.0 + key,
        "state_total_error": -state, "empty_block_persons": 0.0,
        "mae_state": state, "rmse_state": state, "mae_block": block, "rmse_block": 2 * block,
        **extra,
    }  # fmt: skip


def test_medians_over_keys_and_the_verdict() -> None:
    runs = [
        _row("ls", 0, 3.0, 10.0), _row("ls", 1, 1.0, 30.0), _row("ls", 2, 2.0, 20.0),
        _row("topdown", 0, 1.0, 5.0), _row("topdown", 1, 1.5, 6.0), _row("topdown", 2, 4.0, 7.0),
        _row("multipass", 0, 0.0, 6.5), _row("multipass", 1, 0.0, 6.5),
        _row("multipass", 2, 0.0, 8.0),
    ]  # fmt: skip
    rows = _accuracy(runs, ["tda-2020"], ["ls", "topdown", "multipass"], ["state", "block"], SD)
    state, block = rows
    assert (state["mae_ls"], state["mae_topdown"], state["mae_multipass"]) == (2.0, 1.5, 0.0)
    assert (block["mae_ls"], block["mae_topdown"], block["mae_multipass"]) == (20.0, 6.0, 6.5)
    assert block["rmse_topdown"] == 12.0
    assert state["sd_total_tda"] == 1.1 and block["sd_total_plan"] == 9.0  # Bureau, plan
    assert state["multipass_ok"] is True and block["multipass_ok"] is False
    # without a baseline there is no verdict
    alone = _accuracy(runs, ["tda-2020"], ["multipass"], ["state"], SD)
    assert alone[0]["multipass_ok"] is None


def test_the_summary_takes_the_worst_key() -> None:
    runs = [
        _row("multipass-int", 0, 0.0, 1.0, block_vs_fractional=0.5),
        _row("multipass-int", 1, 3.0, 1.0, block_vs_fractional=1.5),
        _row("ls", 0, 2.0, 1.0),
    ]
    got = {r["method"]: r for r in _summary(runs, ["tda-2020"], ["ls", "multipass-int"])}
    assert got["multipass-int"]["wall_s_median"] == 1.5
    assert got["multipass-int"]["state_total_error_max"] == 3.0
    assert got["multipass-int"]["block_vs_fractional_max"] == 1.5
    assert got["ls"]["block_vs_fractional_max"] is None


def test_option_lists() -> None:
    assert _names("ls, topdown,ls", ("ls", "topdown"), "--methods") == ["ls", "topdown"]
    with pytest.raises(ArgumentError, match=r"--plans: \['hdmm'\] not among"):
        _names("fitness,hdmm", ("tda-2020", "fitness"), "--plans")
    with pytest.raises(ArgumentError, match="--methods"):
        _names(" , ", ("ls",), "--methods")
