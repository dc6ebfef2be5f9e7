"""The one spec reader (``dpdask.specs``): strict YAML, the id rule, the budget parser."""

from __future__ import annotations

import os
import pathlib
import time
from fractions import Fraction

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdask.errors import SpecError
from dpdask.privacy import ApproxDP, PureDP, zCDP
from dpdask.specs import MAX_SPEC_BYTES, check_id, parse_budget, read_spec, spec_model


def _read(tmp_path: pathlib.Path, text: str | bytes):
    p = tmp_path / "spec.yaml"
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return read_spec(p)


# -- strict YAML ------------------------------------------------------------------------------
class _NoAliases(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


_scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8)
_keys = st.text(min_size=1, max_size=6)
_docs = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(doc=st.dictionaries(_keys, _docs, max_size=5))
def test_strict_reading_agrees_with_pyyaml_on_plain_documents(tmp_path_factory, doc) -> None:
    """Without repeated keys or aliases, the strict reader reads what PyYAML's safe loader
    reads (an independent loader as the oracle)."""
    text = yaml.dump(doc, Dumper=_NoAliases, allow_unicode=True)
    assert _read(tmp_path_factory.mktemp("y"), text) == yaml.safe_load(text)


@pytest.mark.parametrize(
    ("text", "key", "line"),
    [
        ("privacy:\n  zcdp: 0.01\n  zcdp: 100\n", "zcdp", 3),
        ("privacy: {zcdp: 0.01,\n  zcdp: 100}\n", "zcdp", 2),
        ("a: 1\nb:\n  - c: [1, {d: 1, e: 2}]\n  - c: [{d: 1,\n       d: 2}]\n", "d", 5),
        ("release: x\nrelease: y\n", "release", 2),
        ("1: a\n1: b\n", "1", 2),
    ],
)
def test_a_repeated_key_at_any_depth_names_the_key_and_line(tmp_path, text, key, line) -> None:
    with pytest.raises(SpecError, match=rf"line {line},.*duplicate key '?{key}'?"):
        _read(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("a: &x 1\nb: 2\n", "anchor"),
        ("a: &x [1]\nb: *x\n", "anchor"),
        ("a: !!str &x y\n", "anchor"),
        ("base: {x: 1}\nb:\n  <<: {x: 2}\n", "merge key"),
        ("[" * 100 + "]" * 100, "nested deeper"),
    ],
)
def test_anchors_aliases_merge_keys_and_deep_nesting_are_refused(tmp_path, text, what) -> None:
    with pytest.raises(SpecError, match=what):
        _read(tmp_path, text)


def test_an_alias_bomb_fails_at_its_first_anchor(tmp_path) -> None:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    start = time.perf_counter()
    with pytest.raises(SpecError, match=r"line 1, .*anchor \(&a\)"):
        _read(tmp_path, "\n".join(lines) + "\nrelease: *i\n")
    assert time.perf_counter() - start < 0.5


def test_the_size_limit(tmp_path) -> None:
    at_limit = "a: 1\n" + "#" * (MAX_SPEC_BYTES - 6) + "\n"
    assert len(at_limit.encode()) == MAX_SPEC_BYTES
    assert _read(tmp_path, at_limit) == {"a": 1}
    with pytest.raises(SpecError, match="larger than 1024 KiB"):
        _read(tmp_path, at_limit + "\n")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"a: \xff\n", "not UTF-8"),
        ("a: [1, 2\n", "not valid YAML"),
        ("a: !!python/name:os.system\n", "not valid YAML"),
        ("a: " + "9" * 5000 + "\n", "cannot be read"),
    ],
)
def test_other_bad_files_are_one_spec_error(tmp_path, content, message) -> None:
    with pytest.raises(SpecError, match=message):
        _read(tmp_path, content)


def test_missing_files_and_folders(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        read_spec(tmp_path / "absent.yaml")
    with pytest.raises(SpecError, match="not a folder"):
        read_spec(tmp_path)
    os.mkfifo(tmp_path / "pipe.yaml")
    with pytest.raises(SpecError, match="regular file"):
        read_spec(tmp_path / "pipe.yaml")  # refused at once, never read


def test_spec_model() -> None:
    assert spec_model({"model": "sums"}) == "sums"
    assert spec_model({"release": "x"}) is None and spec_model(None) is None
    with pytest.raises(SpecError, match="model"):
        spec_model({"model": ["local"]})


# -- ids and budgets --------------------------------------------------------------------------
@pytest.mark.parametrize("good", ["a", "pl94-providence", "A.b_c-1", "x" * 200])
def test_good_ids(good) -> None:
    assert check_id(good, "release") == good


@pytest.mark.parametrize(
    "bad", ["", "../../etc/x", "a/b", "a\u202eb", "a\nb", "a\n", "1a", ".x", "a b", "x" * 201, 3]
)
def test_bad_ids_name_the_field(bad) -> None:
    with pytest.raises(SpecError, match=r"^release: "):
        check_id(bad, "release")


def test_budgets_of_each_form() -> None:
    assert parse_budget({"zcdp": "1/2"}, "privacy") == zCDP(Fraction(1, 2))
    assert parse_budget({"rho": 2}, "privacy") == zCDP(2)
    assert parse_budget({"epsilon": 1, "delta": 0}, "privacy") == PureDP(1)
    assert parse_budget({"epsilon": 1, "delta": "1e-9"}, "privacy") == ApproxDP(1, "1e-9")


@pytest.mark.parametrize(
    ("raw", "allowed", "message"),
    [
        ({"zcdp": 1, "epsilon": 1}, None, "exactly one"),
        ({"zcdp": 1}, ("epsilon",), "unknown key 'zcdp'"),
        ({"epsilon": 1, "delta": 1e-9}, ("epsilon",), "unknown key 'delta'"),
        ({"epsilon": -1}, None, "positive"),
        ({"epsilon": 0}, None, "positive"),
        ({"epsilon": True}, None, "positive"),
        ({"epsilon": "x"}, None, "privacy"),
        ({"zcdp": 10**7}, None, "outside"),
        ({"delta": 1e-9}, None, "goes with epsilon"),
        ({}, ("epsilon", "dataset"), r"give one of epsilon$"),
        ([1], None, "expected a mapping"),
    ],
)
def test_bad_budgets_name_the_field(raw, allowed, message) -> None:
    args = () if allowed is None else (allowed,)
    with pytest.raises(SpecError, match=message):
        parse_budget(raw, "privacy", *args)
