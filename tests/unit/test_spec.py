"""The YAML release spec: valid specs parse, each kind of error names its field."""

from __future__ import annotations

import pathlib
import re
from fractions import Fraction

import pytest
import yaml

from dpdask.pipeline.spec import SpecError, load_spec, parse_spec
from dpdask.privacy import ApproxDP, PureDP, zCDP
from tests import ROOT

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


# -- strict specs: one test per rule, over the inputs that break it ---------------------------
def _fails(spec: dict, *fragments: str) -> str:
    """Parse ``spec``, expecting a one-line SpecError containing every fragment."""
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return message


@pytest.mark.parametrize("name", ["pl94-providence.yaml", "cph-synthetic.yaml"])
def test_shipped_specs_parse(name: str) -> None:
    spec = load_spec(ROOT / "pipelines" / name)
    assert spec.data.id is not None
    assert spec.ledger_create is True
    assert spec.ledger == (ROOT / "out" / "ledger.sqlite").resolve()
    budgets = spec.level_budgets(spec.levels)
    assert sum(budgets.values()) == spec.privacy


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"format": "synthetic", "colour": "blue"}, "colour"),
        ({"format": "synthetic", "geographys": 10}, "geographys"),
        ({"format": "pl94", "path": "x", "seed": 0}, "seed"),
        ({"format": "store", "path": "x", "geographies": 3}, "geographies"),
        ({"format": "records", "path": "x", "geography_column": "g", "sep": ","}, "sep"),
    ],
)
def test_data_unknown_key(data: dict, key: str) -> None:
    _fails(_with(data=data), f"data: unknown key {key!r}; allowed: [", "'format'", "'id'")


@pytest.mark.parametrize(
    ("data", "allowed"),
    [
        ({"format": "synthetic", "x": 1}, "'population'"),
        ({"format": "records", "path": "x", "x": 1}, "'geography_column'"),
        ({"format": "records", "path": "x", "x": 1}, "'categories'"),
    ],
)
def test_data_unknown_key_lists_the_formats_keys(data: dict, allowed: str) -> None:
    _fails(_with(data=data), "data: unknown key 'x'", allowed)


def test_data_options_and_id() -> None:
    data = {"format": "records", "path": "x.csv", "id": "census-2020.v1"}
    data.update(geography_column="geoid", attribute_columns={"sex": "SEX"}, blocksize="1MB")
    data.update(geographies=["0101"])
    spec = parse_spec(_with(data=data))
    assert spec.data.id == "census-2020.v1"
    assert spec.data.options == {
        "geography_column": "geoid",
        "geographies": ["0101"],
        "attribute_columns": {"sex": "SEX"},
        "blocksize": "1MB",
    }
    assert parse_spec(GOOD).data.id is None


@pytest.mark.parametrize("bad", [3, "1st", "has space", "", ["a"]])
def test_data_id_is_an_id(bad) -> None:
    _fails(_with(data={"format": "synthetic", "id": bad}), "data.id")


def test_records_need_a_geography_column() -> None:
    _fails(_with(data={"format": "records", "path": "x.csv"}), "data.geography_column")


@pytest.mark.parametrize(
    ("privacy", "key"),
    [
        ({"zcdp": 1, "sigma": 1}, "sigma"),
        ({"zcdp": 1, "Split": {"state": 1}}, "Split"),
        ({"epsilon": 1, "delta": 1e-9, "dleta": 0}, "dleta"),
    ],
)
def test_privacy_unknown_key(privacy: dict, key: str) -> None:
    _fails(_with(privacy=privacy), f"privacy: unknown key {key!r}; allowed: [", "'dataset'")


@pytest.mark.parametrize(
    ("privacy", "fragment"),
    [
        ({"zcdp": 1, "epsilon": 0.01}, "exactly one budget form"),
        ({"zcdp": 1, "rho": 1}, "exactly one budget form"),
        ({"rho": 1, "epsilon": 1, "delta": 1e-9}, "exactly one budget form"),
        ({"delta": 1e-9}, "privacy.delta"),
        ({"zcdp": 1, "delta": 1e-9}, "privacy.delta"),
        ({"rho": 1, "delta": 0}, "privacy.delta"),
        ({"split": {"state": 1, "county": 1}}, "give one of"),
        ({}, "give one of"),
        ({"epsilon": 1, "delta": True}, "privacy"),
        ({"epsilon": 1, "delta": 1}, "privacy"),
        ("zcdp 1", "privacy"),
    ],
)
def test_privacy_has_exactly_one_budget_form(privacy, fragment: str) -> None:
    _fails(_with(privacy=privacy), fragment)


@pytest.mark.parametrize(
    ("privacy", "budget"),
    [
        ({"zcdp": "1/2"}, zCDP(Fraction(1, 2))),
        ({"rho": "1/2"}, zCDP(Fraction(1, 2))),
        ({"epsilon": 1}, PureDP(1)),
        ({"epsilon": 1, "delta": 0}, PureDP(1)),
        ({"epsilon": 1, "delta": 1e-9}, ApproxDP(1, "1e-9")),
    ],
)
def test_privacy_budget_forms(privacy: dict, budget) -> None:
    assert parse_spec(_with(privacy=privacy)).privacy == budget


@pytest.mark.parametrize(
    ("dataset", "fragments"),
    [
        ({"zcdp": 2, "foo": 1}, ("privacy.dataset: unknown key 'foo'", "'zcdp'")),
        ({"zcdp": 2, "split": {"state": 1}}, ("privacy.dataset: unknown key 'split'",)),
        ({"zcdp": 2, "dataset": {"zcdp": 3}}, ("privacy.dataset: unknown key 'dataset'",)),
        ({"zcdp": 2, "epsilon": 1}, ("privacy.dataset: give exactly one budget form",)),
        ({"delta": 1e-9}, ("privacy.dataset.delta",)),
        (2, ("privacy.dataset: expected a mapping",)),
    ],
)
def test_privacy_dataset_is_a_strict_budget(dataset, fragments: tuple[str, ...]) -> None:
    _fails(_with(privacy={"zcdp": 1, "dataset": dataset}), *fragments)


def test_privacy_dataset_budget() -> None:
    spec = parse_spec(_with(privacy={"zcdp": 1, "dataset": {"rho": 4}}))
    assert spec.dataset_budget == zCDP(4)


@pytest.mark.parametrize(
    ("split", "fragment"),
    [
        ({"state": 1}, "no share for level(s) ['county']"),
        ({"state": 1, "county": 1, "nation": 1}, "['nation']"),
        ({"state": 1, "county": -1}, "positive"),
        ({"state": 1, "county": True}, "boolean"),
        ([1, 3], "expected a mapping"),
    ],
)
def test_privacy_split_matches_the_levels(split, fragment: str) -> None:
    _fails(_with(privacy={"zcdp": 1, "split": split}), "privacy.split", fragment)


def test_level_budgets_name_the_split() -> None:
    spec = parse_spec(_with(levels=None, privacy={"zcdp": 1, "split": {"county": 1}}))
    assert spec.level_budgets(("county",)) == {"county": zCDP(1)}
    with pytest.raises(SpecError, match=re.escape("privacy.split: no share for level(s)")):
        spec.level_budgets(("state", "county"))


@pytest.mark.parametrize(
    ("workload", "key"),
    [
        ({"name": "marginals", "kk": 2}, "kk"),
        ({"name": "pl94", "k": 1}, "k"),
        ({"name": "sf1-persons", "table": ["P12"]}, "table"),
        ({"name": "age-pyramid", "kind": "prefix", "voting": True}, "voting"),
        ({"name": "prefix", "size": 4}, "size"),
    ],
)
def test_workload_unknown_option(workload: dict, key: str) -> None:
    _fails(_with(workload=workload), f"workload: unknown key {key!r}; allowed: [", "'name'")


@pytest.mark.parametrize(
    "workload",
    [
        "marginals",
        {"name": "marginals", "k": 2},
        {"name": "sf1", "tables": ["P12"]},
        {"name": "age-pyramid", "kind": "prefix", "voting_age": False},
        {"name": "marginal", "attrs": ["sex"]},
    ],
)
def test_workload_options(workload) -> None:
    expected = {"name": workload} if isinstance(workload, str) else workload
    assert parse_spec(_with(workload=workload)).workload == expected


@pytest.mark.parametrize(
    ("workload", "field"),
    [("nonsense", "workload.name"), ({"k": 1}, "workload"), ({"name": 3}, "workload")],
)
def test_workload_name(workload, field: str) -> None:
    _fails(_with(workload=workload), field)


@pytest.mark.parametrize(
    ("strategy", "key"),
    [
        ({"name": "hdmm", "restart": 3}, "restart"),
        ({"name": "hdmm", "client": "tcp://x"}, "client"),
        ({"name": "hdmm", "domain": {"a": 2}}, "domain"),
        ({"restarts": 3, "colour": 1}, "colour"),
        ({"name": "identity", "seed": 0}, "seed"),
        ({"name": "hierarchical", "restarts": 1}, "restarts"),
        ({"name": "convex", "tolerance": 1e-3}, "tolerance"),
        ({"name": "fitness", "restarts": 3}, "restarts"),
        ({"name": "fitness", "budget": {"zcdp": 1}}, "budget"),
    ],
)
def test_strategy_unknown_option(strategy: dict, key: str) -> None:
    _fails(_with(strategy=strategy), f"strategy: unknown key {key!r}; allowed: [", "'name'")


@pytest.mark.parametrize(
    ("strategy", "name", "options"),
    [
        ("identity", "identity", {}),
        ({"restarts": 2}, "hdmm", {"restarts": 2}),
        ({"name": "hdmm", "seed": 1, "templates": ["kron"], "ftol": 1e-4}, "hdmm", None),
        ({"name": "hierarchical", "branching": 4}, "hierarchical", None),
        ({"name": "convex", "weights": None, "tol": 1e-6, "max_iter": 5}, "convex", None),
        ({"name": "fitness", "targets": 2.0, "method": "auto"}, "fitness", None),
    ],
)
def test_strategy_options(strategy, name: str, options) -> None:
    spec = parse_spec(_with(strategy=strategy))
    assert spec.strategy == name
    if options is None:
        options = {k: v for k, v in strategy.items() if k != "name"}
    assert spec.strategy_options == options


@pytest.mark.parametrize(
    ("ledger", "path", "create"),
    [
        (None, "out/demo.zarr.ledger.sqlite", False),
        ("led/ger.sqlite", "led/ger.sqlite", False),
        ({"path": "led/ger.sqlite"}, "led/ger.sqlite", False),
        ({"path": "led/ger.sqlite", "create": True}, "led/ger.sqlite", True),
        ({"path": "led/ger.sqlite", "create": False}, "led/ger.sqlite", False),
    ],
)
def test_ledger_forms(tmp_path: pathlib.Path, ledger, path: str, create: bool) -> None:
    spec = parse_spec(_with(ledger=ledger), base=tmp_path)
    assert spec.ledger == (tmp_path / path).resolve()
    assert spec.ledger_create is create


@pytest.mark.parametrize(
    ("ledger", "fragment"),
    [
        ({"path": "l.sqlite", "craete": True}, "ledger: unknown key 'craete'; allowed: ["),
        ({"path": "l.sqlite", "create": "yes"}, "ledger.create: expected true or false"),
        ({"path": "l.sqlite", "create": 1}, "ledger.create: expected true or false"),
        ({"create": True}, "ledger: missing required field 'path'"),
        ({"path": 3}, "ledger.path"),
        (["l.sqlite"], "ledger: expected a path"),
    ],
)
def test_bad_ledger(ledger, fragment: str) -> None:
    _fails(_with(ledger=ledger), fragment)


@pytest.mark.parametrize(
    "cluster",
    [
        "tcp://scheduler:8786",
        {"address": "tls://scheduler:8786"},
        {"address": "tcp://scheduler:8786", "insecure": True},
        {"n_workers": 1, "threads_per_worker": 2, "processes": False},
        {"memory_limit": "4GiB", "dashboard_address": ":0"},
    ],
)
def test_cluster_forms(cluster) -> None:
    assert parse_spec(_with(cluster=cluster)).cluster == cluster


def test_cluster_tls_paths_resolve(tmp_path: pathlib.Path) -> None:
    tls = {"ca_file": "ca.pem", "cert": "/abs/cert.pem", "key": "key.pem"}
    spec = parse_spec(_with(cluster={"address": "tls://s:8786", "tls": tls}), base=tmp_path)
    assert spec.cluster == {
        "address": "tls://s:8786",
        "tls": {
            "ca_file": str(tmp_path.resolve() / "ca.pem"),
            "cert": "/abs/cert.pem",
            "key": str(tmp_path.resolve() / "key.pem"),
        },
    }


@pytest.mark.parametrize(
    ("cluster", "fragment"),
    [
        ({"workers": 2}, "cluster: unknown key 'workers'; allowed: ["),
        ({"address": "tcp://s:8786", "n_workers": 2}, "LocalCluster options ['n_workers']"),
        ({"tls": {"ca_file": "ca.pem"}}, "cluster.tls: missing ['cert', 'key']"),
        ({"address": "tcp://s:8786", "insecure": "yes"}, "cluster.insecure"),
        ({"address": "tls://s", "tls": {"ca": "ca.pem"}}, "cluster.tls: unknown key 'ca'"),
        ({"address": "tls://s", "tls": "ca.pem"}, "cluster.tls: expected a mapping"),
        ({"address": "tls://s", "insecure": True, "tls": {"key": "k"}}, "cluster.tls"),
        ({"address": 8786}, "cluster.address"),
        ({"n_workers": 0}, "cluster.n_workers"),
        ({"threads_per_worker": 1.5}, "cluster.threads_per_worker"),
        ({"processes": "no"}, "cluster.processes"),
        ({"memory_limit": True}, "cluster.memory_limit"),
        ({"dashboard_address": 8787}, "cluster.dashboard_address"),
        (["tcp://s:8786"], "cluster: expected"),
        ("", "cluster"),
    ],
)
def test_bad_cluster(cluster, fragment: str) -> None:
    _fails(_with(cluster=cluster), fragment)


@pytest.mark.parametrize(
    ("levels", "fragment"),
    [
        ({"state": 0, "county": 1}, "levels: expected a list"),
        ("state", "levels: expected a non-empty list"),
        (["state", 3], "levels: expected a non-empty list"),
        (["state", "county", "state"], "levels: ['state'] repeated"),
    ],
)
def test_levels_are_a_list(levels, fragment: str) -> None:
    _fails(_with(levels=levels), fragment)
