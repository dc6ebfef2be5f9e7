"""The YAML release spec: valid specs parse, each kind of error names its field."""

from __future__ import annotations

import pathlib
from fractions import Fraction

import pytest
import yaml

from dpdask.pipeline.spec import SpecError, load_spec, parse_spec
from dpdask.privacy import PureDP, zCDP

GOOD = {
    "release": "demo",
    "data": {"format": "synthetic", "geographies": 10},
    "domain": {"sex": 2, "age": 5},
    "levels": ["state", "county"],
    "workload": {"name": "marginals", "k": 1},
    "privacy": {"zcdp": "1/2", "split": {"state": 1, "county": 3}},
    "output": "out/demo.zarr",
}


def _with(**changes):
    spec = {**GOOD}
    for k, v in changes.items():
        if v is None:
            spec.pop(k, None)
        else:
            spec[k] = v
    return spec


def test_good_spec_parses(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(GOOD, sort_keys=False))
    spec = load_spec(path)
    assert spec.release == "demo"
    assert spec.domain.shape == (2, 5)
    assert spec.output == (tmp_path / "out/demo.zarr").resolve()
    assert spec.privacy == zCDP(Fraction(1, 2))
    shares = spec.level_budgets(("state", "county"))
    assert shares == {"state": zCDP(Fraction(1, 8)), "county": zCDP(Fraction(3, 8))}
    assert sum(shares.values()) == spec.privacy


def test_pure_dp_and_even_split() -> None:
    spec = parse_spec(_with(privacy={"epsilon": 1}))
    assert spec.level_budgets(("state", "county")) == {
        "state": PureDP(Fraction(1, 2)),
        "county": PureDP(Fraction(1, 2)),
    }


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (_with(release=None), "release"),
        (_with(release="3bad id"), "release"),
        (_with(data={"format": "csv", "path": "x"}), "data.format"),
        (_with(data={"format": "store"}), "data.path"),
        (_with(domain={"sex": 0}), "domain"),
        (_with(domain="nowhere"), "domain"),
        (_with(levels=[]), "levels"),
        (_with(workload=3), "workload"),
        (_with(privacy={"zcdp": -1}), "privacy"),
        (_with(privacy={"epsilon": "nan"}), "privacy"),
        (_with(privacy={"sigma": 1}), "privacy"),
        (_with(privacy={"zcdp": 1, "split": {"state": 0, "county": 1}}), "privacy.split"),
        (_with(privacy={"zcdp": 1, "split": {"nation": 1}}), "privacy.split"),
        (_with(strategy="magic"), "strategy"),
        (_with(reconstruct="guess"), "reconstruct"),
        (_with(output=None), "output"),
        (_with(colour="blue"), "unknown field"),
    ],
)
def test_bad_specs_name_the_field(spec, field: str) -> None:
    with pytest.raises(SpecError, match=field):
        parse_spec(spec)


def test_missing_and_malformed_files(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_spec(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("release: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
