"""HDMM never returns a template's result worse than the closed-form members of its family."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpdask import Domain, select
from dpdask.linalg import AllRange, Identity, Kron, Ones, Prefix, VStack
from dpdask.privacy import PureDP, zCDP
from dpdask.strategy import optimize
from dpdask.strategy._terms import kron_terms
from dpdask.strategy.hdmm._closed_form import members, workload_subsets
from dpdask.strategy.hdmm._opt_marginals import marginals_spectrum
from dpdask.workloads import marginals

RTOL = 1e-9


def _loss(W: np.ndarray, A: np.ndarray, norm: int) -> float:
    """``||A||_norm^2 ||W A^+||_F^2`` from dense matrices (inf if ``A`` does not support ``W``)."""
    Ap = np.linalg.pinv(A)
    if not np.allclose(W @ Ap @ A, W, atol=1e-8 * max(1.0, np.abs(W).max())):
        return np.inf
    sens = np.linalg.norm(A, ord=norm, axis=0).max()
    return float(sens**2 * np.linalg.norm(W @ Ap, "fro") ** 2)


def _marginal(sizes: tuple[int, ...], subset: tuple[int, ...]) -> np.ndarray:
    return Kron([Identity(n) if i in subset else Ones(n) for i, n in enumerate(sizes)]).dense()


def _oracles(W: np.ndarray, sizes: tuple[int, ...], subsets: list, norm: int) -> dict:
    """Identity, Total and the workload's marginals (equal weights), dense."""
    wm = np.vstack([_marginal(sizes, s) for s in subsets])
    return {
        "identity": _loss(W, np.eye(W.shape[1]), norm),
        "total": _loss(W, np.ones((1, W.shape[1])), norm),
        "workload marginals": _loss(W, wm, norm),
    }


def _stand_in() -> tuple[VStack, Domain, list]:
    dom = Domain(sex=2, race=5, rel=4, age=6)
    W = VStack(
        [
            Kron([Identity(2), Ones(5), Ones(4), AllRange(6)]),
            Kron([Ones(2), Identity(5), Ones(4), Ones(6)]),
            Kron([Identity(2), Identity(5), Ones(4), Prefix(6)]),
            Kron([Ones(2), Ones(5), Identity(4), Ones(6)]),
        ]
    )
    return W, dom, [(0, 3), (1,), (0, 1, 3), (2,)]


@pytest.mark.parametrize("norm", [1, 2])
def test_members_match_dense_losses(norm: int) -> None:
    W, dom, subsets = _stand_in()
    terms = kron_terms(W, dom.shape)
    got = {m.name: m.loss for m in members(terms, marginals_spectrum(terms), norm)}
    want = _oracles(W.dense(), dom.shape, subsets, norm)
    assert set(got) == set(want)
    for name, loss in want.items():
        assert (
            got[name] == pytest.approx(loss, rel=1e-9) if np.isfinite(loss) else got[name] == loss
        )
    idx = [int(np.ravel_multi_index([int(i in s) for i in range(4)], (2,) * 4)) for s in subsets]
    assert workload_subsets(terms) == idx


@pytest.mark.parametrize(("norm", "privacy"), [(1, PureDP(1)), (2, zCDP(1))])
def test_every_template_at_or_below_its_closed_form_members(norm: int, privacy) -> None:
    W, dom, subsets = _stand_in()
    oracle = _oracles(W.dense(), dom.shape, subsets, norm)
    terms = kron_terms(W, dom.shape)
    cands = optimize(terms, norm, templates=["kron", "union", "marginals"], restarts=1)
    for c in cands:
        assert c.loss <= oracle["identity"] * (1 + RTOL), c.name
        assert _loss(W.dense(), c.strategy.dense(), norm) == pytest.approx(c.loss, rel=1e-6)
    marg = next(c for c in cands if c.name == "marginals")
    assert marg.loss <= min(oracle.values()) * (1 + RTOL)
    plan = select(W, privacy, domain=dom, restarts=1)
    assert plan.sensitivity**2 * plan.analysis.total() <= min(oracle.values()) * (1 + RTOL)


@pytest.mark.parametrize("d", [8, 10])
@pytest.mark.parametrize(("norm", "privacy"), [(1, PureDP(1)), (2, zCDP(1))])
def test_opt_m_on_binary_three_way_marginals_at_or_below_identity(
    d: int, norm: int, privacy
) -> None:
    dom = Domain({f"b{chr(97 + i)}": 2 for i in range(d)})
    W = marginals(dom, 3)
    plan = select(W, privacy, domain=dom, templates=["marginals"], restarts=2)
    # Identity's loss: sensitivity 1, ||W||_F^2 = rows * 2^(d-3) ones per row
    rows = len(list(itertools.combinations(range(d), 3))) * 8
    identity = rows * 2 ** (d - 3)
    assert plan.info["templates"]["marginals"] <= identity * (1 + RTOL)
    assert plan.expected_error() <= plan.identity_error() * (1 + RTOL)


def test_replaced_template_says_so() -> None:
    """Pure DP on binary 3-way marginals: the random starts of OPT_M alone end above Identity."""
    dom = Domain({f"b{chr(97 + i)}": 2 for i in range(8)})
    W = marginals(dom, 3)
    terms = kron_terms(W, dom.shape)
    (cand,) = optimize(terms, 1, templates=["kron"], restarts=1)
    assert cand.loss <= 8 * 56 * 32 * (1 + RTOL)  # Identity: 448 rows of 32 ones
    if "closed_form" in cand.details:
        assert cand.details["optimised_loss"] > cand.loss
