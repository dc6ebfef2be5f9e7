"""The embedded local cluster of ``dpdask run`` and the benchmarks."""

from __future__ import annotations

from typing import ClassVar

import dask.config
import distributed  # registers its configuration defaults
import pytest

from dpdask.errors import ArgumentError, ArgumentTypeError
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


# -- keys stay on the client: no plain TCP to a remote scheduler ------------------------
class _NoConnect:
    """Stands in for ``distributed.Client``: records what it was asked to connect to."""

    calls: ClassVar[list[tuple[str, dict]]] = []

    def __init__(self, address, **kwargs):
        # every connection gives up after dpdask.cluster.connect-timeout
        if kwargs.pop("timeout", None) != dask.config.get("dpdask.cluster.connect-timeout"):
            raise AssertionError("connect() did not pass the configured timeout")
        _NoConnect.calls.append((address, kwargs))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def no_connect(monkeypatch):
    _NoConnect.calls = []
    monkeypatch.setattr(distributed, "Client", _NoConnect)
    return _NoConnect.calls


_REFUSAL = "plain TCP to a remote scheduler would carry per-chunk keys unencrypted"


@pytest.mark.parametrize(
    "address",
    ["tcp://10.1.2.3:8786", "10.1.2.3:8786", "tcp://scheduler.example.org:8786", "[2001:db8::1]:1"],
)
def test_remote_plain_tcp_is_refused_before_connecting(no_connect, address) -> None:
    for cluster in (address, {"address": address}, {"address": address, "insecure": False}):
        with pytest.raises(ArgumentError, match=_REFUSAL) as info:
            with connect(cluster):
                pass
        assert "cluster.insecure: true" in str(info.value)
    assert no_connect == []


def test_insecure_allows_remote_plain_tcp(no_connect) -> None:
    with connect({"address": "tcp://10.1.2.3:8786", "insecure": True}) as client:
        assert isinstance(client, _NoConnect)
    with connect("10.1.2.3:8786", insecure=True):
        pass
    assert no_connect == [("tcp://10.1.2.3:8786", {}), ("10.1.2.3:8786", {})]


@pytest.mark.parametrize(
    "address", ["tcp://127.0.0.1:8786", "127.0.0.9:8786", "localhost:8786", "tcp://[::1]:8786"]
)
def test_loopback_plain_tcp_is_allowed(no_connect, address) -> None:
    with connect(address):
        pass
    assert no_connect == [(address, {})]


def test_tls_needs_security_and_builds_one_that_requires_encryption(no_connect) -> None:
    with pytest.raises(ValueError, match="no TLS settings"):
        with connect("tls://10.1.2.3:8786"):
            pass
    tls = {"ca_file": "/etc/dpdask/ca.pem", "cert": "/etc/dpdask/c.pem", "key": "/etc/dpdask/k.pem"}
    with connect({"address": "tls://10.1.2.3:8786", "tls": tls}):
        pass
    ((address, kwargs),) = no_connect
    sec = kwargs["security"]
    assert address == "tls://10.1.2.3:8786" and isinstance(sec, distributed.Security)
    assert sec.require_encryption
    assert (sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key) == (
        tls["ca_file"],
        tls["cert"],
        tls["key"],
    )
    with connect("tls://10.1.2.3:8786", security=sec):
        pass
    assert no_connect[-1][1]["security"] is sec
    for bad in ({"ca_file": "a", "cert": "b"}, {**tls, "extra": "x"}, {**tls, "key": 3}):
        with pytest.raises(ValueError, match=r"cluster\.tls"):
            with connect({"address": "tls://10.1.2.3:8786", "tls": bad}):
                pass
    with pytest.raises(ValueError, match="not a tls:// address"):
        with connect({"address": "tcp://10.1.2.3:8786", "tls": tls, "insecure": True}):
            pass
    assert len(no_connect) == 2


def test_a_scheduler_address_takes_no_local_cluster_options(no_connect) -> None:
    with pytest.raises(ValueError, match="n_workers"):
        with connect({"address": "tcp://127.0.0.1:8786", "n_workers": 2}):
            pass
    with pytest.raises(ArgumentTypeError, match="insecure"):
        with connect({"address": "tcp://10.1.2.3:8786", "insecure": "yes"}):
            pass
    assert no_connect == []


def test_connects_to_a_real_loopback_scheduler() -> None:
    with distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tcp://",
        host="127.0.0.1",
        dashboard_address=":0",
    ) as lc:
        address = lc.scheduler_address
        assert address.startswith("tcp://127.0.0.1:")
        with connect(address) as client:
            assert client.submit(sum, [1, 2]).result() == 3
        with connect({"address": address.removeprefix("tcp://")}) as client:
            assert client.submit(sum, [3, 4]).result() == 7


def test_an_unreachable_scheduler_is_a_one_line_error() -> None:
    from dpdask.pipeline.cluster import ClusterUnreachableError

    # nothing listens on port 1 of the loopback address: refused at once
    with dask.config.set({"dpdask.cluster.connect-timeout": "2s"}):
        with pytest.raises(ClusterUnreachableError, match="cannot reach the scheduler"):
            with connect("tcp://127.0.0.1:1"):
                pass
