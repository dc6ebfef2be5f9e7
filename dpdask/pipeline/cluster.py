"""Where a pipeline runs: the embedded default (a local cluster), a scheduler address, or
a SLURM allocation.

Which cluster a run uses, first match wins:

1. ``--scheduler ADDRESS`` on the command line (``scheduler=`` of :func:`connect`);
2. the spec's ``cluster:``: an address (``cluster: tls://host:8786`` or
   ``{address: ...}``), LocalCluster options (``{n_workers: 4}``), or a SLURM
   allocation through dask-jobqueue (``{slurm: {...}}``);
3. the ``DASK_SCHEDULER_ADDRESS`` environment variable;
4. Dask's configuration ``scheduler-address`` (a ``dask.yaml``, or ``dask.config.set``;
   Dask itself maps ``DASK_SCHEDULER_ADDRESS`` to this key when it is imported);
5. the embedded default: a local cluster of two single-threaded worker processes.

The dashboard of a cluster dpdask starts (the local one, or a SLURM allocation's
scheduler) listens on the loopback interface only, ``127.0.0.1`` (its page shows the
release's dataset, run ids and budgets), unless the spec's
``cluster.dashboard_address`` or ``dpdask run --dashboard-address`` (which wins) says
otherwise, e.g. ``:8787`` for every interface.

A spec's ``cluster: {insecure: true}`` or ``cluster: {tls: {ca_file, cert, key}}``
without an address chooses no cluster: it gives the transport settings of whatever
address is chosen (by the flag, the environment or the configuration).

Tasks carry per-chunk stream keys (:class:`~dpdask.noise.StreamKey`): secrets, if
only of one chunk's noise each. They must not cross a network in the clear, so a
remote scheduler is reached over TLS (``tls://`` with a
:class:`distributed.Security`), and plain TCP is refused unless the address is a
loopback one (the same machine) or the spec says ``insecure: true``. The rule holds
whichever source the address came from, and is checked before any connection.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dpdask import config
from dpdask.errors import ArgumentError, ArgumentTypeError, ClusterUnreachableError
from dpdask.pipeline._clusters import DEFAULT_DASHBOARD, local_client, outcome_kept, slurm_client

__all__ = ["ClusterChoice", "ClusterUnreachableError", "choose_cluster", "connect", "security_from"]

log = logging.getLogger("dpdask")

DEFAULT_LOCAL = {"n_workers": 2, "threads_per_worker": 1, "processes": True}
ENV_VAR = "DASK_SCHEDULER_ADDRESS"
CONFIG_KEY = "scheduler-address"

# where a scheduler address or a cluster came from (ClusterChoice.source)
FROM_FLAG = "--scheduler"
FROM_SPEC = "cluster"
FROM_ENV = ENV_VAR
FROM_CONFIG = f"dask config {CONFIG_KEY}"
FROM_DEFAULT = "default"

_ENCRYPTED = ("tls", "wss")
_PLAIN = ("tcp", "ws", "ucx", "inproc")
_TRANSPORT_KEYS = ("insecure", "tls")
_INSECURE = (
    "plain TCP to a remote scheduler would carry per-chunk keys unencrypted; use tls:// "
    "with a distributed.Security, or set cluster.insecure: true"
)


def _split_address(address: str | None) -> tuple[str, str]:
    """``(scheme, host)`` of a scheduler address (a bare ``host:port`` is TCP)."""
    if not isinstance(address, str) or not address.strip():
        raise ArgumentError(f"a scheduler address is a non-empty string, got {address!r}")
    address = address.strip()
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    scheme = scheme.lower()
    if rest.startswith("["):  # [ipv6]:port
        host = rest[1 : rest.find("]")] if "]" in rest else rest[1:]
    elif rest.count(":") > 1:  # a bare IPv6 address without a port
        host = rest
    else:
        host = rest.split(":", 1)[0]
    return scheme, host.split("/", 1)[0]


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def security_from(tls: Any) -> Any:
    """A :class:`distributed.Security` requiring encryption, from a spec's ``tls`` section.

    Parameters
    ----------
    tls : mapping or distributed.Security
        ``{ca_file, cert, key}``: the certificate authority's file and the client's
        certificate and private key (paths). A ``Security`` is returned as is.

    Returns
    -------
    distributed.Security

    Raises
    ------
    dpdask.errors.ArgumentError
        If a field is missing, unknown or not a non-empty string (a ``ValueError``).
    """
    from distributed import Security

    if isinstance(tls, Security):
        return tls
    if not isinstance(tls, Mapping):
        raise ArgumentError(f"cluster.tls is a mapping {{ca_file, cert, key}}, got {tls!r}")
    fields = ("ca_file", "cert", "key")
    unknown = sorted(set(tls) - set(fields))
    missing = [f for f in fields if not tls.get(f)]
    if unknown or missing:
        raise ArgumentError(
            f"cluster.tls needs exactly {list(fields)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {unknown}" if unknown else "")
        )
    for f in fields:
        if not isinstance(tls[f], str):
            raise ArgumentError(f"cluster.tls.{f} is a path, got {tls[f]!r}")
    return Security(  # type: ignore[no-untyped-call]
        tls_ca_file=tls["ca_file"],
        tls_client_cert=tls["cert"],
        tls_client_key=tls["key"],
        require_encryption=True,
    )


def _check_transport(address: str | None, insecure: bool, security: Any, source: str) -> None:
    """Refuse, before connecting, an address that would carry keys unencrypted."""
    scheme, host = _split_address(address)
    where = "" if source == FROM_SPEC else f" (from {source})"
    if scheme in _ENCRYPTED:
        if security is None:
            raise ArgumentError(
                f"{address}{where} is a TLS address but no TLS settings were given; set "
                "cluster.tls {ca_file, cert, key}, pass a distributed.Security, or set Dask's "
                "distributed.comm.tls.{ca-file, client.cert, client.key}"
            )
        return
    if scheme not in _PLAIN:
        raise ArgumentError(f"unknown scheduler protocol {scheme!r} in {address!r}{where}")
    if security is not None:
        raise ArgumentError(
            f"TLS settings were given but {address}{where} is not a tls:// address; use tls://"
        )
    if scheme != "inproc" and not insecure and not _is_loopback(host):
        raise ArgumentError(f"refusing {address}{where}: {_INSECURE}")


def _config_security() -> Any:
    """A ``Security`` requiring encryption from Dask's configuration
    (``distributed.comm.tls.ca-file``, ``.client.cert``, ``.client.key``; the
    ``DASK_DISTRIBUTED__COMM__TLS__...`` variables), or ``None`` if it names no CA file
    and client certificate."""
    from distributed import Security

    sec: Any = Security(require_encryption=True)  # type: ignore[no-untyped-call]
    return sec if sec.tls_ca_file and sec.tls_client_cert else None


@dataclass(frozen=True)
class ClusterChoice:
    """The cluster a run will use, as :func:`choose_cluster` resolved it.

    ``kind`` is ``"address"`` (an existing scheduler at ``address``), ``"local"`` (a
    :class:`distributed.LocalCluster` with ``options``) or ``"slurm"`` (a
    ``dask_jobqueue.SLURMCluster`` with ``options``); ``source`` says where it came
    from (``"--scheduler"``, ``"cluster"`` for the spec, ``"DASK_SCHEDULER_ADDRESS"``,
    ``"dask config scheduler-address"`` or ``"default"``). ``security`` is a
    :class:`distributed.Security` or ``None``; ``insecure`` allows plain TCP to a
    remote address.
    """

    kind: str
    source: str
    address: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    insecure: bool = False
    security: Any = None

    def describe(self) -> str:
        """One line for the log: what runs the release, and from where it was chosen."""
        if self.kind == "address":
            return f"scheduler {self.address} (from {self.source})"
        if self.kind == "slurm":
            return "a SLURM allocation (dask-jobqueue, from the spec's cluster.slurm)"
        what = "the embedded local cluster" if self.source == FROM_DEFAULT else "a local cluster"
        return f"{what} (from {self.source})"


def _address_from(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ArgumentError(f"{where}: a scheduler address is a non-empty string, got {value!r}")
    return value.strip()


def choose_cluster(
    cluster: str | Mapping[str, Any] | None = None,
    *,
    scheduler: str | None = None,
    insecure: bool = False,
    security: Any = None,
) -> ClusterChoice:
    """Resolve which cluster a run uses, and check its transport, without connecting.

    Takes the arguments of :func:`connect`; see there (and the module docstring) for
    the order of the sources.

    Returns
    -------
    ClusterChoice

    Raises
    ------
    dpdask.errors.ArgumentError
        For a remote plain-TCP address without ``insecure``, a ``tls://`` address
        without TLS settings, TLS settings without a ``tls://`` address, or a
        malformed ``cluster`` (a ``ValueError``).
    dpdask.errors.ArgumentTypeError
        If ``cluster`` is neither an address nor a mapping, or ``insecure`` not a bool.
    """
    import dask.config

    if not isinstance(insecure, bool):
        raise ArgumentTypeError(f"insecure must be a bool, got {insecure!r}")
    spec_address: str | None = None
    options: dict[str, Any] = {}
    slurm: Mapping[str, Any] | None = None
    if isinstance(cluster, str):
        spec_address = _address_from(cluster, "cluster")
    elif cluster is not None:
        if not isinstance(cluster, Mapping):
            raise ArgumentTypeError(
                f"cluster is an address or a mapping, got {type(cluster).__name__}"
            )
        options = dict(cluster)
        if "address" in options:
            spec_address = _address_from(options.pop("address"), "cluster.address")
        spec_insecure = options.pop("insecure", False)
        if not isinstance(spec_insecure, bool):
            raise ArgumentTypeError(
                f"cluster.insecure must be true or false, got {spec_insecure!r}"
            )
        insecure = insecure or spec_insecure
        tls = options.pop("tls", None)
        if tls is not None:
            if security is not None:
                raise ArgumentError("TLS settings given twice (cluster.tls and security=)")
            security = tls
        if "slurm" in options:
            slurm = options.pop("slurm")
            if not isinstance(slurm, Mapping):
                raise ArgumentTypeError(
                    f"cluster.slurm is a mapping of SLURMCluster options, got {slurm!r}"
                )
            if spec_address is not None or options:
                raise ArgumentError(
                    "cluster.slurm goes with cluster.insecure only, not "
                    f"{sorted(['address'] * (spec_address is not None) + list(options))}"
                )
        if spec_address is not None and options:
            raise ArgumentError(
                f"a scheduler address goes with insecure and tls only, not {sorted(options)}"
            )
    if security is not None:
        security = security_from(security)

    if scheduler is not None:
        choice = ClusterChoice(
            "address", FROM_FLAG, _address_from(scheduler, "--scheduler"), {}, insecure, security
        )
    elif spec_address is not None:
        choice = ClusterChoice("address", FROM_SPEC, spec_address, {}, insecure, security)
    elif slurm is not None:
        if security is not None:
            raise ArgumentError(
                "cluster.slurm: the scheduler runs in this process and encrypts with a "
                "temporary certificate of its own; cluster.tls does not apply"
            )
        return ClusterChoice("slurm", FROM_SPEC, None, dict(slurm), insecure, None)
    elif options:
        choice = ClusterChoice("local", FROM_SPEC, None, options, insecure, security)
    elif os.environ.get(ENV_VAR, "").strip():
        choice = ClusterChoice(
            "address", FROM_ENV, os.environ[ENV_VAR].strip(), {}, insecure, security
        )
    elif dask.config.get(CONFIG_KEY, None):
        address = _address_from(dask.config.get(CONFIG_KEY), f"dask config {CONFIG_KEY}")
        choice = ClusterChoice("address", FROM_CONFIG, address, {}, insecure, security)
    else:
        choice = ClusterChoice("local", FROM_DEFAULT, None, {}, insecure, security)

    if choice.kind == "address":
        if choice.security is None and _split_address(choice.address)[0] in _ENCRYPTED:
            choice = dataclasses.replace(choice, security=_config_security())
        _check_transport(choice.address, choice.insecure, choice.security, choice.source)
    elif choice.security is not None:
        raise ArgumentError(
            "TLS settings (cluster.tls) go with a tls:// scheduler address (cluster.address, "
            f"--scheduler, {ENV_VAR} or dask config {CONFIG_KEY}); a local cluster's "
            "workers run on this machine"
        )
    return choice


@contextmanager
def connect(
    cluster: str | Mapping[str, Any] | None = None,
    *,
    scheduler: str | None = None,
    insecure: bool = False,
    security: Any = None,
    dashboard_address: str | None = None,
) -> Iterator[Any]:
    """A ``distributed.Client`` for the duration of a run.

    The cluster is chosen in this order, first match wins (:func:`choose_cluster`):

    1. ``scheduler`` (``dpdask run --scheduler ADDRESS``) overrides the spec's cluster;
    2. ``cluster`` (the spec's ``cluster:``), when it names an address, LocalCluster
       options or ``slurm``;
    3. the ``DASK_SCHEDULER_ADDRESS`` environment variable;
    4. Dask's configuration ``scheduler-address``;
    5. the embedded default, a local cluster of two single-threaded worker processes.

    Whatever the source, a remote plain-TCP address is refused, before connecting,
    unless ``insecure`` (or ``cluster["insecure"]``) allows it; ``cluster["insecure"]``
    and ``cluster["tls"]`` given without an address apply to the address from the flag
    or the environment.

    Parameters
    ----------
    cluster : str, mapping or None
        The spec's ``cluster``: a scheduler address (``"tls://host:8786"``,
        ``"tcp://127.0.0.1:8786"`` or a bare ``"host:port"``, which is TCP); a mapping
        ``{address, insecure, tls}`` for a scheduler (``insecure`` and ``tls`` may come
        without ``address``); a mapping of :class:`distributed.LocalCluster` options;
        ``{slurm: {...}, insecure}``, the options of a ``dask_jobqueue.SLURMCluster``
        (``jobs``: how many SLURM jobs to submit, 1 by default unless ``n_workers``
        is given; dask-jobqueue must be installed); or ``None``. A local cluster's
        workers sample their tasks for the dashboard's Profile page every
        ``dpdask.cluster.profile-interval`` (100 ms; Dask's default is 10 ms).
    scheduler : str, optional
        A scheduler address that overrides ``cluster`` (``--scheduler``).
    insecure : bool
        Allow plain TCP to a remote (non-loopback) scheduler. Tasks carry per-chunk
        keys, which then cross the network unencrypted. ``cluster["insecure"]``
        also allows it.
    security : distributed.Security or mapping, optional
        TLS settings for a ``tls://`` address (a mapping ``{ca_file, cert, key}`` is
        turned into a ``Security`` that requires encryption, see
        :func:`security_from`); ``cluster["tls"]`` may give them instead. Without
        either, a ``tls://`` address takes them from Dask's configuration
        ``distributed.comm.tls`` (``ca-file``, ``client.cert``, ``client.key``: the
        ``DASK_DISTRIBUTED__COMM__TLS__...`` variables of the container recipes).
    dashboard_address : str, optional
        Where the dashboard of a cluster dpdask starts listens (``--dashboard-address``;
        over ``cluster["dashboard_address"]``); by default ``127.0.0.1`` on a free port.
        Refused for a scheduler dpdask does not start (its dashboard is its own).

    Yields
    ------
    distributed.Client
        Its ``dashboard_link`` shows the release's tasks (``measure-county-...``).

    Raises
    ------
    dpdask.errors.ArgumentError
        Before connecting, for a remote plain-TCP address without ``insecure``, a
        ``tls://`` address without TLS settings, or ``cluster.slurm`` without
        dask-jobqueue installed (a ``ValueError``).
    ClusterUnreachableError
        If the scheduler does not answer within ``dpdask.cluster.connect-timeout``.
    """
    from distributed import Client

    choice = choose_cluster(cluster, scheduler=scheduler, insecure=insecure, security=security)
    log.info("cluster: %s", choice.describe())
    if dashboard_address is not None and choice.kind == "address":
        raise ArgumentError(
            f"--dashboard-address: dpdask does not start the scheduler at {choice.address} "
            "(its dashboard listens where it was started)"
        )
    if choice.kind == "address":
        address = choice.address
        kwargs = {} if choice.security is None else {"security": choice.security}
        timeout = config.get("cluster.connect-timeout")
        try:
            client = Client(address, timeout=timeout, **kwargs)  # type: ignore[no-untyped-call]
        except (OSError, TimeoutError) as exc:
            where = "" if choice.source == FROM_SPEC else f" (from {choice.source})"
            raise ClusterUnreachableError(
                f"cannot reach the scheduler at {address}{where} within {timeout} "
                f"({type(exc).__name__}); check the address and that it is running"
            ) from None
        with outcome_kept(client, f"the client of {address}"):
            yield client
        return
    if choice.kind == "slurm":
        slurm = slurm_client(choice.options, choice.insecure, dashboard_address)
        with outcome_kept(slurm, "the SLURM cluster") as client:
            yield client
        return
    options = {**DEFAULT_LOCAL, **choice.options}
    if dashboard_address is not None:
        options["dashboard_address"] = dashboard_address
    options.setdefault("dashboard_address", DEFAULT_DASHBOARD)
    # the workers (processes) take the configuration in force when they start
    interval = config.get("cluster.profile-interval")
    settings = {"distributed.worker.profile.interval": interval}
    host = _split_address(str(options["dashboard_address"]))[1]
    if host and _is_loopback(host):  # the link names where the dashboard listens
        settings["distributed.dashboard.link"] = f"{{scheme}}://{host}:{{port}}/status"
    with outcome_kept(local_client(options, settings), "the local cluster") as client:
        yield client
