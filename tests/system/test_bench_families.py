"""``dpdask bench topdown --families``: the block-family timings and their comparison."""

from __future__ import annotations

import argparse

import pytest
from dpdask_benchmarks import topdown


def test_families_part_times_both_paths_and_compares_them() -> None:
    parser = argparse.ArgumentParser()
    topdown.add_arguments(parser)
    args = parser.parse_args(
        ["--families", "2", "--children", "3,5", "--repeats", "1", "--family-domain", "pl94"]
    )
    out = topdown.run(args)
    cases = out["cases"]
    assert [(c["domain"], c["integer"]) for c in cases] == [("pl94", False), ("pl94", True)]
    for c in cases:
        assert 6 <= c["blocks"] <= 10
        assert c["new_s"] > 0 and c["baseline_s"] > 0
        assert c["new_s_per_block"] == pytest.approx(c["new_s"] / c["blocks"])
        assert c["new_extrapolated_700k_2_workers_s"] == pytest.approx(
            c["new_s_per_block"] * 350_000
        )
        # the two paths agree within the solver's tolerance (integers: floor or ceiling)
        assert c["max_abs_diff"] <= (1.0 if c["integer"] else 1e-2)
