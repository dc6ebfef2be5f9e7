"""The unbiased least-squares answers of a level's measurements and their variance
(:mod:`dpdask.graph._unbiased`), against dense oracles on tiny cases: ``Q pinv(A) y``
by NumPy's pseudo-inverse, and the variance ``sigma^2 diag(Q pinv(A) pinv(A)^T Q^T)``
written out; and the labels of what every uncertainty is of."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpdask.graph import level_plans
from dpdask.graph._caches import clear_caches
from dpdask.graph._unbiased import (
    unbiased_answers,
    unbiased_queries,
    unbiased_variances,
)
from dpdask.graph._uncertainty import estimator_label, published_label, uncertainty_attrs
from dpdask.linalg import Dense, Identity, Kron, Prefix, Total, VStack
from tests.helpers import DOMAIN, make_plan


def _dense_oracle(A: np.ndarray, Q: np.ndarray, y: np.ndarray) -> np.ndarray:
    return y @ np.linalg.pinv(A).T @ Q.T


@pytest.mark.parametrize(
    "A",
    [
        VStack([Kron([Identity(2), Identity(3)]), Kron([Total(2), Prefix(3)])]),  # tall
        Dense(np.random.default_rng(3).normal(size=(4, 6))),  # rank-deficient
    ],
)
@pytest.mark.parametrize("formed", [False, True], ids=["factor", "formed"])
def test_unbiased_answers_are_the_dense_pseudo_inverse(A, formed):
    """Both ways (a level of few units from the Gram matrix's factor, of many through the
    formed matrix; a rank-deficient ``A`` always the latter) give the oracle's answers."""
    W = make_plan().workload
    u = unbiased_queries(W, A, n_units=5, limit=10**6)
    assert u.formed is False  # five units: the factor
    u = dataclasses.replace(u, formed=formed)
    clear_caches()
    y = np.random.default_rng(1).normal(size=(5, A.shape[0])) * 10
    Q = np.vstack([np.ones((1, DOMAIN.size)), W.dense()])  # the total first
    got = unbiased_answers(A, y, u)
    np.testing.assert_allclose(got, _dense_oracle(A.dense(), Q, y), rtol=1e-9, atol=1e-9)
    P = np.linalg.pinv(A.dense())
    want = 2.5 * np.einsum("ij,jk,ik->i", Q, P @ P.T, Q)
    np.testing.assert_allclose(unbiased_variances(A, u, 2.5), want, rtol=1e-9, atol=1e-12)
    clear_caches()  # as in the client that publishes them: without the answers' matrix
    np.testing.assert_allclose(unbiased_variances(A, u, 2.5), want, rtol=1e-9, atol=1e-12)


def test_a_level_of_many_units_forms_the_matrix():
    """The flop counts: forming ``(Q A^+)^T`` pays once the units are many."""
    A, W = make_plan().strategy, make_plan().workload
    few = unbiased_queries(W, A, n_units=1, limit=10**9)
    many = unbiased_queries(W, A, n_units=10**6, limit=10**9)
    assert not few.formed and many.formed


def test_unbiased_answers_of_exact_measurements_are_the_truth():
    """Noise-free measurements of a full-rank strategy: the answers are ``Q x``."""
    A = make_plan().strategy
    x = np.random.default_rng(2).integers(0, 40, size=(3, DOMAIN.size)).astype(float)
    u = unbiased_queries(make_plan().workload, A, 3)
    Q = np.vstack([np.ones((1, DOMAIN.size)), make_plan().workload.dense()])
    np.testing.assert_allclose(unbiased_answers(A, x @ A.dense().T, u), x @ Q.T, atol=1e-9)


def test_groups_are_kept_while_units_times_queries_fit():
    W = VStack(
        [Total(6), Identity(6), Kron([Identity(2), Total(3)])], names=["total", "cells", "a"]
    )
    everything = unbiased_queries(W, Identity(6), 10, limit=90)
    assert everything.groups == ("total",) + ("cells",) * 6 + ("a",) * 2
    assert everything.skipped == ()
    some = unbiased_queries(W, Identity(6), 10, limit=50)  # the cells' 6 rows do not fit; a's 2 do
    assert some.labels == ("total_001", "a_001", "a_002") and some.skipped == ("cells",)
    least = unbiased_queries(W, Identity(6), 10, limit=0)  # the total always
    assert least.labels == ("total_001",) and least.skipped == ("cells", "a")
    np.testing.assert_array_equal(least.queries.dense(), np.ones((1, 6)))


def test_labels_say_what_the_uncertainty_is_of():
    assert estimator_label("ls").startswith("least-squares estimate")
    assert "not the published integer top-down" in estimator_label("topdown", integer=True)
    assert "not the published (non-negative) admm-l1" in estimator_label("admm-l1")
    assert published_label("topdown") == "published top-down estimate (its workload answers)"
    plan = level_plans(make_plan(), ["county"])["county"]  # nominal noise: no data dtype
    attrs = uncertainty_attrs("x", plan, False)
    assert attrs["uncertainty_of"] == "x" and attrs["describes_published"] is False
    sigma = make_plan().noise_scale  # the dense oracle's calibration
    assert attrs["noise"] == (
        f"gaussian, drawn scale {sigma:.6g} (data units), variance {sigma**2:.6g} per measured row"
    )


def _drawn_plan():
    from dpdask.graph._plans import realised

    return realised(level_plans(make_plan(), ["county"])["county"], np.int64)


def _ctx(test_mode=True):
    from dpdask.graph._blocks import ChunkContext

    return ChunkContext("rel", "county", "run", None, True, test_mode)


def _sim_key(trial: int, chunk: int = 0):
    from dpdask.measure import stream_key
    from dpdask.noise import SecretKey

    return stream_key(
        SecretKey.for_testing(9), ("rel", "county", chunk, f"simulate-{trial}"), "run"
    )


def test_simulated_noise_has_the_variance_drawn_and_reproduces():
    """Around a zero truth the simulated measurements are the noise: its variance is the
    plan's row variance (``noise.draw_variance``), within 4 standard errors of a sample
    variance of N draws (``sqrt(2 / N)``), and the same stream gives the same draws."""
    from dpdask.graph._simulate import simulated_measurement

    plan = _drawn_plan()
    x = np.zeros((4000, DOMAIN.size))
    info = {0: {"chunk-location": (0, 0)}}
    y = simulated_measurement(x, plan, _sim_key(0), _ctx(), info, trial=0)
    n = y.size
    assert abs(y.var() / plan.row_variance - 1) < 4 * np.sqrt(2 / n)
    again = simulated_measurement(x, plan, _sim_key(0), _ctx(), info, trial=0)
    np.testing.assert_array_equal(y, again)
    other = simulated_measurement(x, plan, _sim_key(1), _ctx(), info, trial=1)
    assert not np.array_equal(y, other)  # each trial its own stream


def test_simulation_refuses_another_streams_key_and_test_keys_in_production():
    from dpdask.errors import NoiseKeyError
    from dpdask.graph._simulate import simulated_measurement

    plan, x, info = _drawn_plan(), np.zeros((2, DOMAIN.size)), {0: {"chunk-location": (0, 0)}}
    with pytest.raises(NoiseKeyError, match="its own simulate stream"):
        simulated_measurement(x, plan, _sim_key(0), _ctx(), info, trial=1)
    with pytest.raises(NoiseKeyError, match="its own simulate stream"):
        simulated_measurement(x, plan, _sim_key(0, chunk=1), _ctx(), info, trial=0)
    with pytest.raises(NoiseKeyError, match="test-only key"):
        simulated_measurement(x, plan, _sim_key(0), _ctx(test_mode=False), info, trial=0)


def test_spec_reconstruct_simulate(tmp_path):
    from dpdask.pipeline.spec import SpecError, parse_spec

    base = {
        "release": "r", "data": {"format": "synthetic", "geographies": 4, "states": 1},
        "domain": "pl94", "workload": "pl94", "privacy": {"zcdp": 1},
        "output": str(tmp_path / "o.zarr"),
    }  # fmt: skip

    def spec(**rec):
        return parse_spec({**base, "reconstruct": rec}, tmp_path)

    assert spec(method="topdown").simulate is None  # the release's default: 1
    assert spec(method="topdown", simulate=0).simulate == 0
    assert spec(method="nnls", simulate=3).simulate == 3
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(SpecError, match=r"reconstruct\.simulate: a number of trials"):
            spec(method="topdown", simulate=bad)
    with pytest.raises(SpecError, match=r"reconstruct\.simulate: least squares"):
        spec(method="ls", simulate=1)
