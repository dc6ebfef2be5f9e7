"""The release graph end to end on small stores, against exact oracles."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import zarr

from dpdask.errors import ArgumentError, ConvergenceWarning, DomainError, ShapeError
from dpdask.graph import _plans, release
from dpdask.linalg import Identity, Kron, LinearQuery, Prefix, Total, VStack
from dpdask.measure import lattice
from dpdask.noise import SecretKey
from dpdask.privacy import BudgetExceededError, Ledger, PureDP, zCDP
from dpdask.strategy import Plan
from tests.helpers import DOMAIN, DensePlan, make_plan


def _level_truth(counts, store):
    geo = store.geography
    out = {}
    for lv in geo.levels:
        idx = geo.ancestor_index(lv) if lv != geo.levels[-1] else np.arange(counts.shape[0])
        n = geo.n_units(lv)
        t = np.zeros((n, *counts.shape[1:]))
        np.add.at(t, idx, counts)
        out[lv] = t
    return out


@pytest.mark.parametrize("chunk_units", [1, 2, 100])
def test_without_noise_reproduces_counts_and_answers(store, tmp_path, chunk_units) -> None:
    st, counts = store
    plan = make_plan()
    r = release(plan, st, test_mode=True, noise=False, chunk_bytes=8 * 6 * chunk_units)
    out = r.to_zarr(tmp_path / "out.zarr")
    g = zarr.open_group(str(out), mode="r")
    W = plan.workload.dense()
    for lv, truth in _level_truth(counts, st).items():
        np.testing.assert_allclose(g[lv]["estimate"][:], truth, atol=1e-9)
        np.testing.assert_allclose(
            g[lv]["answers"][:], truth.reshape(len(truth), -1) @ W.T, atol=1e-8
        )
        assert g[lv]["ids"][:].tolist() == list(st.geography.ids[st.geography.level_index(lv)])


def test_noisy_release_is_consistent_and_charged(store, tmp_path) -> None:
    st, _ = store
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    plan = make_plan(rho=2)
    r = release(
        plan,
        st,
        release_id="rel",
        run_id="one",
        ledger=ledger,
        test_mode=True,
        key=SecretKey.for_testing(3),
        budget_split={"state": 1, "county": 1, "tract": 2},
    )
    out = r.to_zarr(tmp_path / "out.zarr")
    g = zarr.open_group(str(out), mode="r")
    for upper, lower in (("state", "county"), ("county", "tract")):
        child = g[lower]["estimate"][:]
        sums = np.zeros_like(g[upper]["estimate"][:])
        np.add.at(sums, g[lower]["parent"][:], child)
        np.testing.assert_allclose(sums, g[upper]["estimate"][:], rtol=0, atol=1e-9)
    assert len(ledger.charges("rel")) == 3
    assert ledger.spent("rel") == zCDP(2)
    meta = dict(g.attrs)["dpdask"]
    assert [c["privacy"] for c in meta["charges"]] == [
        zCDP("1/2").to_dict(),
        zCDP("1/2").to_dict(),
        zCDP(1).to_dict(),
    ]
    assert not (tmp_path / ".out.zarr.run-one").exists()  # work folder and key removed


def test_variance_matches_plan(store, tmp_path) -> None:
    st, counts = store
    plan = make_plan(rho=1)
    truth = _level_truth(counts, st)
    W = plan.workload.dense()
    z2 = []
    for seed in range(25):
        r = release(
            plan,
            st,
            release_id="v",
            run_id=f"r{seed}",
            test_mode=True,
            key=SecretKey.for_testing(seed),
        )
        g = zarr.open_group(str(r.to_zarr(tmp_path / f"o{seed}.zarr")), mode="r")
        for lv, t in truth.items():
            err = g[lv]["answers"][:] - t.reshape(len(t), -1) @ W.T
            z2.append((err**2 / g[lv]["variance"][:]).ravel())
    z2 = np.concatenate(z2)
    # standardised squared errors average 1 when the published variances are right
    assert z2.mean() == pytest.approx(1.0, abs=0.12)


def test_resume_after_crash_is_bit_identical(store, tmp_path, monkeypatch) -> None:
    st, _ = store
    plan = make_plan()
    key = SecretKey.for_testing(9)
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    kwargs = dict(
        release_id="res",
        run_id="same",
        ledger=ledger,
        test_mode=True,
        key=key,
        chunk_bytes=8 * 6 * 2,
    )
    # the uninterrupted reference: the same run id and key, in a ledger of its own (a
    # published run id can never be run again in the same ledger)
    ref_ledger = Ledger.init(tmp_path / "ref-ledger.sqlite")
    ref = release(plan, st, **{**kwargs, "ledger": ref_ledger}).to_zarr(tmp_path / "ref.zarr")
    n_charges = len(ref_ledger.charges("res"))

    import dpdask.graph as release_module

    def crash(*args, **kw):
        raise KeyboardInterrupt("killed after measuring")

    monkeypatch.setattr(release_module._finish, "finish", crash)
    with pytest.raises(KeyboardInterrupt):
        release(plan, st, **kwargs).to_zarr(tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    monkeypatch.undo()
    out = release(plan, st, **kwargs).to_zarr(tmp_path / "out.zarr")
    assert len(ledger.charges("res")) == n_charges  # the retry charged nothing
    a, b = zarr.open_group(str(ref), mode="r"), zarr.open_group(str(out), mode="r")
    for lv in st.geography.levels:
        for name in ("estimate", "answers", "variance"):
            np.testing.assert_array_equal(a[lv][name][:], b[lv][name][:])


def test_over_budget_refuses_before_reading(store, tmp_path, monkeypatch) -> None:
    st, _ = store
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    release(
        make_plan(rho=1),
        st,
        release_id="b",
        run_id="first",
        ledger=ledger,
        test_mode=True,
        key=SecretKey.for_testing(1),
    ).to_zarr(tmp_path / "first.zarr")

    import dpdask.graph as release_module

    def no_read(*args, **kw):
        raise AssertionError("data was read")

    monkeypatch.setattr(release_module._graph, "level_data", no_read)
    second = release(
        make_plan(rho=2),
        st,
        release_id="b",
        run_id="second",
        ledger=ledger,
        test_mode=True,
        key=SecretKey.for_testing(1),
    )
    with pytest.raises((BudgetExceededError, ValueError)):
        second.to_zarr(tmp_path / "second.zarr")
    assert not (tmp_path / "second.zarr").exists()
    assert len(ledger.charges("b")) == 3


def test_existing_output_is_untouched(store, tmp_path) -> None:
    st, _ = store
    out = tmp_path / "out.zarr"
    release(make_plan(), st, test_mode=True, noise=False).to_zarr(out)
    before = sorted(p.name for p in out.rglob("*"))
    with pytest.raises(FileExistsError):
        release(make_plan(), st, test_mode=True, noise=False).to_zarr(out)
    assert sorted(p.name for p in out.rglob("*")) == before


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(levels=("state", "county")), DomainError, "finest released level"),
        (dict(levels=("nation", "tract")), DomainError, "unknown geography level"),
        (dict(noise=False), ArgumentError, "test mode"),
        (dict(budget_split={"state": 1}), ArgumentError, "budget_split"),
        (dict(reconstruct="magic"), ArgumentError, "reconstruct"),
    ],
)
def test_bad_release_arguments(store, kwargs, error, message) -> None:
    st, _ = store
    with pytest.raises(error, match=message):  # DPDaskErrors, and ValueErrors
        release(make_plan(), st, **kwargs)


def test_plan_must_fit_domain(store) -> None:
    st, _ = store
    with pytest.raises(ShapeError, match="columns"):  # a plan for 5 cells, data of 6
        release(Plan(Identity(5), Identity(5), zCDP(1)), st, test_mode=True)
    with pytest.raises(ValueError, match="columns"):  # a plan-like that does not fit itself
        release(make_plan(strategy=Identity(5)), st, test_mode=True)


def _assert_nonnegative_and_consistent(g: zarr.Group) -> None:
    """Every level's estimates are non-negative and children add up to their parents."""
    for upper, lower in (("state", "county"), ("county", "tract")):
        child = g[lower]["estimate"][:]
        assert child.min() >= 0
        sums = np.zeros_like(g[upper]["estimate"][:])
        np.add.at(sums, g[lower]["parent"][:], child)
        np.testing.assert_allclose(sums, g[upper]["estimate"][:], atol=1e-8)


@pytest.mark.parametrize("method", ["nnls", "admm-l1"])
def test_nonnegative_estimators_are_consistent_and_nonnegative(store, tmp_path, method) -> None:
    st, counts = store
    # with exact measurements every estimator returns the truth
    exact = release(make_plan(), st, test_mode=True, noise=False, reconstruct=method)
    g = zarr.open_group(str(exact.to_zarr(tmp_path / "exact.zarr")), mode="r")
    for lv, truth in _level_truth(counts, st).items():
        np.testing.assert_allclose(g[lv]["estimate"][:], truth, atol=1e-3 * max(1, truth.max()))
    # with much noise, estimates stay non-negative and children add up to parents
    noisy = release(
        make_plan(rho="1/1000"),
        st,
        test_mode=True,
        reconstruct=method,
        key=SecretKey.for_testing(4),
        run_id="noisy",
    )
    g = zarr.open_group(str(noisy.to_zarr(tmp_path / "noisy.zarr")), mode="r")
    _assert_nonnegative_and_consistent(g)
    assert dict(g.attrs)["dpdask"]["reconstruct"] == method


def test_iterative_estimators_stop_in_noise_units(store, tmp_path, monkeypatch) -> None:
    """NNLS is fitted at the finest level with row weights 1 / noise variance; ADMM gets
    each level's scale: both of the noise the measure step draws."""
    import dpdask.graph._blocks as blocks

    seen: dict[str, list] = {"nnls": [], "admm": []}
    real_fitter, real_admm = blocks.nonnegative_fitter, blocks.admm

    def spy_fitter(M, weights=None, **kw):
        fit = real_fitter(M, weights, **kw)

        def spy_fit(x):
            seen["nnls"].append((M, weights))
            return fit(x)

        return spy_fit

    def spy_admm(A, y, **kw):
        seen["admm"].append(kw.get("scale"))
        return real_admm(A, y, **kw)

    monkeypatch.setattr(blocks, "nonnegative_fitter", spy_fitter)
    monkeypatch.setattr(blocks, "admm", spy_admm)
    st, _ = store
    # non-integer weights: measured on a lattice, whose law differs from the nominal
    A = VStack([Kron([Identity(2), Identity(3)]), Kron([Total(2), Prefix(3)])], weights=[1, 0.7])
    for method in ("nnls", "admm-l1"):
        rel = release(
            make_plan(rho="1/10", strategy=A), st, test_mode=True, reconstruct=method,
            key=SecretKey.for_testing(5), run_id=f"units-{method}",
            simulate=0,  # the simulation of the error would run the fits again
        )  # fmt: skip
        with dask.config.set(scheduler="sync"):
            rel.to_zarr(tmp_path / f"{method}.zarr")
        got = seen[method.split("-")[0]]
        assert got, "the estimator was not called"
        if method == "nnls":
            finest = rel.released[-1].plan
            assert len(got) == st.geography.n_units("tract")  # one solve per finest unit
            assert all(M is finest.strategy for M, _ in got)
            # weights of the noise drawn (the lattice's discrete law), not the nominal
            drawn = lattice(finest, st.dtype).variance
            assert abs(drawn / finest.noise_scale**2 - 1) > 1e-4
            np.testing.assert_allclose([1.0 / w for _, w in got], drawn)
        else:
            assert set(got) == {lattice(L.plan, st.dtype).noise_scale for L in rel.released}


@pytest.mark.parametrize("levels", [None, ("tract",)], ids=["three-levels", "one-level"])
@pytest.mark.parametrize("kind", ["gram-root", "laplace-union"])
def test_nnls_release_fits_consistent_least_squares(store, tmp_path, kind, levels) -> None:
    """The NNLS release is scipy's NNLS of the least-squares release's finest estimates
    in the metric of the finest strategy (rows weighted by the inverse noise variance:
    Gaussian noise on a Gram root, Laplace noise on a union); coarser levels are sums
    of children. With one level, that is NNLS on the measurements themselves."""
    from scipy.optimize import nnls as scipy_nnls

    st, _ = store
    kwargs = dict(test_mode=True, key=SecretKey.for_testing(6), release_id="o", run_id="r")
    if levels is not None:
        kwargs["levels"] = levels
    plan = make_plan(rho="1/20") if kind == "gram-root" else _pure_plan(FULL_RANK_UNION, eps=0.05)
    ls = zarr.open_group(str(release(plan, st, **kwargs).to_zarr(tmp_path / "ls.zarr")), mode="r")
    rel = release(plan, st, reconstruct="nnls", **kwargs)
    nn = zarr.open_group(str(rel.to_zarr(tmp_path / "nnls.zarr")), mode="r")
    assert set(nn.group_keys()) == set(levels or st.geography.levels)
    A = rel.released[-1].plan.strategy.dense()  # the measured strategy (a Gram root here)
    x_ls = ls["tract"]["estimate"][:].reshape(7, -1)
    assert (x_ls < 0).any(), "the oracle needs a case where the constraint binds"
    want = np.stack([scipy_nnls(A, A @ row)[0] for row in x_ls])
    got = nn["tract"]["estimate"][:].reshape(7, -1)
    assert got.min() >= 0
    # the release stops at 1e-2 noise units (rms projected gradient): its objective, in
    # noise units, is within a hair of scipy's exact minimum
    sigma2 = rel.released[-1].plan.row_variance
    f = lambda x, x0: 0.5 * np.sum((A @ (x - x0)) ** 2) / sigma2  # noqa: E731
    gaps = [f(g, x0) - f(w, x0) for g, w, x0 in zip(got, want, x_ls, strict=True)]
    assert max(gaps) <= 1e-3, gaps
    assert min(gaps) >= -1e-9  # scipy's is the minimum
    for upper, lower in (("county", "tract"), ("state", "county")) if levels is None else ():
        sums = np.zeros_like(nn[upper]["estimate"][:])
        np.add.at(sums, nn[lower]["parent"][:], nn[lower]["estimate"][:])
        np.testing.assert_allclose(nn[upper]["estimate"][:], sums, rtol=1e-12)


@pytest.mark.parametrize("method", ["nnls", "admm-l1"])
def test_estimators_that_stop_early_are_reported(store, tmp_path, monkeypatch, method) -> None:
    """An iteration limit hit shows in the output's attributes, per chunk, and the
    estimate published is still non-negative and consistent."""
    import dpdask.graph._blocks as blocks

    real = {"nnls": blocks.nonnegative_fitter, "admm-l1": blocks.admm}[method]

    def capped(*args, **kw):
        return real(*args, **{**kw, "maxiter": 1})

    monkeypatch.setattr(blocks, "nonnegative_fitter" if method == "nnls" else "admm", capped)
    st, _ = store
    rel = release(
        make_plan(rho="1/1000"), st, test_mode=True, reconstruct=method,
        key=SecretKey.for_testing(9), run_id=f"capped-{method}",
    )  # fmt: skip
    # the limit is the point: each capped fit warns, and the output reports it
    with dask.config.set(scheduler="sync"), pytest.warns(ConvergenceWarning):
        g = zarr.open_group(str(rel.to_zarr(tmp_path / "out.zarr")), mode="r")
    reports = dict(g.attrs)["dpdask"]["not_converged"]
    assert reports, "no chunk reported"
    assert all(not r["converged"] and r["residual"] > r["tolerance"] for r in reports)
    levels = {r["level"] for r in reports}
    assert levels == ({"tract"} if method == "nnls" else set(st.geography.levels))
    _assert_nonnegative_and_consistent(g)


# -- the fused least-squares path and structured pseudo-inverses ----------------------
def _pure_plan(
    strategy: LinearQuery, workload: LinearQuery | None = None, eps: float = 1.0
) -> DensePlan:
    """A pure-DP plan: Laplace noise keeps a union strategy as it is (no Gram root)."""
    W = workload or make_plan().workload
    budget = PureDP(eps)
    scale = budget.laplace_scale(strategy.sensitivity(1))
    return DensePlan(strategy, W, DOMAIN, "laplace", scale, budget)


FULL_RANK_UNION = VStack(
    [Kron([Identity(2), Total(3)]), Kron([Identity(2), Prefix(3)])], weights=[0.6, 0.8]
)
# rank 4 of 6, like OPT_+ on SF1: neither part sees the interaction of a and b
DEFICIENT_UNION = VStack(
    [Kron([Identity(2), Total(3)]), Kron([Total(2), Prefix(3)])], weights=[0.6, 0.8]
)
SUPPORTED_WORKLOAD = VStack([Kron([Identity(2), Total(3)]), Kron([Total(2), Prefix(3)])])


@pytest.mark.parametrize(
    "plan",
    [make_plan(), _pure_plan(FULL_RANK_UNION)],
    ids=["gram-root", "union"],
)
def test_fused_path_equals_measure_then_reconstruct(store, tmp_path, monkeypatch, plan) -> None:
    """``x + A^+ z`` with the keyed noise of the chunk is ``A^+ (A x + z)`` (same key)."""
    st, _ = store
    kwargs = dict(release_id="f", run_id="one", test_mode=True, key=SecretKey.for_testing(8))
    fused = release(plan, st, chunk_bytes=8 * 6 * 2, **kwargs)
    assert all(_plans.fused(p, "ls") for p in fused.plans.values())
    a = zarr.open_group(str(fused.to_zarr(tmp_path / "fused.zarr")), mode="r")
    monkeypatch.setattr(_plans, "fused", lambda plan, method: False)
    general = release(plan, st, chunk_bytes=8 * 6 * 2, **kwargs)
    b = zarr.open_group(str(general.to_zarr(tmp_path / "general.zarr")), mode="r")
    for lv in st.geography.levels:
        ea, eb = a[lv]["estimate"][:], b[lv]["estimate"][:]
        assert np.abs(ea - eb).max() <= 1e-9 * np.abs(eb).max()
        if lattice(fused.plans[lv], np.int64).exact:  # x + A^+ z: two computations
            assert np.abs(ea - eb).max() > 0 or lv == "state"
        else:  # on the lattice the fused task forms the measurement: the same numbers
            np.testing.assert_array_equal(ea, eb)


def test_rank_deficient_strategy_is_not_fused(store) -> None:
    st, _ = store
    r = release(_pure_plan(DEFICIENT_UNION, SUPPORTED_WORKLOAD), st, test_mode=True)
    assert not any(_plans.fused(p, "ls") for p in r.plans.values())
    assert not any(
        _plans.fused(p, "nnls") for p in release(make_plan(), st, test_mode=True).plans.values()
    )


@pytest.mark.parametrize("strategy", [FULL_RANK_UNION, DEFICIENT_UNION], ids=["full", "deficient"])
def test_union_plan_releases_exact_answers(store, tmp_path, strategy) -> None:
    """OPT_+ form (two Kronecker parts) reconstructed by the pair inverse, noise off."""
    from dpdask.reconstruct.structured import KronPairInverse

    st, counts = store
    plan = _pure_plan(strategy, SUPPORTED_WORKLOAD)
    r = release(plan, st, test_mode=True, noise=False)
    assert all(isinstance(_plans.structured_inverse(p), KronPairInverse) for p in r.plans.values())
    g = zarr.open_group(str(r.to_zarr(tmp_path / "out.zarr")), mode="r")
    W, A = SUPPORTED_WORKLOAD.dense(), strategy.dense()
    for lv, truth in _level_truth(counts, st).items():
        est = g[lv]["estimate"][:].reshape(len(truth), -1)
        t = truth.reshape(len(truth), -1)
        np.testing.assert_allclose(g[lv]["answers"][:], t @ W.T, atol=1e-8)
        # the estimate solves the normal equations of the exact measurements
        np.testing.assert_allclose(est @ A.T @ A, t @ A.T @ A, atol=1e-8)
        if strategy is FULL_RANK_UNION:
            np.testing.assert_allclose(est, t, atol=1e-9)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("deficient", [False, True])
def test_pair_inverse_matches_dense_least_squares(seed: int, deficient: bool) -> None:
    from dpdask.linalg import Dense
    from dpdask.reconstruct.structured import structured_pinv

    rng = np.random.default_rng(seed)
    K1 = Kron([Total(3), Dense(rng.normal(size=(4, 4))), Identity(2)])
    # with a total on the last attribute neither part sees (attr 0 x attr 2) interactions
    K2 = Kron([Dense(rng.normal(size=(5, 3))), Prefix(4), Total(2) if deficient else Identity(2)])
    A = VStack([K1, K2], weights=rng.uniform(0.2, 2, size=2))
    P = structured_pinv(A)
    assert P.full_rank is not deficient
    Ad = A.dense()
    Y = rng.normal(size=(3, A.shape[0]))
    X = P.apply(Y)
    # a least-squares solution: the normal equations hold
    np.testing.assert_allclose(X @ Ad.T @ Ad, Y @ Ad, atol=1e-9)
    # A G A^T is the orthogonal projector onto range(A), as with the pseudo-inverse
    np.testing.assert_allclose(Ad @ P.dense(), Ad @ np.linalg.pinv(Ad), atol=1e-9)
    if not deficient:
        np.testing.assert_allclose(P.dense(), np.linalg.pinv(Ad), atol=1e-10)


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_data_above_max_total_refused_before_any_charge(store, tmp_path, layout):
    """On the lattice (a non-integer strategy), a geography above the public bound on
    totals is refused before the ledger is charged; at the bound the release runs (from
    a dense or a sparse store)."""
    from dpdask.errors import DataError
    from dpdask.linalg import Dense
    from dpdask.store import write_store

    st, counts = store
    if layout == "sparse":
        st = write_store(tmp_path / "sp.zarr", counts, st.domain, st.geography, layout="sparse")
    frac = Kron([Dense(np.array([[1.0, 0.5], [0.25, 1.0]])), Prefix(3)])
    ledger = Ledger.init(tmp_path / "ledger.sqlite")
    total = int(counts.sum())

    def run(max_total, run_id):
        rel = release(
            make_plan(strategy=frac), st, release_id="mt", run_id=run_id, ledger=ledger,
            max_total=max_total,
        )  # fmt: skip
        return rel.to_zarr(tmp_path / f"{run_id}.zarr")

    with pytest.raises(DataError, match="max_total"):
        run(total - 1, "low")
    assert ledger.charges("mt") == []
    assert run(total, "ok").exists()
    assert len(ledger.charges("mt")) == len(st.geography.levels)


def _wide_store(tmp_path, rng, n_units: int = 240):
    """Two levels (4 states of 60 counties) of the 2 x 3 domain: many independent units."""
    from dpdask.domain import Geography
    from dpdask.store import write_store

    parents = np.repeat(np.arange(4), n_units // 4)
    geo = Geography(
        levels=("state", "county"),
        ids=(tuple(f"s{i}" for i in range(4)), tuple(f"c{i:03d}" for i in range(n_units))),
        parents=(parents,),
    )
    counts = rng.integers(0, 40, size=(n_units, 2, 3))
    return write_store(tmp_path / "wide.zarr", counts, DOMAIN, geo, geo_chunk=60), counts


# A fractional strategy measured on a coarse lattice (a large public max_total makes the
# grid coarse, so the noise drawn is far above the plan's nominal scale), and an integral
# strategy at a scale where the discrete Gaussian's variance is well below sigma**2.
_FRACTIONAL = VStack([Kron([Identity(2), Identity(3)]), Kron([Total(2), Prefix(3)]) * 0.3])
VARIANCE_CASES = {
    "lattice": dict(rho=1, strategy=_FRACTIONAL, max_total=2**44),
    "discrete": dict(rho=5, strategy=Identity(6), max_total=2**33),
}


@pytest.mark.parametrize("case", sorted(VARIANCE_CASES))
def test_published_variances_are_those_of_the_noise_drawn(tmp_path, rng, case) -> None:
    """Mean squared z-scores of the published answers against the truth: 1 within the
    sampling band with the published variances, and outside it with the plan's nominal
    ones (so the test would catch a release that publishes the nominal scale)."""
    opts = VARIANCE_CASES[case]
    st, counts = _wide_store(tmp_path, rng)
    plan = make_plan(rho=opts["rho"], strategy=opts["strategy"])
    truth = _level_truth(counts, st)
    W = plan.workload.dense()
    z2, z2_nominal = [], []
    for seed in range(8):
        r = release(
            plan, st, release_id="v", run_id=f"r{seed}", test_mode=True,
            key=SecretKey.for_testing(100 + seed), max_total=opts["max_total"],
        )  # fmt: skip
        g = zarr.open_group(str(r.to_zarr(tmp_path / f"o{seed}.zarr")), mode="r")
        t = truth["county"]
        err = g["county"]["answers"][:] - t.reshape(len(t), -1) @ W.T
        published = g["county"]["variance"][:]
        z2.append((err**2 / published).ravel())
        # what the release would publish for the plan's nominal continuous noise
        level = r.summary()["levels"][1]
        nominal = published * level["nominal_noise_scale"] ** 2 / level["noise_variance"]
        z2_nominal.append((err**2 / nominal).ravel())
    z2, z2_nominal = np.concatenate(z2), np.concatenate(z2_nominal)
    # 8 trials x 240 units x 11 answers, correlated within a unit: the standard error of
    # the mean is below 0.02 (z**2 has variance 2, at most 11 answers per unit
    # correlated), so 0.08 is a band of more than 4 standard errors
    assert z2.mean() == pytest.approx(1.0, abs=0.08)
    assert abs(z2_nominal.mean() - 1.0) > 0.2  # the nominal variances are off by 25-50%
