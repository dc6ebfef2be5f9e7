"""The linear models of ``dpdask bench census --part linear`` against a dense GLS.

When every level's total rows are its least-squares total (``t = s``) and least squares
weighs the levels with the totals' own variances (``u = s``), both models are
generalised least squares on the tree's totals (Hay et al.'s two passes): least squares
from every unit's measured total, the multi-pass total pass with the top total known
exactly. The oracle is that GLS computed densely, with the leaves' totals as the
unknowns, its expected MAE ``sqrt(2 / pi)`` times each unit's sd.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dpdask_benchmarks._census_linear import level_errors

# a root, 3 children (one with a single child), 7 leaves
PARENTS = [np.zeros(3, dtype=int), np.array([0, 0, 0, 1, 2, 2, 2])]
SIZES = [1, 3, 7]


def _membership() -> list[np.ndarray]:
    """Per level, ``(units, leaves)``: which leaves each unit holds."""
    leaves = SIZES[-1]
    mid = np.zeros((SIZES[1], leaves))
    mid[PARENTS[1], np.arange(leaves)] = 1
    return [np.ones((1, leaves)), mid, np.eye(leaves)]


def _gls_mae(s: list[float], top_exact: bool, known: np.ndarray) -> list[float]:
    """Per level, the mean over units of ``sqrt(2 / pi)`` times the GLS estimate's sd."""
    member = _membership()
    keep = ~known  # a known leaf is exactly 0: not an unknown
    info = np.zeros((keep.sum(), keep.sum()))
    for i, M in enumerate(member):
        if i == 0 and top_exact:
            continue
        Mk = M[:, keep]
        info += Mk.T @ Mk / s[i]
    cov = np.linalg.inv(info)
    if top_exact:  # condition on the top total: a rank-one update
        a = member[0][:, keep].T
        cov = cov - cov @ a @ a.T @ cov / (a.T @ cov @ a).item()
    out = []
    for M in member:
        Mk = M[:, keep]
        sd = np.sqrt(np.maximum(np.einsum("ij,jk,ik->i", Mk, cov, Mk), 0.0))
        out.append(float(np.mean(sd)) * math.sqrt(2 / math.pi))
    return out


@pytest.mark.parametrize("known_leaf", [None, 4])
def test_both_models_are_the_dense_gls(known_leaf) -> None:
    s = [0.5, 2.0, 9.0]
    known = np.zeros(SIZES[-1], dtype=bool)
    if known_leaf is not None:
        known[known_leaf] = True
    err = level_errors(PARENTS, SIZES, s, s, s, known, trials=40_000, seed=3)
    # least squares knows nothing of the known leaf: its oracle has it unknown
    ls = _gls_mae(s, top_exact=False, known=np.zeros(SIZES[-1], dtype=bool))
    mp = _gls_mae(s, top_exact=True, known=known)
    for i in range(3):
        assert err["ls_mae"][i] == pytest.approx(ls[i], abs=4 * err["ls_se"][i] + 1e-3)
        assert err["multipass_mae"][i] == pytest.approx(
            mp[i], abs=4 * err["multipass_se"][i] + 1e-3
        )
    assert err["multipass_mae"][0] == 0  # the invariant


def test_total_rows_noisier_than_least_squares_cost_the_multipass_model() -> None:
    """With the total rows noisier than the least-squares total (``t > s``), the
    multi-pass model's errors grow and least squares' do not change."""
    s = [0.5, 2.0, 9.0]
    known = np.zeros(SIZES[-1], dtype=bool)
    same = level_errors(PARENTS, SIZES, s, s, s, known, trials=20_000, seed=4)
    worse = level_errors(PARENTS, SIZES, s, [0.5, 8.0, 36.0], s, known, trials=20_000, seed=4)
    np.testing.assert_allclose(worse["ls_mae"], same["ls_mae"], rtol=1e-12)
    assert (worse["multipass_mae"][1:] > same["multipass_mae"][1:] * 1.1).all()
