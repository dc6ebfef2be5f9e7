"""ADMM maximum-likelihood reconstruction and the hierarchical tree, against independent solvers.

Oracles: scipy.optimize.linprog (HiGHS) for the L1 problems, cvxpy QPs for the elastic
net and least squares, dense generalised least squares for the tree projection, and a
one-dimensional numerical minimisation for the proximal operators.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from scipy.optimize import linprog, minimize_scalar

from dpdask.errors import ConvergenceWarning
from dpdask.linalg import AllRange, Dense, Identity, Kron, Ones, Prefix, Total, VStack
from dpdask.noise import KeyedRNG
from dpdask.reconstruct import HierarchicalTree, admm, tree_consistent
from tests import requires_cvxpy, requires_shared_data, shared_data

admm_module = importlib.import_module("dpdask.reconstruct.admm")
system_module = importlib.import_module("dpdask.reconstruct._admm_system")


# -- oracles --------------------------------------------------------------------------
def _l1_linprog(M, y, E=None, d=None, nonneg=True, b=1.0):
    """min sum |M x - y| / b  s.t.  E x = d, x >= 0, as a linear program."""
    m, n = M.shape
    w = np.broadcast_to(1.0 / np.asarray(b, dtype=float), (m,))
    cost = np.concatenate([np.zeros(n), w])
    A_ub = np.block([[M, -np.eye(m)], [-M, -np.eye(m)]])
    A_eq = None if E is None else np.hstack([E, np.zeros((E.shape[0], m))])
    bounds = [(0, None) if nonneg else (None, None)] * n + [(0, None)] * m
    b_eq = None if E is None else d
    res = linprog(cost, A_ub=A_ub, b_ub=np.concatenate([y, -y]), A_eq=A_eq, b_eq=b_eq,
                  bounds=bounds, method="highs")  # fmt: skip
    assert res.status == 0
    return res.fun


def _qp_cvxpy(M, y, loss, alpha=0.9, E=None, d=None, nonneg=True, b=1.0):
    import cvxpy as cp

    x = cp.Variable(M.shape[1])
    r = cp.multiply(1.0 / np.broadcast_to(b, (M.shape[0],)), M @ x - y)
    obj = (
        alpha * cp.norm1(r) + (1 - alpha) * cp.sum_squares(r)
        if loss == "enet"
        else (0.5 * cp.sum_squares(r))
    )
    cons = ([x >= 0] if nonneg else []) + ([E @ x == d] if E is not None else [])
    cp.Problem(cp.Minimize(obj), cons).solve(
        solver="CLARABEL", tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12
    )
    return x.value


def _relerr(x, ref) -> float:
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-12))


def _operators(rng: np.random.Generator):
    yield Kron([Prefix(3), Identity(4)])
    yield Kron([Dense(rng.uniform(size=(5, 3))), AllRange(4)])
    yield VStack([Kron([Identity(3), Total(4)]), Identity(12)], weights=[1.0, 2.0])


@pytest.fixture(params=["cholesky", "kron-eigen", "cg"])
def solver(request, monkeypatch) -> str:
    """Force each way of factoring the x-update on small problems."""
    if request.param != "cholesky":
        monkeypatch.setattr(system_module, "_DENSE_N", 0)
    if request.param == "cg":
        monkeypatch.setattr(system_module, "_FACTOR_N", 0)
    return request.param


# -- the proximal steps ----------------------------------------------------------------
@pytest.mark.parametrize("loss", ["l1", "enet", "l2"])
@pytest.mark.parametrize("rho", [0.5, 2.0])
def test_prox_is_the_minimiser(loss: str, rho: float) -> None:
    alpha = 0.9
    phi = {
        "l1": abs,
        "enet": lambda s: alpha * abs(s) + (1 - alpha) * s * s,
        "l2": lambda s: 0.5 * s * s,
    }[loss]
    step = admm_module.prox(loss, alpha, rho)
    for v in (-3.0, -0.3, 0.0, 0.2, 0.45, 1.7):
        ref = minimize_scalar(
            lambda s, v=v: phi(s) + rho / 2 * (s - v) ** 2, bracket=(-5, 5), tol=1e-12
        )
        assert abs(step(np.array([v]))[0] - ref.x) < 1e-6


# -- matrix-mechanism form -------------------------------------------------------------
@pytest.mark.parametrize("with_equality", [False, True])
def test_l1_objective_matches_linprog(
    solver: str, with_equality: bool, rng: np.random.Generator
) -> None:
    E = Kron([Total(3), Identity(4)])
    for A in list(_operators(rng))[: 1 if solver == "cg" else None]:
        M = A.dense()
        x = rng.integers(0, 4, size=12).astype(float)
        Y = M @ x + rng.laplace(scale=2.0, size=(2, M.shape[0]))
        d = E.dense() @ x
        eq = (E, d) if with_equality else None
        est = admm(A, Y, loss="l1", equality=eq, tol=1e-8, maxiter=20_000, scale=2.0)
        assert est.report.converged
        assert est.report.details["solver"].startswith(solver)
        assert (est.x >= 0).all()
        for xh, y in zip(est.x, Y, strict=True):
            ref = _l1_linprog(M, y, E.dense() if with_equality else None, d, b=2.0)
            assert abs(np.abs(M @ xh - y).sum() / 2.0 - ref) <= 1e-6 * ref
            if with_equality:
                np.testing.assert_allclose(E.dense() @ xh, d, atol=1e-6)


@requires_cvxpy
@pytest.mark.parametrize("loss", ["enet", "l2"])
def test_unique_solutions_match_cvxpy(solver: str, loss: str, rng: np.random.Generator) -> None:
    E = Kron([Total(3), Identity(4)])
    for A in list(_operators(rng))[: 1 if solver == "cg" else None]:
        M = A.dense()
        x = rng.integers(0, 4, size=12).astype(float)
        y = M @ x + rng.laplace(scale=2.0, size=M.shape[0])
        b = rng.uniform(1.0, 3.0, size=M.shape[0])  # unequal noise scales
        for eq in (None, (E, E.dense() @ x)):
            est = admm(A, y, loss=loss, equality=eq, scale=b, tol=1e-10, maxiter=50_000)
            Ed, d = (None, None) if eq is None else (E.dense(), eq[1])
            assert _relerr(est.x, _qp_cvxpy(M, y, loss, E=Ed, d=d, b=b)) < 1e-6


@requires_cvxpy
def test_without_nonnegativity(rng: np.random.Generator) -> None:
    A = VStack([Identity(6), Prefix(6)])
    M = A.dense()
    y = M @ np.zeros(6) + rng.laplace(scale=2.0, size=12)
    est = admm(A, y, loss="enet", nonneg=False, tol=1e-10, maxiter=50_000)
    assert (est.x < 0).any()
    assert _relerr(est.x, _qp_cvxpy(M, y, "enet", nonneg=False)) < 1e-6


@pytest.mark.parametrize("loss", ["l1", "enet", "l2"])
def test_exact_measurements_return_the_truth(solver: str, loss: str, rng) -> None:
    A = VStack([Kron([Identity(3), Total(4)]), Kron([Prefix(3), Identity(4)])])
    x = rng.integers(0, 10, size=12).astype(float)
    x[[1, 5]] = 0.0
    E = Kron([Total(3), Total(4)])
    est = admm(A, A @ x, loss=loss, equality=(E, E @ x), tol=1e-10, maxiter=50_000)
    np.testing.assert_allclose(est.x, x, atol=1e-6)


def test_identity_with_known_marginals_is_algorithm_one(rng: np.random.Generator) -> None:
    """A = I: noisy cells, exact margins (contingency-table release, section 5.1)."""
    shape = (3, 4, 2)
    x = rng.poisson(2.0, size=shape).astype(float).ravel()
    marg = VStack([Kron([Identity(3), Ones(4), Ones(2)]), Kron([Ones(3), Identity(4), Ones(2)])])
    y = x + rng.laplace(scale=1.0, size=x.size)
    est = admm(Identity(24), y, equality=(marg, marg @ x), tol=1e-10, maxiter=50_000)
    ref = _l1_linprog(np.eye(24), y, marg.dense(), marg @ x)
    assert abs(np.abs(est.x - y).sum() - ref) <= 1e-6 * ref
    np.testing.assert_allclose(marg @ est.x, marg @ x, atol=1e-6)


def test_iteration_limit_is_reported(rng: np.random.Generator) -> None:
    A = Kron([Prefix(3), Identity(4)])
    Y = A @ rng.poisson(2.0, size=12) + rng.laplace(scale=2.0, size=(3, 12))
    with pytest.warns(ConvergenceWarning, match="admm-l1 stopped at its iteration limit"):
        est = admm(A, Y, tol=1e-12, maxiter=7, check_every=5)
    report = est.report
    assert not report.converged and report.iterations == 7
    assert report.details["not_converged"] == 3 and report.residual > report.tolerance
    assert (est.x >= 0).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss": "huber"}, "loss"),
        ({"alpha": 1.5}, "alpha"),
        ({"rho": 0.0}, "rho"),
        ({"scale": -1.0}, "scale"),
        ({"equality": (Total(5), np.ones(1))}, "columns"),
        ({"tree": HierarchicalTree(4, 2)}, "strategy"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        admm(Identity(4), np.ones(4), **kwargs)


# -- hierarchical tree -------------------------------------------------------------------
@pytest.mark.parametrize(("n", "b"), [(1, 2), (2, 2), (5, 2), (7, 2), (10, 3), (16, 4), (13, 5)])
@pytest.mark.parametrize("root", [True, False])
def test_tree_projection_is_weighted_least_squares(n: int, b: int, root: bool, rng) -> None:
    T = HierarchicalTree(n, b, root=root)
    H = T.strategy().dense()
    np.testing.assert_array_equal(T.answers(np.eye(n)), H)
    np.testing.assert_array_equal(T.leaves(H), np.eye(n))
    V = rng.normal(size=(T.m, 3))
    np.testing.assert_allclose(T.project(V), H @ np.linalg.pinv(H) @ V, atol=1e-10)
    np.testing.assert_allclose(T.project(V[:, 0]), T.project(V)[:, 0], atol=1e-12)
    var = rng.uniform(0.5, 3.0, size=T.m)
    Si = np.diag(1.0 / var)
    gls = H @ np.linalg.solve(H.T @ Si @ H, H.T @ Si @ V)
    np.testing.assert_allclose(T.project(V, var), gls, atol=1e-10)


@pytest.mark.parametrize(("n", "b"), [(8, 2), (27, 3)])
def test_full_tree_projection_equals_geography_consistency(n: int, b: int, rng) -> None:
    """On a full tree the passes are those of the geography-level tree consistency."""
    T = HierarchicalTree(n, b)
    V = rng.normal(size=(T.m, 2))
    var = rng.uniform(0.5, 2.0, size=T.levels)
    per_level = [V[s] for s in T.level_slices()]
    parents = [np.arange(T.level_sizes[i + 1]) // b for i in range(T.levels - 1)]
    joined, _ = tree_consistent(per_level, list(var), parents)
    np.testing.assert_allclose(np.concatenate(joined), T.project(V, var), atol=1e-10)


def test_tree_structure() -> None:
    T = HierarchicalTree(10, 3)
    assert T.level_sizes == (1, 3, 9, 2) and T.shape == (15, 10) and T.levels == 4
    assert (T.lo[0], T.hi[0]) == (0, 9)
    assert list(zip(T.lo[1:4], T.hi[1:4], strict=True)) == [(0, 3), (4, 6), (7, 9)]
    assert T.strategy().sensitivity(1) == T.levels
    assert HierarchicalTree(10, 3, root=False).level_sizes == (3, 9, 2)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError):
            HierarchicalTree(bad, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="branching"):
        HierarchicalTree(8, 1)
    with pytest.raises(ValueError, match="variances"):
        T.project(np.zeros(15), variances=np.ones(5))
    with pytest.raises(ValueError, match="positive"):
        T.project(np.zeros(15), variances=0.0)


def test_tree_form_l1_matches_linprog(rng: np.random.Generator) -> None:
    T = HierarchicalTree(10, 3)
    H = T.strategy()
    M = H.dense()
    x = rng.poisson(1.0, size=10).astype(float)
    Y = M @ x + rng.laplace(scale=3.0, size=(3, T.m))
    est = admm(H, Y, tree=T, scale=3.0, tol=1e-10, maxiter=50_000)
    assert est.report.converged and est.report.details["form"] == "tree"
    for xh, y in zip(est.x, Y, strict=True):
        ref = _l1_linprog(M, y, b=3.0)
        assert abs(np.abs(M @ xh - y).sum() / 3.0 - ref) <= 1e-6 * ref


@requires_cvxpy
@pytest.mark.parametrize("loss", ["enet", "l2"])
def test_tree_form_matches_cvxpy(loss: str, rng: np.random.Generator) -> None:
    T = HierarchicalTree(9, 2)
    H = T.strategy()
    M = H.dense()
    y = M @ rng.poisson(1.0, size=9) + rng.laplace(scale=2.0, size=T.m)
    b = np.repeat([4.0, 3.0, 2.0, 1.0, 1.0][: T.levels], T.level_sizes)  # per-level scales
    est = admm(H, y, loss=loss, tree=T, scale=b, tol=1e-10, maxiter=50_000)
    assert _relerr(est.x, _qp_cvxpy(M, y, loss, b=b)) < 1e-6
    # tree form and matrix form solve the same problem
    np.testing.assert_allclose(
        admm(H, y, loss=loss, scale=b, tol=1e-10, maxiter=50_000).x, est.x, atol=1e-6
    )


def test_tree_form_exact_measurements() -> None:
    T = HierarchicalTree(20, 2)
    x = np.arange(20.0) % 4
    est = admm(T.strategy(), T.answers(x), tree=T, tol=1e-10, maxiter=20_000)
    np.testing.assert_allclose(est.x, x, atol=1e-6)


# -- findings of paper 001 on real data -------------------------------------------------
def _lap(seed: int, identity: tuple, scale: float, size: int) -> np.ndarray:
    # The paper's continuous Laplace noise: a reproduction, not a release.
    return KeyedRNG.for_testing(seed, identity).laplace(scale, size, unsafe_float=True)


@requires_shared_data
@pytest.mark.parametrize("name", ["NETTRACE", "SEARCHLOGS"])
@pytest.mark.parametrize("eps", [0.1, 1.0])
def test_dpbench_l1_beats_least_squares_tree(name: str, eps: float) -> None:
    """Unit-length queries on sparse histograms: ADMM-L1 has lower MSE than HTree (Fig. 5.2.1)."""
    x = np.load(shared_data("dpbench", "1D", f"{name}.n4096.npy")).astype(float)
    T = HierarchicalTree(x.size, 2)
    H = T.strategy()
    b = T.levels / eps  # Laplace scale: the strategy's L1 sensitivity is the number of levels
    trials = 3
    Y = T.answers(x)[None, :] + np.stack(
        [_lap(7, ("dpbench", name, str(eps), t), b, T.m) for t in range(trials)]
    )
    l1 = admm(H, Y, tree=T, scale=b, tol=1e-3)
    assert l1.report.converged
    ls = T.leaves(T.project(Y.T)).T
    mse_l1 = np.mean((l1.x - x) ** 2)
    mse_ls = np.mean((np.maximum(ls, 0) - x) ** 2)  # HTree with negatives set to 0, as the paper
    assert mse_l1 < mse_ls


@requires_shared_data
def test_adult_known_marginals_l1_beats_laplace() -> None:
    """Contingency table with one-way marginals known (M1, Fig. 5.1.1): L1 beats Laplace."""
    import json

    cols = ["workclass", "education-num", "marital-status", "race", "sex", "income>50K"]
    sizes = json.loads(shared_data("adult", "adult-domain.json").read_text())
    shape = tuple(sizes[c] for c in cols)
    data = np.loadtxt(shared_data("adult", "adult.csv"), delimiter=",", skiprows=1, dtype=int)
    header = shared_data("adult", "adult.csv").read_text().split("\n", 1)[0].split(",")
    idx = [header.index(c) for c in cols]
    x = np.zeros(shape)
    np.add.at(x, tuple(data[:, i] for i in idx), 1.0)
    x = x.ravel()
    margins = VStack(
        [Kron([Identity(s) if j == i else Ones(s) for j, s in enumerate(shape)])
         for i in range(len(shape))]
    )  # fmt: skip
    for eps in (0.1, 1.0):
        y = x + _lap(11, ("adult", str(eps)), 1.0 / eps, x.size)
        est = admm(Identity(x.size), y, equality=(margins, margins @ x), scale=1.0 / eps,
                   tol=1e-3)  # fmt: skip
        assert est.report.converged
        assert est.report.details["solver"] == "kron-eigen+woodbury"
        mse_l1 = np.mean((est.x - x) ** 2)
        mse_lap = np.mean((np.maximum(y, 0) - x) ** 2)  # Laplace with negatives set to 0
        assert mse_l1 < mse_lap


def test_bench_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from dpdask.cli import main

    argv = ["bench", "reconstruct", "--json", "--bins", "64", "--repeats", "1"]
    assert main([*argv, "--trials", "1", "--parts", "admm_tree"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["admm_tree.bins"] == 64 and out["admm_tree.admm_converged"]
    assert out["admm_tree.mse_admm"] < out["admm_tree.mse_ls_tree"]
    assert main([*argv, "--parts", "nothing"]) == 2
