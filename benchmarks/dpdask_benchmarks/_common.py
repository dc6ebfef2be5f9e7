"""Timing and memory helpers shared by the benchmarks."""

from __future__ import annotations

import gc
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

__all__ = ["PeakRSS", "median_time"]


def median_time(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, list[float], Any]:
    """Run ``fn`` ``repeats`` times; return the median wall time, all times, last result."""
    times, result = [], None
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, result


class PeakRSS:
    """Context manager sampling this process's resident memory; ``.peak`` in bytes.

    Also reports ``.baseline`` (RSS on entry) so that the increase is ``peak - baseline``.
    """

    def __init__(self, interval: float = 0.02, pid: int | None = None):
        self.interval = interval
        self.proc = psutil.Process(pid or os.getpid())
        self.peak = 0
        self.baseline = 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            self._stop.wait(self.interval)

    def _rss(self) -> int:
        rss = self.proc.memory_info().rss
        for child in self.proc.children(recursive=True):
            try:
                rss += child.memory_info().rss
            except psutil.Error:
                pass
        return rss

    def __enter__(self) -> PeakRSS:
        gc.collect()
        self.baseline = self._rss()
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
