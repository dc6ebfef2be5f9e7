"""Error analytics against dense matrices, Monte Carlo and closed forms."""

from __future__ import annotations

import itertools
from functools import reduce

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from dpdask.linalg import (
    AllRange,
    Dense,
    Identity,
    Kron,
    Ones,
    Prefix,
    RangeQueries,
    Sparse,
    VStack,
)
from dpdask.strategy import ErrorAnalysis, PIdentity, WeightedMarginals, query_variances, svd_bound
from dpdask.strategy import squared_error as sq_err
from dpdask.strategy._marginals import marginal_eigenvalues, pinv_coefficients

# -- dense oracles -------------------------------------------------------------


def dense_error(W: np.ndarray, A: np.ndarray) -> float:
    return float(np.linalg.norm(W @ np.linalg.pinv(A), "fro") ** 2)


def dense_variances(W: np.ndarray, A: np.ndarray) -> np.ndarray:
    return np.einsum("ij,jk,ik->i", W, np.linalg.pinv(A.T @ A), W)


def kron_dense(factors: list[np.ndarray]) -> np.ndarray:
    return reduce(np.kron, factors)


def one_d_workloads(n: int, rng: np.random.Generator) -> dict:
    return {
        "prefix": Prefix(n),
        "allrange": AllRange(n),
        "dense": Dense(rng.normal(size=(5, n))),
        "ranges": RangeQueries(n, [0, 2, 1], [3, n - 1, 1]),
        "union": VStack([Identity(n), Ones(n), Prefix(n)], weights=[1.0, 3.0, 0.5]),
    }


def one_d_strategies(n: int, rng: np.random.Generator) -> dict:
    tree = np.vstack([np.eye(n), np.ones((1, n)), np.kron(np.eye(2), np.ones((1, n // 2)))])
    return {
        "pidentity-l1": PIdentity(rng.random((3, n))),
        "pidentity-l2": PIdentity(rng.normal(size=(4, n)), norm=2),
        "identity": Identity(n),
        "tree": Sparse(tree),
        "dense": Dense(rng.normal(size=(n + 2, n))),
    }


@pytest.mark.parametrize("wname", ["prefix", "allrange", "dense", "ranges", "union"])
@pytest.mark.parametrize("aname", ["pidentity-l1", "pidentity-l2", "identity", "tree", "dense"])
def test_one_attribute_matches_dense(wname: str, aname: str, rng: np.random.Generator) -> None:
    n = 8
    W = one_d_workloads(n, rng)[wname]
    A = one_d_strategies(n, rng)[aname]
    Wd, Ad = W.dense(), A.dense()
    an = ErrorAnalysis(W, A)
    assert an.total() == pytest.approx(dense_error(Wd, Ad), rel=1e-9)
    np.testing.assert_allclose(an.variances(), dense_variances(Wd, Ad), rtol=1e-9, atol=1e-9)


def _random_factor(kind: str, n: int, rng: np.random.Generator):
    return {
        "I": Identity(n),
        "T": Ones(n),
        "P": Prefix(n),
        "R": AllRange(n),
        "D": Dense(rng.normal(size=(2, n))),
    }[kind]


def _union(sizes, kinds_per_term, weights, rng):
    parts = [
        Kron([_random_factor(k, n, rng) for k, n in zip(kinds, sizes, strict=True)])
        for kinds in kinds_per_term
    ]
    return VStack(parts, weights=weights)


@pytest.mark.parametrize(
    "terms",
    [
        ["IPT", "TTD", "RIT"],
        ["DDD"],
        ["TIP", "PTI", "ITT", "TTT"],
    ],
)
def test_kron_strategy_on_union_matches_dense(terms: list[str], rng: np.random.Generator) -> None:
    sizes = (3, 4, 2)
    W = _union(sizes, terms, rng.random(len(terms)) + 0.5, rng)
    A = Kron([PIdentity(rng.random((2, 3))), PIdentity(rng.normal(size=(2, 4)), 2), Identity(2)])
    an = ErrorAnalysis(W, A)
    Wd, Ad = W.dense(), A.dense()
    assert an.total() == pytest.approx(dense_error(Wd, Ad), rel=1e-9)
    np.testing.assert_allclose(an.variances(), dense_variances(Wd, Ad), rtol=1e-8, atol=1e-10)
    # per term: the rows of each part
    for j, sl in enumerate(W.part_slices()):
        assert an.by_term()[j] == pytest.approx(dense_error(Wd[sl], Ad), rel=1e-9)


def test_kron_with_total_factor_supports_only_totals(rng: np.random.Generator) -> None:
    sizes = (3, 4)
    A = Kron([PIdentity(rng.random((1, 3))), Ones(4)])
    W_ok = _union(sizes, ["PT", "IT"], [1.0, 2.0], rng)
    assert sq_err(W_ok, A) == pytest.approx(dense_error(W_ok.dense(), A.dense()), rel=1e-9)
    W_bad = _union(sizes, ["PT", "II"], [1.0, 1.0], rng)
    with pytest.raises(ValueError, match="does not support"):
        sq_err(W_bad, A)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_marginals_match_dense(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = (3, 2, 4)
    theta = rng.random(8)
    theta[rng.random(8) < 0.3] = 0.0
    theta[-1] = 0.4  # the full table: supports everything
    A = WeightedMarginals(sizes, theta)
    W = _union(sizes, ["PIT", "DTR", "TTI", "IID"], [1.0, 0.5, 2.0, 1.0], rng)
    an = ErrorAnalysis(W, A)
    Wd, Ad = W.dense(), A.dense()
    assert an.total() == pytest.approx(dense_error(Wd, Ad), rel=1e-9)
    np.testing.assert_allclose(an.variances(), dense_variances(Wd, Ad), rtol=1e-8, atol=1e-10)


def test_marginals_support() -> None:
    sizes = (3, 2, 4)
    theta = np.zeros(8)
    theta[[0b110, 0b011]] = 1.0  # marginals a x b and b x c
    A = WeightedMarginals(sizes, theta)
    supported = VStack([Kron([Identity(3), Ones(2), Ones(4)]), Kron([Ones(3), Prefix(2), Ones(4)])])
    assert sq_err(supported, A) == pytest.approx(
        dense_error(supported.dense(), A.dense()), rel=1e-9
    )
    with pytest.raises(ValueError, match="does not support"):
        sq_err(Kron([Identity(3), Ones(2), Identity(4)]), A)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    data=st.data(),
)
def test_marginal_algebra_pseudo_inverse(sizes: list[int], data: st.DataObject) -> None:
    d = len(sizes)
    u = np.array(
        data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=2**d, max_size=2**d))
    )
    K = [
        kron_dense([np.eye(n) if b else np.ones((n, n)) for n, b in zip(sizes, bits, strict=True)])
        for bits in itertools.product([0, 1], repeat=d)
    ]
    X = sum(c * k for c, k in zip(u, K, strict=True))
    c = pinv_coefficients(u, sizes)
    Xp = sum(ci * k for ci, k in zip(c, K, strict=True))
    np.testing.assert_allclose(Xp, np.linalg.pinv(X), atol=1e-9)
    mu = marginal_eigenvalues(u, sizes)
    expect = np.sort(np.linalg.eigvalsh(X))
    dims = [
        int(np.prod([n - 1 if b else 1 for n, b in zip(sizes, bits, strict=True)]))
        for bits in itertools.product([0, 1], repeat=d)
    ]
    np.testing.assert_allclose(np.sort(np.repeat(mu, dims)), expect, atol=1e-9)


def test_grouped_union_is_block_reconstruction(rng: np.random.Generator) -> None:
    sizes = (3, 4)
    W = _union(sizes, ["PT", "IP", "TI"], [1.0, 1.0, 2.0], rng)
    K1 = Kron([PIdentity(rng.random((1, 3))), Ones(4)])
    K2 = Kron([PIdentity(rng.random((2, 3))), PIdentity(rng.random((1, 4)))])
    c = np.array([0.3, 0.7])
    A = VStack([K1, K2], weights=c)
    an = ErrorAnalysis(W, A, groups=[[0], [1, 2]])
    Wd = W.dense()
    s = W.part_slices()
    block = dense_error(Wd[s[0]], c[0] * K1.dense()) + dense_error(
        np.vstack([Wd[s[1]], Wd[s[2]]]), c[1] * K2.dense()
    )
    assert an.total() == pytest.approx(block, rel=1e-9)
    assert an.total() >= dense_error(Wd, A.dense()) * (1 - 1e-12)  # an upper bound of full LS
    v = an.variances()
    np.testing.assert_allclose(v[s[0]], dense_variances(Wd[s[0]], c[0] * K1.dense()), rtol=1e-9)


def test_flat_fallback(rng: np.random.Generator) -> None:
    W = _union((3, 4), ["PI", "TD"], [1.0, 1.0], rng)
    A = Dense(rng.normal(size=(14, 12)))
    assert sq_err(W, A) == pytest.approx(dense_error(W.dense(), A.dense()), rel=1e-9)


def test_monte_carlo_laplace(rng: np.random.Generator) -> None:
    """The analytic variance matches least squares on Laplace-noised measurements."""
    sizes = (3, 4)
    W = _union(sizes, ["PI", "TP"], [1.0, 1.0], rng)
    A = Kron([PIdentity(rng.random((2, 3))), PIdentity(rng.random((1, 4)))])
    b = 1.7  # Laplace scale
    Wd, Ad = W.dense(), A.dense()
    x = rng.integers(0, 50, size=12).astype(float)
    trials = 20000
    y = Ad @ x + rng.laplace(0.0, b, size=(trials, Ad.shape[0]))
    est = y @ np.linalg.pinv(Ad).T @ Wd.T
    err = est - Wd @ x
    expected = 2 * b * b * query_variances(W, A)
    np.testing.assert_allclose(err.var(axis=0), expected, rtol=0.06)
    total = (err**2).sum(axis=1).mean()
    assert total == pytest.approx(2 * b * b * sq_err(W, A), rel=0.03)


def test_svd_bound_matches_dense(rng: np.random.Generator) -> None:
    for W in (
        Prefix(16),
        Kron([Prefix(4), AllRange(3)]),
        _union((3, 4), ["IT", "TI", "II"], [1.0, 2.0, 0.5], rng),  # marginal algebra
        _union((3, 4), ["PT", "PI"], [1.0, 1.0], rng),  # commuting factor grams
    ):
        Wd = W.dense()
        s = np.linalg.svd(Wd, compute_uv=False).sum()
        assert svd_bound(W) == pytest.approx(s * s / Wd.shape[1], rel=1e-9)
    assert svd_bound(_union((3, 4), ["PT", "RI"], [1.0, 1.0], rng)) is None


def test_svd_bound_is_a_lower_bound(rng: np.random.Generator) -> None:
    W = Prefix(12)
    for A in (Identity(12), PIdentity(rng.random((3, 12))), PIdentity(rng.normal(size=(2, 12)), 2)):
        assert A.sensitivity(2) ** 2 * sq_err(W, A) >= svd_bound(W) * (1 - 1e-12)


def test_example_in_docstring() -> None:
    assert sq_err(Prefix(4), Identity(4)) == 10.0


@pytest.mark.parametrize("weights", [(0.3, 0.7), (1.0, 0.05)])
def test_two_part_union_is_exact(weights, rng: np.random.Generator) -> None:
    sizes = (3, 4, 2)
    K1 = Kron([PIdentity(rng.random((1, 3))), Ones(4), PIdentity(rng.random((1, 2)))])
    K2 = Kron([Ones(3), PIdentity(rng.random((2, 4))), PIdentity(rng.normal(size=(1, 2)), 2)])
    K3 = Kron([PIdentity(rng.random((2, 3))), Identity(4), Ones(2)])
    for Ka, Kb, kinds in ((K1, K2, ["PTI", "TPD", "TTT", "RTP"]), (K3, K2, ["PIT", "TPI", "IRT"])):
        W = _union(sizes, kinds, rng.random(len(kinds)) + 0.5, rng)
        A = VStack([Ka, Kb], weights=weights)
        an = ErrorAnalysis(W, A)
        Wd, Ad = W.dense(), A.dense()
        assert an.total() == pytest.approx(dense_error(Wd, Ad), rel=1e-8)
        np.testing.assert_allclose(an.variances(), dense_variances(Wd, Ad), rtol=1e-7, atol=1e-9)


def test_two_part_union_support(rng: np.random.Generator) -> None:
    K1 = Kron([PIdentity(rng.random((1, 3))), Ones(4)])
    K2 = Kron([Ones(3), PIdentity(rng.random((1, 4)))])
    A = VStack([K1, K2], weights=[0.5, 0.5])
    ok = _union((3, 4), ["PT", "TP", "TT"], [1.0, 1.0, 1.0], rng)
    assert sq_err(ok, A) == pytest.approx(dense_error(ok.dense(), A.dense()), rel=1e-8)
    with pytest.raises(ValueError, match="does not support"):
        sq_err(_union((3, 4), ["PP"], [1.0], rng), A)
