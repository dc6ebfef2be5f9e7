"""The interior point's KKT systems for a block-diagonal Hessian, by a Schur complement.

A family's QP (:mod:`dpdask.reconstruct.topdown._constrained`) has one dense Hessian
block per child (the strategy's Gram on the child's free cells) and a few slack
variables with none; the children are coupled only through the equality rows (the
parent's cells). :class:`BlockKKT` solves the regularised KKT system of
:func:`~dpdask.reconstruct.topdown._qp.solve_qp`,

    [[H, M^T], [M, -delta I]] [x; y] = [r1; r2],   H = P + D + delta_p I,

by eliminating each block: ``x = H^-1 (r1 - M^T y)`` and
``(M H^-1 M^T + delta I) y = M H^-1 r1 - r2``. Each child's block is inverted through
its Cholesky factor (blocks of one size stacked; the cost the cube of the child's free
cells, not of the family's) and the Schur complement ``S = sum_b M_b H_b^-1 M_b^T``, a
dense matrix in the equality rows, factored once per iteration. A parent's cell is a
row with one entry 1 per child, so a child's share of ``S`` in those rows is its
``H_b^-1`` itself, scattered; only its query rows need products.

Children with a singular Gram block (a pass whose rows are the total alone) make ``H_b``
ill-conditioned where the barrier is small, so the blocks are regularised by a larger
``delta_p`` (relative ``1e-9``) and every solve is refined against the system with the
solver's own ``delta`` (up to two steps of iterative refinement, products only). A solve
whose residual against that system stays above ``1e-8`` of its right-hand side is
redone by the sparse LU, and a factorisation that fails (a block or ``S`` not
numerically positive definite) raises :class:`numpy.linalg.LinAlgError`, on which the
solver uses the sparse LU for the iteration: the directions are always those of the
solver's own system.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

__all__ = ["BlockKKT"]

_BLOCK_REG = 1e-9  # the blocks' primal regularisation, relative to the largest diagonal
_REFINE = 2  # refinement steps of every solve against the solver's own system, at most
_EXACT = 1e-13  # ... none once its residual is this small (relative)


def _inverse(H: np.ndarray) -> np.ndarray:
    """The inverse of a symmetric positive definite ``H`` (LAPACK ``potrf``, ``potri``).

    Raises
    ------
    numpy.linalg.LinAlgError
        If ``H`` is not numerically positive definite.
    """
    L, info = sla.lapack.dpotrf(H, lower=1, clean=0)
    if info != 0:
        raise np.linalg.LinAlgError("a block is not positive definite")
    inv, info = sla.lapack.dpotri(L, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError("a block is singular")
    lower = np.tril_indices(inv.shape[0], -1)
    inv[lower[1], lower[0]] = inv[lower]  # potri fills the lower triangle only
    out: np.ndarray = inv
    return out


_Rows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


_BATCH = 64  # blocks up to this size are inverted together (NumPy's stacked LAPACK)


def _inverses(H: np.ndarray, d: np.ndarray, ones: np.ndarray | None) -> np.ndarray:
    """The inverses of the stacked symmetric positive definite ``H`` ``(k, s, s)``; where
    ``H = diag(d) + c 1 1^T`` (``ones`` the ``c``, per block, ``d > 0``) by
    Sherman-Morrison, ``diag(1/d) - c/(1 + c sum(1/d)) (1/d)(1/d)^T``, in ``s^2``.

    Raises
    ------
    numpy.linalg.LinAlgError
        If one is not numerically positive definite.
    """
    if ones is not None:
        inv_d = 1.0 / d  # (k, s)
        coef = ones / (1.0 + ones * inv_d.sum(axis=1))
        out_sm: np.ndarray = -coef[:, None, None] * inv_d[:, :, None] * inv_d[:, None, :]
        s = H.shape[1]
        out_sm[:, np.arange(s), np.arange(s)] += inv_d
        return out_sm
    if H.shape[1] <= _BATCH:
        Li = np.linalg.inv(np.linalg.cholesky(H))  # LinAlgError unless positive definite
        small: np.ndarray = np.matmul(Li.transpose(0, 2, 1), Li)
        return small
    out = np.empty_like(H)
    for k in range(H.shape[0]):
        out[k] = _inverse(H[k])
    return out


def _split_rows(Mc: sp.csc_array, lo: int, hi: int) -> _Rows:
    """The rows of ``M`` in the columns ``lo .. hi - 1`` (one block): those with a
    single entry 1 in a column no other such row uses (rows, their columns, local) and
    the others (rows, dense ``rows x (hi - lo)``)."""
    start, stop = int(Mc.indptr[lo]), int(Mc.indptr[hi])
    r = np.asarray(Mc.indices[start:stop], dtype=np.int64)
    v = np.asarray(Mc.data[start:stop], dtype=float)
    j = np.repeat(np.arange(hi - lo), np.diff(Mc.indptr[lo : hi + 1]))
    rows, inv, count = np.unique(r, return_inverse=True, return_counts=True)
    single = (count[inv] == 1) & (v == 1.0)
    cand_rows, cand_cols = r[single], j[single]
    _, first = np.unique(cand_cols, return_index=True)  # one unit row per column
    unit_rows, unit_cols = cand_rows[first], cand_cols[first]
    others = np.setdiff1d(rows, unit_rows)
    dense = np.zeros((others.size, hi - lo))
    at = np.isin(r, others)
    dense[np.searchsorted(others, r[at]), j[at]] = v[at]
    return unit_rows, unit_cols, others, dense


class BlockKKT:
    """The KKT systems of ``P = blockdiag(blocks, 0)`` and equality rows ``M`` (module
    notes); the structure is read once, each iteration's barrier ``D`` factored by
    :meth:`factor`. Blocks of one size are stacked and factored together.

    Parameters
    ----------
    blocks : sequence of ndarray
        The dense symmetric positive semi-definite diagonal blocks of ``P``, in variable
        order; the variables after the last block have a zero Hessian (slacks).
    M : sparse array
        ``(E, N)`` the equality rows.
    """

    def __init__(self, blocks: Sequence[np.ndarray], M: sp.sparray) -> None:
        sizes = np.array([B.shape[0] for B in blocks], dtype=np.int64)
        offsets = np.cumsum([0, *sizes])
        self.M = sp.csr_array(M)
        Mc = sp.csc_array(M)
        Mc.sum_duplicates()
        self.MT = sp.csr_array(Mc.T)
        self.E, self.N = M.shape
        self.n_blocks = int(offsets[-1])
        diag = [float(np.max(np.diagonal(B), initial=0.0)) for B in blocks]
        self.top = max(diag, default=1.0)
        # per size: the blocks' variables (k, s), their stacked Hessians (k, s, s), and
        # per block its rows of M: the unit rows (one entry 1, each in its own column:
        # the parent's cells) as (rows, columns), and the others dense (rows x s)
        self.groups: list[tuple[np.ndarray, np.ndarray, list[_Rows]]] = []
        for size in np.unique(sizes[sizes > 0]):
            which = [int(b) for b in np.flatnonzero(sizes == size)]
            idx = offsets[which][:, None] + np.arange(size)[None, :]
            stack = np.stack([np.asarray(blocks[b], dtype=np.float64) for b in which])
            parts = [_split_rows(Mc, int(offsets[b]), int(offsets[b + 1])) for b in which]
            self.groups.append((idx, stack, parts))
        self.tail = sp.csr_array(Mc[:, self.n_blocks :])  # the slacks' columns
        # groups whose blocks are each a multiple of the all-ones matrix (a pass of the
        # total alone): the multiples, for Sherman-Morrison inverses
        self.ones: list[np.ndarray | None] = []
        for _, stack, _ in self.groups:
            corner = stack[:, :1, :1]
            self.ones.append(corner[:, 0, 0].copy() if (stack == corner).all() else None)
        # where every variable of a group is in a unit row: its blocks' other rows
        # stacked (k, q, s; zero rows as padding) and the flat indices in S of H^-1,
        # O H^-1 O^T and the cross terms H^-1 O^T, (row of one, row of the other)
        self.flat: list[tuple[np.ndarray, np.ndarray] | None] = []
        for idx, _, parts in self.groups:
            k, s = idx.shape
            if not all(uc.size == s for _, uc, _, _ in parts):
                self.flat.append(None)
                continue
            q = max(o.size for _, _, o, _ in parts)
            row = np.empty((k, s), dtype=np.int64)
            orow = np.zeros((k, q), dtype=np.int64)
            O = np.zeros((k, q, s))
            for b, (ur, uc, orows, other) in enumerate(parts):
                row[b, uc] = ur
                orow[b, : orows.size] = orows
                O[b, : orows.size] = other
            E = self.E
            at = [
                row[:, :, None] * E + row[:, None, :],
                orow[:, :, None] * E + orow[:, None, :],
                row[:, :, None] * E + orow[:, None, :],
                orow[:, None, :] * E + row[:, :, None],
            ]
            self.flat.append((np.concatenate([a.ravel() for a in at]), O))

    def product(self, P_scale: float, D: np.ndarray, delta: float, x: np.ndarray) -> np.ndarray:
        """``(P / P_scale + D + delta I) x`` (the KKT matrix's primal block)."""
        out = (D + delta) * x
        for idx, stack, _ in self.groups:
            out[idx] += np.matmul(stack, x[idx][..., None])[..., 0] / P_scale
        result: np.ndarray = out
        return result

    def factor(
        self, P_scale: float, D: np.ndarray, delta: float,
        fallback: Callable[[], Callable[[np.ndarray], np.ndarray]] | None = None,
    ) -> Callable[[np.ndarray], np.ndarray]:  # fmt: skip
        """A solver of ``[[P / P_scale + D + delta I, M^T], [M, -delta I]]``; a solve
        whose refined residual is not within ``1e-8`` of the right-hand side (or not
        finite) is redone by ``fallback()``'s solver (built once, when first needed), or
        without one raises :class:`numpy.linalg.LinAlgError`.

        Raises
        ------
        numpy.linalg.LinAlgError
            If a block or the Schur complement is not numerically positive definite.
        """
        E, N, nb = self.E, self.N, self.n_blocks
        reg = max(delta, _BLOCK_REG * self.top / P_scale)
        S = np.zeros((E, E))
        inverses = []
        for (idx, stack, parts), flat, ones in zip(self.groups, self.flat, self.ones, strict=True):
            ones_scale = None if ones is None else ones / P_scale
            H = stack / P_scale
            s = H.shape[1]
            H[:, np.arange(s), np.arange(s)] += D[idx] + reg
            Hi = _inverses(H, D[idx] + reg, ones_scale)
            inverses.append(Hi)
            if flat is not None:  # every variable in one unit row: H^-1 scattered
                at, O = flat
                HC = np.matmul(Hi, O.transpose(0, 2, 1))  # (k, s, q)
                vals = [Hi.ravel(), np.matmul(O, HC).ravel(), HC.ravel(), HC.ravel()]
                S += np.bincount(at, np.concatenate(vals), minlength=E * E).reshape(E, E)
                continue
            for k, (ur, uc, orows, other) in enumerate(parts):
                Hk = Hi[k]
                if ur.size:
                    S[np.ix_(ur, ur)] += Hk[np.ix_(uc, uc)]
                if orows.size:
                    HC = Hk @ other.T  # (s, q)
                    S[np.ix_(orows, orows)] += other @ HC
                    if ur.size:
                        cross = HC[uc]
                        S[np.ix_(ur, orows)] += cross
                        S[np.ix_(orows, ur)] += cross.T
        dt = 1.0 / (D[nb:] + reg)
        if self.tail.shape[1]:
            S += (self.tail * dt[None, :]) @ self.tail.T
        S[np.diag_indices_from(S)] += delta
        cS = sla.cho_factor(S, lower=True, check_finite=False) if E else None
        groups = [(g[0], Hi) for g, Hi in zip(self.groups, inverses, strict=True)]

        def h_solve(r: np.ndarray) -> np.ndarray:
            out = np.empty_like(r)
            for idx, Hi in groups:
                out[idx] = np.matmul(Hi, r[idx][..., None])[..., 0]
            out[nb:] = r[nb:] * dt
            return out

        def reg_solve(rhs: np.ndarray) -> np.ndarray:
            r1, r2 = rhs[:N], rhs[N:]
            u = h_solve(r1)
            if cS is None:
                return np.concatenate([u, np.zeros(0)])
            y = sla.cho_solve(cS, self.M @ u - r2, check_finite=False)
            x = h_solve(r1 - self.MT @ y)
            return np.concatenate([x, y])

        def apply(sol: np.ndarray) -> np.ndarray:
            x, y = sol[:N], sol[N:]
            top = self.product(P_scale, D, delta, x) + self.MT @ y
            return np.concatenate([top, self.M @ x - delta * y])

        backup: list[Callable[[np.ndarray], np.ndarray]] = []

        def solve(rhs: np.ndarray) -> np.ndarray:
            size = 1.0 + float(np.max(np.abs(rhs), initial=0.0))
            sol = reg_solve(rhs)
            res = rhs - apply(sol)
            for _ in range(_REFINE):  # refined until the residual is at rounding level
                if float(np.max(np.abs(res), initial=0.0)) <= _EXACT * size:
                    break
                sol = sol + reg_solve(res)
                res = rhs - apply(sol)
            bad = float(np.max(np.abs(res), initial=0.0))
            if bad <= 1e-8 * size:  # (NaN is not <=)
                return sol
            if fallback is None:
                raise np.linalg.LinAlgError("the block solve is inaccurate")
            if not backup:
                backup.append(fallback())
            return backup[0](rhs)

        return solve
