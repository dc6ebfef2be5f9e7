"""A release run's work folder: checkpointed estimates, chunk markers, reports, the key.

While a release runs, ``.<output name>.run-<run id>/`` beside its output holds

- ``raw/<level>/<k>.npy``: every level's reconstructed estimates, a file per Dask chunk
  written whole by its task, and ``raw/<level>-sums/`` the finest level's sums by
  parent (so that consistency never re-reads the largest level;
  :mod:`dpdask.graph._checkpoint`);
- ``done/<level>-<chunk>``: a marker per checkpointed chunk, written after its data,
  so that a resumed run skips exactly the finished chunks;
- ``reports/``: a JSON report per chunk whose reconstruction stopped before converging;
- ``key``: the run's secret key (:class:`~dpdask.noise.KeyFile`, mode 0600), so that
  a resumed run draws the same noise; the ledger holds only its fingerprint;
- ``input-<fingerprint>.zarr``: the input converted to a data store
  (:mod:`dpdask.store._source`). What the run measures is bound in the ledger
  (:class:`~dpdask.privacy.RunBinding`), never here: nothing authenticates this folder.

The folder is private to its owner (mode 0700) and is removed, the key overwritten
first, once the release is published.
"""

from __future__ import annotations

import datetime
import pathlib
import secrets
import shutil

from dpdask.noise import KeyFile

__all__ = [
    "FLAT_KEYS",
    "marker",
    "new_run_id",
    "remove_work",
    "work_dir",
]

# chunk files named c.<i>.0.0... side by side: with one row per chunk, the default
# nested folders (c/<i>/0/0/...) cost a mkdir and an rmdir per level per row
FLAT_KEYS = {"name": "default", "separator": "."}


def work_dir(path: pathlib.Path, run_id: str) -> pathlib.Path:
    """The work folder of run ``run_id`` of the release published at ``path``."""
    return path.with_name(f".{path.name}.run-{run_id}")


def remove_work(work: pathlib.Path) -> None:
    """Remove a run's work folder, overwriting its key file first."""
    KeyFile(work / "key").delete()
    shutil.rmtree(work, ignore_errors=True)


def new_run_id() -> str:
    """A fresh run id: UTC time and random letters (sortable, unique)."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def marker(folder: pathlib.Path, level: str, k: int) -> pathlib.Path:
    """The marker file of chunk ``k`` of ``level`` in the markers ``folder``."""
    return folder / f"{level}-{k}"
