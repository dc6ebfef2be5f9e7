"""Baseline strategies against hand-built matrices, paper tables, closed forms and cvxpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar

from dpdask import Domain
from dpdask.errors import ArgumentTypeError, ConvergenceError, ConvergenceWarning
from dpdask.linalg import AllRange, Identity, Kron, Ones, Prefix, RangeQueries, Sparse, VStack
from dpdask.strategy import baselines as B
from dpdask.strategy.analysis import query_variances, squared_error
from dpdask.workloads import age_pyramid, marginals, pl94, random_ranges
from tests import requires_cvxpy

# -- dense oracles ---------------------------------------------------------------------


def dense_error(W: np.ndarray, A: np.ndarray, p: int = 2) -> float:
    """Total squared error ``||A||_p^2 ||W A^+||_F^2`` from dense matrices."""
    sens = np.abs(A).sum(0).max() if p == 1 else np.sqrt((A * A).sum(0).max())
    return float(sens**2 * np.sum((W @ np.linalg.pinv(A)) ** 2))


def dense_variances(W: np.ndarray, A: np.ndarray) -> np.ndarray:
    """Per-query variances ``||A||_2^2 diag(W (A^T A)^+ W^T)`` from dense matrices."""
    sens2 = (A * A).sum(0).max()
    return sens2 * np.einsum("ij,jk,ik->i", W, np.linalg.pinv(A.T @ A), W)


def dyadic_tree(n: int, b: int, root: bool = True) -> np.ndarray:
    """The b-ary tree over n = b^h cells, built block size by block size."""
    rows, block = [], n
    while block >= 1:
        for start in range(0, n, block):
            r = np.zeros(n)
            r[start : start + block] = 1
            rows.append(r)
        block //= b
    A = np.array(rows)
    return A if root else A[1:]


def haar_recursive(n: int) -> np.ndarray:
    """Haar matrix by the recursion H_2m = [H_m (x) (1, 1); I_m (x) (1, -1)]."""
    H = np.ones((1, 1))
    while H.shape[0] < n:
        m = H.shape[0]
        H = np.vstack([np.kron(H, [1, 1]), np.kron(np.eye(m), [1, -1])])
    return H


# -- hand-typed matrices (the HDMM tutorial, paper 003, shows n = 4) -------------------

SLIDES_H4 = np.array(
    [
        [1, 1, 1, 1],
        [1, 1, 0, 0],
        [0, 0, 1, 1],
        [1, 0, 0, 0],
        [0, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 0, 1],
    ],
    dtype=float,
)
SLIDES_Y4 = np.array(
    [[1, 1, 1, 1], [1, 1, -1, -1], [1, -1, 0, 0], [0, 0, 1, -1]],
    dtype=float,
)
# n = 5, b = 2: [0..4] splits into [0..2], [3..4]; [0..2] into [0..1], [2]; [0..1] into [0], [1]
H2_5 = np.array(
    [
        [1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 1],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1],
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
    ],
    dtype=float,
)


# -- fixed strategies ------------------------------------------------------------------


def test_identity_and_input_perturbation():
    assert isinstance(B.identity(5), Identity)
    np.testing.assert_array_equal(B.input_perturbation(5).dense(), np.eye(5))
    K = B.identity(Domain(a=2, b=3))
    assert isinstance(K, Kron)
    np.testing.assert_array_equal(K.dense(), np.eye(6))
    np.testing.assert_array_equal(B.identity((2, 3)).dense(), np.eye(6))


def test_workload_strategy_is_the_workload():
    W = Prefix(6)
    assert B.workload(W) is W
    M = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(B.workload(M).dense(), M)


def test_hierarchical_matches_slides_n4():
    A = B.hierarchical(4)
    assert isinstance(A, RangeQueries)
    np.testing.assert_array_equal(A.dense(), SLIDES_H4)


@pytest.mark.parametrize(("n", "b"), [(4, 2), (8, 2), (16, 2), (16, 4), (27, 3), (16, 16)])
@pytest.mark.parametrize("root", [True, False])
def test_hierarchical_matches_dyadic_tree(n, b, root):
    np.testing.assert_array_equal(B.hierarchical(n, b, root=root).dense(), dyadic_tree(n, b, root))


def test_hierarchical_uneven_split_hand_typed():
    np.testing.assert_array_equal(B.hierarchical(5).dense(), H2_5)


def test_hierarchical_on_domain_is_kron_of_trees():
    A = B.hierarchical(Domain(x=4, y=5))
    assert isinstance(A, Kron)
    np.testing.assert_array_equal(A.dense(), np.kron(SLIDES_H4, H2_5))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), b=st.integers(2, 12), root=st.booleans())
def test_tree_is_laminar_and_balanced(n, b, root):
    lo, hi = B.tree_intervals(n, b, root)
    A = RangeQueries(n, lo, hi).dense()
    # every cell is a leaf exactly once
    leaves = lo[lo == hi]
    np.testing.assert_array_equal(np.sort(leaves), np.arange(n))
    # laminar: two nodes are nested or disjoint
    inter = A @ A.T
    size = A.sum(1)
    nested_or_disjoint = (inter == 0) | (inter == np.minimum.outer(size, size))
    assert nested_or_disjoint.all()
    # height: least h with b^h >= n, so every cell lies in at most h + 1 nodes
    h = 0
    while b**h < n:
        h += 1
    depth = A.sum(0)
    assert depth.max() == (h + 1 if root else max(h, 1))
    assert depth.min() >= 1


def test_hb_strategy_is_tree_without_root():
    A = B.hb(256)  # branching 16: 16 ranges of 16 cells, then the cells
    np.testing.assert_array_equal(A.dense(), dyadic_tree(256, 16, root=False))
    np.testing.assert_array_equal(B.hb(128).dense(), np.eye(128))  # flat
    K = B.hb(Domain(a=256, b=3))
    assert isinstance(K, Kron)
    assert [f.shape for f in K.factors] == [(256 + 16, 256), (3, 3)]


def test_hm_is_hb_on_flat_domain():
    d = Domain(votingage=2, hisp=2, race=63)
    np.testing.assert_array_equal(B.hm(d).dense(), B.hb(252).dense())


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000))
def test_hb_branching_minimises_the_rule_over_all_b(n):
    def V(b):
        h = 1
        while b**h < n:
            h += 1
        return (b - 1) * h**3 - 2 * (b + 1) * h**2 / 3

    if n == 1:
        assert B.hb_branching(1) == 1
        return
    values = {b: V(b) for b in range(2, n + 1)}
    best = min(values.values())
    assert B.hb_branching(n) == min(b for b, v in values.items() if v == best)


def test_wavelet_matches_slides_n4():
    A = B.wavelet(4)
    assert isinstance(A, Sparse)
    np.testing.assert_array_equal(A.dense(), SLIDES_Y4)


@pytest.mark.parametrize("n", [1, 2, 8, 16, 64])
def test_wavelet_matches_haar_recursion(n):
    np.testing.assert_array_equal(B.wavelet(n).dense(), haar_recursive(n))


@pytest.mark.parametrize("n", [3, 5, 6, 11, 100])
def test_wavelet_pads_to_power_of_two(n):
    size = 1 << (n - 1).bit_length()
    H = haar_recursive(size)[:, :n]
    expected = H[np.abs(H).sum(1) > 0]
    A = B.wavelet(n).dense()
    np.testing.assert_array_equal(A, expected)
    assert B.wavelet(n).sensitivity(1) == np.log2(size) + 1


def test_wavelet_on_domain_is_kron():
    np.testing.assert_array_equal(B.wavelet((4, 2)).dense(), np.kron(SLIDES_Y4, haar_recursive(2)))


# -- supports W: W A^+ A = W ------------------------------------------------------------

SUPPORT_CASES = {
    "prefix": (Prefix(16), 16),
    "allrange": (AllRange(12), 12),
    "random": (random_ranges(20, 30, np.random.default_rng(7)), 20),
    "marginals": (marginals(Domain(a=2, b=3, c=4), 2), Domain(a=2, b=3, c=4)),
}


@pytest.mark.parametrize("case", sorted(SUPPORT_CASES))
@pytest.mark.parametrize("name", ["identity", "hierarchical", "hb", "hm", "wavelet", "workload"])
def test_baselines_support_workload(case, name):
    W, where = SUPPORT_CASES[case]
    A = B.workload(W) if name == "workload" else getattr(B, name)(where)
    Wd, Ad = W.dense(), A.dense()
    np.testing.assert_allclose(Wd @ np.linalg.pinv(Ad) @ Ad, Wd, atol=1e-9)


# -- the HDMM tutorial's prefix table (pure DP, RMSE relative to HDMM) ---------------

# rows: n -> (Identity, H2, Privelet, HB) as printed in paper 003
SLIDES_PREFIX = {
    128: (1.80, 1.79, 1.78, 1.80),
    256: (2.18, 1.79, 1.78, 1.22),
    512: (2.68, 1.80, 1.79, 1.28),
    1024: (3.34, 1.80, 1.80, 1.34),
}


@pytest.mark.parametrize(
    "n", [pytest.param(n, marks=pytest.mark.slow) if n > 512 else n for n in sorted(SLIDES_PREFIX)]
)
def test_prefix_table_of_the_tutorial(n):
    W = Prefix(n)

    def rmse(A):
        return np.sqrt(A.sensitivity(1) ** 2 * squared_error(W, A))

    ident, h2, privelet, hb = SLIDES_PREFIX[n]
    base = rmse(B.identity(n))
    assert base**2 == pytest.approx(n * (n + 1) / 2)  # ||P||_F^2
    # the table's entries are rounded to 2 decimals: compare ratios to 1%
    assert rmse(B.hierarchical(n, 2)) / base == pytest.approx(h2 / ident, rel=0.01)
    assert rmse(B.wavelet(n)) / base == pytest.approx(privelet / ident, rel=0.01)
    assert rmse(B.hb(n)) / base == pytest.approx(hb / ident, rel=0.01)


# -- CA: closed forms ------------------------------------------------------------------


def _check_certificate(sol, W: np.ndarray, tol: float = 1e-7):
    assert sol.converged
    assert sol.lower_bound <= sol.error * (1 + 1e-12)
    assert sol.gap <= tol
    A = sol.strategy.dense()
    assert np.sqrt((A * A).sum(0).max()) == pytest.approx(1.0)
    assert dense_error(W, A) == pytest.approx(sol.error, rel=1e-9)
    np.testing.assert_allclose(W @ np.linalg.pinv(A) @ A, W, atol=1e-8)


def test_ca_on_identity_is_identity():
    sol = B.ca_solve(Identity(7))
    A = sol.strategy.dense()
    np.testing.assert_allclose(A.T @ A, np.eye(7), atol=1e-12)
    assert sol.error == pytest.approx(7.0)
    _check_certificate(sol, np.eye(7))


def _identity_sum(n: int) -> VStack:
    return VStack([Identity(n), Ones(n)])


@pytest.mark.parametrize("n", [2, 5, 64])
def test_ca_identity_plus_sum_closed_form(n):
    # X = (1 - b) I + b 11^T has eigenvalues 1 + (n-1) b (on 1) and 1 - b, so
    # tr(G X^-1) = (n-1)/(1-b) + (n+1)/(1+(n-1)b), minimised where
    # 1 + (n-1) b = sqrt(n+1) (1-b)
    b = (np.sqrt(n + 1) - 1) / (n - 1 + np.sqrt(n + 1))
    error = (n - 1) / (1 - b) + (n + 1) / (1 + (n - 1) * b)
    sol = B.ca_solve(_identity_sum(n))
    A = sol.strategy.dense()
    np.testing.assert_allclose(A.T @ A, (1 - b) * np.eye(n) + b, atol=1e-9)
    assert sol.error == pytest.approx(error, rel=1e-9)
    _check_certificate(sol, _identity_sum(n).dense())


@pytest.mark.parametrize(
    ("n", "ratio"), [(64, 4.48), pytest.param(1024, 16.49, marks=pytest.mark.slow)]
)
def test_ca_identity_plus_sum_overshoots_sum_target(n, ratio):
    """Issue 6 / paper 000 section 5.1: at the privacy cost where the best mechanism
    meets every target 1, CA's sum query has variance about 4.48 (n = 64), 16.49 (1024)."""

    # the fitness optimum is symmetric, X = (1 - b) I + b 11^T (diag 1): minimise the
    # larger of the cell variance and the sum variance over b
    def worst(b):
        cell = (1 + (n - 2) * b) / ((1 - b) * (1 + (n - 1) * b))
        return max(cell, n / (1 + (n - 1) * b))

    best = minimize_scalar(
        worst, bounds=(-1 / (n - 1) + 1e-9, 1 - 1e-9), method="bounded", options={"xatol": 1e-12}
    ).fun
    W = _identity_sum(n)
    A = B.convex_ca(W)
    var = A.sensitivity(2) ** 2 * query_variances(W, A)
    assert var[-1] / best == pytest.approx(ratio, abs=0.006)


def _svd_bound(W: np.ndarray) -> float:
    s = np.linalg.svd(W, compute_uv=False)
    return s.sum() ** 2 / W.shape[1]


@pytest.mark.parametrize(
    "W",
    [
        _identity_sum(9),
        VStack(
            [marginals(Domain(a=2, b=2, c=2, d=2), 1), marginals(Domain(a=2, b=2, c=2, d=2), 2)]
        ),
        marginals(Domain(a=3, b=4), 1),
    ],
    ids=["identity+sum", "1,2-way marginals", "1-way marginals"],
)
def test_ca_reaches_svd_bound_on_symmetric_workloads(W):
    """When the cells are interchangeable the optimum is the SVD bound (sum sigma)^2 / n."""
    Wd = W.dense()
    sol = B.ca_solve(W)
    assert sol.error == pytest.approx(_svd_bound(Wd), rel=1e-8)
    _check_certificate(sol, Wd)


@pytest.mark.parametrize(
    "W",
    [Prefix(32), AllRange(24), random_ranges(40, 60, np.random.default_rng(3)), age_pyramid()],
    ids=["prefix", "allrange", "random", "age"],
)
def test_ca_beats_every_baseline_and_the_svd_bound_holds(W):
    Wd = W.dense()
    n = Wd.shape[1]
    sol = B.ca_solve(W)
    _check_certificate(sol, Wd)
    assert sol.error >= _svd_bound(Wd) * (1 - 1e-9)
    for A in [B.identity(n), B.hierarchical(n), B.hb(n), B.wavelet(n), B.workload(W)]:
        assert sol.error <= dense_error(Wd, A.dense()) * (1 + 1e-9)


def test_ca_pl94():
    W = pl94()
    sol = B.ca_solve(W)
    _check_certificate(sol, W.dense())


def test_ca_rank_deficient_and_unused_cells(rng):
    # WRelated-style workload of rank 3, plus two cells no query touches
    core = rng.standard_normal((10, 3)) @ rng.standard_normal((3, 12))
    W = np.hstack([core[:, :5], np.zeros((10, 1)), core[:, 5:], np.zeros((10, 1))])
    sol = B.ca_solve(W)
    _check_certificate(sol, W)
    A = sol.strategy.dense()
    assert A.shape[0] == 3
    np.testing.assert_array_equal(A[:, [5, 13]], 0.0)
    assert sol.multipliers[[5, 13]].max() == 0.0
    assert sol.error == pytest.approx(B.ca_solve(core).error, rel=1e-7)


def test_wca_uniform_targets_equal_ca():
    W = random_ranges(30, 40, np.random.default_rng(11))
    A = B.convex_ca(W).dense()
    for fn in (B.wca_i, B.wca_ii):
        A2 = fn(W, np.full(40, 3.0)).dense()
        np.testing.assert_allclose(A2.T @ A2, A.T @ A, atol=1e-6)


def test_wca_weights_minimise_their_own_objective(rng):
    W = random_ranges(24, 36, np.random.default_rng(5))
    Wd = W.dense()
    c = rng.uniform(0.5, 5.0, 36)
    var = {
        name: dense_variances(Wd, fn(W, c).dense())
        for name, fn in [("ca", lambda W, c: B.convex_ca(W)), ("i", B.wca_i), ("ii", B.wca_ii)]
    }
    objectives = {"ca": np.ones(36), "i": 1 / c, "ii": 1 / np.sqrt(c)}
    for name, w in objectives.items():
        mine = w @ var[name]
        for other in var:
            assert mine <= w @ var[other] * (1 + 1e-7)


# -- CA certified against an SDP (cvxpy) -------------------------------------------------


def cvxpy_optimum(W: np.ndarray, weights: np.ndarray | None = None) -> float:
    """min tr(F^T X^+ F) s.t. diag(X) <= 1, X PSD, with F F^T = W^T D W (an SDP)."""
    import cvxpy as cp

    G = W.T @ (W if weights is None else weights[:, None] * W)
    ev, V = np.linalg.eigh(G)
    keep = ev > 1e-10 * ev.max()
    F = V[:, keep] * np.sqrt(ev[keep])
    X = cp.Variable(G.shape, PSD=True)
    problem = cp.Problem(cp.Minimize(cp.matrix_frac(F, X)), [cp.diag(X) <= 1])
    problem.solve(solver="CLARABEL")
    assert problem.status == "optimal"
    return float(problem.value)


def _sdp_cases() -> dict[str, np.ndarray]:
    g = np.random.default_rng(20261122)
    return {
        "random ranges": random_ranges(16, 24, g).dense(),
        "prefix": Prefix(12).dense(),
        "wrelated (rank 3)": g.standard_normal((12, 3)) @ g.standard_normal((3, 16)),
        "random 0/1": (g.random((10, 12)) < 0.5).astype(float),
        "marginals": marginals(Domain(a=2, b=3, c=2), 2).dense(),
    }


@requires_cvxpy
@pytest.mark.parametrize("case", sorted(_sdp_cases()))
@pytest.mark.parametrize("weighted", [False, True])
def test_ca_matches_sdp(case, weighted, rng):
    W = _sdp_cases()[case]
    w = rng.uniform(0.2, 3.0, W.shape[0]) if weighted else None
    expected = cvxpy_optimum(W, w)
    sol = B.ca_solve(W, w)
    assert sol.error == pytest.approx(expected, rel=1e-4)
    # the returned strategy realises it
    A = sol.strategy.dense()
    wts = np.ones(W.shape[0]) if w is None else w
    assert wts @ dense_variances(W, A) == pytest.approx(expected, rel=1e-4)


@requires_cvxpy
def test_wca_variants_match_sdp_with_their_weights(rng):
    W = _sdp_cases()["random ranges"]
    c = rng.uniform(0.5, 5.0, W.shape[0])
    for fn, w in [(B.wca_i, 1 / c), (B.wca_ii, 1 / np.sqrt(c))]:
        A = fn(W, c).dense()
        assert w @ dense_variances(W, A) == pytest.approx(cvxpy_optimum(W, w), rel=1e-4)


# -- failing closed --------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: B.hierarchical(8, 1),
        lambda: B.hierarchical(0),
        lambda: B.tree_intervals(8, 2.5),
        lambda: B.identity([3, 0]),
        lambda: B.wavelet(-2),
        lambda: B.hb_branching(0),
        lambda: B.ca_solve(np.eye(3), weights=[1, 2]),
        lambda: B.ca_solve(np.eye(3), weights=[1, 0, 2]),
        lambda: B.ca_solve(np.eye(3), weights=[1, np.nan, 2]),
        lambda: B.ca_solve(np.zeros((2, 3))),
        lambda: B.ca_solve(np.eye(3), tol=0),
        lambda: B.wca_i(np.eye(3), [1.0, -1.0, 2.0]),
        lambda: B.wca_ii(np.eye(3), [1.0, 2.0]),
        lambda: B.wca_i(np.eye(3), [1.0, np.inf, 2.0]),
    ],
)
def test_bad_input_raises(call):
    with pytest.raises(ValueError):  # some from dpdask.linalg
        call()


def test_identity_rejects_non_sizes():
    with pytest.raises(ArgumentTypeError):
        B.identity("abc")


def test_convex_ca_raises_when_not_converged():
    with pytest.raises(ConvergenceError, match="did not converge"):
        B.convex_ca(Prefix(16), max_iter=0)
    assert issubclass(ConvergenceError, RuntimeError)


def test_ca_solve_warns_at_its_iteration_limit():
    with pytest.warns(ConvergenceWarning, match="CA stopped at its iteration limit"):
        sol = B.ca_solve(Prefix(16), max_iter=1)
    assert not sol.converged and sol.iterations == 1
