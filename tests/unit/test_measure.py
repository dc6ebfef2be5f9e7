"""The measure step: correct answers, the integer noise rule, parallel composition,
fail-closed input checks (also under ``python -O``) and crash safety.

Oracles: dense matrices (``A.dense() @ x`` per geography), the noise regenerated
independently from the documented key derivation, the ledger file's bytes, spies
on the samplers, and separate Python processes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpdask.measure._step as measure_step
from dpdask import Domain
from dpdask.errors import ArgumentTypeError, DataError, DataTypeError, NoiseKeyError, PlanError
from dpdask.linalg import Dense, Identity, Kron, LinearQuery, Ones, Prefix, VStack
from dpdask.measure import (
    charge_level,
    has_integer_entries,
    lattice,
    measure,
    measurement_noise,
    noise_mechanism,
    stream_identity,
    stream_key,
)
from dpdask.noise import KeyedRNG, KeyFile, MeasurementId, SecretKey, new_key
from dpdask.noise import _samplers as samplers
from dpdask.privacy import ApproxDP, Budget, BudgetExceededError, Ledger, PureDP, zCDP
from dpdask.testing.strategies import operators

DOMAIN = Domain(a=2, b=3)
STRATEGY = VStack([Kron([Identity(2), Prefix(3)]), Kron([Ones(2), Ones(3)])])


@dataclass
class Plan:
    """A stand-in for ``dpdask.Plan`` with the attributes ``measure`` reads."""

    strategy: LinearQuery
    mechanism: str
    noise_scale: float
    privacy: Budget
    domain: Domain | None


def make_plan(mechanism: str = "gaussian", privacy: Budget | None = None, A=STRATEGY) -> Plan:
    if mechanism in ("laplace", "discrete_laplace"):
        privacy = privacy or PureDP("0.5")
        scale = privacy.laplace_scale(A.sensitivity(1))
    else:
        privacy = privacy or zCDP("0.25")
        scale = privacy.gaussian_sigma(A.sensitivity(2))
    return Plan(A, mechanism, scale, privacy, DOMAIN if A.shape[1] == DOMAIN.size else None)


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    led = Ledger(tmp_path / "ledger.sqlite", create=True)
    led.open_release("r", zCDP(1))
    return led


@pytest.fixture
def data(rng) -> np.ndarray:
    return rng.integers(0, 50, size=(4, *DOMAIN.shape))


def _expected_noise(key, run_id, ident, mechanism, scale, shape, unsafe_float=False):
    """The documented derivation: KeyedRNG(key, {"run": run_id, "measurement": identity})."""
    rng = KeyedRNG(key, {"run": run_id, "measurement": ident})
    return rng.sample(mechanism, scale, shape, unsafe_float=unsafe_float)


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- correctness ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "mechanism, dtype, used",
    [
        ("gaussian", np.int64, "discrete_gaussian"),
        ("gaussian", np.float64, "discrete_gaussian"),
        ("laplace", np.int32, "discrete_laplace"),
        ("laplace", np.float32, "discrete_laplace"),
        ("discrete_gaussian", np.uint16, "discrete_gaussian"),
        ("discrete_laplace", np.int64, "discrete_laplace"),
    ],
)
def test_answers_are_dense_oracle_plus_keyed_noise(ledger, data, mechanism, dtype, used):
    plan = make_plan(mechanism)
    key, ident = new_key(), MeasurementId("r", "county", 2, "A")
    x = data.astype(dtype)
    y = measure(plan, x, key, ident, ledger, run_id="run1")
    exact = x.reshape(4, -1).astype(float) @ STRATEGY.dense().T
    spec = lattice(plan, dtype)
    noise = _expected_noise(key, "run1", ident, used, spec.grid_scale, exact.shape)
    if np.issubdtype(dtype, np.integer):  # exact integer answers, the plan's scale
        assert spec.exact and spec.k == 0 and spec.noise_scale == plan.noise_scale
        assert y.dtype == np.int64
        np.testing.assert_array_equal(y, exact.astype(np.int64) + noise)
    else:  # float data: rounded to the grid 2**-k, integer noise of scale s' 2**k
        assert not spec.exact and spec.k > 0 and spec.noise_scale >= plan.noise_scale
        assert y.dtype == np.float64
        grid = np.rint(np.ldexp(exact, spec.k)).astype(np.int64)
        np.testing.assert_array_equal(y, np.ldexp((grid + noise).astype(float), -spec.k))
    assert noise_mechanism(plan, dtype) == used


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_noise_alone_is_the_noise_measure_adds(ledger, data, mechanism):
    """``A x + measurement_noise`` is bit for bit ``measure`` (same checks, same stream)."""
    plan = make_plan(mechanism)
    key, ident = new_key(), MeasurementId("r", "county", 1, "A")
    x = data.astype(np.int64)
    y = measure(plan, x, key, ident, ledger, run_id="run1")
    z = measurement_noise(plan, x, key, ident, ledger, run_id="run1")
    exact = np.asarray(STRATEGY.apply(x), dtype=np.float64).astype(np.int64)
    np.testing.assert_array_equal(exact + z, y)
    used = "discrete_" + mechanism
    expected = _expected_noise(key, "run1", ident, used, plan.noise_scale, exact.shape)
    np.testing.assert_array_equal(z, expected)
    # float data: the noise alone is no post-processing of the lattice measurement
    with pytest.raises(ValueError, match="lattice"):
        measurement_noise(plan, data.astype(float), key, ident, ledger, run_id="run1")
    # unsafe float noise (benchmarks): A x + z is bit for bit measure
    xf = data.astype(np.float64)
    kw = {"integer_noise": False, "unsafe_float": True}
    yf = measure(plan, xf, key, ident, ledger, run_id="run1", **kw)
    zf = measurement_noise(plan, xf, key, ident, ledger, run_id="run1", **kw)
    np.testing.assert_array_equal(np.asarray(STRATEGY.apply(xf), dtype=np.float64) + zf, yf)
    expected = _expected_noise(
        key, "run1", ident, mechanism, plan.noise_scale, exact.shape, unsafe_float=True
    )
    np.testing.assert_array_equal(zf, expected)
    assert len(ledger) == 1  # one charge for the level, whichever entry point drew


def test_single_geography_and_reordered_axes(ledger, data):
    plan, key = make_plan(), new_key()
    ident = MeasurementId("r", "county", 0, "A")
    many = measure(plan, data, key, ident, ledger, run_id="run1")
    # a batch with the attribute axes stored as (b, a), named by dims
    swapped = measure(plan, data.transpose(0, 2, 1), key, ident, ledger, "run1", dims=["b", "a"])
    np.testing.assert_array_equal(many, swapped)
    one = measure(plan, data[0], key, ident, ledger, run_id="run1")
    assert one.shape == (STRATEGY.shape[0],)


def test_integer_noise_rule():
    half = Plan(0.5 * Kron([Identity(2), Identity(3)]), "gaussian", 4.0, zCDP(1), DOMAIN)
    spec = lattice(half, np.int64)  # non-integer strategy: the lattice
    assert noise_mechanism(half, np.int64) == "discrete_gaussian" and not spec.exact
    assert noise_mechanism(half, np.int64, integer_noise=True) == "discrete_gaussian"
    # unsafe float noise (benchmarks only) keeps the old rule
    assert noise_mechanism(half, np.int64, unsafe_float=True) == "gaussian"
    with pytest.raises(ValueError, match="non-integer"):
        noise_mechanism(half, np.int64, integer_noise=True, unsafe_float=True)
    plan = make_plan("gaussian")
    with pytest.raises(ValueError, match="unsafe_float"):
        noise_mechanism(plan, np.int64, integer_noise=False)
    assert noise_mechanism(plan, np.int64, integer_noise=False, unsafe_float=True) == "gaussian"
    with pytest.raises(TypeError, match="integer counts"):
        noise_mechanism(make_plan("discrete_gaussian"), np.float64)
    # (eps, delta) budgets: where the discrete Gaussian's CKS bound does not fit at the
    # plan's sigma, the exact sampler's sigma is raised until it does (never float noise)
    approx = ApproxDP(1, "1e-6")
    tight = replace(plan, privacy=approx, noise_scale=approx.gaussian_sigma(2.0))
    loose = replace(plan, privacy=approx, noise_scale=3 * approx.gaussian_sigma(2.0))
    t, lo = lattice(tight, np.int64), lattice(loose, np.int64)
    assert t.mechanism == lo.mechanism == "discrete_gaussian" and t.exact and lo.exact
    assert t.noise_scale > tight.noise_scale and lo.noise_scale == loose.noise_scale
    from dpdask.privacy import check_calibration

    check_calibration("discrete_gaussian", t.sensitivity, t.noise_scale, approx)
    with pytest.raises(ValueError):
        check_calibration("discrete_gaussian", 2.0, tight.noise_scale, approx)


@settings(max_examples=60, deadline=None)
@given(operators(), st.booleans())
def test_has_integer_entries_never_claims_a_fractional_matrix(A, rounded):
    if rounded:
        A = Dense(np.round(A.dense()))
        assert has_integer_entries(A)
    if has_integer_entries(A):
        M = A.dense()
        assert np.array_equal(M, np.round(M))


def test_has_integer_entries_structural_cases():
    assert has_integer_entries(VStack([Prefix(3), Ones(3)], weights=[1, 2]))
    assert not has_integer_entries(VStack([Prefix(3), Ones(3)], weights=[1, 0.5]))
    assert has_integer_entries(Kron([Prefix(2), Identity(3)]).T @ Kron([Ones(2), Identity(3)]).T)
    assert not has_integer_entries(Dense([[0.25, 1.0]]))


# -- accounting --------------------------------------------------------------------------
def test_level_is_charged_once_for_all_chunks(ledger, data):
    plan, key = make_plan(), new_key()
    receipt = charge_level(plan, ledger, "r", "run1", "county", "A", key=key)
    assert receipt.key_fingerprint == key.fingerprint()
    outs = [
        measure(plan, data, key, MeasurementId("r", "county", c, "A"), ledger, "run1")
        for c in range(3)
    ]
    assert len(ledger) == 1 and ledger.spent("r") == plan.privacy
    assert not np.array_equal(outs[0], outs[1])  # chunks get independent noise
    # workers without the ledger file use the receipt; it must match the measurement
    again = measure(plan, data, key, MeasurementId("r", "county", 0, "A"), receipt, "run1")
    np.testing.assert_array_equal(again, outs[0])
    with pytest.raises(ValueError, match="does not match"):
        measure(plan, data, key, MeasurementId("r", "tract", 0, "A"), receipt, "run1")
    # another level is another (sequential) charge
    measure(plan, data, key, MeasurementId("r", "tract", 0, "A"), ledger, "run1")
    assert len(ledger) == 2


def test_charge_level_needs_the_key(ledger):
    with pytest.raises(ArgumentTypeError, match="key="):
        charge_level(make_plan(), ledger, "r", "run1", "county", "A")
    assert len(ledger) == 0


def test_a_receipt_for_another_key_is_refused(ledger, data, monkeypatch):
    """The receipt binds the run to its key: any other key is refused before the data."""
    plan, key, other = make_plan(), new_key(), new_key()
    receipt = charge_level(plan, ledger, "r", "run1", "county", "A", key=key)
    ident = MeasurementId("r", "county", 0, "A")
    reads: list[int] = []
    monkeypatch.setattr(measure_step, "check_data", lambda *a, **k: reads.append(1))
    x = data
    for wrong in (other, stream_key(other, ident, "run1")):
        with pytest.raises(ValueError, match="this key is not the one charged for run 'run1'"):
            measure(plan, x, wrong, ident, receipt, "run1")
        with pytest.raises(ValueError, match="not the one charged"):
            measurement_noise(plan, x, wrong, ident, receipt, "run1")
    # fail closed: a receipt without a fingerprint is refused outside test mode
    with pytest.raises(ValueError, match="no key fingerprint"):
        measure(plan, x, key, ident, replace(receipt, key_fingerprint=None), "run1")
    assert not reads, "the data was read before the key was refused"


def test_stream_keys_draw_the_same_noise_and_only_their_own(ledger, data):
    plan, key = make_plan(), new_key()
    receipt = charge_level(plan, ledger, "r", "run1", "county", "A", key=key)
    ident = MeasurementId("r", "county", 2, "A")
    sk = stream_key(key, ident, "run1")
    assert "run1" not in repr(sk) and bytes(key).hex() not in repr(sk)
    y = measure(plan, data, sk, ident, receipt, "run1")
    np.testing.assert_array_equal(y, measure(plan, data, key, ident, receipt, "run1"))
    z = measurement_noise(plan, data, sk, ident, ledger, "run1")
    np.testing.assert_array_equal(z, measurement_noise(plan, data, key, ident, ledger, "run1"))
    assert stream_identity(ident, "run1") == {"run": "run1", "measurement": ident}
    for other_ident, other_run in [(MeasurementId("r", "county", 3, "A"), "run1"), (ident, "run2")]:
        with pytest.raises(ValueError, match="another measurement or run"):
            measure(plan, data, sk, other_ident, ledger, other_run)
    with pytest.raises(ArgumentTypeError):
        stream_key(sk, ident, "run1")


def test_test_only_stream_keys_follow_the_test_rules(data):
    plan, key = make_plan(), SecretKey.for_testing(5)
    ident = MeasurementId("r", "county", 0, "A")
    sk = stream_key(key, ident, "test")
    with pytest.raises(ValueError, match="test-only"):
        measure(plan, data, sk, ident, None, "test")
    y = measure(plan, data, sk, ident, test_mode=True)
    np.testing.assert_array_equal(y, measure(plan, data, key, ident, test_mode=True))


def test_retry_reproduces_new_run_recharges(ledger, data):
    plan, key = make_plan(), new_key()
    ident = MeasurementId("r", "county", 0, "A")
    first = measure(plan, data, key, ident, ledger, "run1")
    retry = measure(plan, data, key, ident, ledger, "run1")
    np.testing.assert_array_equal(first, retry)
    assert len(ledger) == 1
    fresh = measure(plan, data, key, ident, ledger, "run2")
    assert len(ledger) == 2 and not np.array_equal(first, fresh)


def test_test_keys_need_test_mode(data):
    plan = make_plan()
    ident = MeasurementId("r", "county", 0, "A")
    with pytest.raises(ValueError, match="test-only"):
        measure(plan, data, SecretKey.for_testing(1), ident, None, "run1")
    y = measure(plan, data, SecretKey.for_testing(1), ident, test_mode=True)
    assert y.shape == (4, STRATEGY.shape[0])


# -- fail closed -------------------------------------------------------------------------
def _bad_cases(data: np.ndarray) -> list[tuple[str, dict[str, Any]]]:
    nan = data.astype(float)
    nan[1, 0, 2] = np.nan
    inf = data.astype(float)
    inf[0, 1, 1] = np.inf
    neg = data.copy()
    neg[2, 1, 0] = -1
    neg_float = data.astype(float)
    neg_float[0, 0, 0] = -0.5
    return [
        ("nan", {"x": nan}),
        ("inf", {"x": inf}),
        ("negative", {"x": neg}),
        ("negative float", {"x": neg_float}),
        (
            "float counts for discrete noise",
            {"x": data + 0.5, "plan": make_plan("discrete_gaussian")},
        ),
        (
            "integral floats for discrete noise",
            {"x": data.astype(float), "plan": make_plan("discrete_laplace")},
        ),
        ("float noise without unsafe_float", {"integer_noise": False}),
        ("wrong shape", {"x": data[:, :, :2]}),
        ("wrong cell count", {"x": data.reshape(4, -1)[:, :5]}),
        ("too many axes", {"x": data[None]}),
        ("unknown attribute", {"dims": ["a", "age"]}),
        ("missing attribute", {"dims": ["a"]}),
        ("boolean data", {"x": data > 3}),
        ("object data", {"x": data.astype(object)}),
        ("list data", {"x": data.tolist()}),
        ("over budget", {"plan": make_plan(privacy=zCDP(2))}),
        ("noise too small", {"plan": replace(make_plan(), noise_scale=0.1)}),
        ("unknown mechanism", {"plan": replace(make_plan(), mechanism="cauchy")}),
        ("nan scale", {"plan": replace(make_plan(), noise_scale=float("nan"))}),
        ("domain mismatch", {"plan": replace(make_plan(), domain=Domain(a=2, b=4))}),
        ("float privacy", {"plan": replace(make_plan(), privacy=0.5)}),
        ("gaussian in pure budget", {"plan": replace(make_plan(), privacy=PureDP(100))}),
        ("test key", {"key": SecretKey.for_testing(5)}),
        ("short key", {"key": b"0123456789"}),
        ("no ledger", {"ledger": None}),
        ("no run id", {"run_id": None}),
        ("unopened release", {"identity": MeasurementId("other", "county", 0, "A")}),
        ("bad identity", {"identity": ("r", "county", -1, "A")}),
    ]


# the dpdask.errors class of each bad case (all ValueError or TypeError subclasses);
# the cases not listed raise a plain ValueError or TypeError
_ERROR_CLASS: dict[str, type[Exception]] = {
    "nan": DataError,
    "inf": DataError,
    "negative": DataError,
    "negative float": DataError,
    "float counts for discrete noise": DataTypeError,
    "integral floats for discrete noise": DataTypeError,
    "float noise without unsafe_float": PlanError,
    "wrong shape": DataError,
    "wrong cell count": DataError,
    "too many axes": DataError,
    "missing attribute": DataError,
    "boolean data": DataTypeError,
    "object data": DataTypeError,
    "list data": DataTypeError,
    "over budget": BudgetExceededError,
    "noise too small": PlanError,
    "unknown mechanism": PlanError,
    "nan scale": PlanError,
    "domain mismatch": PlanError,
    "gaussian in pure budget": PlanError,
    "test key": NoiseKeyError,
    "short key": NoiseKeyError,
}


@pytest.mark.parametrize("entry", [measure, measurement_noise], ids=["measure", "noise"])
def test_bad_inputs_fail_closed(ledger, data, monkeypatch, entry):
    # a first, valid charge so that "unchanged" is checked on a non-empty ledger
    key = new_key()
    measure(make_plan(), data, key, MeasurementId("r", "state", 0, "A"), ledger, "run1")
    calls: list[str] = []
    for name in ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian"):
        monkeypatch.setattr(samplers, name, lambda *a, _n=name, **k: calls.append(_n))
    reads: list[int] = []
    real_check = measure_step.check_data
    monkeypatch.setattr(
        measure_step, "check_data", lambda *a, **k: reads.append(1) or real_check(*a, **k)
    )
    before = (_file_digest(ledger.path), len(ledger), ledger.spent("r"))
    assert len(_bad_cases(data)) >= 25
    for label, case in _bad_cases(data):
        args = {
            "plan": make_plan(),
            "x": data,
            "key": key,
            "identity": MeasurementId("r", "county", 0, "A"),
            "ledger": ledger,
            "run_id": "run1",
        }
        args.update(case)
        reads.clear()
        with pytest.raises((TypeError, ValueError)) as info:
            entry(**args)
        assert str(info.value), label
        if label in _ERROR_CLASS:
            assert isinstance(info.value, _ERROR_CLASS[label]), (label, type(info.value))
        if label == "over budget":
            assert isinstance(info.value, BudgetExceededError)
            assert "is left" in str(info.value)
            assert not reads, "the data was read before the budget was refused"
        assert calls == [], f"{label}: a sampler was called"
        after = (_file_digest(ledger.path), len(ledger), ledger.spent("r"))
        assert after == before, f"{label}: the ledger changed"


_OPTIMISED = textwrap.dedent(
    """
    import sys
    import numpy as np
    from dataclasses import dataclass
    from dpdask import Domain
    from dpdask.linalg import Identity, Kron, Prefix
    from dpdask.measure import measure
    from dpdask.noise import MeasurementId, SecretKey, new_key
    from dpdask.privacy import Ledger, zCDP

    assert False, "this script must run under python -O"
    if __debug__:
        sys.exit("not optimised")

    @dataclass
    class Plan:
        strategy: object
        mechanism: str
        noise_scale: float
        privacy: object
        domain: object

    A = Kron([Identity(2), Prefix(3)])
    plan = Plan(A, "gaussian", zCDP(1).gaussian_sigma(A.sensitivity(2)), zCDP(1), Domain(a=2, b=3))
    led = Ledger(sys.argv[1], create=True)
    led.open_release("r", zCDP(1))
    x = np.ones((2, 2, 3), dtype=np.int64)
    ident = MeasurementId("r", "county", 0, "A")
    bad = {
        "nan": dict(x=np.full((2, 2, 3), np.nan)),
        "negative": dict(x=-x),
        "shape": dict(x=x[:, :1]),
        "test key": dict(key=SecretKey.for_testing(1)),
        "over budget": dict(plan=Plan(A, "gaussian", plan.noise_scale * 0.5, zCDP(4), plan.domain)),
    }
    for label, case in bad.items():
        args = dict(plan=plan, x=x, key=new_key(), identity=ident, ledger=led, run_id="run1")
        args.update(case)
        try:
            measure(**args)
        except (TypeError, ValueError):
            continue
        print("NOT REFUSED:", label)
        sys.exit(1)
    if len(led) != 0:
        print("LEDGER CHANGED")
        sys.exit(1)
    print("OK")
    """
)


def test_fail_closed_under_python_O(tmp_path):
    script = tmp_path / "optimised.py"
    script.write_text(_OPTIMISED)
    # optimised bytecode is cached under a private prefix so that later runs start fast
    env = dict(os.environ, PYTHONPYCACHEPREFIX=os.path.join(tempfile.gettempdir(), "dpdask-opt"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run(
        [sys.executable, "-O", str(script), str(tmp_path / "l.sqlite")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "OK"


# -- crash safety -------------------------------------------------------------------------
_CRASH = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from dataclasses import dataclass
    from dpdask import Domain
    from dpdask.linalg import Identity, Kron, Prefix
    from dpdask.measure import measure
    from dpdask.noise import KeyFile, MeasurementId
    from dpdask.noise import _samplers
    from dpdask.privacy import Ledger, zCDP

    @dataclass
    class Plan:
        strategy: object
        mechanism: str
        noise_scale: float
        privacy: object
        domain: object

    ledger_path, key_path, out_path, crash = sys.argv[1:5]
    if crash == "crash":
        def die(*args, **kwargs):
            os._exit(17)  # killed after the ledger write, before any noise
        for name in ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian"):
            setattr(_samplers, name, die)
    A = Kron([Identity(2), Prefix(3)])
    rho = zCDP("0.5")
    plan = Plan(A, "gaussian", rho.gaussian_sigma(A.sensitivity(2)), rho, Domain(a=2, b=3))
    x = np.arange(3 * 6, dtype=np.int64).reshape(3, 2, 3)
    y = measure(plan, x, KeyFile(key_path).load(), MeasurementId("r", "county", 0, "A"),
                Ledger(ledger_path), run_id="run1")
    np.save(out_path, y)
    """
)


def test_crash_between_charge_and_noise(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(_CRASH)
    ledger = Ledger(tmp_path / "ledger.sqlite", create=True)
    ledger.open_release("r", zCDP(1))
    key_file = KeyFile.create(tmp_path / "r.key")

    def run(mode: str, out: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(script), str(ledger.path), str(key_file.path), out, mode]
        return subprocess.run(cmd, capture_output=True, text=True)

    crashed = run("crash", str(tmp_path / "never.npy"))
    assert crashed.returncode == 17, crashed.stderr
    assert not (tmp_path / "never.npy").exists()
    # the charge survived the crash
    assert len(ledger) == 1 and ledger.spent("r") == zCDP("0.5")
    # the retry in a fresh process: no new charge ...
    done = run("retry", str(tmp_path / "retry.npy"))
    assert done.returncode == 0, done.stderr
    assert len(ledger) == 1 and ledger.spent("r") == zCDP("0.5")
    y1 = np.load(tmp_path / "retry.npy")
    # ... and the noise the key and identity determine, which a second retry here reproduces
    A = Kron([Identity(2), Prefix(3)])
    x = np.arange(18, dtype=np.int64).reshape(3, 2, 3)
    exact = np.rint(x.reshape(3, -1) @ A.dense().T).astype(np.int64)
    ident = MeasurementId("r", "county", 0, "A")
    rho = zCDP("0.5")
    sigma = rho.gaussian_sigma(A.sensitivity(2))
    noise = _expected_noise(key_file.load(), "run1", ident, "discrete_gaussian", sigma, (3, 6))
    np.testing.assert_array_equal(y1, exact + noise)
    plan = Plan(A, "gaussian", sigma, rho, DOMAIN)
    y2 = measure(plan, x, key_file.load(), ident, ledger, run_id="run1")
    np.testing.assert_array_equal(y1, y2)
    assert len(ledger) == 1
    key_file.delete()
    assert not os.path.exists(key_file.path)
