"""Which cluster a run uses: ``--scheduler``, the spec's ``cluster:``,
``DASK_SCHEDULER_ADDRESS``, Dask's ``scheduler-address``, the embedded default, in that
order; and the transport rule (no plain TCP to a remote scheduler) for every source."""

from __future__ import annotations

import sys
import types
from typing import ClassVar

import dask.config
import distributed
import pytest

from dpdask.pipeline import cluster as cluster_mod
from dpdask.pipeline.cluster import choose_cluster, connect
from dpdask.pipeline.spec import SpecError, parse_spec

ENV = "DASK_SCHEDULER_ADDRESS"
REFUSAL = "plain TCP to a remote scheduler would carry per-chunk keys unencrypted"
TLS = {"ca_file": "/etc/dpdask/ca.pem", "cert": "/etc/dpdask/c.pem", "key": "/etc/dpdask/k.pem"}


class _NoConnect:
    """Stands in for ``distributed.Client``: records what it was asked to connect to."""

    calls: ClassVar[list[tuple[str, dict]]] = []

    def __init__(self, address, **kwargs):
        kwargs.pop("timeout", None)
        _NoConnect.calls.append((address, kwargs))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def clean(monkeypatch):
    """No address in the environment or in Dask's configuration."""
    monkeypatch.delenv(ENV, raising=False)
    with dask.config.set({"scheduler-address": None}):
        yield monkeypatch


@pytest.fixture
def no_connect(clean, monkeypatch):
    _NoConnect.calls = []
    monkeypatch.setattr(distributed, "Client", _NoConnect)

    def _no_local(**kwargs):
        raise AssertionError(f"a local cluster was started with {kwargs}")

    monkeypatch.setattr(distributed, "LocalCluster", _no_local)
    return _NoConnect.calls


def _address(**kw) -> tuple[str | None, str]:
    c = choose_cluster(**kw)
    return c.address, c.source


# -- the order of the sources -------------------------------------------------------------
def test_default_is_the_embedded_local_cluster(clean) -> None:
    c = choose_cluster()
    assert (c.kind, c.source, c.address) == ("local", "default", None)
    assert choose_cluster({"insecure": True}).source == "default"  # chooses no cluster
    assert choose_cluster({}).source == "default"


def test_dask_config_scheduler_address(clean) -> None:
    with dask.config.set({"scheduler-address": "tcp://127.0.0.1:8786"}):
        assert _address() == ("tcp://127.0.0.1:8786", "dask config scheduler-address")
    # dask's own spelling with an underscore is the same key
    with dask.config.set(scheduler_address="tcp://127.0.0.2:8786"):
        assert _address()[0] == "tcp://127.0.0.2:8786"


def test_environment_before_config(clean) -> None:
    clean.setenv(ENV, "tcp://127.0.0.3:8786")
    with dask.config.set({"scheduler-address": "tcp://127.0.0.1:8786"}):
        assert _address() == ("tcp://127.0.0.3:8786", ENV)
    clean.setenv(ENV, "  ")  # blank: unset
    assert choose_cluster().source == "default"


def test_spec_before_environment(clean) -> None:
    clean.setenv(ENV, "tcp://127.0.0.3:8786")
    assert _address(cluster="tcp://127.0.0.4:8786") == ("tcp://127.0.0.4:8786", "cluster")
    assert _address(cluster={"address": "127.0.0.4:1"}) == ("127.0.0.4:1", "cluster")
    # a spec asking for a local cluster gets one, whatever the environment says
    c = choose_cluster({"n_workers": 3})
    assert (c.kind, c.source, c.options) == ("local", "cluster", {"n_workers": 3})
    c = choose_cluster({"slurm": {"cores": 1}})
    assert (c.kind, c.options) == ("slurm", {"cores": 1})


def test_flag_before_everything(clean) -> None:
    clean.setenv(ENV, "tcp://127.0.0.3:8786")
    with dask.config.set({"scheduler-address": "tcp://127.0.0.1:8786"}):
        for spec in (None, "tcp://127.0.0.4:8786", {"n_workers": 2}, {"slurm": {"cores": 1}}):
            got = _address(cluster=spec, scheduler="tcp://127.0.0.5:8786")
            assert got == ("tcp://127.0.0.5:8786", "--scheduler"), spec


def test_connect_uses_the_flag_then_env_then_config(no_connect, clean) -> None:
    with dask.config.set({"scheduler-address": "tcp://127.0.0.1:1"}):
        with connect():
            pass
        clean.setenv(ENV, "tcp://127.0.0.2:2")
        with connect():
            pass
        with connect({"insecure": True}, scheduler="tcp://127.0.0.3:3"):
            pass
    got = [a for a, _ in no_connect]
    assert got == ["tcp://127.0.0.1:1", "tcp://127.0.0.2:2", "tcp://127.0.0.3:3"]


def test_cli_passes_the_flag_over_the_spec(no_connect, tmp_path, monkeypatch) -> None:
    """``dpdask run --scheduler`` reaches connect() as the override, with the spec."""
    from dpdask import cli

    seen = {}

    def fake_connect(cluster=None, *, scheduler=None, **kw):
        seen.update(cluster=cluster, scheduler=scheduler)
        raise ValueError("stop here")

    monkeypatch.setattr(cluster_mod, "connect", fake_connect)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "release: r\ndata: {format: synthetic, geographies: 4}\ndomain: {a: 2}\n"
        "levels: [state, county]\nworkload: identity\nprivacy: {zcdp: 1}\n"
        "strategy: identity\noutput: out.zarr\ncluster: {insecure: true}\n"
    )
    rc = cli.main(["run", str(spec), "--scheduler", "tcp://10.0.0.1:8786", "--no-progress"])
    assert rc == 2
    assert seen == {"cluster": {"insecure": True}, "scheduler": "tcp://10.0.0.1:8786"}


# -- the transport rule, for every source -------------------------------------------------
REMOTE = "tcp://10.1.2.3:8786"


@pytest.mark.parametrize("source", ["flag", "spec", "env", "config"])
def test_remote_plain_tcp_is_refused_from_every_source(no_connect, clean, source) -> None:
    kw: dict = {}
    if source == "env":
        clean.setenv(ENV, REMOTE)
    elif source == "flag":
        kw["scheduler"] = REMOTE
    elif source == "spec":
        kw["cluster"] = REMOTE
    with dask.config.set({"scheduler-address": REMOTE if source == "config" else None}):
        with pytest.raises(ValueError, match=REFUSAL) as info:
            with connect(**kw):
                pass
    assert "cluster.insecure: true" in str(info.value)
    if source in ("env", "config", "flag"):
        assert "from " in str(info.value)  # says where the address came from
    assert no_connect == []


@pytest.mark.parametrize("source", ["flag", "env", "config"])
def test_spec_insecure_without_address_allows_the_others(no_connect, source, clean) -> None:
    kw: dict = {"cluster": {"insecure": True}}
    if source == "flag":
        kw["scheduler"] = REMOTE
    elif source == "env":
        clean.setenv(ENV, REMOTE)
    with dask.config.set({"scheduler-address": REMOTE if source == "config" else None}):
        with connect(**kw):
            pass
    assert no_connect == [(REMOTE, {})]


@pytest.mark.parametrize("source", ["flag", "env", "config"])
def test_spec_tls_without_address_applies_to_the_others(no_connect, source, clean) -> None:
    address = "tls://10.1.2.3:8786"
    kw: dict = {"cluster": {"tls": TLS}}
    if source == "flag":
        kw["scheduler"] = address
    elif source == "env":
        clean.setenv(ENV, address)
    with dask.config.set({"scheduler-address": address if source == "config" else None}):
        with connect(**kw):
            pass
    ((got, kwargs),) = no_connect
    sec = kwargs["security"]
    assert got == address and sec.require_encryption and sec.tls_ca_file == TLS["ca_file"]


def test_tls_from_dask_config(no_connect, clean) -> None:
    """A tls:// address without cluster.tls takes Dask's own TLS settings."""
    clean.setenv(ENV, "tls://10.1.2.3:8786")
    with pytest.raises(ValueError, match="no TLS settings"):
        with connect():
            pass
    settings = {
        "distributed.comm.tls.ca-file": TLS["ca_file"],
        "distributed.comm.tls.client.cert": TLS["cert"],
        "distributed.comm.tls.client.key": TLS["key"],
    }
    with dask.config.set(settings):
        with connect():
            pass
    ((_, kwargs),) = no_connect
    sec = kwargs["security"]
    assert sec.require_encryption
    assert (sec.tls_ca_file, sec.tls_client_cert, sec.tls_client_key) == tuple(TLS.values())


def test_tls_settings_without_a_tls_address_are_refused(no_connect, clean) -> None:
    with pytest.raises(ValueError, match="TLS settings"):  # no address at all: local
        with connect({"tls": TLS}):
            pass
    clean.setenv(ENV, "tcp://127.0.0.1:8786")
    with pytest.raises(ValueError, match=r"\(from DASK_SCHEDULER_ADDRESS\) is not a tls://"):
        with connect({"tls": TLS}):
            pass
    assert no_connect == []


def test_loopback_from_the_environment_is_allowed(no_connect, clean) -> None:
    clean.setenv(ENV, "tcp://127.0.0.1:8786")
    with connect():
        pass
    assert no_connect == [("tcp://127.0.0.1:8786", {})]


def test_an_unreachable_env_scheduler_says_where_it_came_from(clean) -> None:
    from dpdask.pipeline.cluster import ClusterUnreachableError

    clean.setenv(ENV, "tcp://127.0.0.1:1")
    with dask.config.set({"dpdask.cluster.connect-timeout": "2s"}):
        with pytest.raises(ClusterUnreachableError, match="from DASK_SCHEDULER_ADDRESS"):
            with connect():
                pass


# -- cluster: {slurm: ...} ----------------------------------------------------------------
def test_slurm_without_dask_jobqueue_is_a_clear_error(clean, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # import fails
    with pytest.raises(ValueError, match=r"cluster\.slurm needs dask-jobqueue"):
        with connect({"slurm": {"cores": 1}}):
            pass


class _FakeSLURMCluster:
    made: ClassVar[list] = []

    def __init__(self, **kwargs):
        self.kwargs, self.scaled = kwargs, []
        _FakeSLURMCluster.made.append(self)

    def scale(self, **kw):
        self.scaled.append(kw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def fake_jobqueue(no_connect, monkeypatch):
    _FakeSLURMCluster.made = []
    # Security.temporary() needs the cryptography package, which dask-jobqueue sites have
    monkeypatch.setattr(
        distributed.Security,
        "temporary",
        classmethod(lambda cls: cls(require_encryption=True, tls_ca_file="temporary")),
    )
    monkeypatch.setitem(
        sys.modules, "dask_jobqueue", types.SimpleNamespace(SLURMCluster=_FakeSLURMCluster)
    )
    return _FakeSLURMCluster.made


def test_slurm_options_pass_through_with_tls(fake_jobqueue, no_connect) -> None:
    opts = {"queue": "normal", "cores": 1, "memory": "4GiB", "walltime": "01:00:00", "jobs": 2}
    with connect({"slurm": opts}) as client:
        assert isinstance(client, _NoConnect)
    (made,) = fake_jobqueue
    kw = dict(made.kwargs)
    sec = kw.pop("security")
    assert kw.pop("scheduler_options") == {"dashboard_address": "127.0.0.1:0"}  # loopback
    assert isinstance(sec, distributed.Security) and sec.require_encryption
    assert kw == {"queue": "normal", "cores": 1, "memory": "4GiB", "walltime": "01:00:00",
                  "protocol": "tls://"}  # fmt: skip
    assert made.scaled == [{"jobs": 2}]
    assert no_connect == [(made, {})]


def test_slurm_tls_without_cryptography_is_a_clear_error(fake_jobqueue, monkeypatch) -> None:
    def _missing(cls):
        raise ImportError("Using `Security.temporary` requires `cryptography`")

    monkeypatch.setattr(distributed.Security, "temporary", classmethod(_missing))
    with pytest.raises(ValueError, match=r"cryptography.*cluster\.insecure: true"):
        with connect({"slurm": {"cores": 1}}):
            pass
    assert fake_jobqueue == []


def test_slurm_insecure_and_defaults(fake_jobqueue) -> None:
    with connect({"slurm": {"cores": 1}, "insecure": True}):
        pass
    with connect({"slurm": {"cores": 1, "n_workers": 4}, "insecure": True}):
        pass
    a, b = fake_jobqueue
    loopback = {"scheduler_options": {"dashboard_address": "127.0.0.1:0"}}
    assert a.kwargs == {"cores": 1, **loopback} and a.scaled == [{"jobs": 1}]
    assert b.kwargs == {"cores": 1, "n_workers": 4, **loopback} and b.scaled == []


@pytest.mark.parametrize(
    ("cluster", "match"),
    [
        ({"slurm": {"security": "x"}}, "cluster.slurm.security"),
        ({"slurm": {"protocol": "tcp://"}}, "cluster.slurm.protocol"),
        ({"slurm": {"jobs": 0}}, "cluster.slurm.jobs"),
        ({"slurm": {}, "tls": TLS}, "cluster.tls does not apply"),
        ({"slurm": {}, "address": "tcp://127.0.0.1:1"}, "cluster.slurm goes with"),
        ({"slurm": {}, "n_workers": 2}, "cluster.slurm goes with"),
    ],
)
def test_slurm_refusals(fake_jobqueue, cluster, match) -> None:
    with pytest.raises(ValueError, match=match):
        with connect(cluster):
            pass
    assert fake_jobqueue == []


# -- the spec's cluster: forms ------------------------------------------------------------
def _spec(cluster) -> dict:
    return {
        "release": "r",
        "data": {"format": "synthetic", "geographies": 4},
        "domain": {"a": 2},
        "levels": ["state", "county"],
        "workload": "identity",
        "privacy": {"zcdp": 1},
        "strategy": "identity",
        "output": "/tmp/out.zarr",
        "cluster": cluster,
    }


@pytest.mark.parametrize(
    "cluster",
    [
        {"insecure": True},
        {"slurm": {"cores": 1, "memory": "4GiB", "jobs": 2}},
        {"slurm": {"cores": 1}, "insecure": True},
    ],
)
def test_spec_forms_without_address(cluster) -> None:
    assert parse_spec(_spec(cluster)).cluster == cluster


def test_spec_tls_without_address_resolves_paths(tmp_path) -> None:
    spec = parse_spec(_spec({"tls": {"ca_file": "ca.pem", "cert": "c.pem", "key": "/k.pem"}}),
                      base=tmp_path)  # fmt: skip
    assert spec.cluster == {"tls": {"ca_file": str(tmp_path.resolve() / "ca.pem"),
                                    "cert": str(tmp_path.resolve() / "c.pem"),
                                    "key": "/k.pem"}}  # fmt: skip


@pytest.mark.parametrize(
    ("cluster", "fragment"),
    [
        ({"insecure": True, "n_workers": 2}, "LocalCluster options ['n_workers']"),
        ({"tls": {"ca_file": "ca.pem"}}, "cluster.tls: missing ['cert', 'key']"),
        ({"slurm": "normal"}, "cluster.slurm: expected a mapping"),
        ({"slurm": {1: 2}}, "cluster.slurm: option names are strings"),
        ({"slurm": {}, "address": "tcp://s:1"}, "cluster.slurm: goes with cluster.insecure"),
        ({"slurm": {}, "processes": True}, "cluster.slurm: goes with cluster.insecure"),
        ({"slurm": {}, "tls": {"ca_file": "a"}}, "cluster.slurm: goes with cluster.insecure"),
    ],
)
def test_bad_spec_cluster(cluster, fragment) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(cluster))
    assert fragment in str(info.value)
