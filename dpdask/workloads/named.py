"""Workloads by name, as release specs and the command line spell them.

One table of names for every entry point (``dpdask plan``, the YAML spec, the
benchmarks), so that a name means the same workload everywhere.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from dpdask import census
from dpdask.domain import Domain
from dpdask.errors import ArgumentError, DomainError, ShapeError, SpecError
from dpdask.linalg import LinearQuery
from dpdask.workloads.marginals import identity, marginal, marginals
from dpdask.workloads.pl94 import pl94
from dpdask.workloads.pl94_full import pl94_full
from dpdask.workloads.pyramid import age_pyramid
from dpdask.workloads.ranges import all_range, prefix
from dpdask.workloads.ri2010 import ri2010, ri2010_domain
from dpdask.workloads.sf1 import sf1_persons
from dpdask.workloads.sf1_reference import hdmm_reference_domain, sf1_hdmm_reference

__all__ = [
    "WORKLOAD_ALIASES",
    "WORKLOAD_NAMES",
    "build_workload",
    "canonical_name",
    "default_domain",
    "named",
    "workload_options",
]


def _one_dim(build: Callable[[int], LinearQuery]) -> Callable[..., LinearQuery]:
    def make(domain: Domain | None, n: int | None = None) -> LinearQuery:
        if n is None:
            if domain is None or len(domain.shape) != 1:
                raise ArgumentError("needs option n or a one-attribute domain")
            n = domain.shape[0]
        if domain is not None and domain.size != int(n):
            raise ShapeError(f"n = {n} does not match the domain's {domain.size} cells")
        return build(int(n))

    return make


def _needs(domain: Domain | None) -> Domain:
    if domain is None:
        raise ArgumentError("needs a domain")
    return domain


_BUILDERS: dict[str, Callable[..., LinearQuery]] = {
    "pl94": lambda d: pl94(_needs(d)),
    "pl94-full": lambda d: pl94_full(_needs(d)),
    "ri2010": lambda d: ri2010(_needs(d)),
    "sf1-persons": lambda d, **o: sf1_persons(_needs(d), **o),
    "sf1-hdmm": lambda d: sf1_hdmm_reference(_needs(d)),
    "age-pyramid": lambda d, **o: age_pyramid(_needs(d), **o),
    "identity": lambda d: identity(_needs(d)),
    "marginals": lambda d, k=1: marginals(_needs(d), int(k)),
    "marginal": lambda d, attrs: marginal(_needs(d), attrs),
    "prefix": _one_dim(prefix),
    "allrange": _one_dim(all_range),
}
# builders that pass their options on (``**o``): whose signature tells the options
_FORWARDS: dict[str, Callable[..., LinearQuery]] = {
    "sf1-persons": sf1_persons,
    "age-pyramid": age_pyramid,
}
_ALIASES = {"sf1": "sf1-persons", "all-range": "allrange", "tda-2020": "pl94-full"}
WORKLOAD_NAMES: tuple[str, ...] = tuple(_BUILDERS)
WORKLOAD_ALIASES: tuple[str, ...] = tuple(_ALIASES)

_DEFAULT_DOMAINS: dict[str, Callable[[], Domain]] = {
    "pl94": census.pl94_domain,
    "pl94-full": census.pl94_full_domain,
    "ri2010": ri2010_domain,
    "sf1-persons": census.cph_domain,
    "sf1-hdmm": hdmm_reference_domain,
}


def _canonical(name: str) -> str:
    name = _ALIASES.get(name, name)
    if name not in _BUILDERS:
        raise ArgumentError(f"unknown workload {name!r}; use one of {', '.join(WORKLOAD_NAMES)}")
    return name


def canonical_name(name: str) -> str:
    """The table name of a workload name or alias (``sf1`` is ``sf1-persons``).

    Raises
    ------
    ArgumentError
        For an unknown name, listing the known ones.
    """
    return _canonical(name)


def default_domain(name: str) -> Domain | None:
    """The domain a named workload is defined on when none is given (Census workloads)."""
    make = _DEFAULT_DOMAINS.get(_canonical(name))
    return make() if make is not None else None


def workload_options(name: str) -> tuple[str, ...] | None:
    """The options the workload called ``name`` accepts (the domain aside).

    Parameters
    ----------
    name : str
        A workload name or alias (see :func:`named`).

    Returns
    -------
    tuple of str or None
        The option names, from the builder's signature; ``None`` when they cannot be
        told (a builder that passes unnamed options on to a function not listed).

    Raises
    ------
    ArgumentError
        For an unknown name.
    """
    canonical = _canonical(name)
    named_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    out: list[str] = []
    for fn in (_BUILDERS[canonical], _FORWARDS.get(canonical)):
        if fn is None:
            return None
        params = list(inspect.signature(fn).parameters.values())[1:]  # the first: the domain
        out += [p.name for p in params if p.kind in named_kinds and p.name not in out]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return tuple(out)
    return None


def named(name: str, domain: Domain | None = None, **options: Any) -> LinearQuery:
    """The workload called ``name`` on ``domain``.

    Parameters
    ----------
    name : str
        One of ``pl94``, ``pl94-full`` (alias ``tda-2020``: the Census Bureau's
        eleven 2020 query groups on the 2,016-cell histogram), ``ri2010`` (the Rhode
        Island 2010 blocks' domain: total, voting-age and race/ethnicity marginals,
        identity), ``sf1-persons`` (alias
        ``sf1``; option ``tables``),
        ``sf1-hdmm`` (the HDMM reference's SF1 encoding, race 64),
        ``age-pyramid`` (options ``kind``, ``voting_age``), ``identity``,
        ``marginals`` (option ``k``, default 1), ``marginal`` (option ``attrs``),
        ``prefix`` and ``allrange`` (option ``n``, or a one-attribute domain).
    domain : Domain, optional
        The data domain; required by all but ``prefix`` and ``allrange``.
    **options
        The workload's options, as above.

    Returns
    -------
    LinearQuery
        The implicit workload matrix.

    Raises
    ------
    ArgumentError
        For an unknown name, a missing domain or option, or an option that does not
        fit the domain (the message says which); ``DomainError`` for an attribute
        the domain lacks, ``ShapeError`` for ``n`` other than the domain's size.
    """
    canonical = _canonical(name)
    try:
        return _BUILDERS[canonical](domain, **options)
    except TypeError as exc:
        raise ArgumentError(f"workload {name!r}: bad options {sorted(options)}: {exc}") from None
    except KeyError as exc:
        raise DomainError(f"workload {name!r}: {exc} is not in the domain {domain}") from None


def build_workload(workload: Mapping[str, Any], domain: Domain) -> LinearQuery:
    """The workload a release spec names (``{"name": NAME, **options}``) on ``domain``.

    Raises
    ------
    SpecError
        ``workload: ...`` for whatever :func:`named` refuses.
    """
    opts = {k: v for k, v in workload.items() if k != "name"}
    try:
        return named(workload["name"], domain, **opts)
    except ValueError as exc:
        raise SpecError(f"workload: {exc}") from None
