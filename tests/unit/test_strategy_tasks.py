"""HDMM's task machinery: drivers, BLAS limits, task reuse, what tasks carry."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from dask.base import tokenize
from threadpoolctl import threadpool_info

from dpdask import Domain, select
from dpdask.linalg import AllRange, Identity, Kron, Ones, Prefix, VStack
from dpdask.privacy import PureDP
from dpdask.strategy._gram import Gram
from dpdask.strategy._terms import kron_terms
from dpdask.strategy.hdmm import _pieces, _tasks
from dpdask.strategy.hdmm._opt_kron import factor_kind
from dpdask.strategy.hdmm._optimize import fit_0, opt_0


def _union() -> tuple[VStack, Domain]:
    dom = Domain(sex=2, race=5, rel=4, age=12)
    W = VStack(
        [
            Kron([Identity(2), Ones(5), Ones(4), AllRange(12)]),
            Kron([Ones(2), Identity(5), Ones(4), Ones(12)]),
            Kron([Identity(2), Identity(5), Ones(4), Prefix(12)]),
            Kron([Ones(2), Ones(5), Identity(4), Ones(12)]),
        ]
    )
    return W, dom


def _square(x: float) -> float:
    return x * x


def _chain(name: str, rounds: int, width: int):
    """A generator of ``rounds`` rounds of ``width`` tasks, each round built on the last."""
    acc = 0.0
    for r in range(rounds):
        tasks = [_tasks.Task([name], _square, (acc + r + i,)) for i in range(width)]
        results = yield tasks
        acc = float(sum(results))
    return name, acc


def _blas_threads() -> set[int]:
    return {d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"}


def test_blas_limit_limits_and_restores() -> None:
    before = _blas_threads()
    with _tasks.blas_limit(1):
        assert _blas_threads() == {1}
    assert _blas_threads() == before
    with _tasks.blas_limit(None):
        assert _blas_threads() == before


def test_small_problems_select_with_one_blas_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[set[int]] = []
    real = _pieces.run_tasks

    def spy(tasks, client=None, inline=False):
        seen.append(_blas_threads())
        return real(tasks, client, inline=inline)

    monkeypatch.setattr(_pieces, "run_tasks", spy)
    W, dom = _union()
    select(W, PureDP(1), domain=dom, restarts=2)
    assert seen and all(s == {1} for s in seen)


def test_drive_runs_a_repeated_task_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key seen in an earlier round is answered from it (the key hashes the problem)."""
    ran: list[str] = []
    real = _pieces.run_tasks

    def spy(tasks, client=None, inline=False):
        ran.extend(t.key for t in tasks)
        return real(tasks, client, inline=inline)

    def gen():
        first = yield [_tasks.Task(["a"], _square, (3.0,)), _tasks.Task(["a"], _square, (3.0,))]
        second = yield [_tasks.Task(["a"], _square, (3.0,)), _tasks.Task(["b"], _square, (4.0,))]
        return first, second

    monkeypatch.setattr(_pieces, "run_tasks", spy)
    first, second = _pieces.drive(gen(), None, inline=True)
    assert first == [9.0, 9.0] and second == [9.0, 16.0]
    assert len(ran) == len(set(ran)) == 2


def test_kron_terms_pickle_without_caches() -> None:
    W, dom = _union()
    terms = kron_terms(W, dom.shape)
    token = tokenize(terms)
    kinds = [factor_kind(terms, i) for i in range(terms.d)]
    for i in range(terms.d):
        terms.stacked_grams(i)
    small = kron_terms(W, dom.shape)
    assert len(pickle.dumps(terms)) <= len(pickle.dumps(small)) + 1000
    back = pickle.loads(pickle.dumps(terms))
    assert tokenize(back) == token
    assert [factor_kind(back, i) for i in range(back.d)] == kinds
    for j in range(terms.k):
        for i in range(terms.d):
            np.testing.assert_array_equal(back.gram(j, i).dense(), terms.gram(j, i).dense())


def test_fit_0_is_opt_0_without_the_check() -> None:
    G = Gram.of(Prefix(24))
    theta, loss, nit = opt_0(G, 4, seed=3)
    theta2, loss2, nit2 = fit_0(G, 4, seed=3)
    np.testing.assert_array_equal(theta, theta2)
    assert nit == nit2
    assert loss == pytest.approx(loss2, rel=1e-6)
