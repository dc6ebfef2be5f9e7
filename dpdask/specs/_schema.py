"""The release-spec JSON Schema shipped in the package, and a checker for it.

``release-spec.schema.json`` (JSON Schema draft 2020-12, beside this module) describes
every kind of release spec; it is generated from the spec readers' own key tables by
``dpdask.cli._schema.release_spec_schema`` (a test keeps the shipped file equal to it),
printed by ``dpdask schema`` and checked by ``dpdask validate`` before the reader's own
checks.

Why a checker of our own rather than the ``jsonschema`` package: the schema uses a
small subset of the vocabulary (``type``, ``enum``, ``const``, ``pattern``,
``minimum``, ``exclusiveMinimum``, ``minItems``, ``items``, ``properties``,
``required``, ``additionalProperties``, ``propertyNames``, ``anyOf``, ``allOf``,
``if``/``then``/``else`` and local ``$ref``), which fits in this module, and the
command runs inside scheduler images where every dependency is one more to keep. A
keyword outside the subset is refused (:func:`schema_problems` raises), never ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any

from dpdask.errors import ArgumentError, SpecError

__all__ = ["SCHEMA_FILE", "check_schema", "release_spec_schema", "schema_problems"]

#: the shipped schema's file name, in this package
SCHEMA_FILE = "release-spec.schema.json"

_ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description", "default", "examples"}
_KEYWORDS = {
    "type", "enum", "const", "pattern", "minimum", "exclusiveMinimum", "minItems", "items",
    "properties", "required", "additionalProperties", "propertyNames", "anyOf", "allOf",
    "if", "then", "else", "$ref", "minLength",
}  # fmt: skip
_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


@cache
def release_spec_schema() -> dict[str, Any]:
    """The shipped release-spec schema (a dict; do not modify it)."""
    schema: dict[str, Any] = json.loads(
        resources.files(__package__).joinpath(SCHEMA_FILE).read_text("utf-8")
    )
    return schema


def _where(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path) or "spec"


def _ref(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    if not ref.startswith("#/"):
        raise ArgumentError(f"schema: only local references are supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    target: Mapping[str, Any] = node
    return target


def schema_problems(
    value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None,
    path: tuple[Any, ...] = (),
) -> Iterator[str]:  # fmt: skip
    """Every way ``value`` fails ``schema``, one line each, naming the dotted field.

    Raises
    ------
    ArgumentError
        If the schema uses a keyword outside the supported subset (module notes).
    """
    root = schema if root is None else root
    unknown = set(schema) - _KEYWORDS - _ANNOTATIONS
    if unknown:
        raise ArgumentError(f"schema: unsupported keyword(s) {sorted(unknown)}")
    where = _where(path)
    if "$ref" in schema:
        yield from schema_problems(value, _ref(root, schema["$ref"]), root, path)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            yield f"{where}: expected {' or '.join(types)}, got {value!r}"
            return
    if "const" in schema and value != schema["const"]:
        yield f"{where}: expected {schema['const']!r}, got {value!r}"
    if "enum" in schema and value not in schema["enum"]:
        yield f"{where}: {value!r} is not one of {schema['enum']}"
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield f"{where}: {value!r} does not match {schema['pattern']}"
        if len(value) < schema.get("minLength", 0):
            yield f"{where}: at least {schema['minLength']} character(s)"
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{where}: {value!r} is below {schema['minimum']}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            yield f"{where}: {value!r} must be above {schema['exclusiveMinimum']}"
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            yield f"{where}: at least {schema['minItems']} item(s)"
        if "items" in schema:
            for i, item in enumerate(value):
                yield from schema_problems(item, schema["items"], root, (*path, i))
    if isinstance(value, Mapping):
        yield from _object_problems(value, schema, root, path)
    for sub in schema.get("allOf", ()):
        yield from schema_problems(value, sub, root, path)
    if "anyOf" in schema:
        tried = [list(schema_problems(value, s, root, path)) for s in schema["anyOf"]]
        if all(tried):
            yield min(tried, key=len)[0] if len(tried) == 1 else (
                f"{where}: matches none of its forms ({'; '.join(t[0] for t in tried)})"
            )  # fmt: skip
    if "if" in schema:
        holds = not any(True for _ in schema_problems(value, schema["if"], root, path))
        branch = schema.get("then" if holds else "else")
        if branch is not None:
            yield from schema_problems(value, branch, root, path)


def _object_problems(
    value: Mapping[Any, Any], schema: Mapping[str, Any], root: Mapping[str, Any],
    path: tuple[Any, ...],
) -> Iterator[str]:  # fmt: skip
    where = _where(path)
    for key in schema.get("required", ()):
        if key not in value:
            yield f"{where}: missing required field {key!r}"
    props = schema.get("properties", {})
    for key, item in value.items():
        if "propertyNames" in schema:
            for problem in schema_problems(key, schema["propertyNames"], root, (*path, key)):
                yield f"{_where((*path, key))}: unknown key; {problem.split(': ', 1)[1]}"
        if key in props:
            yield from schema_problems(item, props[key], root, (*path, key))
        elif schema.get("additionalProperties") is False:
            yield f"{where}: unknown key {key!r}; allowed: {sorted(props)}"
        elif isinstance(schema.get("additionalProperties"), Mapping):
            yield from schema_problems(item, schema["additionalProperties"], root, (*path, key))


def check_schema(doc: Any, schema: Mapping[str, Any] | None = None) -> None:
    """Raise a one-line :class:`~dpdask.errors.SpecError` naming the first field where
    ``doc`` (a spec, as read) fails the release-spec schema (or ``schema``)."""
    schema = release_spec_schema() if schema is None else schema
    for problem in schema_problems(doc, schema):
        raise SpecError(f"{problem} (release-spec schema)")
