"""Benchmarks behind ``dpdask bench NAME``.

Each benchmark is a module in this package with two functions::

    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> dict: ...

``run`` returns one JSON-safe dictionary of figures; ``dpdask bench NAME --json``
prints it as one JSON object and ``dpdask bench NAME`` as a readable report.
Register a new benchmark by adding its module name to :data:`BENCHES`.

The helpers the benchmarks share are public here: :func:`median_time`,
:class:`PeakRSS` and :func:`format_report` (the readable rendering of a result).
"""

from __future__ import annotations

from dpdask_benchmarks._common import PeakRSS, median_time

__all__ = ["PeakRSS", "median_time"]
