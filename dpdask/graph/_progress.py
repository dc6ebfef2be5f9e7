"""Progress of a release on standard error, labelled by step and level.

On a terminal a line redrawn in place (a bar); anywhere else (a file, a pipe, a
scheduler's log) plain lines, one when a step starts, then at most one per tenth of its
work or per :data:`EVERY` seconds, and one when it ends: never a carriage return or an
escape sequence, so that a log read later says which step and level a run was in.
Standard output stays for the command's result.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import IO, Any

__all__ = ["EVERY", "Progress", "compute_items", "level_of"]

#: seconds between two plain lines of one step when its work advances slowly
EVERY = 30.0


def level_of(key: Any, words: Iterable[str]) -> str | None:
    """The level a task key (``checkpoint-<level>-<token>``) names, among ``words``."""
    name = key[0] if isinstance(key, tuple) else key
    name = str(name)
    for word in sorted(words, key=len, reverse=True):
        if f"-{word}-" in f"-{name}-":
            return word
    return None


class Progress:
    """Reports of one step (``measure-reconstruct``, ``publish``, ...) of a release.

    Parameters
    ----------
    step : str
        The step's name, first on every line.
    totals : dict of str to int
        Units of work per part (a level's chunks); ``{"": n}`` for a step without parts.
    stream : file, optional
        Where to write (default standard error).
    tty : bool, optional
        Draw a bar in place (default: whether ``stream`` is a terminal).
    """

    def __init__(
        self, step: str, totals: dict[str, int], stream: IO[str] | None = None,
        tty: bool | None = None,
    ) -> None:  # fmt: skip
        self.step = step
        self.totals = {k: v for k, v in totals.items() if v > 0}
        self.done = dict.fromkeys(self.totals, 0)
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.tty = bool(isatty()) if tty is None else tty
        self.start = self.last = time.monotonic()
        self._tenths = dict.fromkeys(self.totals, 0)
        self._write(f"{self._prefix('')}started", newline=not self.tty)

    def _prefix(self, part: str) -> str:
        return f"dpdask: {self.step}" + (f" {part}" if part else "") + ": "

    def _write(self, text: str, newline: bool = True) -> None:
        if self.tty:  # redraw the one line in place
            self.stream.write("\r\x1b[2K" + text + ("\n" if newline else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _line(self, part: str) -> str:
        n, total = self.done[part], self.totals[part]
        elapsed = time.monotonic() - self.start
        if self.tty:
            width = 30
            fill = int(width * n / total)
            bar = "#" * fill + " " * (width - fill)
            return f"{self._prefix(part)}[{bar}] {n}/{total} ({elapsed:.0f}s)"
        return f"{self._prefix(part)}{n}/{total} ({100 * n // total}%, {elapsed:.0f}s)"

    def update(self, part: str = "", n: int = 1) -> None:
        """Count ``n`` more units of ``part`` done, and report when it is time."""
        if part not in self.totals:
            part = next(iter(self.totals), "")
            if part not in self.totals:
                return
        self.done[part] = min(self.done[part] + n, self.totals[part])
        now = time.monotonic()
        tenth = 10 * self.done[part] // self.totals[part]
        if self.tty:
            self._write(self._line(part), newline=False)
        elif tenth > self._tenths[part] or now - self.last >= EVERY:
            self._write(self._line(part))
        else:
            return
        self._tenths[part] = tenth
        self.last = now

    def close(self) -> None:
        """Report the step's end."""
        elapsed = time.monotonic() - self.start
        self._write(f"{self._prefix('')}done ({elapsed:.0f}s)")


def compute_items(
    items: list[Any], client: Any, progress: bool, step: str = "compute",
    levels: dict[str, str] | None = None,
) -> list[Any]:  # fmt: skip
    """Compute ``items`` (Dask collections) on ``client`` (or the local scheduler) and
    return their results, flattened; with ``progress``, report them as step ``step``,
    counted per level where a result's key names one of ``levels`` (task-key word ->
    level name)."""
    from dask.base import compute

    levels = levels or {}
    if client is not None:
        futures = client.compute(items)
        if progress:
            from distributed import as_completed

            parts = [levels.get(level_of(f.key, levels) or "", "") for f in futures]
            totals: dict[str, int] = {}
            for part in parts:
                totals[part] = totals.get(part, 0) + 1
            reports = Progress(step, totals)
            for f in as_completed(futures):  # type: ignore[no-untyped-call]
                reports.update(levels.get(level_of(f.key, levels) or "", ""))
            reports.close()
        return [r for f in client.gather(futures) for r in (f if isinstance(f, list) else [f])]
    if progress:
        with _local_progress(step):
            res = compute(items)  # type: ignore[no-untyped-call]
    else:
        res = compute(items)  # type: ignore[no-untyped-call]
    return list(res[0])


def _local_progress(step: str) -> Any:
    """A callback reporting a computation on the local scheduler (a context manager)."""
    from dask.callbacks import Callback

    class LocalProgress(Callback):
        """Progress of a computation on the local scheduler, counted in tasks."""

        def __init__(self, step: str) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.step = step
            self.reports: Progress | None = None

        def _start_state(self, dsk: Any, state: dict[str, Any]) -> None:
            total = sum(len(state[k]) for k in ("ready", "waiting", "running", "finished"))
            self.reports = Progress(self.step, {"": max(total, 1)})

        def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker: Any) -> None:
            if self.reports is not None:
                self.reports.update()

        def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
            if self.reports is not None and not errored:
                self.reports.close()

    return LocalProgress(step)
