"""``dpdask bench noise``: throughput of the keyed noise samplers against numpy's normal.

Rows: the exact production samplers (``table``: :mod:`dpdask.noise._table`, the
discrete Gaussian at sigma 1, 10, 100 and 1e4 and the discrete Laplace at 10 and
1e4), CKS's Bernoulli-factory samplers (``cks``: :meth:`dpdask.noise.KeyedRNG.reference_cks`, the
reference, on ``--n / 4`` values), and the unsafe floating-point samplers
(``unsafe_float=True``) for comparison.

Every sampler draws ``--n`` values from a fresh :class:`~dpdask.noise.KeyedRNG`
``--repeats`` times (one core; numpy's generators are single-threaded); the
median wall time gives samples per second, and the median CPU time of this
process gives samples per CPU second (the figure that matters on a shared
machine, where wall time includes waiting for a core). The baseline, measured in the same run,
is ``numpy.random.Generator.standard_normal`` on the default bit generator
(PCG64) and on Philox (the bit generator dpdask uses).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpdask.noise import KeyedRNG, MeasurementId, new_key
from dpdask_benchmarks._common import median_time

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=2_000_000, help="samples per draw")
    parser.add_argument("--repeats", type=int, default=5, help="draws per sampler (median)")


def _rate(fn: Callable[[], Any], n: int, repeats: int) -> tuple[float, float, float]:
    """Samples per wall second, median wall seconds, samples per CPU second of this process."""
    fn()  # warm up
    cpu: list[float] = []

    def timed() -> None:
        t0 = time.process_time()
        fn()
        cpu.append(time.process_time() - t0)

    med, _, _ = median_time(timed, repeats)
    return n / med, med, n / statistics.median(cpu)


def run(args: argparse.Namespace) -> dict:
    n, repeats = int(args.n), int(args.repeats)
    if n < 1 or repeats < 1:
        raise ValueError("--n and --repeats must be positive")
    pcg = np.random.default_rng(12345)
    philox = np.random.Generator(np.random.Philox(key=12345))
    base_rate, base_time, base_cpu = _rate(lambda: pcg.standard_normal(n), n, repeats)
    philox_rate, philox_time, philox_cpu = _rate(lambda: philox.standard_normal(n), n, repeats)

    key = new_key()
    ident = MeasurementId("bench", "county", 0, "noise")
    factor = np.tril(np.ones((8, 8)))
    n_cks = max(1, n // 4)
    cases: list[tuple[str, str, float, int, Callable[[KeyedRNG], Any]]] = [
        ("laplace", "unsafe float", 10.0, n, lambda r: r.laplace(10.0, n, unsafe_float=True)),
        ("gaussian", "unsafe float", 10.0, n, lambda r: r.gaussian(10.0, n, unsafe_float=True)),
        ("discrete_laplace", "table", 10.0, n, lambda r: r.discrete_laplace(10.0, n)),
        ("discrete_laplace", "table", 1e4, n, lambda r: r.discrete_laplace(1e4, n)),
    ]
    for sigma in (1.0, 10.0, 100.0, 1e4):
        cases.append(
            ("discrete_gaussian", "table", sigma, n, lambda r, s=sigma: r.discrete_gaussian(s, n))
        )
    cases += [
        (
            "discrete_laplace",
            "cks",
            10.0,
            n_cks,
            lambda r: r.reference_cks("discrete_laplace", 10, n_cks),
        ),
    ]
    for sigma in (1, 10, 100, 10_000):
        cases.append(
            (
                "discrete_gaussian",
                "cks",
                float(sigma),
                n_cks,
                lambda r, s=sigma: r.reference_cks("discrete_gaussian", s * s, n_cks),
            )
        )
    cases.append(
        (
            "correlated_gaussian (8x8 factor)",
            "unsafe float",
            1.0,
            n,
            lambda r: r.correlated_gaussian(factor, n // 8, unsafe_float=True),
        )
    )
    rows = []
    for name, method, scale, count, draw in cases:
        rng = KeyedRNG(key, ident)
        rate, med, cpu_rate = _rate(lambda rng=rng, draw=draw: draw(rng), count, repeats)
        rows.append(
            {
                "sampler": name,
                "method": method,
                "scale": scale,
                "samples_per_s": rate,
                "median_s": med,
                "ratio_to_numpy_normal": rate / base_rate,
                "samples_per_cpu_s": cpu_rate,
                "cpu_ratio_to_numpy_normal": cpu_rate / base_cpu,
            }
        )
    return {
        "n": n,
        "repeats": repeats,
        "numpy_normal_pcg64_samples_per_s": base_rate,
        "numpy_normal_pcg64_median_s": base_time,
        "numpy_normal_philox_samples_per_s": philox_rate,
        "numpy_normal_philox_median_s": philox_time,
        "numpy_normal_pcg64_samples_per_cpu_s": base_cpu,
        "numpy_normal_philox_samples_per_cpu_s": philox_cpu,
        "samplers": rows,
    }
