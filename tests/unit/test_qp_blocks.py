"""The Schur-complement KKT solver of block-diagonal QPs against a dense solve.

Oracle: the regularised KKT matrix assembled densely and solved by LAPACK
(``numpy.linalg.solve``); and the constrained fit through the block path against cvxpy
(in test_topdown_constraints.py, with the path counted here).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from dpdask.reconstruct.topdown._qp_blocks import BlockKKT


def _problem(seed: int, rank_one: bool):
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(1, 7, 5)]
    blocks = []
    for s in sizes:
        if rank_one:
            v = np.ones((1, s))
        else:
            v = rng.normal(size=(int(rng.integers(1, s + 2)), s))
        blocks.append(v.T @ v)
    nb, tail = sum(sizes), 3
    N = nb + tail
    cells = int(max(sizes))
    rows = []
    off = 0
    for s in sizes:  # each block's variables in the parent's cells, one each
        for j in range(s):
            r = np.zeros(N)
            r[off + j] = 1.0
            rows.append((j, r))
        off += s
    M = np.zeros((cells + 4, N))
    for j, r in rows:
        M[j] += r
    for q in range(4):  # query rows inside blocks, three with a slack
        b = int(rng.integers(0, len(sizes)))
        lo = sum(sizes[:b])
        M[cells + q, lo : lo + sizes[b]] = rng.integers(0, 2, sizes[b])
        M[cells + q, lo] = 1.0
        if q < tail:
            M[cells + q, nb + q] = -1.0
    D = rng.uniform(1e-6, 2.0, N)
    return blocks, M, D


@pytest.mark.parametrize("rank_one", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_block_solve_matches_the_dense_kkt(seed, rank_one):
    blocks, M, D = _problem(seed, rank_one)
    E, N = M.shape
    scale, delta = 2.0, 1e-11
    P = np.zeros((N, N))
    off = 0
    for B in blocks:
        P[off : off + B.shape[0], off : off + B.shape[0]] = B
        off += B.shape[0]
    K = np.zeros((N + E, N + E))
    K[:N, :N] = P / scale + np.diag(D + delta)
    K[:N, N:] = M.T
    K[N:, :N] = M
    K[N:, N:] = -delta * np.eye(E)
    rhs = np.random.default_rng(100 + seed).normal(size=N + E)
    want = np.linalg.solve(K, rhs)
    got = BlockKKT(blocks, sp.csr_array(M)).factor(scale, D, delta)(rhs)
    # backward error: the residual against the exact (regularised) system
    assert np.abs(K @ got - rhs).max() <= 1e-8 * max(1.0, np.abs(rhs).max())
    np.testing.assert_allclose(got, want, atol=1e-6 * max(1.0, np.abs(want).max()))


def test_constrained_fit_takes_the_block_path(monkeypatch):
    """A family above the dense size is solved by the Schur complement, not the LU."""
    from dpdask.datasets import synthetic_pl94_blocks
    from dpdask.reconstruct.topdown import (
        _qp,
        _qp_blocks,
        fit_constrained_children,
        pl94_full_constraints,
    )

    monkeypatch.setattr(_qp, "DENSE_KKT", 0)
    calls = []
    real = _qp_blocks.BlockKKT.factor

    def counted(self, *a):
        calls.append(1)
        return real(self, *a)

    monkeypatch.setattr(_qp_blocks.BlockKKT, "factor", counted)
    b = synthetic_pl94_blocks(6, 120, seed=3)
    truth = b.counts.reshape(6, -1).astype(float)
    c = pl94_full_constraints(b.housing_units, b.facilities)
    Y = truth + np.random.default_rng(0).normal(0, 1.0, truth.shape)
    est = fit_constrained_children(np.eye(2016), Y, truth.sum(axis=0), c)
    assert calls
    assert c.satisfied(est.x, atol=1e-8).all()
    np.testing.assert_allclose(est.x.sum(axis=0), truth.sum(axis=0), atol=1e-7)


def test_an_inaccurate_solve_is_redone_by_the_fallback(monkeypatch):
    """A block regularisation too large for the refinement: the solve is checked against
    the exact system and redone by the fallback (the dense solve here)."""
    from dpdask.reconstruct.topdown import _qp_blocks

    monkeypatch.setattr(_qp_blocks, "_BLOCK_REG", 1.0)
    monkeypatch.setattr(_qp_blocks, "_REFINE", 0)
    blocks, M, D = _problem(3, True)
    E, N = M.shape
    K = np.zeros((N + E, N + E))
    off = 0
    for B in blocks:
        K[off : off + B.shape[0], off : off + B.shape[0]] = B
        off += B.shape[0]
    K[:N, :N] += np.diag(D)
    K[:N, N:] = M.T
    K[N:, :N] = M
    used = []

    def fallback():
        used.append(1)
        return lambda r: np.linalg.solve(K, r)

    rhs = np.random.default_rng(5).normal(size=N + E)
    got = BlockKKT(blocks, sp.csr_array(M)).factor(1.0, D, 0.0, fallback)(rhs)
    assert used
    np.testing.assert_allclose(K @ got, rhs, atol=1e-9)
