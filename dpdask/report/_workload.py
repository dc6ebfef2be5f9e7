"""The workload a report compares with the truth: the release's own, or one named.

A release records its workload's size, parts and labels but not the name a spec gave
it (only ``pl94`` is recognised by its part names). To compare its answers with a
truth the report rebuilds it: from ``--workload NAME`` (``workload=`` in Python), or
by trying every named workload (:data:`dpdask.workloads.named.WORKLOAD_NAMES`, default
options) on the release's domain. A candidate is the release's workload only if it
has the published number of queries and their labels, **and** it reproduces the
published answers from the published estimates (:func:`answers_match`, the first
units of the level): labels alone do not fix a matrix.

A named workload that is not the release's is answered from the published estimates
(post-processing, no further privacy cost): its tables get realised errors against
the truth, but no predicted error (the release publishes no variances for them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dpdask.errors import ArgumentError, ArgumentTypeError, DPDaskError

__all__ = ["Rebuilt", "answers_match", "describe", "level_workloads", "rebuild", "workload_spec"]

_CHECKED_UNITS = 16  # units whose published answers a candidate workload must reproduce
_CHECKED_CELLS = 4_000_000  # at most this many estimate cells read for the check


class Rebuilt:
    """A level's workloads as the report rebuilt them.

    Attributes
    ----------
    own : LinearQuery or None
        The release's workload (its answers are published), or None if not rebuilt.
    own_name : str or None
        Its name, when known.
    other : LinearQuery or None
        A named workload that is not the release's, answered from the estimates.
    other_name : str or None
        Its name.
    """

    def __init__(
        self,
        own: Any = None,
        own_name: str | None = None,
        other: Any = None,
        other_name: str | None = None,
    ) -> None:
        self.own, self.own_name = own, own_name
        self.other, self.other_name = other, other_name

    def record(self) -> dict[str, Any]:
        """What the report records: ``release`` (the release's workload's name, ``""``
        when given as a workload, None if not rebuilt) and ``other``."""
        return {
            "release": self.own_name if self.own is not None else None,
            "other": self.other_name,
        }


def workload_spec(value: str) -> str | dict[str, Any]:
    """``--workload``'s value: a name (``marginals``), or a mapping with options in YAML
    flow style, as a release spec writes it (``{name: marginals, k: 2}``).

    Raises
    ------
    dpdask.errors.ArgumentError
        If a mapping is not valid YAML or has no ``name`` (a ``ValueError``).
    """
    text = value.strip()
    if not text.startswith("{"):
        return text
    import yaml

    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ArgumentError(f"--workload {value!r}: not a YAML mapping ({exc})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ArgumentError(f"--workload {value!r}: needs a name, e.g. {{name: marginals, k: 2}}")
    return spec


def describe(spec: str | Mapping[str, Any]) -> str:
    """A workload spec as text: ``marginals`` or ``marginals (k=2)``."""
    if isinstance(spec, str):
        return spec
    opts = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    return f"{spec['name']} ({opts})" if opts else str(spec["name"])


def rebuild(spec: str | Mapping[str, Any], domain: Any) -> Any:
    """The workload ``spec`` names on ``domain``: a name (default options) or a mapping
    ``{"name": NAME, **options}`` as in a release spec.

    Raises
    ------
    dpdask.errors.ArgumentError
        For an unknown name or options, or a workload that cannot be built on ``domain``
        (a ``ValueError``).
    """
    from dpdask.workloads.named import build_workload

    spec = {"name": spec} if isinstance(spec, str) else dict(spec)
    try:
        return build_workload(spec, domain)
    except (ValueError, TypeError, DPDaskError) as exc:
        msg = str(exc).removeprefix("workload: ")
        raise ArgumentError(f"workload {describe(spec)!r} on the release's domain: {msg}") from None


def _is_spec(workload: Any) -> bool:
    return isinstance(workload, str) or (
        isinstance(workload, Mapping) and isinstance(workload.get("name"), str)
    )


def answers_match(g: Any, W: Any, domain: Any) -> bool:
    """Whether ``W`` applied to the level's published estimates gives its published
    answers (the first units; relative tolerance 1e-9, plus 1e-9 of the answers' scale)."""
    from dpdask.report._data import estimate_rows, read_rows

    space = _workload_labels(g)
    if space is None or g[space].shape[0] != W.shape[0] or "estimate" not in g:
        return False
    n = min(int(g["ids"].shape[0]), _CHECKED_UNITS, max(1, _CHECKED_CELLS // domain.size))
    if n == 0:
        return True
    rows = np.arange(n, dtype=np.int64)
    est = estimate_rows(g, rows, (n, *domain.shape))
    want = read_rows(g["answers"], rows)
    got = np.asarray(W.apply(est), dtype=np.float64)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    return bool(np.allclose(got, want, rtol=1e-9, atol=1e-9 * scale))


def _workload_labels(g: Any) -> str | None:
    from dpdask.publish.reader import query_spaces

    return next((s[0] for s in query_spaces(g) if s[4] == "part"), None)


def _labels_match(g: Any, W: Any, domain: Any) -> bool:
    from dpdask.publish import query_labels

    space = _workload_labels(g)
    if space is None or g[space].shape[0] != W.shape[0]:
        return False
    labels = [str(s) for s in np.asarray(g[space][:]).tolist()]
    return query_labels(W, domain) == labels


def _candidates(domain: Any, cache: dict[str, Any]) -> dict[str, Any]:
    from dpdask.workloads.named import WORKLOAD_NAMES

    if not cache:
        for name in WORKLOAD_NAMES:
            try:
                cache[name] = rebuild(name, domain)
            except ValueError:
                cache[name] = None
    return {n: W for n, W in cache.items() if W is not None and W.shape[1] == domain.size}


def level_workloads(
    meta: Mapping[str, Any],
    levels: list[str],
    groups: Mapping[str, Any],
    domain: Any,
    workload: Any,
    notes: list[str],
) -> dict[str, Rebuilt]:
    """Each level's workload for the realised errors (module notes).

    Parameters
    ----------
    meta : mapping
        The release's attributes.
    levels : list of str
        Its levels, coarsest first.
    groups : mapping of str to zarr.Group
        Their groups.
    domain : Domain
        The release's domain.
    workload : str, mapping, LinearQuery, mapping of level to LinearQuery, or None
        A workload name or ``{"name": NAME, **options}`` (``--workload``), the
        workload itself, or None: recognise it.
    notes : list of str
        Where to say what could not be rebuilt.

    Returns
    -------
    dict of str to Rebuilt

    Raises
    ------
    dpdask.errors.ArgumentError
        If ``workload`` names no workload that can be built on the domain (a
        ``ValueError``).
    dpdask.errors.ArgumentTypeError
        If a given workload is not a :class:`~dpdask.linalg.LinearQuery` (a ``TypeError``).
    """
    from dpdask.linalg import LinearQuery

    record = meta.get("workload") or {}
    given = rebuild(workload, domain) if _is_spec(workload) else None
    given_name = describe(workload) if given is not None else None
    cache: dict[str, Any] = {}
    out: dict[str, Rebuilt] = {}
    for lv in levels:
        g = groups[lv]
        rec = record.get("levels", {}).get(lv, record) if "levels" in record else record
        W = workload.get(lv) if isinstance(workload, Mapping) else workload
        if W is not None and given is None:
            if not isinstance(W, LinearQuery):
                raise ArgumentTypeError(
                    f"workload for level {lv!r}: expected a LinearQuery, not {type(W)}"
                )
            out[lv] = Rebuilt(W, "")
            continue
        if given is not None and _labels_match(g, given, domain):
            if answers_match(g, given, domain):
                out[lv] = Rebuilt(given, given_name)
                continue
        found = Rebuilt()
        names = ["pl94"] if rec.get("name") == "pl94" else list(_candidates(domain, cache))
        for name in names:
            cand = cache[name] if name in cache else rebuild(name, domain)
            if _labels_match(g, cand, domain) and answers_match(g, cand, domain):
                found = Rebuilt(cand, name)
                break
        if given is not None:  # not the release's: answered from the estimates
            found.other, found.other_name = given, given_name
        out[lv] = found
    missing = [lv for lv, r in out.items() if r.own is None]
    if missing:
        notes.append(
            f"levels {', '.join(missing)}: the release's workload is none of the named "
            "workloads with their default options (pass --workload NAME, or workload= to "
            "write_report): realised errors of its queries are left out, those of the "
            "histogram cells are shown"
        )
    other = [lv for lv, r in out.items() if r.other is not None]
    if other:
        notes.append(
            f"levels {', '.join(other)}: workload {given_name!r} is not the release's; its "
            "answers are computed from the published estimates (post-processing) and "
            "compared with the truth, without a predicted error"
        )
    return out
