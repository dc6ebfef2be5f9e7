"""``dpdask plan --compare tda-2020`` through the command line: per level and query group,
the measured and reconstructed standard deviations beside the Census Bureau's."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import pathlib
from fractions import Fraction

import pytest
import yaml

from dpdask.cli import main
from dpdask.strategy.tda2020 import LEVEL_SHARES, QUERY_SHARES
from dpdask.workloads.pl94_full import PL94_FULL_GROUPS
from tests import ROOT

SPEC = ROOT / "pipelines" / "tda2020-synthetic.yaml"
KEYS = {"group", "sd_measured", "sd_reconstructed", "sd_measured_tda", "sd_reconstructed_tda"}


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _spec(tmp_path: pathlib.Path, **changes) -> pathlib.Path:
    """The shipped spec with its outputs under ``tmp_path`` (and ``changes``)."""
    raw = yaml.safe_load(SPEC.read_text())
    raw["output"] = str(tmp_path / "out" / "release.zarr")
    raw["ledger"] = {"path": str(tmp_path / "out" / "ledger.sqlite"), "create": True}
    raw.update(changes)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[dict, str]:
    """The JSON and the text of ``dpdask plan SPEC --compare tda-2020`` (run once)."""
    tmp = tmp_path_factory.mktemp("compare")
    spec = _spec(tmp)
    capture: list[str] = []
    for extra in (["--json"], []):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["plan", str(spec), "--compare", "tda-2020", *extra]) == 0
        capture.append(out.getvalue())
    assert not (tmp / "out").exists()  # a plan writes nothing
    return json.loads(capture[0].strip().splitlines()[-1]), capture[1]


def test_compare_json_has_every_level_and_group(compared) -> None:
    report, _text = compared
    assert [lv["level"] for lv in report["levels"]] == ["state", "county"]
    for lv in report["levels"]:
        assert [g["group"] for g in lv["groups"]] == list(PL94_FULL_GROUPS)
        for g in lv["groups"]:
            assert KEYS <= set(g)
            assert all(isinstance(g[k], float) and g[k] > 0 for k in KEYS - {"group"})
            # GLS uses every level's measurements: never worse than one level's alone
            assert g["sd_reconstructed"] <= g["sd_measured"] * (1 + 1e-9)
            assert g["sd_reconstructed_tda"] <= g["sd_measured_tda"] * (1 + 1e-9)
    # 60 counties in 2 states: the mean fan-out of the county level
    assert report["levels"][1]["fanout"] == pytest.approx(30.0)


def test_tda_measured_sd_is_the_closed_form(compared) -> None:
    """``1 / (2 rho l q)``: the spec's total spent in the Bureau's proportions of its two
    levels is the persons budget times each level's share."""
    report, _text = compared
    total = Fraction(str(yaml.safe_load(SPEC.read_text())["privacy"]["zcdp"]))
    persons = total / (LEVEL_SHARES["state"] + LEVEL_SHARES["county"])
    assert Fraction(report["groups"]["compare"]["persons_budget"]["rho"]) == persons
    for lv in report["levels"]:
        rho = persons * LEVEL_SHARES[lv["level"]]
        for g in lv["groups"]:
            closed = 1 / float(2 * rho * QUERY_SHARES[lv["level"]][g["group"]])
            assert g["sd_measured_tda"] == pytest.approx(math.sqrt(closed), rel=1e-9)
            # the spec's own plan is tda-2020 at the same budgets, measured as a release
            # draws it (on a lattice): the same closed form scaled by the drawn scale
            inflation = lv["noise_scale"] / lv["nominal_noise_scale"]
            assert g["sd_measured"] == pytest.approx(math.sqrt(closed) * inflation, rel=1e-6)
    # the county total: the facts sheet's sd at the production budget
    county = report["levels"][1]["groups"][0]
    assert round(county["sd_measured_tda"], 2) == 2.17


def test_compare_text_is_one_aligned_table_per_level(compared) -> None:
    _report, text = compared
    assert "sd = sqrt(mean variance over the group's queries)" in text
    assert "mean fan-out 30" in text
    for level in ("state", "county"):
        head = text.index(f"\nlevel {level} (")
        block = text[head:].strip().split("\n\n")[0].splitlines()
        rows = block[1:]
        assert rows[0].startswith("group") and "tda measured" in rows[0]
        assert [r.split()[0] for r in rows[1:]] == list(PL94_FULL_GROUPS)
        assert len({len(r) for r in rows}) == 1, rows  # aligned columns


def test_compare_refuses_a_spec_that_is_not_pl94_full(tmp_path, capsys) -> None:
    spec = _spec(tmp_path, domain="pl94", workload="pl94", strategy="hdmm")
    save = tmp_path / "plan.npz"
    code = main(["plan", str(spec), "--compare", "tda-2020", "--save", str(save), "--json"])
    assert code == 2
    refusal = _json(capsys)
    assert refusal["ok"] is False and refusal["kind"] == "invalid"
    assert "pl94-full" in refusal["message"] and "--compare tda-2020" in refusal["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # nothing written
    assert main(["plan", str(spec), "--compare", "tda-2020"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pl94-full" in err[0]


def test_fanout_from_the_files_header_unknown_or_given(tmp_path, capsys) -> None:
    """A P.L. 94 file's geographic header gives the mean fan-outs (the full reader's
    geography is the oracle); without the file they are unknown and the reconstructed
    figures n/a, saying why; ``--fanout`` gives them. Reconstructed never exceeds measured."""
    from dpdask.store import read_pl94_file

    shipped = ROOT / "pipelines" / "pl94-providence.yaml"
    geo = read_pl94_file(ROOT / "examples" / "data" / "pl94_providence").geography
    units = [geo.n_units(lv) for lv in geo.levels]
    assert main(["plan", str(shipped), "--json"]) == 0
    report = _json(capsys)
    assert [lv["fanout"] for lv in report["levels"]] == [
        None, *(b / a for a, b in itertools.pairwise(units))
    ]  # fmt: skip
    for lv in report["levels"]:
        assert lv["reconstructed_note"] is None
        for g in lv["groups"]:
            assert 0 < g["sd_reconstructed"] <= g["sd_measured"] * (1 + 1e-9)
    raw = yaml.safe_load(shipped.read_text())
    raw["data"]["path"] = str(tmp_path / "not-here")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(raw))
    assert main(["plan", str(spec), "--json"]) == 0
    for lv in _json(capsys)["levels"]:
        assert "--fanout" in lv["reconstructed_note"]
        assert all(g["sd_reconstructed"] is None and g["sd_measured"] > 0 for g in lv["groups"])
    fanout = "county=5,tract=50,block_group=3,block=25"
    assert main(["plan", str(spec), "--json", "--fanout", fanout]) == 0
    report = _json(capsys)
    assert [lv["fanout"] for lv in report["levels"]] == [None, 5.0, 50.0, 3.0, 25.0]
    for lv in report["levels"]:
        assert lv["reconstructed_note"] is None
        for g in lv["groups"]:
            assert 0 < g["sd_reconstructed"] <= g["sd_measured"] * (1 + 1e-9)
    assert main(["plan", str(spec), "--fanout", "tract=0.5"]) == 2
    assert "--fanout" in capsys.readouterr().err


def test_a_bad_fanout_is_refused_before_the_plan_is_saved(tmp_path, capsys) -> None:
    spec = _spec(tmp_path)
    save = tmp_path / "plan.npz"
    for bad in ("district=3", "county=0", "county"):
        assert main(["plan", str(spec), "--fanout", bad, "--save", str(save)]) == 2
        assert "--fanout" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # nothing written
