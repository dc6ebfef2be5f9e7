"""The release-spec JSON Schema, built from the spec readers' own tables.

:func:`release_spec_schema` builds the schema of every kind of spec (counts,
``model: local``, ``model: sums``) from the tables the readers check with (the keys of
each mapping, the data formats, reconstructions, mechanisms, thresholds and the one id
rule), so that each is said once; the package ships its output as
``dpdask/specs/release-spec.schema.json`` (``dpdask schema --generate`` prints it; a
test keeps the shipped file equal). The schema says which keys exist where and the form of
their values; the readers stay the judges of everything a schema cannot say (a split
over the spec's levels, a budget's range, files that exist).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["release_spec_schema", "render"]

_ID = "https://dpdask.invalid/schemas/release-spec.schema.json"
_NUMBER = {"anyOf": [{"type": "number"}, {"type": "string", "minLength": 1}]}  # 1/3 exact
_PATH = {"type": "string", "minLength": 1}


def _closed(props: dict[str, Any], required: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def _named(names: list[str] | None = None) -> dict[str, Any]:
    """A name, or ``{name: ..., options...}``."""
    name = {"type": "string"} if names is None else {"enum": names}
    return {"anyOf": [name, {"type": "object", "properties": {"name": name}, "required": ["name"]}]}


_SET = {"type": "array", "items": {"type": "string"}, "minItems": 1}
#: ``{marginals: {k: K, attributes: [...]}}`` or ``{marginals: [set or {attributes, weight}]}``
#: (:func:`dpdask.pipeline._spec_plan._marginals`)
_MARGINALS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "marginals": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"k": {"type": "integer", "minimum": 0}, "attributes": _SET},
                    "required": ["k"],
                    "additionalProperties": False,
                },
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "anyOf": [
                            _SET,
                            {
                                "type": "object",
                                "properties": {"attributes": _SET, "weight": _NUMBER},
                                "required": ["attributes"],
                                "additionalProperties": False,
                            },
                        ]
                    },
                },
            ]
        }
    },
    "required": ["marginals"],
    "additionalProperties": False,
}


def _per_level(one: dict[str, Any]) -> dict[str, Any]:
    """One value for every level, or ``{levels: {level: value}}``."""
    levels = _closed({"levels": {"type": "object", "additionalProperties": one}}, ["levels"])
    return {"anyOf": [one, levels]}


def _budget(keys: tuple[str, ...] | list[str]) -> dict[str, Any]:
    return _closed({k: _NUMBER for k in keys})


def _counts() -> dict[str, Any]:
    from dpdask.pipeline import spec as s
    from dpdask.privacy.neighbours import NEIGHBOURS
    from dpdask.specs import BUDGET_KEYS, ID_RULE

    data_keys = {
        "synthetic": s._SYNTHETIC_KEYS,
        "records": tuple(s._records_keys()),
        "pl94": s._CONVERTED_KEYS,
        "ri2010": s._CONVERTED_KEYS,
        "synthetic-blocks": s._SYNTHETIC_BLOCKS_KEYS,
        "store": (),
    }
    every = sorted({k for keys in data_keys.values() for k in keys} | set(s._DATA_KEYS))
    data = {
        "type": "object",
        "properties": {
            "format": {"enum": list(s.DATA_FORMATS)},
            "path": _PATH,
            "id": {"type": "string", "pattern": _pattern(ID_RULE.pattern)},
            "layout": {"enum": ["auto", "dense", "sparse"]},
        },
        "required": ["format"],
        "propertyNames": {"enum": every},
        "allOf": [
            {
                "if": {"properties": {"format": {"const": fmt}}, "required": ["format"]},
                "then": {"propertyNames": {"enum": [*s._DATA_KEYS, *keys]}}
                | ({} if fmt.startswith("synthetic") else {"required": ["path"]}),
            }
            for fmt, keys in data_keys.items()
        ],
    }
    budget_keys = [k for k in s.PRIVACY_KEYS if k in BUDGET_KEYS]
    privacy = _budget(budget_keys)
    privacy["properties"]["split"] = {"type": "object", "additionalProperties": _NUMBER}
    privacy["properties"]["dataset"] = _budget(BUDGET_KEYS)
    privacy["properties"]["neighbours"] = {"enum": list(NEIGHBOURS)}
    reconstruct = {"enum": list(s.RECONSTRUCTIONS)}
    props = {
        "release": {"type": "string", "minLength": 1},
        "data": data,
        "domain": {
            "anyOf": [
                {"enum": list(s.NAMED_DOMAINS)},
                {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1}},
            ]
        },
        "levels": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "workload": _per_level({"anyOf": [*_named()["anyOf"], _MARGINALS]}),
        "privacy": privacy,
        "strategy": _per_level(_named()),
        "reconstruct": {
            "anyOf": [
                reconstruct,
                _closed(
                    {
                        "method": reconstruct,
                        "integer": {"type": "boolean"},
                        "simulate": {"type": "integer", "minimum": 0},
                        "passes": {
                            "anyOf": [
                                {"const": "default"},
                                {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {"anyOf": [{"type": "string"}, _SET]},
                                },
                            ]
                        },
                        "slack": {"type": "number", "minimum": 0},
                        "spine": {"type": "boolean"},
                    }
                ),
            ]
        },
        "output": _PATH,
        "ledger": {
            "anyOf": [
                _PATH,
                _closed({"path": _PATH, "create": {"type": "boolean"}, "url": _PATH}),
            ]
        },
        "cluster": {"anyOf": [_PATH, {"type": "object"}]},
        **_invariants(),
    }
    if set(props) != set(s.SPEC_KEYS):
        raise RuntimeError("the schema must name every key of a count spec")
    return _closed(props, s.REQUIRED_KEYS)


def _invariants() -> dict[str, Any]:
    """``invariants:`` and ``constraints:`` (:mod:`dpdask.pipeline.invariants`)."""
    from dpdask.pipeline import invariants as v

    names = {"enum": list(v.INVARIANT_NAMES)}
    count = {"type": "integer", "minimum": 0}
    switch = {"type": "boolean"}
    codes = {"anyOf": [count, {"type": "array", "items": count, "minItems": 1}]}
    cell = _closed(
        {
            "level": {"type": "string"},
            "mask": {"type": "object", "additionalProperties": codes},
            "lower": count,
            "upper": count,
        },
        ["level", "mask"],
    )
    constraints = {
        "empty_units": {
            "anyOf": [switch, _closed({"facilities": {"enum": list(v.FACILITY_SOURCES)}})]
        },
        "nursing_minors": switch,
        "gq_bounds": {
            "anyOf": [switch, _closed({"capacity": {"anyOf": [count, {"type": "string"}]}})]
        },
        "cells": {"type": "array", "items": cell, "minItems": 1},
    }
    if set(constraints) != set(v.CONSTRAINT_KEYS):
        raise RuntimeError("the schema must name every constraint")
    return {
        "invariants": {
            "type": "object",
            "additionalProperties": {
                "anyOf": [names, {"type": "array", "items": names, "minItems": 1}]
            },
        },
        "constraints": _closed(constraints),
    }


def _local() -> dict[str, Any]:
    from dpdask.ldp import local_spec as s
    from dpdask.specs import ID_RULE

    known: dict[str, Any] = {
        "model": {"const": "local"},
        "release": {"type": "string", "pattern": _pattern(ID_RULE.pattern)},
        "domain": {"type": "object"},
        "n": {"type": "integer", "minimum": 1},
        "workload": _named(),
        "privacy": {"type": "object"},
        "strategy": {"type": "object"},
        "strategy_file": _PATH,
        "responses": _PATH,
        "response_column": {"type": "string", "minLength": 1},
        "geography_column": {"type": ["string", "null"]},
        "reconstruct": {"enum": list(s._RECONSTRUCT)},
        "output": _PATH,
        "alpha": {"type": "number", "exclusiveMinimum": 0},
    }
    return _closed(
        {k: known.get(k, {}) for k in s.SPEC_KEYS},
        ["model", "workload", "privacy", "strategy_file"],
    )


def _sums() -> dict[str, Any]:
    from dpdask.specs import ID_RULE
    from dpdask.sums import sum_spec as s

    data = _closed(
        {k: {"type": "string", "minLength": 1} for k in sorted(s._DATA_KEYS)},
        sorted(s._DATA_KEYS - {"format", "id"}),
    )
    thresholds = sorted(s._THRESHOLD_KEYS)
    known: dict[str, Any] = {
        "model": {"const": "sums"},
        "release": {"type": "string", "pattern": _pattern(ID_RULE.pattern)},
        "data": data,
        "geographies": {"anyOf": [_PATH, {"type": "array", "minItems": 1}]},
        "by": {"type": "object", "additionalProperties": {"type": "array", "minItems": 1}},
        "bins": {"type": "object"},
        "workload": {"anyOf": [{"enum": ["prefix", "total", "range"]}, {"type": "object"}]},
        "threshold": {
            "anyOf": [
                {"enum": [*thresholds, "none"]},  # none: no threshold (the bins' top)
                {
                    "anyOf": [
                        _closed({k: {} for k in sorted(keys)} | {"name": {"const": name}}, ["name"])
                        for name, keys in sorted(s._THRESHOLD_KEYS.items())
                    ]
                },
            ]
        },
        "mechanism": {"enum": list(s._MECHANISMS)},
        "strategy": _named(),
        "postprocess": {"type": "string"},
        "privacy": {"type": "object", "required": ["epsilon"]},
        "output": _PATH,
        "ledger": {"anyOf": [_PATH, {"type": "object"}]},
    }
    return _closed({k: known.get(k, {}) for k in s.SPEC_KEYS}, ["model", *s._REQUIRED])


def cmd_schema(argv: Sequence[str]) -> int:
    """``dpdask schema``: print the shipped release-spec JSON Schema."""
    from dpdask.specs import release_spec_schema as shipped

    parser = argparse.ArgumentParser(
        prog="dpdask schema",
        description="Print the JSON Schema (draft 2020-12) of every kind of release spec, "
        "as shipped in the package (dpdask/specs/release-spec.schema.json); dpdask validate "
        "checks a spec with it first.",
    )
    parser.add_argument(
        "--generate", action="store_true",
        help="print the schema built from this checkout's spec readers instead (to rewrite "
        "the shipped file: dpdask schema --generate > dpdask/specs/release-spec.schema.json)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sys.stdout.write(render() if args.generate else json.dumps(shipped(), indent=2) + "\n")
    return 0


def _pattern(python: str) -> str:
    """A Python ``\\A...\\Z`` pattern as an ECMA-262 one (``^...$``)."""
    return "^" + python.removeprefix("\\A").removesuffix("\\Z") + "$"


def release_spec_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of every kind of release spec.

    A spec's ``model`` picks its form: absent, a release of counts; ``local``, a
    local-model collection; ``sums``, a release of sums.

    Returns
    -------
    dict
        The schema, as :func:`json.dumps` writes it into the shipped file.
    """
    from dpdask.cli._release import MODELS

    kinds = {"local": _local(), "sums": _sums()}
    if set(kinds) != {k for k in MODELS if k is not None}:
        raise RuntimeError("the schema must describe every model")

    def pick(name: str) -> dict[str, Any]:
        return {"properties": {"model": {"const": name}}, "required": ["model"]}

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": _ID,
        "title": "dpdask release spec",
        "description": "A dpdask release spec (YAML): counts (no model), model: local or "
        "model: sums. Generated from dpdask's spec readers; `dpdask validate` checks more.",
        "type": "object",
        "$defs": {"counts": _counts(), **kinds},
        "properties": {"model": {"enum": sorted(kinds)}},
        "if": pick("local"),
        "then": {"$ref": "#/$defs/local"},
        "else": {
            "if": pick("sums"),
            "then": {"$ref": "#/$defs/sums"},
            "else": {"$ref": "#/$defs/counts"},
        },
    }


def render() -> str:
    """The schema as the shipped file holds it."""
    return json.dumps(release_spec_schema(), indent=2, sort_keys=False) + "\n"
