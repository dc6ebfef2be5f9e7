"""NNLS and workload NNLS on implicit operators against scipy.optimize.nnls on dense matrices."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import nnls as scipy_nnls

from dpdask.errors import ConvergenceWarning
from dpdask.linalg import AllRange, Dense, Identity, Kron, Prefix, Total, VStack
from dpdask.reconstruct import least_squares, nnls, wnnls
from dpdask.reconstruct.nnls import nonnegative_fitter


def _strategies(rng: np.random.Generator):
    yield Kron([Prefix(3), Identity(4)])
    yield Kron([Dense(rng.uniform(size=(5, 3))), AllRange(4)])
    yield VStack([Kron([Identity(3), Total(4)]), Kron([Total(3), Identity(4)]), Identity(12)])
    yield VStack([Kron([Identity(3), Prefix(4)]), Kron([Total(3), Identity(4)])], weights=[2, 0.5])


def _relerr(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-12))


@pytest.mark.parametrize("method", ["newton", "spg"])
def test_matches_scipy_nnls(method: str, rng: np.random.Generator) -> None:
    for A in _strategies(rng):
        M = A.dense()
        x_true = rng.poisson(1.0, size=M.shape[1]).astype(float)
        Y = M @ x_true + rng.laplace(scale=2.0, size=(4, M.shape[0]))
        est = nnls(A, Y, tol=1e-12, method=method)
        assert est.report.converged
        assert est.x.shape == (4, M.shape[1]) and (est.x >= 0).all()
        for x, y in zip(est.x, Y, strict=True):
            assert _relerr(x, scipy_nnls(M, y)[0]) < 1e-6
        # a single right-hand side gives the same answer as its row of the batch
        np.testing.assert_allclose(nnls(A, Y[1], tol=1e-12, method=method).x, est.x[1], atol=1e-8)


def test_weighted_matches_scipy(rng: np.random.Generator) -> None:
    A = VStack([Identity(6), Prefix(6), Total(6)])
    M = A.dense()
    w = np.concatenate([np.full(6, 4.0), rng.uniform(0.2, 1.0, size=6), [1.0]])
    y = M @ rng.poisson(1.0, size=6) + rng.laplace(scale=2.0, size=M.shape[0])
    ref = scipy_nnls(np.sqrt(w)[:, None] * M, np.sqrt(w) * y)[0]
    for weights in (w, 2.0 * w):  # a common factor does not move the solution
        assert _relerr(nnls(A, y, weights=weights, tol=1e-12).x, ref) < 1e-6
    ref_scalar = scipy_nnls(M, y)[0]
    assert _relerr(nnls(A, y, weights=3.0, tol=1e-12).x, ref_scalar) < 1e-6


@pytest.mark.parametrize("x0", ["auto", "ls", "zero"])
def test_exact_measurements_return_the_truth(x0: str, rng: np.random.Generator) -> None:
    A = VStack([Kron([Identity(3), Total(4)]), Identity(12)])
    x = rng.integers(0, 20, size=12).astype(float)
    x[[2, 7]] = 0.0
    est = nnls(A, A @ x, x0=x0, tol=1e-12)
    np.testing.assert_allclose(est.x, x, atol=1e-8)
    assert est.report.converged
    # projected Newton (the default) starts from zero under "auto"
    assert est.report.details["start"] == ("zero" if x0 == "auto" else x0)


def test_given_start_and_iteration_limit_reported(rng: np.random.Generator) -> None:
    A = Kron([Dense(rng.uniform(size=(6, 5))), Prefix(4)])
    y = A @ rng.poisson(1.0, size=20) + rng.laplace(scale=3.0, size=A.shape[0])
    with pytest.warns(ConvergenceWarning, match="iteration limit"):
        short = nnls(A, y, x0="zero", tol=1e-14, maxiter=2)
    assert not short.report.converged and short.report.iterations == 2
    assert short.report.residual > short.report.tolerance
    # restarting from where it stopped finishes the job
    full = nnls(A, y, x0=short.x, tol=1e-12)
    assert full.report.converged and full.report.details["start"] == "given"
    assert _relerr(full.x, scipy_nnls(A.dense(), y)[0]) < 1e-6


def test_wnnls_matches_nnls_on_the_workload(rng: np.random.Generator) -> None:
    """WNNLS is NNLS of the workload against the workload answers of the LS estimate."""
    A = VStack([Identity(8), Kron([Total(2), Identity(4)])])
    for W in (AllRange(8), Prefix(8), Kron([Identity(2), Total(4)])):  # the last is rank 2
        Wd = W.dense()
        Y = A @ rng.poisson(0.5, size=8) + rng.laplace(scale=3.0, size=(3, A.shape[0]))
        est = wnnls(W, A, Y, tol=1e-12)
        assert est.report.converged and (est.x >= 0).all()
        x_ls = least_squares(A, Y).x
        for x, xl in zip(est.x, x_ls, strict=True):
            ref = scipy_nnls(Wd, Wd @ xl)[0]
            # W x is what the problem determines (x itself is not unique for a rank-deficient W)
            assert _relerr(Wd @ x, Wd @ ref) < 1e-6


def test_wnnls_with_nonnegative_ls_keeps_it(rng: np.random.Generator) -> None:
    A = Identity(5)
    y = rng.uniform(1.0, 5.0, size=5)
    np.testing.assert_allclose(wnnls(Prefix(5), A, y).x, y, atol=1e-9)


def test_bad_input_raises() -> None:
    A = Identity(3)
    with pytest.raises(ValueError, match="shape"):
        nnls(A, np.ones(4))
    with pytest.raises(ValueError, match="NaN"):
        nnls(A, np.array([1.0, np.nan, 2.0]))
    with pytest.raises(ValueError, match="start"):
        nnls(A, np.ones(3), x0="middle")
    with pytest.raises(ValueError, match="columns"):
        wnnls(Identity(4), A, np.ones(3))
    with pytest.raises(ValueError, match="weights"):
        nnls(A, np.ones(3), weights=np.array([1.0, -1.0, 1.0]))


def test_stopping_rule_is_in_noise_units(rng: np.random.Generator) -> None:
    """With inverse-variance weights the scaled gradient at the truth has unit variance."""
    A = VStack([Identity(6), Prefix(6), Total(6)])
    sd = np.concatenate([np.full(6, 0.5), np.full(6, 3.0), [10.0]])
    w = 1.0 / sd**2
    Aw = np.sqrt(w)[:, None] * A.dense()
    scale = np.sqrt((Aw**2).sum(axis=0))
    x = rng.uniform(5.0, 10.0, size=6)  # interior: the projected gradient is the gradient
    noise = rng.normal(size=(4000, A.shape[0])) * sd
    grads = (Aw.T @ (np.sqrt(w) * (-noise)).T).T / scale
    np.testing.assert_allclose((grads**2).mean(axis=0), 1.0, rtol=0.1)
    # so a loose tolerance stops within a small fraction of the noise of the optimum
    y = A @ x + noise[0]
    loose, tight = nnls(A, y, weights=w, tol=1e-2), nnls(A, y, weights=w, tol=1e-12)
    gap = np.sqrt(((Aw @ (loose.x - tight.x)) ** 2).mean())
    assert loose.report.converged and gap < 0.05


def test_compact_gram_is_the_gram(rng: np.random.Generator) -> None:
    metric_module = importlib.import_module("dpdask.reconstruct._metric")
    for A in _strategies(rng):
        for op in (A, 3.0 * A):
            G = metric_module.compact_gram(op)
            np.testing.assert_allclose(G.dense(), op.dense().T @ op.dense(), atol=1e-10)


def _kron_case(rng: np.random.Generator) -> Kron:
    """A Kronecker strategy with ill-conditioned dense factors, a tiny and an implicit one."""
    return Kron(
        [
            Dense(rng.uniform(size=(2, 2)) + np.eye(2)),
            Dense(np.vstack([np.eye(6), rng.uniform(size=(3, 6))])),
            AllRange(5),
        ]
    )


def test_scaled_kron_gram_is_the_scaled_gram(rng: np.random.Generator) -> None:
    """The factor-wise Jacobi-scaled float32 product against the dense ``S A^T A S``."""
    kg = importlib.import_module("dpdask.reconstruct._kron_gram")
    A = _kron_case(rng)
    for op in (A, 0.3 * A):
        M = op.dense()
        G = M.T @ M
        s = 1.0 / np.sqrt(np.diag(G))
        ref = s[:, None] * G * s[None, :]
        fast = kg.scaled_kron_gram(op)
        X = rng.normal(size=(op.shape[1], 3))
        np.testing.assert_allclose(fast.with_dtype(np.float64)(X), ref @ X, atol=1e-12)
        out = fast(X)
        assert out.dtype == np.float64
        assert np.abs(out - ref @ X).max() <= 1e-5 * np.abs(ref @ X).max()
    # not a Kronecker product of small factors: the generic path
    assert kg.scaled_kron_gram(VStack([A, A])) is None
    assert kg.scaled_kron_gram(Kron([Identity(3), Identity(600)])) is None


def test_kronecker_path_matches_generic_path(rng: np.random.Generator) -> None:
    """The float32 Kronecker-Gram products give the generic path's answer (and scipy's)."""
    A = _kron_case(rng)
    M = A.dense()
    x = np.where(rng.uniform(size=A.shape[1]) < 0.3, rng.poisson(3.0, size=A.shape[1]), 0)
    Y = M @ x + rng.normal(scale=1.5, size=(3, M.shape[0]))
    fast = nnls(A, Y, tol=1e-10)
    assert fast.report.details["kronecker_float32"] and fast.report.converged
    generic = nnls(Dense(M), Y, tol=1e-10)  # the same matrix, without its structure
    assert not generic.report.details["kronecker_float32"]
    assert not generic.report.details["union_float32"]
    for xf, xg, y in zip(fast.x, generic.x, Y, strict=True):
        ref = scipy_nnls(M, y)[0]
        assert _relerr(xf, ref) < 1e-6 and _relerr(xg, ref) < 1e-6


@pytest.mark.parametrize("tol", [1e-1, 1e-2, 1e-3])
def test_reported_residual_is_the_float64_projected_gradient(
    tol: float, rng: np.random.Generator
) -> None:
    """The stopping test holds for the returned x, recomputed densely in float64."""
    A = _kron_case(rng)
    M = A.dense()
    x = np.where(rng.uniform(size=A.shape[1]) < 0.1, rng.poisson(5.0, size=A.shape[1]), 0)
    y = M @ x + rng.normal(scale=2.0, size=M.shape[0])
    w = 1.0 / 4.0
    est = nnls(A, y, weights=w, tol=tol)
    G, c = w * M.T @ M, w * M.T @ y
    s = 1.0 / np.sqrt(np.diag(G))
    u, grad = est.x / s, s * (G @ est.x - c)
    rms = np.sqrt(np.mean((u - np.maximum(u - grad, 0.0)) ** 2))
    assert est.report.converged
    assert rms <= tol and rms == pytest.approx(est.report.residual, rel=1e-3)


def test_newton_and_spg_agree_on_a_sparse_histogram(rng: np.random.Generator) -> None:
    """Two algorithms, one answer: a mostly-zero histogram under a union strategy."""
    A = VStack([Kron([Identity(8), Total(6)]), Kron([Prefix(8), Identity(6)]), Identity(48)])
    x = np.where(rng.uniform(size=48) < 0.15, rng.poisson(4.0, size=48), 0).astype(float)
    Y = A @ x + rng.laplace(scale=2.0, size=(5, A.shape[0]))
    newton, spg = nnls(A, Y, tol=1e-11), nnls(A, Y, tol=1e-11, method="spg")
    assert newton.report.method == "nnls-newton" and spg.report.method == "nnls-spg"
    assert newton.report.converged and spg.report.converged
    np.testing.assert_allclose(newton.x, spg.x, atol=1e-7 * np.abs(spg.x).max())


def test_unknown_method_raises() -> None:
    with pytest.raises(ValueError, match="method"):
        nnls(Identity(3), np.ones(3), method="lbfgs")


def _union_case(rng: np.random.Generator) -> VStack:
    """OPT_+ shaped: two Kronecker parts that total out different attributes."""
    return VStack(
        [
            Kron([Identity(2), Dense(rng.uniform(size=(5, 4)) + np.eye(5, 4)), Total(3)]),
            Kron([Dense(rng.uniform(size=(3, 2))), Total(4), Prefix(3)]),
        ],
        weights=[1.5, 0.4],
    )


def test_scaled_union_gram_is_the_scaled_gram(rng: np.random.Generator) -> None:
    """Roots of the total factors, weights, scaling: against the dense ``S A^T A S``."""
    ug = importlib.import_module("dpdask.reconstruct._union_gram")
    A = _union_case(rng)
    for op in (A, 0.3 * A, VStack([A, Kron([Identity(2), Identity(4), Identity(3)])])):
        M = op.dense()
        G = M.T @ M
        s = 1.0 / np.sqrt(np.diag(G))
        ref = s[:, None] * G * s[None, :]
        fast = ug.scaled_union_gram(op)
        np.testing.assert_allclose(fast.scale, s, rtol=1e-12)
        X = rng.normal(size=(3, op.shape[1]))
        np.testing.assert_allclose(fast.with_dtype(np.float64).rows(X), X @ ref, atol=1e-12)
        out = fast.rows(X)
        assert out.dtype == np.float32
        assert np.abs(out - X @ ref).max() <= 1e-5 * np.abs(X @ ref).max()
        np.testing.assert_allclose(fast(X.T), ref @ X.T, atol=1e-5 * np.abs(X @ ref).max())
    # the total factors are applied through their roots (contracting the tensor first)
    parts = ug.scaled_union_gram(A)._parts
    assert [[axis for axis, _, _ in p.roots] for p in parts] == [[2], [1]]
    # not a union of Kronecker products over one factorisation of the domain
    assert ug.scaled_union_gram(VStack([Kron([Identity(4), Identity(6)]), Identity(24)])) is None
    assert ug.scaled_union_gram(Kron([Identity(3), Identity(600)])) is None


@pytest.mark.parametrize("weights", [None, 0.25])
def test_union_path_matches_generic_path_and_scipy(
    weights: float | None, rng: np.random.Generator
) -> None:
    """A rank-deficient union (NNLS minimiser not unique): the objective and the strategy
    answers agree with scipy's and the generic (float64, unstructured) path's."""
    A = _union_case(rng)
    M = A.dense()
    assert np.linalg.matrix_rank(M) < M.shape[1]
    x = np.where(rng.uniform(size=A.shape[1]) < 0.3, rng.poisson(3.0, size=A.shape[1]), 0)
    Y = M @ x + rng.normal(scale=1.5, size=(3, M.shape[0]))
    fast = nnls(A, Y, weights=weights, tol=1e-10)
    assert fast.report.details["union_float32"] and fast.report.converged
    generic = nnls(Dense(M), Y, weights=weights, tol=1e-10)
    assert not generic.report.details["union_float32"]
    for xf, xg, y in zip(fast.x, generic.x, Y, strict=True):
        ref = scipy_nnls(M, y)[0]
        assert (xf >= 0).all() and (xg >= 0).all()
        for est in (xf, xg):
            assert _relerr(M @ est, M @ ref) < 1e-6
            resid, best = np.linalg.norm(M @ est - y), np.linalg.norm(M @ ref - y)
            assert resid <= best * (1 + 1e-9)


@given(st.sets(st.integers(0, 200)), st.sets(st.integers(0, 200)))
def test_working_set_union_is_numpy_union(a: set[int], b: set[int]) -> None:
    """The merge of two sorted index arrays (the free set) against ``np.union1d``."""
    newton = importlib.import_module("dpdask.reconstruct._newton")
    ia, ib = np.array(sorted(a), dtype=np.intp), np.array(sorted(b), dtype=np.intp)
    got = newton._sorted_union(ia, ib)
    np.testing.assert_array_equal(got, np.union1d(ia, ib))
    assert got.dtype == np.intp


@given(
    st.lists(st.floats(-3.0, 0.0), min_size=0, max_size=60),
    st.floats(0.0, 1.0),
    st.floats(0.0, 20.0),
)
def test_freeing_threshold_keeps_the_smallest_violations_within_budget(
    gs: list[float], floor: float, budget: float
) -> None:
    """The variables at zero left unfreed are those with the smallest violations, all of
    those under ``floor`` and then as many as fit in the budget (brute force)."""
    newton = importlib.import_module("dpdask.reconstruct._newton")
    gn = np.array(gs, dtype=float)
    at_zero = np.arange(gn.size) % 3 != 0  # the others are positive variables
    t = newton._freeing_threshold(gn, at_zero, floor, budget)
    assert t >= floor
    viol = np.sort(-gn[at_zero])  # ascending violations
    forced = viol[viol < floor]
    room = newton._KEEP * budget - float(np.dot(forced, forced))
    rest = viol[viol >= floor]
    fits = np.cumsum(rest**2) <= room
    want = max(floor, rest[fits].max()) if room > 0 and fits.any() else floor
    assert t == pytest.approx(want, abs=0)


def _counting(G: np.ndarray) -> tuple[list[int], object]:
    calls = [0]

    def op(v: np.ndarray) -> np.ndarray:
        calls[0] += 1
        return G @ v

    return calls, op


@pytest.mark.parametrize("n", [5, 12])
def test_conjugate_residual_solves_and_reports_no_stagnation(n: int, rng) -> None:
    """Enough CR iterations on a well-conditioned SPD matrix solve it (``np.linalg.solve``
    as the oracle) without stagnation; one product per iteration, none wasted."""
    newton = importlib.import_module("dpdask.reconstruct._newton")
    B = rng.normal(size=(n, n))
    G = B @ B.T + n * np.eye(n)
    b = rng.normal(size=n)
    calls, op = _counting(G)
    d, left = newton._conjugate_residual(op, b, 3 * n)
    assert left == 0.0  # stopped early
    # stopped at the relative residual _INNER_RTOL
    assert np.linalg.norm(G @ d - b) <= newton._INNER_RTOL * np.linalg.norm(b)
    assert calls[0] <= n + 1
    d, _ = newton._conjugate_residual(_counting(G)[1], b, 100)
    np.testing.assert_allclose(G @ d, b, rtol=0, atol=newton._INNER_RTOL * np.linalg.norm(b))


def test_conjugate_residual_flags_stagnation_on_an_ill_conditioned_system(rng) -> None:
    """On eigenvalues spread over ten decades with the right-hand side in the small ones,
    three iterations barely reduce the residual: CR says it stagnated, having taken
    exactly three products (the product a fourth iteration would need is not taken)."""
    newton = importlib.import_module("dpdask.reconstruct._newton")
    n = 40
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    lam = np.logspace(-10, 0, n)
    G = (Q * lam) @ Q.T
    b = Q[:, :5] @ rng.normal(size=5)  # in the eigenvectors of 1e-10 .. 1e-9
    calls, op = _counting(G)
    d, left = newton._conjugate_residual(op, b, 3)
    assert calls[0] == 3
    assert left == pytest.approx(np.linalg.norm(G @ d - b) / np.linalg.norm(b), rel=1e-6)
    assert left > newton._STAGNANT
    assert newton._inner_budget(newton._INNER, left) == 2 * newton._INNER


@given(st.lists(st.sampled_from([0.0, 0.3, 0.9]), max_size=30))
def test_inner_budget_grows_only_while_stagnating_within_its_bounds(lefts: list[float]) -> None:
    """The CR budget stays in ``[_INNER, _INNER_MAX]``; it grows only after a solve that
    stagnated (more than ``_STAGNANT`` of the residual left), shrinks only after one that
    stopped early (0 left) and is kept otherwise; two stagnations from the start reach
    the cap (10, 20, 40)."""
    newton = importlib.import_module("dpdask.reconstruct._newton")
    budget = newton._INNER
    for left in lefts:
        new = newton._inner_budget(budget, left)
        assert newton._INNER <= new <= newton._INNER_MAX
        if left > newton._STAGNANT:
            assert new >= budget
        elif left == 0:
            assert new <= budget
        else:
            assert new == budget
        budget = new
    budget = newton._INNER
    for _ in range(2):
        budget = newton._inner_budget(budget, 0.9)
    assert budget == newton._INNER_MAX


# -- the ADMM start, restricted products and fits to an estimate ------------------------
@pytest.mark.parametrize("sizes", [(7,), (3, 5), (2, 2, 6, 3, 5), (4, 9, 3, 11)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "branch",
    [(1.1, 1e9), (1.1, 0.0), (0.0, 1e9)],
    ids=["restricted", "first-mode-dense", "full-product"],
)
def test_restricted_product_is_the_principal_submatrix(
    sizes, dtype, branch, rng, monkeypatch
) -> None:
    """``G[idx, idx] v`` through the permuted, fibre-restricted product vs dense ``G``,
    on each of its paths (forced through the thresholds that choose them)."""
    kg = importlib.import_module("dpdask.reconstruct._kron_gram")
    monkeypatch.setattr(kg, "_RESTRICT_MAX", branch[0])
    monkeypatch.setattr(kg, "_FIRST_DENSE", branch[1])
    factors = []
    for n in sizes:
        B = rng.normal(size=(n + 2, n))
        G = B.T @ B
        d = 1.0 / np.sqrt(np.diag(G))
        factors.append(d[:, None] * G * d[None, :])
    dense = factors[0]
    for F in factors[1:]:
        dense = np.kron(dense, F)
    op = kg.ScaledKronGram(factors, np.float64)
    for frac in (0.05, 0.5, 1.0):
        k = max(1, int(frac * dense.shape[0]))
        idx = np.sort(rng.choice(dense.shape[0], size=k, replace=False))
        v = rng.normal(size=k).astype(dtype)
        got = op.restricted(idx, dtype)(v)
        assert got.dtype == dtype
        want = dense[np.ix_(idx, idx)] @ v.astype(float)
        tol = 1e-12 if dtype == np.float64 else 1e-5
        assert np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("sizes", [(7,), (3, 5), (2, 2, 6, 3, 5), (4, 9, 3, 11)])
@pytest.mark.parametrize("limit", [1.1, 0.0], ids=["occupied-fibres", "full-product"])
def test_product_of_entries_is_the_dense_product(sizes, limit, rng, monkeypatch) -> None:
    """``G v`` for ``v`` given by its non-zero entries vs dense ``G``, on both paths, for
    entries in a few fibres of the last axis and scattered ones."""
    kg = importlib.import_module("dpdask.reconstruct._kron_gram")
    monkeypatch.setattr(kg, "_RESTRICT_MAX", limit)
    factors = []
    for n in sizes:
        B = rng.normal(size=(n + 2, n))
        factors.append(B.T @ B)
    dense = factors[0]
    for F in factors[1:]:
        dense = np.kron(dense, F)
    n, last = dense.shape[0], sizes[-1]
    op = kg.ScaledKronGram(factors, np.float64)
    fibre = rng.choice(n // last, size=max(1, n // last // 4), replace=False)
    few = (fibre[:, None] * last + rng.integers(0, last, size=(fibre.size, 2))).ravel()
    for idx in (np.unique(few), rng.permutation(n)[: n // 3 + 1]):
        v = rng.normal(size=idx.size)
        got = op.from_entries(idx, v)
        x = np.zeros(n)
        x[idx] = v
        assert got.shape == (n,) and got.dtype == np.float64
        np.testing.assert_allclose(got, dense @ x, rtol=0, atol=1e-10 * np.abs(dense @ x).max())


def _admm_case(rng: np.random.Generator):
    """A Kronecker NNLS case for the ADMM start: the dense strategy ``M``, measurements
    ``y``, the float64 scaled Gram, the Jacobi scaling ``s`` and the scaled linear term."""
    kg = importlib.import_module("dpdask.reconstruct._kron_gram")
    A = _kron_case(rng)
    M = A.dense()
    x = np.where(rng.uniform(size=A.shape[1]) < 0.2, rng.poisson(4.0, size=A.shape[1]), 0)
    y = M @ x + rng.normal(scale=1.0, size=M.shape[0])
    G = kg.scaled_kron_gram(A).with_dtype(np.float64)
    s = 1.0 / np.sqrt(np.diag(M.T @ M))
    return M, y, G, s, s * (M.T @ y)


def test_admm_start_converges_to_the_nnls_solution(rng: np.random.Generator) -> None:
    """Run long, the warm start's ADMM is itself an NNLS solver (scipy as the oracle)."""
    start = importlib.import_module("dpdask.reconstruct._admm_start")
    M, y, G, s, c = _admm_case(rng)
    c = c[None, :]
    ref = scipy_nnls(M, y)[0]
    errs = [_relerr(s * start.AdmmStart(G)(c, iterations=it)[0], ref) for it in (2, 20, 2000)]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-6
    assert (start.AdmmStart(G)(c)[0] >= 0).all()


@pytest.mark.parametrize(
    ("residual", "steps"),
    [(1e9, "MIN_ITERATIONS"), (0.0, "ITERATIONS"), (None, "between")],
    ids=["settled-at-once", "never-settled", "settles-midway"],
)
def test_admm_start_stops_once_its_primal_residual_settles(residual, steps, rng, monkeypatch):
    """By default the start takes MIN_ITERATIONS to ITERATIONS steps (two transforms each,
    plus one for the linear term), stopping at the first step from MIN_ITERATIONS on whose
    root-mean-square primal residual ``u - z`` is at most RESIDUAL; ``u`` is recomputed
    from ``z`` and ``v`` with a dense solve of ``(G + rho I) u = c + rho (z - v)``."""
    start = importlib.import_module("dpdask.reconstruct._admm_start")
    M, _, G, s, c = _admm_case(rng)
    Gd = s[:, None] * (M.T @ M) * s[None, :]
    zs, res = _dense_admm(Gd, c, start)
    if residual is None:  # halfway between two late residuals
        k = start.MIN_ITERATIONS + 2
        residual = 0.5 * (res[k - 1] + res[k - 2]) if res[k - 1] < res[k - 2] else res[k - 1]
        stop = next(
            i + 1 for i, r in enumerate(res) if i + 1 >= start.MIN_ITERATIONS and r <= residual
        )
        assert start.MIN_ITERATIONS < stop < start.ITERATIONS
    else:
        stop = getattr(start, steps)
    monkeypatch.setattr(start, "RESIDUAL", residual)
    calls = [0]
    real = start.kron_rows

    def counted(*args):
        calls[0] += 1
        return real(*args)

    monkeypatch.setattr(start, "kron_rows", counted)
    got = start.AdmmStart(G)(c[None, :])[0]
    assert calls[0] == 1 + 2 * stop
    np.testing.assert_allclose(got, zs[stop - 1], atol=1e-8)


def _dense_admm(Gd: np.ndarray, c: np.ndarray, start) -> tuple[list, list]:
    """Over-relaxed ADMM on ``u = z, z >= 0`` (Boyd et al., with ``v`` the scaled dual)
    from zero, dense: ``z`` and the rms primal residual ``u - z`` of every step."""
    z, v, zs, res = np.zeros_like(c), np.zeros_like(c), [], []
    for _ in range(start.ITERATIONS):
        u = np.linalg.solve(Gd + start.RHO * np.eye(c.size), c + start.RHO * (z - v))
        uh = start.RELAX * u + (1 - start.RELAX) * z
        res.append(np.linalg.norm(u - z) / np.sqrt(c.size))
        z_new = np.maximum(uh + v, 0)
        v, z = v + uh - z_new, z_new
        zs.append(z)
    return zs, res


def test_single_kronecker_right_hand_side_takes_the_fast_path(rng) -> None:
    """One geography: ADMM start and restricted inner products; scipy's answer."""
    A = _kron_case(rng)
    M = A.dense()
    x = np.where(rng.uniform(size=A.shape[1]) < 0.2, rng.poisson(4.0, size=A.shape[1]), 0)
    y = M @ x + rng.normal(scale=1.5, size=M.shape[0])
    est = nnls(A, y, tol=1e-10)
    details = est.report.details
    assert details["start"] == "admm" and details["restricted"] > 0 and est.report.converged
    assert _relerr(est.x, scipy_nnls(M, y)[0]) < 1e-6
    # an explicit start is kept; rows of a batch are solved one by one
    assert nnls(A, y, tol=1e-10, x0="zero").report.details["start"] == "zero"
    both = nnls(A, np.stack([y, 2.0 * y]), tol=1e-10)
    assert _relerr(both.x[0], est.x) < 1e-6
    assert _relerr(both.x[1], scipy_nnls(M, 2.0 * y)[0]) < 1e-6


@pytest.mark.parametrize("checks", [0, 3])
def test_large_counts_converge_below_the_float32_floor(checks, rng, monkeypatch) -> None:
    """Counts of 1e5 put float32's resolution of the gradient far above ``tol``: exact
    checks, then exact gradients and steps (float32 inner solves; forced at the first
    failed check with ``checks=0``), still reach scipy's answer."""
    monkeypatch.setattr(importlib.import_module("dpdask.reconstruct._newton"), "_CHECKS", checks)
    A = _kron_case(rng)
    M = A.dense()
    x = np.where(rng.uniform(size=A.shape[1]) < 0.5, rng.poisson(1e5, size=A.shape[1]), 0)
    y = M @ x + rng.normal(scale=1.5, size=M.shape[0])
    est = nnls(A, y, weights=1 / 1.5**2, tol=1e-6)
    assert est.report.converged and est.report.details["kronecker_float32"]
    assert _relerr(est.x, scipy_nnls(M, y)[0]) < 1e-9


@pytest.mark.parametrize("weights", [None, 0.25])
@pytest.mark.parametrize("case", ["kron", "union", "dense"])
def test_nonnegative_fit_is_nnls_from_the_estimate(case, weights, rng) -> None:
    """Fitting ``x >= 0`` to the least-squares estimate in ``M``'s metric is NNLS on the
    measurements: against scipy on ``sqrt(w) M`` and against :func:`nnls` on ``y``."""
    from dpdask.reconstruct import nonnegative_fit

    A = {"kron": _kron_case, "union": _union_case}.get(
        case, lambda r: Dense(r.normal(size=(9, 6)))
    )(rng)
    M = A.dense()
    x = np.where(rng.uniform(size=A.shape[1]) < 0.3, rng.poisson(3.0, size=A.shape[1]), 0)
    Y = M @ x + rng.normal(scale=2.0, size=(2, M.shape[0]))
    x_ls = least_squares(A, Y, weights).x
    fit = nonnegative_fit(A, x_ls, weights, tol=1e-10)
    from_y = nnls(A, Y, weights, tol=1e-10)
    w = 1.0 if weights is None else weights
    for got, other, xl, y in zip(fit.x, from_y.x, x_ls, Y, strict=True):
        ref = scipy_nnls(np.sqrt(w) * M, np.sqrt(w) * y)[0]
        # the answers M x are unique (the union is rank deficient: x need not be)
        assert _relerr(M @ got, M @ ref) < 1e-6 and _relerr(M @ other, M @ ref) < 1e-6
        assert (xl < 0).any()  # the constraint binds
    assert fit.report.converged and fit.x.min() >= 0


@pytest.fixture
def admm_builds(monkeypatch) -> list[int]:
    """The ADMM starts built from now on (one entry each), with no metric shared yet."""
    nn = importlib.import_module("dpdask.reconstruct._metric")
    built: list[int] = []

    class Counted(nn.AdmmStart):
        def __init__(self, *args, **kw):
            built.append(1)
            super().__init__(*args, **kw)

    monkeypatch.setattr(nn, "AdmmStart", Counted)
    monkeypatch.setattr(nn, "_metrics", type(nn._metrics)())
    return built


def test_fitter_shares_its_setup_across_estimates(rng, admm_builds) -> None:
    """One fitter, several estimates fitted one by one: each is scipy's NNLS of its own
    measurements, and the eigenvectors of the ADMM start are computed once."""
    A = _kron_case(rng)
    M = A.dense()
    fit = nonnegative_fitter(A, 0.5, tol=1e-10)
    for scale in (1.0, 2.0, 5.0):
        x = np.where(rng.uniform(size=A.shape[1]) < 0.3, rng.poisson(3.0 * scale, A.shape[1]), 0)
        y = M @ x + rng.normal(scale=2.0, size=M.shape[0])
        est = fit(least_squares(A, y, 0.5).x)
        assert est.report.converged and est.report.details["start"] == "admm"
        assert _relerr(est.x, scipy_nnls(M, y)[0]) < 1e-6
    assert len(admm_builds) == 1
    with pytest.raises(ValueError, match="NaN"):
        fit(np.full(A.shape[1], np.nan))


def test_fitters_of_one_metric_share_it_within_the_process(rng, admm_builds) -> None:
    """A second fitter of an equal operator and the same weights (a later task on the same
    worker) reuses the first one's setup; other weights get their own, and only the last
    ``_SHARED_METRICS`` are kept. The shared fitter's estimates are still scipy's NNLS."""
    nn = importlib.import_module("dpdask.reconstruct._metric")
    seed = int(rng.integers(2**31))
    A, A_again = (_kron_case(np.random.default_rng(seed)) for _ in range(2))
    assert A is not A_again
    M = A.dense()
    x = np.where(rng.uniform(size=A.shape[1]) < 0.3, rng.poisson(4.0, A.shape[1]), 0)
    y = M @ x + rng.normal(scale=2.0, size=M.shape[0])
    x_ls = least_squares(A, y, 0.5).x
    for op in (A, A_again):
        est = nonnegative_fitter(op, 0.5, tol=1e-10)(x_ls)
        assert _relerr(est.x, scipy_nnls(M, y)[0]) < 1e-6
    assert len(admm_builds) == 1
    for w in (0.25, 1.0, 2.0, 4.0, 0.5):
        nonnegative_fitter(A, w, tol=1e-10)(x_ls)
    assert len(nn._metrics) == nn._SHARED_METRICS
    assert len(admm_builds) == 6  # four new weights, then 0.5 again after it was dropped
