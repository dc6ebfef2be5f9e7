"""The deployment recipes of ``deploy/``: the image's build context, the compose
topology, the Kubernetes manifests, the Helm values, the SLURM script and their specs,
parsed and checked against what their tools require; and the compose topology run as
local processes (``dask scheduler`` with the dpdask plugin, two ``dask worker``s, a
runner reaching the scheduler through ``DASK_SCHEDULER_ADDRESS``), publishing the same
bytes as the embedded local default for the same key."""

from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys
import time
from typing import IO

import dask.config
import numpy as np
import pytest
import yaml

from dpdask.pipeline.cluster import choose_cluster
from dpdask.pipeline.spec import load_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = pathlib.Path(sys.executable).parent
HAVE_DASHBOARD = (ROOT / "dpdask" / "dashboard" / "__init__.py").exists()


def _yaml(rel: str):
    return yaml.safe_load((DEPLOY / rel).read_text())


def _yaml_all(rel: str) -> list:
    return [d for d in yaml.safe_load_all((DEPLOY / rel).read_text()) if d is not None]


# -- the image: Dockerfile and the repository root's .dockerignore -------------------------
def _dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    """The patterns of ``.dockerignore`` as Docker reads them: in order, ``!`` re-includes,
    ``*`` stays within a path segment, ``**`` crosses segments, and the last match wins."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = os.path.normpath(line.lstrip("!").strip("/"))
        rx, i = "", 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pat.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pat[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pat[i] == "?":
                rx, i = rx + "[^/]", i + 1
            elif pat[i] == "[":
                j = pat.index("]", i)
                rx, i = rx + pat[i : j + 1], j + 1
            else:
                rx, i = rx + re.escape(pat[i]), i + 1
        rules.append((negate, re.compile(rx + "$")))
    return rules


def _in_context(path: str, rules) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    excluded = False
    for negate, rx in rules:
        # a pattern matching the path or one of its parent folders (Docker's rule)
        if any(rx.match(p) for p in prefixes):
            excluded = not negate
    return not excluded


def test_dockerignore_keeps_out_runs_keys_ledgers_and_the_environment() -> None:
    rules = _dockerignore_rules()
    for path in [
        "out",
        "out/pl94-providence.zarr/zarr.json",
        "out/.pl94-providence.zarr.run-20260101T000000-abcdef/key",
        "out/ledger.sqlite",
        "pipelines/.x.zarr.run-1/key",  # a work folder wherever an output was put
        "dpdask/.tmp.zarr.run-1/raw.zarr/zarr.json",
        "ledger.sqlite",
        "ledger.sqlite.head",
        "tls/ca.pem",
        "dpdask/__pycache__/cli.cpython-311.pyc",
        "dpdask.egg-info/PKG-INFO",
        ".git/HEAD",
        ".venv/bin/python",
        ".pytest_cache/v/cache/nodeids",
        ".hypothesis/examples/x",
        "tests/test_deploy.py",
        "examples/data/pl94_providence/x",
    ]:
        assert not _in_context(path, rules), path
    for path in [
        "pyproject.toml",
        "constraints.txt",
        "README.md",
        "dpdask/__init__.py",
        "dpdask/dpdask.yaml",
        "dpdask/dashboard/__init__.py",
        "pipelines/pl94-monthly.yaml",
        "deploy/entrypoint-shims/dask-worker",
    ]:
        assert _in_context(path, rules), path


def test_dockerfile_builds_from_the_root_what_the_context_holds() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert (
        "docker build -f deploy/Dockerfile" in text
        and text.count("\nFROM ") + (text.startswith("FROM ")) >= 1
    )
    rules = _dockerignore_rules()
    copies = re.findall(r"^COPY\s+(.+)$", text, flags=re.M)
    assert copies
    for line in copies:
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), src  # relative to the repository root
            files = [ROOT / src] if (ROOT / src).is_file() else (ROOT / src).rglob("*")
            kept = [
                f for f in files if f.is_file() and _in_context(str(f.relative_to(ROOT)), rules)
            ]
            assert kept, f"COPY {src}: nothing of it is in the build context"
    assert re.search(r"^USER\s+(?!root|0\b)\S+", text, flags=re.M), "the image runs as root"
    assert "pip install -c constraints.txt ." in text
    for name, verb in (("dask-scheduler", "scheduler"), ("dask-worker", "worker")):
        shim = DEPLOY / "entrypoint-shims" / name
        assert os.access(shim, os.X_OK)
        assert f'exec dask {verb} "$@"' in shim.read_text()


# -- docker compose ----------------------------------------------------------------------
def _command(service: dict) -> list[str]:
    cmd = service["command"]
    return cmd.split() if isinstance(cmd, str) else [str(c) for c in cmd]


def test_compose_topology() -> None:
    doc = _yaml("docker-compose.yml")
    services = doc["services"]
    assert {"scheduler", "worker", "runner"} <= set(services)
    for s in services.values():
        assert s["image"] == "dpdask:latest"
        assert s["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    scheduler = _command(services["scheduler"])
    assert scheduler[:2] == ["dask", "scheduler"]
    assert scheduler[scheduler.index("--preload") + 1] == "dpdask.dashboard"
    assert scheduler[scheduler.index("--port") + 1] == "8786"
    worker = _command(services["worker"])
    assert worker[:3] == ["dask", "worker", "tcp://scheduler:8786"]
    assert worker[worker.index("--nthreads") + 1] == "1"
    assert services["worker"]["deploy"]["replicas"] == 2
    runner = services["runner"]
    assert _command(runner)[:2] == ["dpdask", "run"]
    assert runner["environment"]["DASK_SCHEDULER_ADDRESS"] == "tcp://scheduler:8786"
    # the ledger's volume is the runner's alone; outputs on the shared one
    mounts = {
        n: {v.split(":")[0]: v.split(":")[1] for v in s.get("volumes", [])}
        for n, s in services.items()
    }
    assert mounts["runner"] == {"shared": "/data", "state": "/state"}
    assert mounts["worker"] == {"shared": "/data"}
    assert "state" not in mounts["scheduler"]
    assert set(doc["volumes"]) == {"shared", "state"}
    # the cluster's plain TCP stays on an internal network; only the dashboard is published
    assert doc["networks"]["cluster"]["internal"] is True
    assert services["scheduler"]["ports"] == ["127.0.0.1:8787:8787"]
    for s in services.values():
        assert "cluster" in s["networks"]
        assert "ports" not in s or s is services["scheduler"]


# -- the specs the recipes run -----------------------------------------------------------
def _spec(rel: str, period: str | None = None):
    return load_spec(DEPLOY / rel, period=period)


@pytest.mark.parametrize(
    ("rel", "period"),
    [
        ("specs/compose-release.yaml", None),
        ("specs/release.yaml", None),
        ("specs/pl94-monthly.yaml", "2026-11"),
    ],
)
def test_recipe_specs_keep_the_ledger_on_the_runners_volume(rel, period) -> None:
    spec = _spec(rel, period)
    assert spec.ledger.parent == pathlib.Path("/state")
    assert spec.output.is_relative_to("/data/out")
    assert spec.data.path.is_relative_to("/data/input")


def test_recipe_specs_and_the_transport_rule(monkeypatch) -> None:
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    compose = _yaml("docker-compose.yml")["services"]["runner"]
    assert _command(compose)[2] == "/data/specs/compose-release.yaml"
    env = compose["environment"]["DASK_SCHEDULER_ADDRESS"]
    # compose: plain TCP on the host's internal network, allowed by the spec only
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", env)
    got = choose_cluster(_spec("specs/compose-release.yaml").cluster)
    assert (got.address, got.source, got.insecure) == (env, "DASK_SCHEDULER_ADDRESS", True)
    with pytest.raises(ValueError, match="plain TCP to a remote scheduler"):
        choose_cluster(_spec("specs/release.yaml").cluster)
    # Kubernetes: tls:// with Dask's TLS settings from the environment
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tls://dpdask-scheduler:8786")
    with pytest.raises(ValueError, match="no TLS settings"):
        choose_cluster(_spec("specs/release.yaml").cluster)
    tls = {
        "distributed.comm.tls.ca-file": "/x/ca.crt",
        "distributed.comm.tls.client.cert": "/x/tls.crt",
        "distributed.comm.tls.client.key": "/x/tls.key",
    }
    with dask.config.set(tls):
        got = choose_cluster(_spec("specs/pl94-monthly.yaml", "2026-11").cluster)
    assert got.security.require_encryption and got.security.tls_client_cert == "/x/tls.crt"


# -- Kubernetes ----------------------------------------------------------------------------
def _container(pod_spec: dict, name: str | None = None) -> dict:
    containers = pod_spec["containers"]
    assert containers and all("image" in c and "name" in c for c in containers)
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _mounts(pod_spec: dict, container: dict) -> dict[str, str]:
    """mount path -> claim name, checking that every mount names a volume of the pod."""
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod_spec.get("volumes", [])
    }
    out = {}
    for m in container.get("volumeMounts", []):
        assert m["name"] in claims, m
        out[m["mountPath"]] = claims[m["name"]]
    return out


def _tls_env(env: dict, role: str) -> None:
    assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True"
    for key in ("CA_FILE", f"{role}__CERT", f"{role}__KEY"):
        ref = env[f"DASK_DISTRIBUTED__COMM__TLS__{key}"]["secretKeyRef"]
        assert ref["name"] == "dpdask-tls"


def test_daskjob_for_one_release() -> None:
    (job,) = _yaml_all("kubernetes/daskjob-release.yaml")
    assert job["apiVersion"] == "kubernetes.dask.org/v1" and job["kind"] == "DaskJob"
    name = job["metadata"]["name"]
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    spec = job["spec"]
    runner_pod = spec["job"]["spec"]
    runner = _container(runner_pod)
    assert runner_pod["restartPolicy"] == "Never"
    args = runner["args"]
    assert args[:2] == ["dpdask", "run"]
    # the operator's DASK_SCHEDULER_ADDRESS is tcp://; the TLS address overrides it
    address = args[args.index("--scheduler") + 1]
    assert address == f"tls://{name}-scheduler:8786"
    _tls_env(_env(runner), "CLIENT")
    assert _mounts(runner_pod, runner) == {"/data": "dpdask-shared", "/state": "dpdask-state"}

    cluster = spec["cluster"]["spec"]
    sched_pod = cluster["scheduler"]["spec"]
    sched = _container(sched_pod)
    sargs = sched["args"]
    assert sargs[:2] == ["dask", "scheduler"]
    assert sargs[sargs.index("--preload") + 1] == "dpdask.dashboard"
    assert sargs[sargs.index("--protocol") + 1] == "tls"
    _tls_env(_env(sched), "SCHEDULER")
    assert {p["name"]: p["containerPort"] for p in sched["ports"]} == {
        "tcp-comm": 8786,
        "http-dashboard": 8787,
    }
    assert not sched.get("volumeMounts")
    service = cluster["scheduler"]["service"]
    assert service["selector"]["dask.org/cluster-name"] == name
    assert {p["port"] for p in service["ports"]} == {8786, 8787}

    worker = cluster["worker"]
    assert worker["replicas"] == 2
    w = _container(worker["spec"])
    assert w["args"][:3] == ["dask", "worker", address]
    _tls_env(_env(w), "WORKER")
    assert _mounts(worker["spec"], w) == {"/data": "dpdask-shared"}  # never the ledger


def test_cronjob_for_a_scheduled_release() -> None:
    (cron,) = _yaml_all("kubernetes/cronjob-release.yaml")
    assert cron["apiVersion"] == "batch/v1" and cron["kind"] == "CronJob"
    assert cron["metadata"]["name"]
    spec = cron["spec"]
    fields = spec["schedule"].split()
    assert len(fields) == 5
    assert spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    runner = _container(pod)
    line = " ".join([*runner.get("command", []), *runner.get("args", [])])
    assert "dpdask run /data/specs/pl94-monthly.yaml" in line
    assert '--period "$(date -u +%Y-%m)"' in line
    env = _env(runner)
    assert env["DASK_SCHEDULER_ADDRESS"] == "tls://dpdask-scheduler:8786"  # the Helm chart's
    _tls_env(env, "CLIENT")
    assert _mounts(pod, runner) == {"/data": "dpdask-shared", "/state": "dpdask-state"}


def test_storage_claims() -> None:
    claims = {d["metadata"]["name"]: d for d in _yaml_all("kubernetes/storage.yaml")}
    assert set(claims) == {"dpdask-shared", "dpdask-state"}
    for c in claims.values():
        assert c["apiVersion"] == "v1" and c["kind"] == "PersistentVolumeClaim"
        assert c["spec"]["resources"]["requests"]["storage"]
    assert claims["dpdask-shared"]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_helm_values_for_the_dask_chart() -> None:
    values = _yaml("helm/dask-values.yaml")
    s, w = values["scheduler"], values["worker"]
    for part in (s, w):
        assert part["image"]["repository"] == "dpdask" and part["image"]["tag"]
    assert s["extraArgs"][s["extraArgs"].index("--preload") + 1] == "dpdask.dashboard"
    assert s["extraArgs"][s["extraArgs"].index("--protocol") + 1] == "tls"
    assert s["servicePort"] == 8786
    assert w["replicas"] == 2
    assert w["custom_scheduler_url"] == "tls://dpdask-scheduler:8786"
    assert w["image"]["dask_worker"] == "dask-worker"  # the image's shim: `dask worker`
    _tls_env(_env(s), "SCHEDULER")
    _tls_env(_env(w), "WORKER")
    vols = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in w["mounts"]["volumes"]}
    assert vols == {"shared": "dpdask-shared"}  # outputs; the ledger is the runner's
    assert values["jupyter"]["enabled"] is False


def test_every_recipe_starts_dask_scheduler_and_dask_worker() -> None:
    for path in [
        DEPLOY / "docker-compose.yml",
        *DEPLOY.glob("kubernetes/*.yaml"),
        *DEPLOY.glob("slurm/*"),
    ]:
        text = path.read_text()
        assert not re.search(r"^[^#]*\bdask-(scheduler|worker)\b", text, flags=re.M), path
    sbatch = (DEPLOY / "slurm" / "dpdask-release.sbatch").read_text()
    assert "dask scheduler --scheduler-file" in sbatch and "--preload dpdask.dashboard" in sbatch
    assert "dask worker --scheduler-file" in sbatch
    assert (
        subprocess.run(["bash", "-n", str(DEPLOY / "slurm" / "dpdask-release.sbatch")]).returncode
        == 0
    )


# -- scheduled releases on one machine: the systemd timer and the cron line ----------------
_STUB = """#!/bin/sh
# dpdask for the test: records its arguments
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" > "$0.args"
"""


def _unit(name: str):
    import configparser

    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # systemd's keys are case-sensitive
    unit.read_string((DEPLOY / name).read_text())
    return unit


def _runs_the_monthly_period(script: str, binary: str, tmp_path: pathlib.Path) -> None:
    """``script`` (a shell line) runs dpdask ``binary`` on this month's period of the
    monthly spec: run it with a stub for dpdask and check what the stub was given."""
    stub = tmp_path / "dpdask"
    stub.write_text(_STUB)
    stub.chmod(0o755)
    assert binary in script
    before = time.strftime("%Y-%m", time.gmtime())
    subprocess.run(["sh", "-c", script.replace(binary, str(stub))], check=True, cwd=tmp_path)
    args = json.loads((tmp_path / "dpdask.args").read_text())
    assert args[:2] == ["run", "pipelines/pl94-monthly.yaml"], args
    period = args[args.index("--period") + 1]
    assert period in (before, time.strftime("%Y-%m", time.gmtime())), period
    assert "--no-progress" in args
    # the spec it names (relative to the checkout) is a scheduled one
    spec = load_spec(ROOT / args[1], period=period)
    assert spec.release == f"pl94-providence-{period}" and period in spec.output.name
    (tmp_path / "dpdask.args").unlink()


def test_systemd_timer_and_cron_release_this_months_period(tmp_path: pathlib.Path) -> None:
    import shlex

    service, timer = _unit("dpdask-release.service"), _unit("dpdask-release.timer")
    assert service["Service"]["Type"] == "oneshot"
    assert service["Service"]["User"] not in ("root", "0")
    assert timer["Timer"]["OnCalendar"] == "monthly" and timer["Timer"]["Persistent"] == "true"
    assert timer["Install"]["WantedBy"] == "timers.target"
    exec_start = service["Service"]["ExecStart"]
    # systemd expands %-specifiers: every literal % must be written %%
    assert not re.search(r"(?<!%)%(?!%)", exec_start.replace("%%", "")), exec_start
    argv = shlex.split(exec_start.replace("%%", "%"))
    assert argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3
    workdir = service["Service"]["WorkingDirectory"]
    _runs_the_monthly_period(argv[2], f"{workdir}/.venv/bin/dpdask", tmp_path)
    if shutil.which("systemd-analyze"):
        done = subprocess.run(
            ["systemd-analyze", "verify", str(DEPLOY / "dpdask-release.timer"),
             str(DEPLOY / "dpdask-release.service")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    # the cron line of deploy/README.md: cron ends the command at an unescaped %
    (line,) = re.findall(r"^- cron: `([^`]+)`", (DEPLOY / "README.md").read_text(), re.M)
    fields = line.split(None, 5)
    assert len(fields) == 6 and all(re.fullmatch(r"[\d*/,-]+", f) for f in fields[:5])
    command = fields[5]
    assert "%" not in command.replace("\\%", "")
    command = command.replace("\\%", "%").replace("cd /srv/dpdask && ", "")
    command = re.sub(r" >> \S+ 2>&1$", "", command)
    _runs_the_monthly_period(command, ".venv/bin/dpdask", tmp_path)


# -- the compose topology as local processes ---------------------------------------------
RECORDS = "geo,sex,age\n" + "".join(
    f"{g},{(i * 7 + j) % 2},{(i * 5 + j) % 3}\n"
    for j, g in enumerate(("0101", "0102", "0201", "0202"))
    for i in range(25)
)


def _tiny_spec(folder: pathlib.Path, data: pathlib.Path) -> pathlib.Path:
    """A tiny records release, with the compose spec's ``cluster: {insecure: true}``
    (chooses no cluster: the address, if any, comes from the environment)."""
    raw = {
        "release": "tiny",
        "data": {
            "format": "records",
            "path": str(data),
            "geography_column": "geo",
            "levels": {"state": 2, "county": 4},
            "geographies": ["0101", "0102", "0201", "0202"],
        },
        "domain": {"sex": 2, "age": 3},
        "levels": ["state", "county"],
        "workload": "identity",
        "privacy": {"zcdp": 1, "split": {"state": 1, "county": 1}},
        "strategy": "identity",
        "output": str(folder / "out" / "tiny.zarr"),
        "ledger": {"path": str(folder / "state" / "ledger.sqlite"), "create": True},
        "cluster": _spec("specs/compose-release.yaml").cluster,
    }
    folder.mkdir(parents=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _place_key(spec: pathlib.Path, run_id: str, key: bytes) -> None:
    """A run that finds ``.<output>.run-<id>/key`` (0600, folder 0700) uses that key."""
    out = load_spec(spec).output
    work = out.parent / f".{out.name}.run-{run_id}"
    work.mkdir(parents=True, mode=0o700)
    os.chmod(work, 0o700)
    fd = os.open(work / "key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, key)
    finally:
        os.close(fd)


def _arrays(path: pathlib.Path) -> dict[str, np.ndarray]:
    import zarr

    group = zarr.open_group(str(path), mode="r")
    return {
        name: np.asarray(a[...])
        for name, a in group.members(max_depth=None)
        if isinstance(a, zarr.Array)
    }


def _env_without_address() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


@pytest.mark.slow
def test_compose_topology_as_local_processes_publishes_the_local_defaults_bytes(
    tmp_path: pathlib.Path,
) -> None:
    services = _yaml("docker-compose.yml")["services"]
    data = tmp_path / "people.csv"
    data.write_text(RECORDS)
    key, run_id = secrets.token_bytes(32), "deploy-test"
    remote_spec = _tiny_spec(tmp_path / "remote", data)
    local_spec = _tiny_spec(tmp_path / "local", data)
    for spec in (remote_spec, local_spec):
        _place_key(spec, run_id, key)

    env = _env_without_address()
    env.update({k: str(v) for k, v in services["worker"].get("environment", {}).items()})
    scheduler_file = tmp_path / "scheduler.json"
    # the compose scheduler's command, on the loopback address and free ports
    cmd = _command(services["scheduler"])
    cmd[cmd.index("--port") + 1] = "0"
    cmd[cmd.index("--dashboard-address") + 1] = "127.0.0.1:0"
    if not HAVE_DASHBOARD:  # the plugin is another change; without it, no preload
        i = cmd.index("--preload")
        del cmd[i : i + 2]
    cmd += ["--host", "127.0.0.1", "--scheduler-file", str(scheduler_file)]
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    log_files: list[IO[str]] = []  # the processes' standard error, closed once they stop

    def log(name: str) -> IO[str]:
        log_files.append(open(logs / name, "w"))  # closed in the finally
        return log_files[-1]

    try:
        procs.append(
            subprocess.Popen(
                [str(BIN / cmd[0]), *cmd[1:]],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=log("scheduler"),
            )
        )
        deadline = time.monotonic() + 30
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            assert procs[0].poll() is None, (logs / "scheduler").read_text()
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tcp://127.0.0.1:")
        hostport = address.removeprefix("tcp://")

        wcmd = [a.replace("scheduler:8786", hostport) for a in _command(services["worker"])]
        for i in range(services["worker"]["deploy"]["replicas"]):
            procs.append(
                subprocess.Popen(
                    [str(BIN / wcmd[0]), *wcmd[1:], "--host", "127.0.0.1"],
                    env=env,
                    cwd=tmp_path,
                    stdout=subprocess.DEVNULL,
                    stderr=log(f"worker-{i}"),
                )
            )

        runner = services["runner"]
        renv = dict(env)
        for k, v in runner["environment"].items():
            renv[k] = str(v).replace("scheduler:8786", hostport)
        assert renv["DASK_SCHEDULER_ADDRESS"] == address
        rcmd = _command(runner)
        rcmd[2] = str(remote_spec)
        done = subprocess.run(
            [str(BIN / rcmd[0]), *rcmd[1:], "--run-id", run_id],
            env=renv,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]

        # the scheduler started apart ran the release's tasks (and has the plugin)
        import distributed

        with distributed.Client(address, timeout="10s") as client:
            prefixes = client.run_on_scheduler(
                lambda dask_scheduler: sorted(dask_scheduler.task_prefixes)
            )
            plugins = client.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.plugins))
            assert len(client.scheduler_info()["workers"]) == 2
        assert any(p.startswith("answer-county") for p in prefixes), prefixes
        if HAVE_DASHBOARD:
            from dpdask.dashboard import PLUGIN_NAME

            assert PLUGIN_NAME in plugins
    finally:
        _stop(procs[::-1])
        for f in log_files:
            f.close()

    # the reference: the same spec, key and run id on the embedded local default
    done = subprocess.run(
        [
            str(BIN / "dpdask"),
            "run",
            str(local_spec),
            "--run-id",
            run_id,
            "--json",
            "--no-progress",
        ],
        env=_env_without_address(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    remote = _arrays(load_spec(remote_spec).output)
    local = _arrays(load_spec(local_spec).output)
    assert remote and remote.keys() == local.keys()
    for name in remote:
        assert remote[name].dtype == local[name].dtype, name
        np.testing.assert_array_equal(remote[name], local[name], err_msg=name)
    # the runs' work folders (and keys) are gone once published
    for spec in (remote_spec, local_spec):
        assert not list(load_spec(spec).output.parent.glob(".tiny.zarr.run-*"))


# -- the SLURM script, with srun standing in for SLURM -------------------------------------
def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


_FAKE_SRUN = """#!/bin/bash
# srun for the test: drops SLURM's options, starts --ntasks copies of the command
n=1
trap 'kill $(jobs -p) 2>/dev/null' TERM INT EXIT
while [[ "$1" == --* ]]; do
    case "$1" in --ntasks=*) n=${1#--ntasks=} ;; esac
    shift
done
for _ in $(seq "$n"); do "$@" & done
wait
"""


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("openssl") is None, reason="the script makes its certificate with openssl"
)
def test_slurm_script_runs_a_release_over_tls(tmp_path: pathlib.Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(_FAKE_SRUN)
    (fake / "srun").chmod(0o755)
    data = tmp_path / "people.csv"
    data.write_text(RECORDS)
    spec = _tiny_spec(tmp_path / "run", data)
    raw = yaml.safe_load(spec.read_text())
    raw.pop("cluster")  # TLS: nothing to allow
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = _env_without_address()
    env.update(
        PATH=f"{fake}:{BIN}:{env.get('PATH', '')}",
        DPDASK_SHARED=str(tmp_path / "shared"),
        DPDASK_DASHBOARD_ADDRESS="127.0.0.1:0",
        SLURM_JOB_ID="4242",
    )
    job = subprocess.Popen(
        ["bash", str(DEPLOY / "slurm" / "dpdask-release.sbatch"), str(spec)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the test's to end
    )
    try:
        stdout, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None or _group_alive(job.pid):
            os.killpg(job.pid, 15)
            job.wait(timeout=15)
    done = subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "scheduler: tls://" in done.stdout
    assert load_spec(spec).output.exists()
    assert not list((tmp_path / "shared").iterdir())  # the job's certificate folder is gone
