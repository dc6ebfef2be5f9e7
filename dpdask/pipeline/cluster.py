"""Where a pipeline runs: the embedded default (a local cluster) or a scheduler address.

Tasks carry per-chunk stream keys (:class:`~dpdask.noise.StreamKey`): secrets, if
only of one chunk's noise each. They must not cross a network in the clear, so a
remote scheduler is reached over TLS (``tls://`` with a
:class:`distributed.Security`), and plain TCP is refused unless the address is a
loopback one (the same machine) or the spec says ``insecure: true``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dpdask import config

__all__ = ["ClusterUnreachableError", "connect", "security_from"]

DEFAULT_LOCAL = {"n_workers": 2, "threads_per_worker": 1, "processes": True}

_ENCRYPTED = ("tls", "wss")
_PLAIN = ("tcp", "ws", "ucx", "inproc")
_INSECURE = (
    "plain TCP to a remote scheduler would carry per-chunk keys unencrypted; use tls:// "
    "with a distributed.Security, or set cluster.insecure: true"
)


def _split_address(address: str) -> tuple[str, str]:
    """``(scheme, host)`` of a scheduler address (a bare ``host:port`` is TCP)."""
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"a scheduler address is a non-empty string, got {address!r}")
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
    ValueError
        If a field is missing, unknown or not a non-empty string.
    """
    from distributed import Security

    if isinstance(tls, Security):
        return tls
    if not isinstance(tls, Mapping):
        raise ValueError(f"cluster.tls is a mapping {{ca_file, cert, key}}, got {tls!r}")
    fields = ("ca_file", "cert", "key")
    unknown = sorted(set(tls) - set(fields))
    missing = [f for f in fields if not tls.get(f)]
    if unknown or missing:
        raise ValueError(
            f"cluster.tls needs exactly {list(fields)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {unknown}" if unknown else "")
        )
    for f in fields:
        if not isinstance(tls[f], str):
            raise ValueError(f"cluster.tls.{f} is a path, got {tls[f]!r}")
    return Security(
        tls_ca_file=tls["ca_file"],
        tls_client_cert=tls["cert"],
        tls_client_key=tls["key"],
        require_encryption=True,
    )


def _check_transport(address: str, insecure: bool, security: Any) -> None:
    """Refuse, before connecting, an address that would carry keys unencrypted."""
    scheme, host = _split_address(address)
    if scheme in _ENCRYPTED:
        if security is None:
            raise ValueError(
                f"{address} is a TLS address but no TLS settings were given; set cluster.tls "
                "{ca_file, cert, key} or pass a distributed.Security"
            )
        return
    if scheme not in _PLAIN:
        raise ValueError(f"unknown scheduler protocol {scheme!r} in {address!r}")
    if security is not None:
        raise ValueError(
            f"TLS settings were given but {address} is not a tls:// address; use tls://"
        )
    if scheme != "inproc" and not insecure and not _is_loopback(host):
        raise ValueError(f"refusing {address}: {_INSECURE}")


class ClusterUnreachableError(ConnectionError, ValueError):
    """The scheduler named by a spec or ``--scheduler`` did not answer."""


@contextmanager
def connect(
    cluster: str | Mapping[str, Any] | None = None,
    *,
    insecure: bool = False,
    security: Any = None,
) -> Iterator[Any]:
    """A ``distributed.Client`` for the duration of a run.

    Parameters
    ----------
    cluster : str, mapping or None
        A scheduler address (``"tls://host:8786"``, ``"tcp://127.0.0.1:8786"`` or a
        bare ``"host:port"``, which is TCP); a mapping ``{address, insecure, tls}``
        for a scheduler; a mapping of :class:`distributed.LocalCluster` options; or
        ``None`` for the embedded default: a local cluster of two single-threaded
        worker processes. A local cluster's workers sample their tasks for the
        dashboard's Profile page every ``dpdask.cluster.profile-interval`` (100 ms;
        Dask's default is 10 ms).
    insecure : bool
        Allow plain TCP to a remote (non-loopback) scheduler. Tasks carry per-chunk
        keys, which then cross the network unencrypted. ``cluster["insecure"]``
        also allows it.
    security : distributed.Security or mapping, optional
        TLS settings for a ``tls://`` address (a mapping ``{ca_file, cert, key}`` is
        turned into a ``Security`` that requires encryption, see
        :func:`security_from`); ``cluster["tls"]`` may give them instead.

    Yields
    ------
    distributed.Client
        Its ``dashboard_link`` shows the release's tasks (``measure-county-...``).

    Raises
    ------
    ValueError
        Before connecting, for a remote plain-TCP address without ``insecure``, or a
        ``tls://`` address without TLS settings.
    """
    import dask.config
    from distributed import Client, LocalCluster

    if not isinstance(insecure, bool):
        raise TypeError(f"insecure must be a bool, got {insecure!r}")
    address = None
    options: dict[str, Any] = {}
    if isinstance(cluster, str):
        address = cluster
    elif cluster is not None:
        if not isinstance(cluster, Mapping):
            raise TypeError(f"cluster is an address or a mapping, got {type(cluster).__name__}")
        options = dict(cluster)
        address = options.pop("address", None)
        spec_insecure = options.pop("insecure", False)
        if not isinstance(spec_insecure, bool):
            raise TypeError(f"cluster.insecure must be true or false, got {spec_insecure!r}")
        insecure = insecure or spec_insecure
        tls = options.pop("tls", None)
        if tls is not None:
            if security is not None:
                raise ValueError("TLS settings given twice (cluster.tls and security=)")
            security = tls
        if address is not None and options:
            raise ValueError(
                f"a scheduler address goes with insecure and tls only, not {sorted(options)}"
            )
    if security is not None:
        security = security_from(security)
    if address is not None:
        _check_transport(address, insecure, security)
        kwargs = {} if security is None else {"security": security}
        timeout = config.get("cluster.connect-timeout")
        try:
            client = Client(address, timeout=timeout, **kwargs)
        except (OSError, TimeoutError) as exc:
            raise ClusterUnreachableError(
                f"cannot reach the scheduler at {address} within {timeout} "
                f"({type(exc).__name__}); check the address and that it is running"
            ) from None
        with client:
            yield client
        return
    if security is not None:
        raise ValueError(
            "TLS settings go with a tls:// scheduler address; the local cluster's workers "
            "run on this machine"
        )
    options = {**DEFAULT_LOCAL, **options}
    options.setdefault("dashboard_address", ":0")
    # the workers (processes) take the configuration in force when they start
    interval = config.get("cluster.profile-interval")
    with (
        dask.config.set({"distributed.worker.profile.interval": interval}),
        LocalCluster(**options) as lc,
        Client(lc) as client,
    ):
        yield client
