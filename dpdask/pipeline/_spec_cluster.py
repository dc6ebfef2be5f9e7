"""The ``cluster:`` part of a release spec: a scheduler address, its transport
(``insecure`` or ``tls``), LocalCluster options, or a SLURM allocation."""

from __future__ import annotations

import pathlib
from typing import Any

from dpdask.errors import SpecError
from dpdask.pipeline._spec_fields import as_bool, as_mapping, as_path, check_keys, positive_int

__all__ = ["parse_cluster"]


_REMOTE_KEYS = ("address", "insecure", "tls")
_LOCAL_KEYS = (
    "n_workers", "threads_per_worker", "processes", "memory_limit", "dashboard_address",
)  # fmt: skip
_TLS_KEYS = ("ca_file", "cert", "key")


def parse_cluster(raw: Any, base: pathlib.Path) -> str | dict[str, Any] | None:
    """The spec's ``cluster:``: an address, a checked mapping, or ``None`` (the default)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        if not raw:
            raise SpecError("cluster: expected a scheduler address, got ''")
        return raw
    c = dict(as_mapping(raw, "cluster", "a scheduler address or a mapping"))
    check_keys(c, [*_REMOTE_KEYS, "slurm", *_LOCAL_KEYS], "cluster")
    remote = [k for k in _REMOTE_KEYS if k in c]
    local = [k for k in _LOCAL_KEYS if k in c]
    if remote and local:
        raise SpecError(
            f"cluster: {remote[0]} is for a scheduler address; LocalCluster options {local} "
            "do not apply"
        )
    if "slurm" in c:  # SLURMCluster options (dask-jobqueue), passed through
        if local or "address" in c or "tls" in c:
            raise SpecError("cluster.slurm: goes with cluster.insecure only")
        slurm = as_mapping(c["slurm"], "cluster.slurm", "a mapping of SLURMCluster options")
        if not all(isinstance(k, str) for k in slurm):
            raise SpecError(f"cluster.slurm: option names are strings, got {list(slurm)!r}")
        c["slurm"] = dict(slurm)
    if remote:  # insecure and tls without an address apply to --scheduler's or the env's
        if "address" in c and (not isinstance(c["address"], str) or not c["address"]):
            raise SpecError(f"cluster.address: expected a scheduler address, got {c['address']!r}")
        if "insecure" in c:
            as_bool(c["insecure"], "cluster.insecure")
        if "tls" in c:
            if c.get("insecure"):
                raise SpecError("cluster.tls: not with insecure: true")
            tls = as_mapping(c["tls"], "cluster.tls", "a mapping with ca_file, cert and key")
            check_keys(tls, _TLS_KEYS, "cluster.tls")
            if missing := [k for k in _TLS_KEYS if k not in tls]:
                raise SpecError(f"cluster.tls: missing {missing}")
            c["tls"] = {k: str(as_path(v, base, f"cluster.tls.{k}")) for k, v in tls.items()}
        return c
    for k in ("n_workers", "threads_per_worker"):
        if k in c:
            positive_int(c[k], f"cluster.{k}")
    if "processes" in c:
        as_bool(c["processes"], "cluster.processes")
    if "memory_limit" in c and (
        isinstance(c["memory_limit"], bool) or not isinstance(c["memory_limit"], str | int | float)
    ):
        raise SpecError(
            f"cluster.memory_limit: expected bytes or '4GiB', got {c['memory_limit']!r}"
        )
    da = c.get("dashboard_address")
    if da is not None and not isinstance(da, str):
        raise SpecError(f"cluster.dashboard_address: expected an address like ':8787', got {da!r}")
    return c
