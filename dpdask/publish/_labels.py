"""Labels of a release's queries and cells, so that every published number can be named.

Query labels (the ``workload_query`` coordinate of ``answers`` and ``variance``)
    Every workload row is labelled ``f"{part}_{j:03d}"``: the name of the
    :class:`~dpdask.linalg.VStack` part it belongs to and its position ``j`` among that
    part's rows, counted from 1. Parts with the same name (the several products of one
    Census table) count on as one part, so the SF1 person workload, whose parts are the
    Census tables, reads ``P12_001`` (P12's total line), ``P12_002`` (male), ... exactly as
    the SF1 technical documentation numbers the cells. The PL94 workload reads
    ``votingage_001`` (under 18), ``votingage_002`` (18 and over), ``hisp_001`` (not
    Hispanic), ``hisp_002`` (Hispanic), ``race-single_001`` .. ``race-single_006`` (White
    alone .. Some Other Race alone), ``race-multiple_001`` .. ``race-multiple_057`` (the
    57 combinations of two or more races, in Census order) and ``identity_001`` ..
    ``identity_252`` (every cell, in the domain's C order). Unnamed parts are named
    ``part1``, ``part2``, ...; a workload that is not a union is one part, ``query``.

P.L. 94-171 tables (the ``table_query`` coordinate of ``table_answers``, ``table_variance``)
    The PL94 workload does not ask for the tables of the P.L. 94-171 file, and its
    labels are not theirs: no workload row is the total population, for instance. A
    release of the PL94 workload therefore also publishes the four person tables of the
    P.L. 94-171 redistricting file, computed from the same consistent estimates (post-
    processing; no further privacy cost), labelled as the Census labels them
    (:func:`pl94_tables`):

    ========  =========================================================  ====
    table     lines                                                      rows
    ========  =========================================================  ====
    P1        race: 001 total, 002 population of one race, 003-008 each       71
              race alone, 009 two or more races, 010 population of two
              races, 011-025 its combinations, 026 three races, 027-046,
              047 four, 048-062, 063 five, 064-069, 070 six, 071
    P2        001 total, 002 Hispanic or Latino, 003 not Hispanic or         73
              Latino, 004-073 P1's lines 002-071 for not Hispanic or Latino
    P3        P1 for the population 18 years and over                        71
    P4        P2 for the population 18 years and over                        73
    ========  =========================================================  ====

    So ``P1_001`` is the total population and ``P1_003`` the population reporting White
    alone (the workload's ``race-single_001``), as in the Census's own files.

Cell labels (the coordinates of ``estimate``'s attribute axes)
    Readable names where the Census coding is known (:mod:`dpdask.census`): race
    combinations such as ``"White; Asian"``, Hispanic origin, sex, voting age,
    relationship and RI 2010's race-ethnicity. They are the attribute dimension's index,
    so ``ds.sel(votingage="18 years and over")`` selects by name, and the values
    ``0 .. n-1`` are kept beside them as ``<attr>_code``. An attribute without known
    names (``age``, or an unknown coding) keeps its values ``0 .. n-1`` as its index
    and has no ``_code`` coordinate: ``sel(age=17)``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpdask import census
from dpdask.domain import Domain
from dpdask.errors import DomainError
from dpdask.linalg import Kron, LinearQuery, VStack
from dpdask.workloads.products import indicator, product
from dpdask.workloads.ri2010 import RACEETH_LABELS

__all__ = [
    "CODE_SUFFIX",
    "PL94_PARTS",
    "QUERY_DIM",
    "category_labels",
    "pl94_tables",
    "published_tables",
    "query_descriptions",
    "query_labels",
    "strategy_record",
    "workload_record",
]

QUERY_DIM = "workload_query"
"""The dimension (and label coordinate) of a release's workload rows; not ``query``,
which would shadow :meth:`xarray.Dataset.query` (older releases are renamed on reading)."""

CODE_SUFFIX = "_code"
"""Suffix of the coordinate holding a labelled attribute's integer values
(``votingage_code``): the attribute's own coordinate holds its category names."""

PL94_PARTS: tuple[str, ...] = ("votingage", "hisp", "race-single", "race-multiple", "identity")
"""Part names of :func:`dpdask.workloads.pl94`, by which its releases are recognised."""

_MAX_DESCRIBED = 100_000  # longer workloads get labels but no descriptions
_MAX_FACTOR_CELLS = 1_000_000  # a factor larger than this is not made dense to describe it

_CATEGORIES: dict[str, tuple[str, ...]] = {
    "race": tuple(census.race_label(i) for i in range(len(census.race_combinations()))),
    "hisp": ("Not Hispanic or Latino", "Hispanic or Latino"),
    "sex": ("Male", "Female"),
    "votingage": ("Under 18 years", "18 years and over"),
    "relation": census.RELATIONSHIPS,
    "raceeth": RACEETH_LABELS,
}


def category_labels(domain: Domain) -> dict[str, list[str] | None]:
    """Readable names of each attribute's values, where the Census coding is known.

    Parameters
    ----------
    domain : Domain
        The data domain.

    Returns
    -------
    dict of str to (list of str or None)
        For each attribute in domain order, ``domain[attr]`` names, or ``None`` when its
        values are plain integers (``age``, or an attribute of unknown coding or size).

    Examples
    --------
    >>> labels = category_labels(Domain(votingage=2, hisp=2, race=63))
    >>> labels["race"][6], labels["votingage"]
    ('White; Black or African American', ['Under 18 years', '18 years and over'])
    """
    out: dict[str, list[str] | None] = {}
    for attr, size in domain.items():
        names = _CATEGORIES.get(attr)
        out[attr] = list(names) if names is not None and len(names) == size else None
    return out


def _parts(W: LinearQuery) -> list[tuple[str, LinearQuery, float]]:
    if not isinstance(W, VStack):
        return [("query", W, 1.0)]
    names = W.names or tuple(f"part{k + 1}" for k in range(len(W.parts)))
    return [(n, p, float(w)) for n, p, w in zip(names, W.parts, W.weights, strict=True)]


def query_labels(W: LinearQuery, domain: Domain | None = None) -> list[str]:
    """A label for every row of a workload: ``f"{part}_{j:03d}"`` (module notes).

    Parameters
    ----------
    W : LinearQuery
        The workload; a :class:`~dpdask.linalg.VStack` labels its rows by its part names.
    domain : Domain, optional
        Unused by the scheme (accepted so that every labelling function has one call).

    Returns
    -------
    list of str
        ``W.shape[0]`` distinct labels, in row order.

    Examples
    --------
    >>> from dpdask.workloads import pl94
    >>> labels = query_labels(pl94())
    >>> labels[0], labels[6], labels[-1]
    ('votingage_001', 'race-single_003', 'identity_252')
    """
    counts: dict[str, int] = {}
    labels: list[str] = []
    for name, part, _ in _parts(W):
        start = counts.get(name, 0)
        labels.extend(f"{name}_{j:03d}" for j in range(start + 1, start + 1 + part.shape[0]))
        counts[name] = start + part.shape[0]
    seen: set[str] = set()
    for i, lab in enumerate(labels):  # pathological part names ("a" and "a_001"...)
        if lab in seen:
            labels[i] = lab = f"{lab}#{i}"
        seen.add(lab)
    return labels


def _value(labels: Sequence[str] | None, v: int) -> str:
    return str(v) if labels is None else labels[v]


def _factor_rows(f: LinearQuery, attr: str, labels: Sequence[str] | None) -> list[str | None]:
    """What each row of one attribute's factor selects (``None``: every value, unweighted)."""
    m, n = f.shape
    if m * n > _MAX_FACTOR_CELLS:
        return [f"{attr}: row {r + 1}" for r in range(m)]
    D = np.asarray(f.dense())
    out: list[str | None] = []
    for row in D:
        nz = np.flatnonzero(row)
        if not np.allclose(row[nz], 1.0):
            out.append(f"{attr}: weighted")
        elif nz.size == n:
            out.append(None)
        elif nz.size == 0:
            out.append(f"{attr}: none")
        elif nz.size == 1:
            out.append(f"{attr}={_value(labels, int(nz[0]))}")
        elif nz[-1] - nz[0] + 1 == nz.size and labels is None:
            out.append(f"{attr}={nz[0]}..{nz[-1]}")
        elif nz.size <= 3:
            out.append(f"{attr} in {{{', '.join(_value(labels, int(v)) for v in nz)}}}")
        else:
            out.append(f"{attr}: {nz.size} of {n} values")
    return out


def query_descriptions(W: LinearQuery, domain: Domain) -> list[str]:
    """A readable description of every workload row, e.g. ``"votingage=18 years and over"``.

    Each row of a product part is described by what each attribute's factor selects,
    joined by ``", "`` (``"total"`` when it selects everything); values are named by
    :func:`category_labels`. Rows of parts that are not products on ``domain``, and every
    row of a workload of more than 100,000 queries, are described as ``""``.

    Parameters
    ----------
    W : LinearQuery
        The workload.
    domain : Domain
        Its domain (one Kronecker factor per attribute, in order).

    Returns
    -------
    list of str
        ``W.shape[0]`` descriptions, in row order.
    """
    if W.shape[0] > _MAX_DESCRIBED:
        return [""] * W.shape[0]
    cats = category_labels(domain)
    out: list[str] = []
    for _, part, weight in _parts(W):
        if not isinstance(part, Kron) or len(part.factors) != len(domain):
            out.extend([""] * part.shape[0])
            continue
        per_attr = [
            _factor_rows(f, attr, cats[attr])
            for f, attr in zip(part.factors, domain.attrs, strict=True)
        ]
        suffix = "" if weight == 1 else f" (weight {weight:g})"
        for combo in itertools.product(*per_attr):
            text = ", ".join(c for c in combo if c is not None) or "total"
            out.append(text + suffix)
    return out


# -- the P.L. 94-171 tables -------------------------------------------------------------
def _race_lines() -> tuple[list[list[int]], list[str]]:
    """Table P1's 71 lines as groups of race values (0..62), and their Census labels."""
    k = census.n_races()
    groups: list[list[int]] = [list(range(k.size))]
    names = ["Total"]
    groups.append([int(c) for c in np.flatnonzero(k == 1)])
    names.append("Population of one race")
    for c in np.flatnonzero(k == 1):
        groups.append([int(c)])
        names.append(f"{census.race_label(int(c))} alone")
    groups.append([int(c) for c in np.flatnonzero(k >= 2)])
    names.append("Two or more races")
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    for j in range(2, 7):
        groups.append([int(c) for c in np.flatnonzero(k == j)])
        names.append(f"Population of {words[j]} races")
        for c in np.flatnonzero(k == j):
            groups.append([int(c)])
            names.append(census.race_label(int(c)))
    return groups, names


def pl94_tables(domain: Domain) -> tuple[list[str], list[str], VStack]:
    """The person tables P1-P4 of the P.L. 94-171 redistricting file on ``domain``.

    Parameters
    ----------
    domain : Domain
        A domain with ``hisp`` (2 values), ``race`` (63) and ``votingage`` (2) or ``age``
        (single years); other attributes are summed over.

    Returns
    -------
    labels : list of str
        ``P1_001`` .. ``P4_073``, 288 labels (module notes).
    descriptions : list of str
        The Census's line labels, prefixed for P2-P4 by the universe (``"18 years and
        over: Not Hispanic or Latino: White alone"``).
    queries : VStack
        The 288 queries (rows in label order), parts named ``P1`` .. ``P4``.

    Raises
    ------
    DomainError
        If the domain lacks an attribute or an attribute has the wrong size.
    """
    from dpdask.workloads.pl94 import VOTING_AGE

    for attr, size in (("hisp", 2), ("race", len(census.race_combinations()))):
        if attr not in domain or domain[attr] != size:
            raise DomainError(f"the P.L. 94-171 tables need attribute {attr!r} of size {size}")
    if "votingage" in domain and domain["votingage"] == 2:
        adult = {"votingage": indicator(2, [[1]])}
    elif "age" in domain and domain["age"] > VOTING_AGE:
        adult = {"age": indicator(domain["age"], [range(VOTING_AGE, domain["age"])])}
    else:
        raise DomainError("the P.L. 94-171 tables need attribute 'votingage' (2) or 'age'")
    groups, names = _race_lines()
    race = indicator(domain["race"], groups)
    race_rest = indicator(domain["race"], groups[1:])
    parts: list[LinearQuery] = []
    part_names: list[str] = []
    labels: list[str] = []
    descriptions: list[str] = []

    def add(table: str, universe: dict[str, Any], prefix: str) -> None:
        rows: list[str] = []
        if table in ("P1", "P3"):
            parts.append(product(domain, {**universe, "race": race}))
            rows = names
        else:
            parts.append(product(domain, universe))
            parts.append(product(domain, {**universe, "hisp": indicator(2, [[1], [0]])}))
            not_hisp = {**universe, "hisp": indicator(2, [[0]]), "race": race_rest}
            parts.append(product(domain, not_hisp))
            nh = "Not Hispanic or Latino"
            rows = ["Total", "Hispanic or Latino", nh, *(f"{nh}: {n}" for n in names[1:])]
        part_names.extend([table] * (len(parts) - len(part_names)))
        labels.extend(f"{table}_{j:03d}" for j in range(1, len(rows) + 1))
        descriptions.extend(prefix + r for r in rows)

    add("P1", {}, "")
    add("P2", {}, "")
    add("P3", adult, "18 years and over: ")
    add("P4", adult, "18 years and over: ")
    return labels, descriptions, VStack(parts, names=part_names)


def published_tables(
    W: LinearQuery, domain: Domain | None
) -> tuple[list[str], list[str], VStack] | None:
    """The Census tables a release of ``W`` also publishes: P1-P4 for the PL94 workload
    (recognised by its part names, :data:`PL94_PARTS`), else ``None``."""
    if domain is None or not isinstance(W, VStack) or W.names != PL94_PARTS:
        return None
    try:
        return pl94_tables(domain)
    except ValueError:
        return None


# -- what a release records about its workload and strategy -----------------------------
def _per_level(records: Sequence[dict[str, Any]], levels: Sequence[str]) -> dict[str, Any]:
    if all(r == records[0] for r in records):
        return records[0]
    return {"levels": dict(zip(levels, records, strict=True))}


def _workload_one(W: LinearQuery) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for name, part, _ in _parts(W):
        if parts and parts[-1]["name"] == name:
            parts[-1]["rows"] += int(part.shape[0])
        else:
            parts.append({"name": name, "rows": int(part.shape[0])})
    recognised = "pl94" if isinstance(W, VStack) and W.names == PL94_PARTS else None
    return {
        "name": recognised,
        "queries": int(W.shape[0]),
        "cells": int(W.shape[1]),
        "operator": repr(W),
        "parts": parts,
        "labels": "workload_query coordinate: {part}_{row:03d}, rows counted from 1 "
        "within each part",
        "tables": "P.L. 94-171 P1-P4 (table_query)" if recognised else None,
    }


def workload_record(plans: Sequence[Any], levels: Sequence[str]) -> dict[str, Any]:
    """The release attributes' record of its workload: size, parts, label scheme.

    ``name`` is ``"pl94"`` when the workload is recognised as
    :func:`dpdask.workloads.pl94` (by its part names), else ``None`` (a release does
    not know the name a spec gave its workload); with per-level plans whose workloads
    differ, ``{"levels": {level: record}}``.
    """
    return _per_level([_workload_one(p.workload) for p in plans], levels)


def strategy_record(plans: Sequence[Any], levels: Sequence[str]) -> dict[str, Any]:
    """The release attributes' record of its strategy: how it was selected and its shape.

    One record when every level measures the same strategy (the budget split over
    levels), else ``{"levels": {level: record}}``.
    """
    records = []
    for p in plans:
        base = getattr(p, "base", p)
        A = getattr(base, "strategy", p.strategy)
        records.append(
            {
                "template": getattr(base, "template", None),
                "mechanism": p.mechanism,
                "rows": int(A.shape[0]),
                "operator": repr(A),
                "measured_rows": int(p.strategy.shape[0]),
            }
        )
    return _per_level(records, levels)
