"""Keyed noise: samplers' distributions (with power), key derivation, keys and key files.

Oracles: scipy.stats distributions (Kolmogorov-Smirnov for continuous samplers),
exact probability mass functions summed independently (chi-square for discrete
samplers), whitening by the inverse factor (correlated Gaussian), and a second
Python process (bit-identical streams).
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import pytest
from scipy import stats

from dpdask.errors import ArgumentTypeError, NoiseKeyError, PlanError
from dpdask.linalg import Dense, Identity, Kron, Prefix
from dpdask.noise import (
    KeyedRNG,
    KeyFile,
    MeasurementId,
    SecretKey,
    StreamKey,
    encode_identity,
    new_key,
)

ALPHA = 1e-6
N = 20_000


def _rng(name: str) -> KeyedRNG:
    return KeyedRNG.for_testing(20261122, identity=("test-noise", name))


# -- distributions ---------------------------------------------------------------
def _ks_p(samples: np.ndarray, dist) -> float:
    return stats.kstest(samples, dist.cdf).pvalue


@pytest.mark.parametrize("scale", [0.5, 3.0, 100.0])
def test_laplace_distribution(scale):
    y = _rng(f"laplace-{scale}").laplace(scale, N, unsafe_float=True)
    assert y.dtype == np.float64 and y.shape == (N,)
    assert _ks_p(y, stats.laplace(scale=scale)) > ALPHA
    for wrong in (0.7, 1.3):  # the same test has power against a wrong scale
        assert _ks_p(y, stats.laplace(scale=wrong * scale)) < ALPHA


@pytest.mark.parametrize("sigma", [0.5, 3.0, 100.0])
def test_gaussian_distribution(sigma):
    y = _rng(f"gauss-{sigma}").gaussian(sigma, N, unsafe_float=True)
    assert _ks_p(y, stats.norm(scale=sigma)) > ALPHA
    for wrong in (0.7, 1.3):
        assert _ks_p(y, stats.norm(scale=wrong * sigma)) < ALPHA


def _dlap_pmf(scale: float, support: np.ndarray) -> np.ndarray:
    q = math.exp(-1.0 / scale)
    return (1 - q) / (1 + q) * q ** np.abs(support)


def _dgauss_pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    wide = np.arange(-int(60 * sigma) - 60, int(60 * sigma) + 61)
    z = np.exp(-(wide.astype(float) ** 2) / (2 * sigma**2)).sum()
    return np.exp(-(support.astype(float) ** 2) / (2 * sigma**2)) / z


def _chi2_p(samples: np.ndarray, pmf) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 merged into two tails."""
    n = samples.size
    lo, hi = int(samples.min()) - 1, int(samples.max()) + 1
    span = max(hi - lo, 1)
    support = np.arange(lo - 10 * span, hi + 10 * span + 1)
    p = pmf(support)
    central = np.flatnonzero(p * n >= 5)
    a, b = support[central[0]], support[central[-1]]
    cells = np.arange(a, b + 1)
    expected = np.concatenate([[p[support < a].sum()], pmf(cells), [p[support > b].sum()]])
    expected[0] += max(0.0, 1.0 - p.sum()) / 2  # mass beyond the summed window
    expected[-1] += max(0.0, 1.0 - p.sum()) / 2
    counts = np.concatenate(
        [
            [(samples < a).sum()],
            np.bincount(samples[(samples >= a) & (samples <= b)] - a, minlength=cells.size),
            [(samples > b).sum()],
        ]
    )
    keep = expected * n > 0
    exp = expected[keep] / expected[keep].sum() * n
    return stats.chisquare(counts[keep], exp).pvalue


@pytest.mark.parametrize("scale", [0.3, 2.0, 25.0])
def test_discrete_laplace_distribution(scale):
    y = _rng(f"dlap-{scale}").discrete_laplace(scale, N)
    assert y.dtype == np.int64
    assert _chi2_p(y, lambda s: _dlap_pmf(scale, s)) > ALPHA
    for wrong in (0.7, 1.3):
        assert _chi2_p(y, lambda s, w=wrong: _dlap_pmf(w * scale, s)) < ALPHA


@pytest.mark.parametrize("sigma", [0.4, 1.5, 7.0, 60.0])
def test_discrete_gaussian_distribution(sigma):
    y = _rng(f"dgauss-{sigma}").discrete_gaussian(sigma, N)
    assert y.dtype == np.int64
    assert _chi2_p(y, lambda s: _dgauss_pmf(sigma, s)) > ALPHA
    for wrong in (0.7, 1.3):
        assert _chi2_p(y, lambda s, w=wrong: _dgauss_pmf(w * sigma, s)) < ALPHA


def test_discrete_gaussian_large_sigma_moments():
    # far beyond the chi-square regime: the variance of N_Z(0, s^2) is s^2 to within e^-(2 pi^2 s^2)
    sigma = 1e5
    y = _rng("dgauss-large").discrete_gaussian(sigma, N)
    assert abs(y.mean()) < 6 * sigma / math.sqrt(N)
    assert y.var() / sigma**2 == pytest.approx(1.0, abs=6 * math.sqrt(2 / N))


@pytest.mark.parametrize(
    "factor",
    [
        np.array([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0], [-1.0, 0.5, 3.0]]),
        Kron([Prefix(2), Identity(2)]),
    ],
    ids=["dense", "implicit"],
)
def test_correlated_gaussian(factor):
    F = factor.dense() if not isinstance(factor, np.ndarray) else factor
    y = _rng("corr").correlated_gaussian(factor, (N // F.shape[0],), unsafe_float=True)
    assert y.shape == (N // F.shape[0], F.shape[0])
    z = np.linalg.solve(F, y.T).ravel()  # whitened: i.i.d. N(0, 1)
    assert _ks_p(z, stats.norm()) > ALPHA
    for wrong in (0.7, 1.3):
        assert _ks_p(np.linalg.solve(wrong * F, y.T).ravel(), stats.norm()) < ALPHA
    # the empirical covariance matches F F^T
    cov = np.cov(y.T)
    assert np.allclose(cov, F @ F.T, atol=0.15 * np.abs(F @ F.T).max())


def test_correlated_gaussian_same_stream_for_dense_and_implicit_factor():
    K = Kron([Prefix(3), Identity(2)])
    a = _rng("same").correlated_gaussian(K, (5,), unsafe_float=True)
    b = _rng("same").correlated_gaussian(Dense(K.dense()), (5,), unsafe_float=True)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", ["laplace", "gaussian", "discrete_laplace", "discrete_gaussian"])
@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), True])
def test_bad_scales_raise(method, scale):
    with pytest.raises((TypeError, ValueError)):
        _rng("bad").sample(method, scale, 3, unsafe_float=True)


@pytest.mark.parametrize("shape", [-1, (2, -3), "abc", (1.5,)])
def test_bad_shapes_raise(shape):
    with pytest.raises((TypeError, ValueError)):
        _rng("bad").gaussian(1.0, shape, unsafe_float=True)


def test_shapes():
    r = _rng("shape")
    assert r.discrete_gaussian(2.0, (3, 4)).shape == (3, 4)
    assert r.laplace(1.0, 0, unsafe_float=True).shape == (0,)
    assert r.discrete_laplace(1.0, ()).shape == ()


# -- keyed derivation --------------------------------------------------------------
_CHILD = """
import hashlib, sys
from dpdask.noise import KeyedRNG, MeasurementId, SecretKey
key = SecretKey(bytes.fromhex(sys.argv[1]))
rng = KeyedRNG(key, MeasurementId("pl94", "county", 3, "A"))
h = hashlib.sha256()
for m in ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian"):
    h.update(rng.sample(m, 2.5, 1000, unsafe_float=True).tobytes())
print(h.hexdigest())
"""


def test_same_identity_is_bit_identical_across_processes():
    key = new_key()
    rng = KeyedRNG(key, MeasurementId("pl94", "county", 3, "A"))
    h = hashlib.sha256()
    for m in ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian"):
        h.update(rng.sample(m, 2.5, 1000, unsafe_float=True).tobytes())
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, bytes(key).hex()], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == h.hexdigest()


def test_identity_and_key_both_change_the_stream():
    key = new_key()
    base = KeyedRNG(key, ("r", "county", 0, "A")).gaussian(1.0, 8, unsafe_float=True)
    assert not np.array_equal(
        base, KeyedRNG(key, ("r", "county", 1, "A")).gaussian(1.0, 8, unsafe_float=True)
    )
    assert not np.array_equal(
        base, KeyedRNG(new_key(), ("r", "county", 0, "A")).gaussian(1.0, 8, unsafe_float=True)
    )
    np.testing.assert_array_equal(
        base, KeyedRNG(bytes(key), ("r", "county", 0, "A")).gaussian(1, 8, unsafe_float=True)
    )


def _max_offdiag_corr(streams: np.ndarray) -> float:
    c = np.corrcoef(streams)
    np.fill_diagonal(c, 0.0)
    return float(np.abs(c).max())


def test_thousand_identities_are_pairwise_uncorrelated():
    key = new_key()
    n_id, length = 1000, 2000
    streams = np.stack(
        [
            KeyedRNG(key, MeasurementId("r", "block", i, "A")).gaussian(
                1.0, length, unsafe_float=True
            )
            for i in range(n_id)
        ]
    )
    pairs = n_id * (n_id - 1) // 2
    # Bonferroni at family-wise alpha = 1e-6: |r| ~ N(0, 1/length) for independent streams
    threshold = stats.norm.isf(ALPHA / (2 * pairs)) / math.sqrt(length)
    assert _max_offdiag_corr(streams) < threshold
    # power: a reused identity among them is caught by the same statistic
    streams[17] = KeyedRNG(key, MeasurementId("r", "block", 3, "A")).gaussian(
        1.0, length, unsafe_float=True
    )
    assert _max_offdiag_corr(streams) > threshold


@pytest.mark.parametrize(
    "a, b",
    [
        (("ab", "c"), ("a", "bc")),
        ((1,), ("1",)),
        (b"x", "x"),
        ((), None),
        ({"a": 1, "b": 2}, {"a": 2, "b": 1}),
        (MeasurementId("r", "l", 0, "m"), MeasurementId("r", "l", 1, "m")),
        (-1, 255),
    ],
)
def test_identity_encoding_is_injective(a, b):
    assert encode_identity(a) != encode_identity(b)


def test_identity_encoding_is_canonical():
    assert encode_identity({"a": 1, "b": 2}) == encode_identity({"b": 2, "a": 1})
    assert encode_identity(MeasurementId("r", "l", 0, "m")) == encode_identity(
        {"release": "r", "level": "l", "chunk": 0, "measurement": "m"}
    )
    assert encode_identity(np.int64(5)) == encode_identity(5)


@pytest.mark.parametrize("bad", [1.0, True, {1: "a"}, object(), np.float32(2)])
def test_identity_encoding_refuses_ambiguous_types(bad):
    with pytest.raises(ArgumentTypeError):
        encode_identity(bad)


# -- keys and test mode -------------------------------------------------------------
def test_new_key_is_32_os_bytes_and_secret_in_repr():
    a, b = new_key(), new_key()
    assert len(bytes(a)) == 32 and a != b and not a.test_only
    assert bytes(a).hex() not in repr(a) and bytes(a).hex() not in str(a)
    assert pickle.loads(pickle.dumps(a)) == a


def test_fingerprint_is_a_16_byte_keyed_hash():
    """32 hex characters: BLAKE2b keyed by the key (recomputed here independently)."""
    key = new_key()
    fp = key.fingerprint()
    assert len(fp) == 32 and int(fp, 16) >= 0
    assert (
        fp
        == hashlib.blake2b(
            b"", key=bytes(key), digest_size=16, person=b"dpdask-keyprint"
        ).hexdigest()
    )
    assert fp not in bytes(key).hex() and bytes(key).hex()[:16] not in fp
    assert fp != new_key().fingerprint() and fp == SecretKey(bytes(key)).fingerprint()
    assert fp in repr(key)


_IDENT = {"run": "run1", "measurement": MeasurementId("r", "county", 0, "A")}
_OTHER = {"run": "run1", "measurement": MeasurementId("r", "county", 1, "A")}


@pytest.mark.parametrize("make", [new_key, lambda: SecretKey.for_testing(3)], ids=["new", "test"])
def test_stream_key_draws_exactly_the_stream_of_its_identity(make):
    key = make()
    sk = key.stream_key(_IDENT)
    assert isinstance(sk, StreamKey) and sk.test_only == key.test_only
    assert sk.fingerprint() == key.fingerprint()
    assert sk.philox_key(_IDENT) == key.derive(_IDENT)
    for m in ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian"):
        np.testing.assert_array_equal(
            KeyedRNG(sk, _IDENT).sample(m, 2.5, 100, unsafe_float=True),
            KeyedRNG(key, _IDENT).sample(m, 2.5, 100, unsafe_float=True),
        )
    # an equal identity spelled differently is the same identity
    same = {"measurement": {"release": "r", "level": "county", "chunk": 0, "measurement": "A"}}
    assert KeyedRNG(sk, {**same, "run": "run1"}).test_only == key.test_only
    for other in (_OTHER, {"run": "run2", "measurement": _IDENT["measurement"]}, "x"):
        assert not sk.is_for(other)
        with pytest.raises(ValueError, match="another identity"):
            KeyedRNG(sk, other)
        with pytest.raises(ValueError):
            sk.philox_key(other)
    assert not hasattr(sk, "derive") and not hasattr(sk, "stream_key")


def test_stream_key_is_picklable_and_keeps_its_secret():
    key = new_key()
    sk = key.stream_key(_IDENT)
    back = pickle.loads(pickle.dumps(sk))
    assert back == sk and hash(back) == hash(sk) and back != key.stream_key(_OTHER)
    np.testing.assert_array_equal(
        KeyedRNG(back, _IDENT).gaussian(1.0, 8, unsafe_float=True),
        KeyedRNG(key, _IDENT).gaussian(1.0, 8, unsafe_float=True),
    )
    philox = sk.philox_key(_IDENT).to_bytes(16, "little")
    for text in (repr(sk), str(sk)):
        assert key.fingerprint() in text
        assert philox.hex() not in text and str(sk.philox_key(_IDENT)) not in text
        assert bytes(key).hex() not in text
    assert bytes(key) not in pickle.dumps(sk)
    with pytest.raises(ArgumentTypeError):
        StreamKey(philox, b"", "fp")
    with pytest.raises(TypeError):
        bytes(sk)


@pytest.mark.parametrize("raw", [b"short", b"x" * 33, "x" * 32, 12345])
def test_bad_keys_raise(raw):
    with pytest.raises((TypeError, ValueError)):
        SecretKey(raw)


def test_test_mode_is_explicit_and_flagged():
    rng = KeyedRNG.for_testing(1, "x")
    assert rng.test_only
    assert not KeyedRNG(new_key(), "x").test_only
    assert SecretKey.for_testing(1).test_only
    np.testing.assert_array_equal(
        rng.gaussian(1.0, 5, unsafe_float=True),
        KeyedRNG(SecretKey.for_testing(1), "x").gaussian(1.0, 5, unsafe_float=True),
    )
    with pytest.raises(ArgumentTypeError):
        pickle.dumps(rng)


def test_key_file_is_private_and_deleted(tmp_path):
    key = new_key()
    kf = KeyFile.create(tmp_path / "r.key", key)
    assert kf.path.stat().st_mode & 0o777 == 0o600
    assert kf.load() == key
    with pytest.raises(FileExistsError):
        KeyFile.create(kf.path)
    os.chmod(kf.path, 0o644)
    with pytest.raises(PermissionError, match="0600"):
        kf.load()
    os.chmod(kf.path, 0o600)
    kf.delete()
    assert not kf.path.exists()
    kf.delete()  # idempotent
    with pytest.raises(ValueError, match="test-only"):
        KeyFile.create(tmp_path / "t.key", SecretKey.for_testing(3))


def test_key_file_refuses_symlinks(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x" * 32)
    (tmp_path / "link.key").symlink_to(target)
    with pytest.raises(OSError):
        KeyFile(tmp_path / "link.key").load()


def test_discrete_gaussian_throughput():
    """A floor well below the benchmark's figure; `dpdask bench noise` reports the real one."""
    rng = _rng("speed")
    rng.discrete_gaussian(10.0, 10_000)
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        rng.discrete_gaussian(10.0, 1_000_000)
        best = min(best, time.perf_counter() - t0)
    assert 1_000_000 / best > 2e6


# -- error classes (dpdask.errors; each still a ValueError) ------------------------
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: SecretKey(b"short"), id="short key"),
        pytest.param(
            lambda: KeyedRNG(SecretKey.for_testing(1).stream_key("a"), "b"), id="other stream"
        ),
    ],
)
def test_key_problems_are_noise_key_errors(make):
    with pytest.raises(NoiseKeyError):
        make()


def test_a_test_key_is_never_persisted(tmp_path):
    with pytest.raises(NoiseKeyError, match="refusing to persist a test-only key"):
        KeyFile.create(tmp_path / "release.key", SecretKey.for_testing(1))
    assert not (tmp_path / "release.key").exists()


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: _rng("e").sample("cauchy", 1.0, 3), id="unknown mechanism"),
        pytest.param(lambda: _rng("e").discrete_laplace(-1.0, 3), id="negative scale"),
        pytest.param(lambda: _rng("e").discrete_gaussian(2.0**31, 3), id="scale too large"),
        pytest.param(lambda: _rng("e").gaussian(1.0, 3), id="float without unsafe_float"),
    ],
)
def test_bad_noise_parameters_are_plan_errors(make):
    with pytest.raises(PlanError):
        make()


def test_public_names_of_the_noise_package():
    from dpdask import noise

    assert noise.as_secret_key(bytes(noise.KEY_BYTES)) == SecretKey(bytes(32))
    assert noise.MAX_TABLE_SCALE == 2.0**30
    rng = np.random.default_rng(0)
    assert noise.discrete_laplace_cks(rng, 3, 5).dtype == np.int64
    assert noise.discrete_gaussian_cks(rng, 4, 5).dtype == np.int64


@pytest.mark.parametrize(
    ("mechanism", "scale"),
    [("discrete_gaussian", 0.45), ("discrete_gaussian", 1.3), ("discrete_laplace", 0.6),
     ("discrete_laplace", 3.0)],
)  # fmt: skip
def test_draw_variance_is_the_samplers_variance(mechanism, scale) -> None:
    """The variance published for a draw is the sampler's own (an independent oracle:
    the empirical variance of 400,000 keyed draws), not the continuous law's."""
    from dpdask.noise import draw_variance

    rng = KeyedRNG.for_testing(11, ("variance", mechanism, str(scale)))
    draws = getattr(rng, mechanism)(scale, 400_000).astype(float)
    v = draw_variance(mechanism, scale)
    # the sample variance's relative standard error is sqrt((kurtosis - 1) / n) < 0.01
    assert draws.var() == pytest.approx(v, rel=0.04)
    continuous = scale**2 if mechanism == "discrete_gaussian" else 2 * scale**2
    if scale < 1:  # where the laws differ, the continuous variance would be far off
        assert abs(continuous / v - 1) > 0.1


def test_draw_variance_tends_to_the_continuous_law() -> None:
    from dpdask.noise import draw_variance

    for s in (8.0, 50.0, 1e4):
        assert draw_variance("discrete_gaussian", s) == pytest.approx(s * s, rel=1e-12)
        # discrete Laplace: 2 t**2 - 1/6 + O(1/t**2)
        assert draw_variance("discrete_laplace", s) == pytest.approx(2 * s * s - 1 / 6, abs=0.01)
