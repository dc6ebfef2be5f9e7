"""The embedded local cluster of ``dpdask run`` and the benchmarks."""

from __future__ import annotations

import dask.config
import distributed  # noqa: F401  (registers its configuration defaults)
import pytest

from dpdask.pipeline.cluster import connect


def _profile_interval_ms(dask_worker) -> float:
    return dask_worker.periodic_callbacks["profile"].callback_time


@pytest.mark.parametrize("processes", [True, False])
def test_local_workers_sample_their_profile_at_the_configured_interval(processes) -> None:
    """Worker processes take ``dpdask.cluster.profile-interval``, not Dask's 10 ms, and
    the setting does not leak into the caller's configuration."""
    before = dask.config.get("distributed.worker.profile.interval")
    with dask.config.set({"dpdask.cluster.profile-interval": "250ms"}):
        with connect({"n_workers": 1, "processes": processes}) as client:
            got = client.run(_profile_interval_ms)
    assert list(got.values()) == [250]
    assert dask.config.get("distributed.worker.profile.interval") == before


def test_the_default_interval_is_coarser_than_dasks() -> None:
    assert dask.config.get("dpdask.cluster.profile-interval") == "100ms"
    assert dask.config.get("distributed.worker.profile.interval") == "10ms"
