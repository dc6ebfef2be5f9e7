"""Pure-DP OPT_0 on large interval workloads, from a hierarchy (``_opt0_tree``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dpdask import select
from dpdask.linalg import AllRange, Identity, Prefix, VStack
from dpdask.privacy import PureDP
from dpdask.strategy import PIdentity
from dpdask.strategy._gram import Gram
from dpdask.strategy._invgram import inverse_gram
from dpdask.strategy.hdmm._opt0_tree import (
    TREE_MIN_N,
    opt_0_tree,
    pidentity_loss_large,
    tree_levels,
    tree_start,
    uses_tree,
)
from dpdask.strategy.hdmm._pidentity import pidentity_loss


def _dense_gram(W) -> Gram:
    return Gram(W.shape[1], [(1.0, "dense", Gram.of(W).dense())])


@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize("density", [1.0, 0.05])
@pytest.mark.parametrize(
    "G",
    [Gram.of(Prefix(90)), Gram.of(AllRange(77)), _dense_gram(Prefix(64))],
    ids=["prefix", "allrange", "dense"],
)
def test_large_loss_matches_the_reference(G: Gram, density: float, norm: int) -> None:
    rng = np.random.default_rng(7)
    p, n = 12, G.n
    T = rng.random((p, n)) * (rng.random((p, n)) < density)
    if norm == 2:
        T -= 0.5 * (T > 0)
    gd = G.diag()
    f0, g0 = pidentity_loss(T.ravel(), p, G, gd, norm)
    for sparse in (None, sp.csr_array(T)):
        f, g = pidentity_loss_large(T.ravel(), p, G, gd, norm, sparse)
        assert f == pytest.approx(f0, rel=1e-11)
        np.testing.assert_allclose(g, g0, rtol=1e-9, atol=1e-9 * np.abs(g0).max())


def test_tree_start_is_a_hierarchy() -> None:
    for n, levels in ((64, 3), (100, 4), (1000, 6)):
        T = tree_start(n, levels, scale=1.0)
        assert T.shape == (2**levels - 1, n)
        np.testing.assert_array_equal(T.sum(axis=0), levels)  # every level covers each cell once
        k = 0
        for level in range(levels):
            rows = T[k : k + 2**level]
            k += 2**level
            np.testing.assert_array_equal(rows.sum(axis=0), 1.0)
            sizes = rows.sum(axis=1)
            assert sizes.max() - sizes.min() <= 1  # near-equal blocks
            for r in rows:  # contiguous blocks
                (idx,) = np.nonzero(r)
                assert idx[-1] - idx[0] + 1 == idx.size
    with pytest.raises(ValueError):
        tree_start(4, 4)


def test_levels_follow_hdmm_p() -> None:
    for n in (TREE_MIN_N, 2048, 3000, 4096, 10_000, 1 << 20):
        L = tree_levels(n)
        assert 2**L - 1 <= n / 16 and 2**L - 1 <= 255
        assert L == 8 or 2 ** (L + 1) - 1 > n / 16


def test_which_problems_use_the_tree() -> None:
    big = TREE_MIN_N
    assert uses_tree(Gram.of(Prefix(big)), 1)
    assert uses_tree(Gram.of(VStack([AllRange(big), Identity(big)])), 1)
    assert not uses_tree(Gram.of(Prefix(big)), 2)  # Gaussian noise: the convex optimum
    assert not uses_tree(Gram.of(Prefix(big - 1)), 1)
    assert not uses_tree(Gram.of(Identity(big)), 1)


@pytest.mark.parametrize("W", [Prefix(1100), AllRange(1030)], ids=["prefix", "allrange"])
def test_opt_0_tree_against_bounds(W) -> None:
    """Between the SVD lower bound and every baseline, with its loss evaluated independently."""
    G = Gram.of(W)
    theta, loss, nit = opt_0_tree(G)
    assert theta.shape == (2 ** tree_levels(W.shape[1]) - 1, W.shape[1])
    assert (theta >= 0).all() and nit > 0
    exact = inverse_gram(PIdentity(theta, 1)).trace(G)
    assert loss == pytest.approx(exact, rel=1e-6)
    plan = select(W, PureDP(1), restarts=1)
    err = plan.expected_error()
    assert err >= plan.svd_bound() * (1 - 1e-9)
    for name in ("identity", "hierarchical", "hb", "wavelet"):
        assert err < select(W, PureDP(1), name).expected_error()
    # the first stage alone is a point of the same template: the second only improves it
    _, first, _ = opt_0_tree(G, full=False)
    assert loss <= first * (1 + 1e-12)


def test_a_given_p_is_kept() -> None:
    plan = select(Prefix(TREE_MIN_N), PureDP(1), restarts=1, p=8)
    assert plan.info["p"] == 8
    assert plan.strategy.shape == (TREE_MIN_N + 8, TREE_MIN_N)
