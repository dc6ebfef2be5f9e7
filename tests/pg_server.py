"""A throwaway PostgreSQL cluster for the ledger tests (Debian's ``postgresql`` package).

:func:`start` runs ``initdb`` into a temporary folder (as the ``postgres`` user when
run as root: the server refuses to run as root), then starts the server on a free
loopback port with password (SCRAM) authentication, and returns a :class:`Server`
whose :meth:`Server.stop` stops it and removes the folder. Tests get it from the
``pg_server`` fixture in ``tests/conftest.py``; a server of one's own can be given
instead in ``DPDASK_TEST_PG_URL`` (a superuser's URL).

``python -m tests.pg_server`` starts one, prints its superuser URL and waits.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["Server", "find_bin", "start", "unavailable"]


def find_bin(name: str) -> str | None:
    """The newest ``/usr/lib/postgresql/*/bin/NAME`` (or NAME on the path)."""

    def version(p: str) -> int:
        v = p.split("/")[4]
        return int(v) if v.isdigit() else 0

    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=version)
    return found[-1] if found else shutil.which(name)


def unavailable() -> str | None:
    """Why no server can be started here (``None`` if one can)."""
    if os.environ.get("DPDASK_TEST_PG_URL"):
        return None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[dev]')"
    if find_bin("initdb") is None or find_bin("pg_ctl") is None:
        return "PostgreSQL is not installed (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' user to run the server as"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running cluster: its superuser URL, and how to make databases and roles on it."""

    url: str
    folder: str | None = None
    _as: list[str] = field(default_factory=list)
    ca: str | None = None  # the server's self-signed certificate, if it offers TLS
    options: str = ""  # the server's options (pg_ctl -o), to start it again

    def halt(self) -> None:
        """Stop the server, keeping its data (:meth:`resume` starts it again)."""
        subprocess.run([*self._as, find_bin("pg_ctl") or "pg_ctl", "stop", "-m", "fast",
                        "-D", f"{self.folder}/data"], capture_output=True, check=True)  # fmt: skip

    def resume(self) -> None:
        """Start the server again after :meth:`halt`."""
        subprocess.run(
            [*self._as, find_bin("pg_ctl") or "pg_ctl", "start", "-w", "-t", "60",
             "-D", f"{self.folder}/data", "-l", f"{self.folder}/log", "-o", self.options],
            capture_output=True, check=True,
        )  # fmt: skip

    def url_for(self, user: str, password: str, dbname: str) -> str:
        parts = urlsplit(self.url)
        return f"postgresql://{user}:{password}@{parts.hostname}:{parts.port}/{dbname}"

    def sql(self, *statements: str, dbname: str | None = None) -> None:
        """Run ``statements`` as the superuser (autocommit)."""
        import psycopg

        url = self.url if dbname is None else self.url.rsplit("/", 1)[0] + "/" + dbname
        with psycopg.connect(url, autocommit=True) as con:
            for s in statements:
                con.execute(s)  # type: ignore[arg-type]

    def new_ledger_database(self) -> tuple[str, str, str]:
        """A fresh database owned by a fresh administrator role, and a fresh operator
        role that may connect to it: ``(admin URL, operator URL, operator role)``."""
        tag = uuid.uuid4().hex[:12]
        admin, operator, db = f"admin_{tag}", f"operator_{tag}", f"ledger_{tag}"
        pw_a, pw_o = secrets.token_hex(8), secrets.token_hex(8)
        self.sql(
            f"CREATE ROLE {admin} LOGIN PASSWORD '{pw_a}'",
            f"CREATE ROLE {operator} LOGIN PASSWORD '{pw_o}'",
            f"CREATE DATABASE {db} OWNER {admin}",
            f"REVOKE ALL ON DATABASE {db} FROM PUBLIC",
            f"GRANT CONNECT ON DATABASE {db} TO {operator}",
        )
        self.sql("REVOKE ALL ON SCHEMA public FROM PUBLIC", dbname=db)
        return self.url_for(admin, pw_a, db), self.url_for(operator, pw_o, db), operator

    def stop(self) -> None:
        if self.folder is None:
            return
        subprocess.run([*self._as, find_bin("pg_ctl") or "pg_ctl", "stop", "-m", "fast",
                        "-D", f"{self.folder}/data"], capture_output=True, check=False)  # fmt: skip
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None


def _certificate(folder: str, run_as: list[str]) -> str | None:
    """A self-signed certificate for 127.0.0.1 (``None`` without openssl)."""
    if shutil.which("openssl") is None:
        return None
    done = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", f"{folder}/server.key", "-out", f"{folder}/server.crt"],
        capture_output=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return None
    os.chmod(f"{folder}/server.key", 0o600)
    if run_as:
        uid = pwd.getpwnam("postgres").pw_uid
        for name in ("server.key", "server.crt"):
            os.chown(f"{folder}/{name}", uid, -1)
    return f"{folder}/server.crt"


def start() -> Server:
    """Start a throwaway cluster (or use ``DPDASK_TEST_PG_URL``); see the module notes."""
    given = os.environ.get("DPDASK_TEST_PG_URL")
    if given:
        return Server(given)
    why = unavailable()
    if why:
        raise RuntimeError(why)
    folder = tempfile.mkdtemp(prefix="dpdask-pg-")
    run_as: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    os.chmod(folder, 0o700)
    password = secrets.token_hex(12)
    pwfile = f"{folder}/pw"
    with open(pwfile, "w") as f:
        f.write(password + "\n")
    if run_as:
        os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
    subprocess.run(
        [*run_as, find_bin("initdb") or "initdb", "-D", f"{folder}/data", "-U", "dpdask",
         "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"],
        capture_output=True, check=True,
    )  # fmt: skip
    port = _free_port()
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off "
            "-c max_connections=100 -c shared_buffers=16MB")  # fmt: skip
    ca = _certificate(folder, run_as)
    if ca:  # TLS offered (not required): tests check clients that require it
        opts += f" -c ssl=on -c ssl_cert_file={ca} -c ssl_key_file={folder}/server.key"
    subprocess.run(
        [*run_as, find_bin("pg_ctl") or "pg_ctl", "start", "-w", "-t", "60",
         "-D", f"{folder}/data", "-l", f"{folder}/log", "-o", opts],
        capture_output=True, check=True,
    )  # fmt: skip
    server = Server(f"postgresql://dpdask:{password}@127.0.0.1:{port}/postgres", folder, run_as)
    server.ca, server.options = ca, opts
    deadline = time.monotonic() + 30
    while True:  # the server accepts connections a moment after pg_ctl returns
        try:
            server.sql("SELECT 1")
            return server
        except Exception:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.2)


if __name__ == "__main__":  # pragma: no cover - a manual helper
    s = start()
    print(s.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        s.stop()
