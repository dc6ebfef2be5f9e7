"""``dpdask bench census --part linear``: each estimator's expected error by its linear model.

A few noise keys cannot rank two estimators at a level of few units: the 25,000-block
state has two counties, whose sum the state invariant fixes, so each key gives one
number. Both estimators the comparison pits against each other are linear in the units'
total errors as long as non-negativity does not bind (true of large units: a county, a
tract), so their expected total-population MAE per level follows from the plans and the
tree alone, without data or releases:

``ls``
    the release's consistent least squares (:mod:`dpdask.reconstruct.consistency`):
    each unit's total from its own measurements (the least-squares total, variance
    ``s_l``), combined up and down the tree with the levels' scalar unit variances
    ``u_l`` (:func:`~dpdask.graph._plans.mean_cell_variance` times the row variance
    when the levels' strategies differ, as the release weighs them);
``multipass``
    the multi-pass top-down's total pass (:mod:`dpdask.graph._multipass`): the top
    level's total exact (the invariant); up the tree, each unit's least-squares total
    combined with its children's sums (:mod:`dpdask.reconstruct.topdown._subtree`,
    the finest level's empty blocks exact at 0); down the tree, each family fitted to
    its parent's total from each child's least-squares total (the total pass fits all of
    a unit's measurements, or their least-squares answers) and its children's sum, the
    difference shared in proportion to the children's variances. (:func:`level_errors`
    can also take a pass that fits the total rows alone, variance ``t_l``, reported as
    ``sd_total_rows``.)

Per level and estimator the figure is the mean absolute error over the level's units
and ``--trials`` draws of the units' independent Gaussian total errors (a Monte Carlo
over the exact tree of ``--blocks``; its standard error is in the output). At the finest
level non-negativity and the detail pass dominate the multi-pass error, so the model's
figure there is not the estimator's (``model_holds`` is false). The plans' noise is as
the releases draw it (``sd_total_plan``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["level_errors", "run_linear"]


def _up(values: np.ndarray, parents: np.ndarray, k: int) -> np.ndarray:
    """``(trials, units)`` summed to the ``k`` parents (the last axis)."""
    out = np.zeros((*values.shape[:-1], k))
    np.add.at(out.T, parents, values.T)
    return out


def _share(var: np.ndarray, parents: np.ndarray, k: int) -> np.ndarray:
    """Each child's part of its family's difference: its variance over the family's."""
    fam = _up(var, parents, k)[parents]
    return np.where(fam > 0, var / np.where(fam > 0, fam, 1.0), 0.0)


def _combine(
    a: np.ndarray, va: np.ndarray, b: np.ndarray, vb: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Inverse-variance combination of two independent estimates (a variance 0 wins;
    ``inf``: no estimate)."""
    wa = np.where(va == 0, np.inf, 1.0 / np.where(va == 0, 1.0, va))
    wb = np.where(vb == 0, np.inf, 1.0 / np.where(vb == 0, 1.0, vb))
    exact_a, exact_b = np.isinf(wa), np.isinf(wb)
    both = ~exact_a & ~exact_b
    wsum = np.where(both, wa + wb, 1.0)
    value = np.where(exact_a, a, np.where(exact_b, b, (a * wa + b * wb) / wsum))
    var = np.where(exact_a | exact_b, 0.0, 1.0 / wsum)
    return value, var


def level_errors(
    parents: Sequence[np.ndarray],
    sizes: Sequence[int],
    s: Sequence[float],
    t: Sequence[float],
    u: Sequence[float],
    known: np.ndarray,
    trials: int,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Per level, the mean absolute and squared total errors of ``ls`` and ``multipass``
    (module notes), with the Monte Carlo's standard error of the mean absolute error.

    Parameters
    ----------
    parents : sequence of ndarray
        ``parents[i]``: each unit of level ``i + 1``'s parent in level ``i``.
    sizes : sequence of int
        Units per level, coarsest first.
    s, t, u : sequence of float
        Per level: the variance of a unit's least-squares total; of the total the
        multi-pass down pass fits for a unit (the release's total pass: that same
        total, ``t = s``; the total rows alone: more); and the scalar unit variance least
        squares weighs the level with.
    known : ndarray of bool
        The finest level's units whose total the constraints fix (at their truth).
    trials : int
        Draws of the total errors.
    seed : int
        The draws' seed.

    Returns
    -------
    dict
        ``{"ls_mae", "ls_mse", "ls_se", "multipass_mae", "multipass_mse",
        "multipass_se"}``, each an array over the levels.
    """
    L = len(sizes)
    rng = np.random.default_rng(seed)
    acc = {k: [np.zeros(L), np.zeros(L), np.zeros(L)] for k in ("ls", "multipass")}
    done = 0
    while done < trials:
        k = min(250, trials - done)
        done += k
        own = [rng.standard_normal((k, n)) * np.sqrt(s[i]) for i, n in enumerate(sizes)]
        rows = [
            o + rng.standard_normal(o.shape) * np.sqrt(max(t[i] - s[i], 0.0))
            for i, o in enumerate(own)
        ]  # the total rows' estimate: the least-squares total plus independent noise
        # least squares: every unit's estimate, the finest level's empty blocks included
        z, vz = [np.empty(0)] * L, [np.empty(0)] * L
        sums, svar = [np.empty(0)] * L, [np.empty(0)] * L
        z[-1], vz[-1] = own[-1], np.full(sizes[-1], u[-1])
        for i in range(L - 2, -1, -1):
            sums[i] = _up(z[i + 1], parents[i], sizes[i])
            svar[i] = _up(vz[i + 1], parents[i], sizes[i])
            z[i], vz[i] = _combine(own[i], np.full(sizes[i], u[i]), sums[i], svar[i])
        final = [z[0]]
        for i in range(1, L):
            p = parents[i - 1]
            diff = final[-1][:, p] - sums[i - 1][:, p]
            final.append(z[i] + _share(vz[i], p, sizes[i - 1]) * diff)
        # the multi-pass total pass: up with least-squares totals, down with total rows
        fixed = np.where(known, 0.0, s[-1])
        zm, vm = [np.empty(0)] * L, [np.empty(0)] * L
        zm[-1], vm[-1] = np.where(known, 0.0, own[-1]), fixed
        for i in range(L - 2, 0, -1):
            sums[i] = _up(zm[i + 1], parents[i], sizes[i])
            svar[i] = _up(vm[i + 1], parents[i], sizes[i])
            zm[i], vm[i] = _combine(own[i], np.full(sizes[i], s[i]), sums[i], svar[i])
        fitted = [np.zeros((k, sizes[0]))]  # the top level's total is the invariant
        for i in range(1, L):
            if i < L - 1:  # its total rows and the levels below (the sums of the up pass)
                est, var = _combine(rows[i], np.full(sizes[i], t[i]), sums[i], svar[i])
            else:
                est = np.where(known, 0.0, rows[i])
                var = np.where(known, 0.0, t[i])
            p = parents[i - 1]
            diff = fitted[-1][:, p] - _up(est, p, sizes[i - 1])[:, p]
            fitted.append(est + _share(var, p, sizes[i - 1]) * diff)
        for name, levels in (("ls", final), ("multipass", fitted)):
            for i, e in enumerate(levels):
                per = np.abs(e).mean(axis=1)  # a trial's MAE over the level's units
                acc[name][0][i] += per.sum()
                acc[name][1][i] += (e**2).mean(axis=1).sum()
                acc[name][2][i] += (per**2).sum()
    out: dict[str, np.ndarray] = {}
    for name, (a, q, a2) in acc.items():
        mae = a / done
        out[f"{name}_mae"] = mae
        out[f"{name}_mse"] = q / done
        out[f"{name}_se"] = np.sqrt(np.maximum(a2 / done - mae**2, 0.0) / done)
    return out


def _level_variances(plans: dict[str, Any], levels: list[str]) -> tuple[list[float], ...]:
    """Per level ``s``, ``t`` and ``u`` of :func:`level_errors` from realised plans."""
    from dask.base import tokenize

    from dpdask.graph._plans import mean_cell_variance
    from dpdask.reconstruct.topdown import total_estimator
    from dpdask.reconstruct.topdown._passes import total_rows

    same = len({tokenize(plans[lv].strategy) for lv in levels}) == 1
    s, t, u = [], [], []
    for lv in levels:
        p = plans[lv]
        A = np.asarray(p.strategy.dense(), dtype=float)
        rv = p.row_variance
        est = total_estimator(A, np.full(A.shape[0], 1.0 / rv))
        if est is None:
            raise ValueError(f"level {lv!r}: the strategy cannot estimate the total")
        s.append(float(est[1]))
        rows = total_rows(A)
        t.append(rv / float(np.sum(A[rows, 0] ** 2)) if rows.size else s[-1])
        u.append(rv * (1.0 if same else mean_cell_variance(p.strategy)))
    return s, t, u


def run_linear(args: argparse.Namespace) -> dict[str, Any]:
    """The model's expected MAE per plan, level and estimator, on the compare's tree."""
    from dpdask.pipeline.run import load_data
    from dpdask.privacy import zCDP
    from dpdask.privacy.neighbours import ADD_REMOVE, CHANGE_ONE, convert
    from dpdask_benchmarks._census_compare import (
        PLANS,
        _names,
        _plans,
        _spec,
        empty_blocks,
        workdir,
    )  # fmt: skip

    plans_ = _names(args.plans, PLANS, "--plans")
    levels = list(args.levels)
    persons = convert(zCDP(args.rho_change_one), CHANGE_ONE, ADD_REMOVE)
    with workdir(args) as root:
        store = load_data(_spec(args, root), root / "work")
        geo = store.geography
        known = empty_blocks(store)  # the empty-block constraint: exactly 0
        parents = [geo.ancestor_index(levels[i], of=levels[i + 1]) for i in range(len(levels) - 1)]
        sizes = [geo.n_units(lv) for lv in levels]
        bound = int(args.persons)  # the state's total, published (an invariant)
        _, drawn, sd, _ = _plans(plans_, levels, persons, store.dtype, bound)
        rows = []
        for name in plans_:
            s, t, u = _level_variances(drawn[name], levels)
            err = level_errors(parents, sizes, s, s, u, known, args.trials, args.seed)
            for i, lv in enumerate(levels):
                row = {
                    "plan": name, "level": lv, "units": sizes[i], "sd_total_plan": sd[name][lv],
                    "sd_total_rows": float(np.sqrt(t[i])), "sd_total_ls": float(np.sqrt(s[i])),
                    "model_holds": i < len(levels) - 1,
                }  # fmt: skip
                for m in ("ls", "multipass"):
                    row[f"mae_{m}"] = float(err[f"{m}_mae"][i])
                    row[f"rmse_{m}"] = float(np.sqrt(err[f"{m}_mse"][i]))
                    row[f"se_{m}"] = float(err[f"{m}_se"][i])
                row["multipass_better"] = bool(row["mae_multipass"] <= row["mae_ls"])
                rows.append(row)
        return {
            "part": "linear",
            "blocks": args.blocks,
            "levels": levels,
            "units": dict(zip(levels, sizes, strict=True)),
            "empty_blocks": int(known.sum()),
            "trials": args.trials,
            "max_total": bound,
            "accuracy": rows,
        }
