"""``reconstruct.passes`` and ``reconstruct.slack`` in a spec: parsed strictly, stated
as the ledger's run binding records them (absent for a spec without them)."""

from __future__ import annotations

import pytest

from dpdask.errors import ArgumentError, SpecError
from dpdask.pipeline._spec_plan import (
    check_pass_groups,
    passes_option,
    reconstruction,
    reconstruction_passes,
)
from dpdask.privacy import RunBinding


def test_default_and_group_passes_parse():
    raw = {"method": "topdown", "passes": "default"}
    assert reconstruction(raw) == ("topdown", False, None, False)
    assert reconstruction_passes(raw) == ("default", 0.0)
    got, slack = reconstruction_passes(
        {"method": "topdown", "passes": ["votingage", ["hisp", "race-single"]], "slack": 2}
    )
    assert got == (("votingage",), ("hisp", "race-single")) and slack == 2.0
    assert passes_option(got) == [["votingage"], ["hisp", "race-single"]]
    assert reconstruction_passes("topdown") == (None, 0.0)
    assert reconstruction_passes({"method": "topdown"}) == (None, 0.0)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"method": "nnls", "passes": "default"}, "reconstruct.passes: only method: topdown"),
        ({"passes": "default"}, "reconstruct.passes: only method: topdown"),  # ls
        ({"method": "topdown", "slack": 1}, "reconstruct.slack: a slack goes with passes"),
        ({"method": "topdown", "passes": "total"}, "reconstruct.passes: 'default' or"),
        ({"method": "topdown", "passes": []}, "reconstruct.passes: 'default' or a non-empty"),
        ({"method": "topdown", "passes": [[]]}, "reconstruct.passes[0]:"),
        ({"method": "topdown", "passes": ["a", 3]}, "reconstruct.passes[1]:"),
        ({"method": "topdown", "passes": [["a", "a"]]}, "reconstruct.passes[0]: a group named"),
        ({"method": "topdown", "passes": ["a", ["b", "a"]]}, "reconstruct.passes: groups ['a']"),
        ({"method": "topdown", "passes": "default", "slack": -0.5}, "reconstruct.slack"),
        ({"method": "topdown", "passes": "default", "slack": True}, "reconstruct.slack"),
        ({"method": "topdown", "passes": "default", "slack": float("inf")}, "reconstruct.slack"),
    ],
)
def test_bad_passes_name_the_field(raw, field):
    with pytest.raises(SpecError) as err:
        reconstruction_passes(raw)
    assert str(err.value).startswith(field)


def test_unknown_keys_of_reconstruct_are_refused():
    with pytest.raises(SpecError, match=r"reconstruct: unknown key\(s\) \['pass'\]"):
        reconstruction({"method": "topdown", "pass": "default"})


def test_groups_are_checked_against_the_workload():
    check_pass_groups((("a",), ("b", "c")), ["a", "b", "c"], "workload 'w'")
    check_pass_groups("default", [], "workload 'w'")
    with pytest.raises(SpecError, match=r"^reconstruct.passes\[1\]: \['d'\] is not a query group"):
        check_pass_groups((("a",), ("b", "d")), ["a", "b", "c"], "workload 'w'")


def test_a_binding_records_passes_only_when_stated():
    old = {"source": "s" * 64, "spec": "p" * 64, "output": "/out/x.zarr"}
    assert RunBinding.from_dict(old).to_dict() == old  # earlier entries read as written
    st = {"passes": [["votingage"]], "slack": 0.0}
    b = RunBinding.from_dict({**old, "passes": st})
    assert b.passes == st and b.to_dict() == {**old, "passes": st}
    with pytest.raises(ArgumentError, match="run binding passes"):
        RunBinding("s" * 64, "p" * 64, "/out/x.zarr", passes={"passes": "default"})
