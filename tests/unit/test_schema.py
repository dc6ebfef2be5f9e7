"""The release-spec JSON Schema: shipped as generated, accepting every shipped spec.

The shipped file must equal what the generator builds from the spec readers' tables
(else it went stale); every spec in ``pipelines/``, ``examples/`` and those the test
fixtures write must pass it, and specs the readers refuse must fail it, naming the field.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from dpdask.cli._schema import release_spec_schema as generated
from dpdask.cli._schema import render
from dpdask.errors import SpecError
from dpdask.specs import SCHEMA_FILE, check_schema, read_spec, release_spec_schema, schema_problems

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "dpdask" / "specs" / SCHEMA_FILE


def _shipped_specs() -> list[pathlib.Path]:
    return sorted([*(ROOT / "pipelines").glob("*.yaml"), *(ROOT / "examples").rglob("*.yaml")])


def test_the_shipped_schema_is_the_generated_one():
    assert SHIPPED.read_text(encoding="utf-8") == render(), (
        "stale: rewrite it with dpdask schema --generate > dpdask/specs/release-spec.schema.json"
    )
    assert release_spec_schema() == generated()
    assert generated()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_schema_is_packaged():
    text = (ROOT / "pyproject.toml").read_text()
    assert f"specs/{SCHEMA_FILE}" in text


@pytest.mark.parametrize("path", _shipped_specs(), ids=lambda p: p.name)
def test_every_shipped_spec_passes(path):
    assert list(schema_problems(read_spec(path), release_spec_schema())) == []


def _fixture_specs(tmp: pathlib.Path) -> list[pathlib.Path]:
    from tests.system.test_accounting import _write_spec
    from tests.system.test_sums_release import _spec

    (tmp / "data").mkdir()
    return [
        _write_spec(tmp),
        _write_spec(tmp, "topdown.yaml", reconstruct={"method": "topdown", "integer": True}),
        _write_spec(tmp, "server.yaml", ledger={"url": "postgresql://op@db/ledger"}),
        _write_spec(
            tmp, "levels.yaml", workload={"levels": {"state": "identity", "county": "marginals"}}
        ),
        pathlib.Path(_spec(tmp)),
        pathlib.Path(_spec(tmp, "t.yaml", threshold="{name: recursive, mu: 3}")),
        pathlib.Path(_spec(tmp, "n.yaml", threshold="none", mechanism="Identity")),
    ]


def test_the_fixtures_specs_pass(tmp_path):
    for path in _fixture_specs(tmp_path):
        assert list(schema_problems(read_spec(path), release_spec_schema())) == [], path.name


def _count() -> dict:
    return yaml.safe_load((ROOT / "pipelines" / "pl94-providence.yaml").read_text())


def _local() -> dict:
    return yaml.safe_load((ROOT / "examples" / "ldp" / "spec.yaml").read_text())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.update(colour="blue"), "colour"),
        (lambda d: d.pop("privacy"), "privacy"),
        (lambda d: d["data"].update(format="excel"), "data.format"),
        (lambda d: d["data"].pop("path"), "path"),
        (lambda d: d["data"].update(geography_column="geo"), "data.geography_column"),
        (lambda d: d.update(reconstruct={"method": "ls", "integer": "yes"}), "integer"),
        (lambda d: d.update(ledger={"path": "l.sqlite", "make": True}), "make"),
        (lambda d: d.update(levels=[]), "levels"),
        (lambda d: d.update(model="global"), "model"),
    ],
)
def test_a_bad_count_spec_fails_naming_the_field(change, field):
    doc = _count()
    change(doc)
    problems = list(schema_problems(doc, release_spec_schema()))
    assert problems and any(field in p for p in problems), problems
    with pytest.raises(SpecError, match="release-spec schema"):
        check_schema(doc)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.pop("strategy_file"), "strategy_file"),
        (lambda d: d.update(reconstruct="nnls"), "reconstruct"),
        (lambda d: d.update(ledger="l.sqlite"), "ledger"),  # the local model keeps none
    ],
)
def test_a_bad_local_spec_fails(change, field):
    doc = _local()
    change(doc)
    assert any(field in p for p in schema_problems(doc, release_spec_schema()))


def test_a_bad_sum_spec_fails(tmp_path):
    from tests.system.test_sums_release import _spec

    for kw, field in [
        ({"mechanism": "Magic"}, "mechanism"),
        ({"threshold": "{name: svt, theta: 3}"}, "threshold"),
        ({"levels": "[state]"}, "levels"),
    ]:
        doc = read_spec(_spec(tmp_path, **kw))
        assert any(field in p for p in schema_problems(doc, release_spec_schema())), kw


def test_the_checker_refuses_a_keyword_it_does_not_know():
    """A schema keyword outside the supported subset is an error, never ignored."""
    with pytest.raises(ValueError, match="maxLength"):
        list(schema_problems("abc", {"type": "string", "maxLength": 2}))


def test_the_checker_against_hand_written_cases():
    schema = {
        "type": "object",
        "properties": {"a": {"anyOf": [{"type": "integer", "minimum": 1}, {"enum": ["x"]}]}},
        "required": ["a"],
        "additionalProperties": False,
        "if": {"properties": {"a": {"const": "x"}}, "required": ["a"]},
        "then": {"required": ["b"]},
    }
    assert list(schema_problems({"a": 3}, schema)) == []
    assert list(schema_problems({"a": True}, schema))  # a boolean is not an integer
    assert list(schema_problems({"a": 0}, schema))
    assert list(schema_problems({}, schema)) == ["spec: missing required field 'a'"]
    assert any("'b'" in p for p in schema_problems({"a": "x"}, schema))
    assert any("unknown key 'c'" in p for p in schema_problems({"a": 1, "c": 2}, schema))
    json.dumps(release_spec_schema())  # plain JSON throughout
