"""What every published uncertainty is the uncertainty of: the labels of a release's
variances, margins of error and simulated RMSEs.

Every published array of uncertainty (``variance``, ``table_variance``, the margins of
error :func:`dpdask.open_release` derives from them, ``unbiased/variance`` and
``simulated_rmse``) carries these attributes (stable keys, documented in the
README's "Reading a release"):

``uncertainty_of``
    the estimator whose error the array describes, in words
    (:func:`estimator_label`): for least squares the published estimate itself; for a
    non-linear estimator (top-down, NNLS, WNNLS, ADMM, integer rounding) the least-squares
    estimate it started from, which is *not* what it published;
``describes_published``
    ``true`` when the array is the uncertainty of the published ``estimate`` /
    ``answers`` of the same group, ``false`` otherwise (read ``simulated_rmse`` and
    ``unbiased/`` for those estimators);
``noise``
    the noise actually drawn (:func:`noise_label`): its law, its scale in data units
    and the variance of one measured row (:func:`dpdask.noise.draw_variance`, through
    the plan's :attr:`~dpdask.strategy.Plan.row_variance`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "DESCRIBES_PUBLISHED",
    "NOISE",
    "UNCERTAINTY_OF",
    "estimator_label",
    "noise_label",
    "published_label",
    "uncertainty_attrs",
]

UNCERTAINTY_OF = "uncertainty_of"
DESCRIBES_PUBLISHED = "describes_published"
NOISE = "noise"

LINEAR = ("ls", "wls")
"""Estimators whose published estimate is the least-squares estimate the variances describe."""

UNBIASED = "unbiased least-squares estimate from this level's measurements alone"
"""What ``<level>/unbiased/`` publishes and its variance describes."""


def _topdown_name(integer: bool, multipass: bool) -> str:
    name = "multi-pass top-down with constraints" if multipass else "top-down"
    return f"integer {name}" if integer else name


def estimator_label(reconstruct: str, integer: bool = False, multipass: bool = False) -> str:
    """What a release's ``variance`` arrays are the variance of, for estimator
    ``reconstruct`` (module notes; ``multipass``: the multi-pass top-down with
    constraints, :mod:`dpdask.graph._multipass`).

    Examples
    --------
    >>> estimator_label("ls")
    "least-squares estimate from all levels' measurements, made consistent across levels"
    """
    if reconstruct in LINEAR:
        return "least-squares estimate from all levels' measurements, made consistent across levels"
    if reconstruct == "topdown":
        what = _topdown_name(integer, multipass)
        return (
            "least-squares estimate from this level's measurements alone, not the "
            f"published {what} estimate (its error: simulated_rmse; the unbiased answers "
            "and their exact variance: unbiased/)"
        )
    return (
        "least-squares estimate from all levels' measurements, made consistent across "
        f"levels, that the {reconstruct} fit started from; not the published "
        f"(non-negative) {reconstruct} estimate"
    )


def published_label(reconstruct: str, integer: bool = False, multipass: bool = False) -> str:
    """The published estimate of a non-linear estimator, in words (what a simulated
    RMSE is of).

    Examples
    --------
    >>> published_label("topdown", integer=True)
    'published integer top-down estimate (its workload answers)'
    >>> published_label("topdown", multipass=True)
    'published multi-pass top-down with constraints estimate (its workload answers)'
    """
    if reconstruct == "topdown":
        return f"published {_topdown_name(integer, multipass)} estimate (its workload answers)"
    return f"published {'integer ' if integer else ''}{reconstruct} estimate (its workload answers)"


def noise_label(plan: Any) -> str:
    """The noise drawn for a level's plan, in words: law, scale, variance per row."""
    drawn = getattr(plan, "drawn", None)
    mechanism = str(getattr(drawn, "mechanism", None) or plan.mechanism).replace("_", " ")
    return (
        f"{mechanism}, drawn scale {float(plan.drawn_scale):.6g} (data units), variance "
        f"{float(plan.row_variance):.6g} per measured row"
    )


def uncertainty_attrs(
    what: str, plan: Any, describes_published: bool, **extra: Any
) -> dict[str, Any]:
    """The attributes of one published uncertainty array (module notes)."""
    return {
        UNCERTAINTY_OF: what,
        DESCRIBES_PUBLISHED: bool(describes_published),
        NOISE: noise_label(plan),
        **extra,
    }
