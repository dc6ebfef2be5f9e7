"""A trial's files: its rewritten spec, a copy of a run's key placed before the run, and
the bit-for-bit comparison of two published releases."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import yaml

__all__ = ["TRIAL_CLUSTER", "compare_releases", "place_key", "trial_spec"]


#: the cluster each CLI run owns: two single-threaded worker processes
TRIAL_CLUSTER = {"n_workers": 2, "threads_per_worker": 1, "processes": True}
_COMPARED_ATTRS = ("release", "run_id", "budget", "domain", "levels", "charges", "reconstruct")


def trial_spec(
    spec_path: str | os.PathLike[str],
    folder: str | os.PathLike[str],
    *,
    reconstruct: str | None = None,
    cluster: Mapping[str, Any] | None = None,
    period: str | None = None,
) -> pathlib.Path:
    """Rewrite a release spec to publish and charge inside ``folder`` only.

    Parameters
    ----------
    spec_path : path-like
        The spec to rewrite (it is parsed first, so an invalid spec is refused here).
    folder : path-like
        Where the rewritten spec, its output and its ledger go (created if missing).
    reconstruct : str, optional
        Another estimator for the release (e.g. ``"admm-l1"``, slower, which widens the
        window in which a run can be killed); the spec's by default.
    cluster : mapping, optional
        :class:`distributed.LocalCluster` options for the run; :data:`TRIAL_CLUSTER` by
        default. A spec's scheduler address is always replaced: trials never run on a
        shared cluster.
    period : str, optional
        For a scheduled spec (``release: name-{period}``), the period (default: today's,
        as ``dpdask run``); the rewritten spec names the resolved release id.

    Returns
    -------
    pathlib.Path
        ``folder / "spec.yaml"``, whose output is ``folder / <the spec's output name>``
        and whose ledger is ``folder / "ledger.sqlite"`` (created by the first run).
    """
    from dpdask.pipeline.spec import load_spec

    spec = load_spec(spec_path) if period is None else load_spec(spec_path, period=period)
    raw = yaml.safe_load(pathlib.Path(spec_path).read_text())
    raw["release"] = spec.release  # a scheduled release's id, resolved once
    folder = pathlib.Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    data = dict(raw["data"])
    if spec.data.path is not None:
        data["path"] = str(spec.data.path)  # resolved against the original spec's folder
    raw["data"] = data
    raw["output"] = str(folder / spec.output.name)
    raw["ledger"] = {"path": str(folder / "ledger.sqlite"), "create": True}
    raw["cluster"] = dict(TRIAL_CLUSTER if cluster is None else cluster)
    if reconstruct is not None:
        raw["reconstruct"] = reconstruct
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def place_key(output: str | os.PathLike[str], run_id: str, raw: bytes) -> pathlib.Path:
    """Put a copy of a run's key in the new work folder of run ``run_id`` at ``output``,
    as a run keeps it (the folder 0700, the file 0600), so that a fresh run of that id
    draws the same noise.

    Parameters
    ----------
    output : path-like
        The output the run will publish (its work folder must not exist yet).
    run_id : str
        The run id.
    raw : bytes
        The key file's bytes.

    Returns
    -------
    pathlib.Path
        The key file written.
    """
    from dpdask.publish import work_dir

    work = work_dir(pathlib.Path(os.path.abspath(output)), run_id)
    work.parent.mkdir(parents=True, exist_ok=True)
    work.mkdir(mode=0o700)
    work.chmod(0o700)
    fd = os.open(work / "key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, raw)
    finally:
        os.close(fd)
    return work / "key"


def compare_releases(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> list[str]:
    """How two published releases differ: every array bit for bit, and the attributes
    that do not depend on when or where they were made.

    Parameters
    ----------
    a, b : path-like
        Two published zarr stores.

    Returns
    -------
    list of str
        One line per difference; empty if the releases are identical.
    """
    import zarr

    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    arrays_a = {n: m for n, m in ga.members(max_depth=None) if isinstance(m, zarr.Array)}
    arrays_b = {n: m for n, m in gb.members(max_depth=None) if isinstance(m, zarr.Array)}
    diffs: list[str] = []
    if set(arrays_a) != set(arrays_b):
        diffs.append(f"arrays differ: {sorted(set(arrays_a) ^ set(arrays_b))}")
    if not arrays_a:
        diffs.append("no arrays")
    for name in sorted(set(arrays_a) & set(arrays_b)):
        x, y = np.asarray(arrays_a[name][...]), np.asarray(arrays_b[name][...])
        if x.shape != y.shape or x.dtype != y.dtype:
            diffs.append(f"{name}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
        elif x.dtype.kind in "biufcmM":
            if np.ascontiguousarray(x).tobytes() != np.ascontiguousarray(y).tobytes():
                n = int(np.count_nonzero(x.view(np.uint8) != y.view(np.uint8)))
                diffs.append(f"{name}: {n} bytes differ")
        elif not np.array_equal(x, y):
            diffs.append(f"{name}: values differ")
    attrs_a: Any = dict(ga.attrs).get("dpdask", {})  # JSON, as zarr reads it
    attrs_b: Any = dict(gb.attrs).get("dpdask", {})
    for key in _COMPARED_ATTRS:
        if attrs_a.get(key) != attrs_b.get(key):
            diffs.append(f"attrs[dpdask][{key!r}] differ")
    return diffs
