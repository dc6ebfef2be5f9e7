"""The shared ledger's recipes in ``deploy/``: the server in compose and Kubernetes, the
jobs that charge it, and the administrator's set-up script run against a real server
over TLS with credentials from password files."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import uuid

import psycopg
import pytest
import yaml

from dpdask.errors import LedgerPermissionError, LedgerServerError
from dpdask.pipeline import load_spec
from dpdask.privacy import Charge, Ledger, is_server_url, zCDP

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _doc(rel: str):
    return yaml.safe_load((DEPLOY / rel).read_text())


def test_compose_runs_the_server_beside_the_cluster() -> None:
    doc = _doc("docker-compose.ledger.yml")
    services = doc["services"]
    db, runner, admin = services["ledger-db"], services["runner"], services["ledger-admin"]
    assert db["networks"] == ["cluster"] and "ports" not in db  # internal network only
    command = " ".join(db["command"])
    assert "ssl=on" in command and "hba_file=/etc/dpdask/pg_hba.conf" in command
    hba = (DEPLOY / "ledger" / "pg_hba.conf").read_text().split("\n")
    rules = [line.split() for line in hba if line and not line.startswith("#")]
    assert ["hostssl", "dpdask_ledger", "all", "all", "scram-sha-256"] in rules
    assert all(r[0] in ("local", "hostssl") or r[-1] == "reject" for r in rules)
    # the runner: the operator's password file and TLS checked, never the admin's file
    env = runner["environment"]
    assert env["PGSSLMODE"] == "verify-full" and env["PGPASSFILE"].endswith("operator.pgpass")
    assert "dpdask_admin.pgpass" not in runner["secrets"]
    assert admin["environment"]["PGPASSFILE"].endswith("admin.pgpass")
    assert set(doc["secrets"]) >= {"dpdask_admin.pgpass", "dpdask_operator.pgpass"}
    # the override layers over the cluster's file: the runner it extends is there
    base = _doc("docker-compose.yml")
    assert "runner" in base["services"] and "cluster" in base["networks"]


def test_kubernetes_jobs_charge_the_server() -> None:
    db = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "ledger-postgres.yaml").read_text()))
    kinds = {d["kind"]: d for d in db}
    assert {"Service", "StatefulSet", "ConfigMap"} <= set(kinds)
    assert kinds["Service"]["metadata"]["name"] == "ledger-db"
    (cron,) = yaml.safe_load_all((DEPLOY / "kubernetes" / "cronjob-release-shared.yaml")
                                 .read_text())  # fmt: skip
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (runner,) = pod["containers"]
    env = {e["name"]: e for e in runner["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "dpdask-ledger-operator"
    assert env["PGSSLMODE"]["value"] == "verify-full"
    # no ledger volume: the server keeps the ledger and its head
    assert all("persistentVolumeClaim" not in v or v["persistentVolumeClaim"]["claimName"]
               != "dpdask-state" for v in pod["volumes"])  # fmt: skip
    assert "pl94-monthly-shared.yaml" in " ".join(runner["args"])


@pytest.mark.parametrize(
    ("rel", "period"),
    [("specs/compose-release-shared.yaml", None), ("specs/pl94-monthly-shared.yaml", "2026-11")],
)
def test_shared_specs_name_the_server_without_a_password(rel, period) -> None:
    spec = load_spec(DEPLOY / rel, period=period)
    assert is_server_url(spec.ledger)
    assert "sslmode=verify-full" in spec.ledger and "dpdask_operator@" in spec.ledger
    assert ":" not in spec.ledger.split("//")[1].split("@")[0]  # no password in the URL
    assert spec.dataset_budget is None  # the administrator registers the lifetime budget


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql (postgresql-client) is missing")
def test_the_admin_script_sets_up_a_ledger_over_tls(pg_server, tmp_path, monkeypatch) -> None:
    if pg_server.ca is None:
        pytest.skip("the test server offers no TLS (openssl is missing)")
    tag = uuid.uuid4().hex[:8]
    db, admin, operator = f"ledger_{tag}", f"admin_{tag}", f"operator_{tag}"
    pg_server.sql(f"CREATE DATABASE {db}")
    host, port = "127.0.0.1", pg_server.url.split(":")[3].split("/")[0]
    superuser_pw = pg_server.url.split(":")[2].split("@")[0]
    files = {}
    for name, text in (
        ("super", superuser_pw),
        ("admin.pgpass", f"{host}:{port}:{db}:{admin}:{uuid.uuid4().hex}"),
        ("operator.pgpass", f"{host}:{port}:{db}:{operator}:{uuid.uuid4().hex}"),
    ):
        files[name] = tmp_path / name
        files[name].write_text(text + "\n")
        files[name].chmod(0o600)
    env = {
        **os.environ,
        "PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "PGHOST": host, "PGPORT": port, "PGDATABASE": db,
        "PGSSLMODE": "verify-full", "PGSSLROOTCERT": pg_server.ca,
        "POSTGRES_USER": "dpdask", "POSTGRES_PASSWORD_FILE": str(files["super"]),
        "PGPASSFILE": str(files["admin.pgpass"]),
        "DPDASK_OPERATOR_PASSFILE": str(files["operator.pgpass"]),
    }  # fmt: skip
    done = subprocess.run(["sh", str(DEPLOY / "ledger" / "init.sh")], env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "created ledger" in done.stdout
    for f in ("admin.pgpass", "operator.pgpass"):
        assert files[f].read_text().split(":")[4].strip() not in done.stdout + done.stderr
    # the jobs: the operator's password file, TLS verified, from the environment
    url = (
        f"postgresql://{operator}@{host}:{port}/{db}?sslmode=verify-full&sslrootcert={pg_server.ca}"
    )
    monkeypatch.setenv("PGPASSFILE", str(files["operator.pgpass"]))
    with psycopg.connect(url) as con:
        assert con.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")\
            .fetchone() == (True,)  # fmt: skip
    op = Ledger(url)
    with pytest.raises(LedgerPermissionError):
        op.set_dataset_total("cef", zCDP(1))
    admin_url = url.replace(operator, admin)
    monkeypatch.setenv("PGPASSFILE", str(files["admin.pgpass"]))
    Ledger(admin_url).set_dataset_total("cef", zCDP(1))
    monkeypatch.setenv("PGPASSFILE", str(files["operator.pgpass"]))
    op.open_release("r", zCDP(1), "cef")
    op.charge(Charge("r", "run", "county", "A", "gaussian", 1.0, 1.0, zCDP(1), "fp"))
    assert op.dataset_remaining("cef") == zCDP(0)
    # a certificate the client does not trust: refused, one line, before anything
    other = tmp_path / "other.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                    "1", "-subj", "/CN=x", "-keyout", str(tmp_path / "k"), "-out",
                    str(other)], capture_output=True, check=True)  # fmt: skip
    with pytest.raises(LedgerServerError, match="TLS check"):
        Ledger(url.replace(pg_server.ca, str(other)))
