"""Reading a spec file as strict YAML.

PyYAML's safe loader, made strict: a document is composed event by event and refused
at the first anchor (``&a``), alias (``*a``) or merge key (``<<``), so an alias bomb
fails on its first anchor, before anything is expanded; every mapping is built key by
key and a key given twice, at any depth, is refused naming the key and both lines
(``privacy: {zcdp: 0.01, zcdp: 100}`` would otherwise keep the last one silently). The
file is read only up to :data:`MAX_SPEC_BYTES`.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import yaml

from dpdask.errors import SpecError

__all__ = ["MAX_SPEC_BYTES", "read_spec", "spec_model"]

#: the largest spec file read (1 MiB); a spec is a page of settings, its data lives elsewhere
MAX_SPEC_BYTES = 1 << 20


class _Refused(yaml.MarkedYAMLError):  # type: ignore[misc]  # PyYAML has no stubs here
    """A construct a strict spec does not allow (raised with its position)."""


#: the deepest nesting of lists and mappings a spec may have
MAX_DEPTH = 64


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no stubs here
    """:class:`yaml.SafeLoader` without anchors, aliases, merge keys or repeated keys."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if self._depth >= MAX_DEPTH:
            raise _Refused(None, None, f"nested deeper than {MAX_DEPTH} levels",
                           event.start_mark)  # fmt: skip
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(None, None, f"an alias (*{event.anchor}) is not allowed in a spec",
                           event.start_mark)  # fmt: skip
        if getattr(event, "anchor", None) is not None:
            raise _Refused(None, None, f"an anchor (&{event.anchor}) is not allowed in a spec",
                           event.start_mark)  # fmt: skip
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            plain: dict[Any, Any] = super().construct_mapping(node, deep=deep)
            return plain
        first: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _Refused(None, None, "a merge key (<<) is not allowed in a spec",
                               key_node.start_mark)  # fmt: skip
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first.get(key)
            except TypeError:  # an unhashable key: the safe constructor says so below
                continue
            if seen is not None:
                raise _Refused(
                    None, None,
                    f"duplicate key {key!r} (first given on line {seen.line + 1})",
                    key_node.start_mark,
                )  # fmt: skip
            first[key] = key_node.start_mark
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


_StrictLoader.add_constructor("tag:yaml.org,2002:map", _StrictLoader.construct_yaml_map)


def _text(path: pathlib.Path) -> str:
    if path.is_dir():
        raise SpecError(f"{path}: a spec is a file, not a folder")
    if not path.is_file():  # a pipe or a device would be read without end
        raise SpecError(f"{path}: a spec is a regular file")
    with path.open("rb") as f:
        data = f.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(
            f"{path}: larger than {MAX_SPEC_BYTES // 1024} KiB; a spec is a page of "
            "settings (lists of geographies belong in a file it names)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_spec(path: str | os.PathLike[str]) -> Any:
    """The YAML document of the spec file at ``path``, read strictly (module notes).

    Parameters
    ----------
    path : str or path-like
        The spec file.

    Returns
    -------
    Any
        The document (usually a mapping; ``None`` for an empty file).

    Raises
    ------
    FileNotFoundError
        If there is no file at ``path``.
    SpecError
        For a file over :data:`MAX_SPEC_BYTES`, text that is not UTF-8 or not YAML, an
        anchor, alias or merge key, or a key repeated in one mapping; the message names
        the file and the line.
    """
    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no spec at {p}")
    text = _text(p)
    try:
        loader = _StrictLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "not valid YAML"
        kind = "" if isinstance(exc, _Refused) else "not valid YAML: "
        raise SpecError(f"{p}{where}: {kind}{problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except (ValueError, OverflowError) as exc:  # e.g. an integer of 5,000 digits
        raise SpecError(f"{p}: a value cannot be read: {exc}") from None


def spec_model(doc: Any) -> str | None:
    """The ``model:`` a spec document names, or ``None`` (a release spec of counts)."""
    if isinstance(doc, dict):
        model = doc.get("model")
        if model is not None and not isinstance(model, str):
            raise SpecError(f"model: expected a name (local, sums), got {model!r}")
        return model
    return None
