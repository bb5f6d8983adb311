"""The services run as the image runs them: a non-root user that may write only the folders the image
declares writable (issue 16, item 6).

As root (CI), with ``setpriv``: every compose service (admission, scheduler, placement, metrics, a
worker) starts as uid 10001, the image's user, from the command compose.yaml gives it, in a working
directory standing for the image's WORKDIR, with its own creds file in a folder of its own and the
relative defaults (the scheduler's SQLite store `.roundhouse`, the worker's work_dir) left to resolve
there, the worker's checkpoints in a shared folder standing for the checkpoint volume. Nothing else
on the machine is writable by that uid. Each service must answer the health check the image runs
(roundhouse-healthcheck: an operator's ping finds this instance; the service's own identity passes
with --connect-only-if-refused), a job submitted as a user must complete on the worker, and every
file the services made must lie inside the writable folders. The bus is the bundled nats-server with
the generated authorization (TLS is deploy/nats-server*.conf's business, tested in
tests/integration/test_deploy_security.py).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from schemas.roles import Role
from services.runtime.auth import AuthDirectory
from services.runtime.broker import Broker
from tests.deploy.conftest import DEPLOY, REPO

UID = 10001
VENV_BIN = Path(sys.executable).parent
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
RUN = ("admission", "scheduler", "placement", "metrics", "worker-0")
READY_S = 30.0

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to run as another uid"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux) to drop to uid 10001"),
]


def as_image_user(*argv: str) -> list[str]:
    return ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all", *argv]


def image_user_python() -> tuple[str, dict[str, str]] | str:
    """An interpreter uid 10001 can run, and can run again from a child (the worker spawns its
    watchdog with ``sys.executable``), with this checkout and its packages importable: this one, else
    the same minor version on PATH given the virtual environment's site-packages (a venv made from a
    Python under /root cannot be executed by another user). A string says why there is none."""
    import site
    import sysconfig

    path = os.pathsep.join([str(REPO), *site.getsitepackages(), sysconfig.get_paths()["purelib"]])
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [shutil.which(minor), shutil.which(minor, path="/usr/local/bin:/usr/bin")]
    candidates: list[tuple[str, dict[str, str]]] = [(sys.executable, {})]
    candidates += [(p, {"PYTHONPATH": path}) for p in dict.fromkeys(filter(None, found))]
    probe = "import subprocess, sys, services, roundhouse; subprocess.run([sys.executable, '-c', ''], check=True)"
    why = []
    for python, env in candidates:
        done = subprocess.run(as_image_user(python, "-c", probe), capture_output=True, text=True, timeout=60,
                              check=False, cwd="/", env={"PATH": "/usr/bin:/bin", **env})  # fmt: skip
        if done.returncode == 0:
            return python, env
        why.append(f"{python}: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return f"uid {UID} cannot run this checkout's Python ({'; '.join(why)})"


def healthcheck_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("roundhouse_healthcheck", DEPLOY / "container" / "healthcheck.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def private_dir(path: Path, owner: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, owner, owner)
    path.chmod(0o700)
    return path


@pytest.fixture
def root() -> Iterator[Path]:
    # Not pytest's tmp_path: its parents are private to root, and uid 10001 must traverse to its folders.
    path = Path(tempfile.mkdtemp(prefix="rh-nonroot-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_services_run_as_the_image_user_writing_only_the_image_folders(root: Path) -> None:
    found = image_user_python()
    if isinstance(found, str):
        pytest.skip(found)
    python, python_env = found

    auth = AuthDirectory(root / "auth")
    auth.init(namespace="prod", users=("alice",), nodes=("node-0",))
    broker = Broker(root / "broker", authorization=auth.server_config_path)
    url = broker.start()
    checkpoints = private_dir(root / "checkpoints", UID)  # the shared checkpoint volume
    processes: dict[str, subprocess.Popen[bytes]] = {}
    homes: dict[str, Path] = {}
    try:
        for name in RUN:
            service = COMPOSE["services"][name]
            command = list(service["command"])
            kind = command[1]
            role, identity = (Role.WORKER, "node-0") if kind == "worker" else (Role(kind), kind)
            # The container: a WORKDIR of its own (/var/lib/roundhouse), its creds alone in a folder.
            home = private_dir(root / name / "var-lib-roundhouse", UID)
            creds = private_dir(root / name / "creds", UID) / f"{identity}.creds"
            shutil.copy(auth.creds_path(role, identity), creds)
            os.chown(creds, UID, UID)
            creds.chmod(0o600)
            command[command.index("--creds") + 1] = str(creds)
            if "--host" in command:
                command[command.index("--host") + 1] = "127.0.0.1"
            env = {
                "PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(home), "ROUNDHOUSE_NATS": url,
                "ROUNDHOUSE_NAMESPACE": service["environment"]["ROUNDHOUSE_NAMESPACE"], "ROUNDHOUSE_INSTANCE": name,
                "ROUNDHOUSE_LOG_FORMAT": "text", **python_env,
            }  # fmt: skip
            if kind == "worker":
                env["ROUNDHOUSE_CHECKPOINT_ROOT"] = str(checkpoints)
            log = (root / f"{name}.log").open("wb")
            processes[name] = subprocess.Popen(
                as_image_user(python, "-m", "roundhouse", *command), cwd=home, env=env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            homes[name] = home

        healthcheck = healthcheck_module()

        def logs() -> str:
            return "\n".join(f"--- {n}\n{(root / f'{n}.log').read_text()[-1500:]}" for n in RUN)

        async def answering(name: str, creds_path: Path, instance: str | None, connect_only: bool) -> tuple[int, str]:
            kind = COMPOSE["services"][name]["command"][1]
            result: tuple[int, str] = await healthcheck.check(
                kind, servers=[url], creds_path=creds_path, namespace="prod", instance=instance, timeout_s=1.0,
                connect_only_if_refused=connect_only,
            )  # fmt: skip
            return result

        operator = auth.creds_path(Role.OPERATOR, "operator")
        deadline = time.monotonic() + READY_S
        waiting = set(RUN)
        while waiting:
            for name in sorted(waiting):
                assert processes[name].poll() is None, f"{name} exited as uid {UID}:\n{logs()}"
                if asyncio.run(answering(name, operator, name, False))[0] == healthcheck.EXIT_HEALTHY:
                    waiting.discard(name)
            assert time.monotonic() < deadline, f"{sorted(waiting)} never answered $SRV.PING:\n{logs()}"

        # The image's own check, as the image's user with the service's own creds file.
        for name in RUN:
            creds = next((root / name / "creds").iterdir())
            done = subprocess.run(
                as_image_user(python, str(DEPLOY / "container" / "healthcheck.py"),
                              COMPOSE["services"][name]["command"][1], "--creds", str(creds), "--nats", url,
                              "--namespace", "prod", "--instance", name, "--connect-only-if-refused"),
                capture_output=True, text=True, timeout=30, check=False, cwd=homes[name],
                env={"PATH": "/usr/bin:/bin", **python_env},
            )  # fmt: skip
            assert done.returncode == 0, f"{name}: {done.stderr}"

        # A job runs on the worker, as that user, from its working directory.
        cli = [str(VENV_BIN / "roundhouse")]
        endpoint = ["--nats", url, "--namespace", "prod", "--creds", str(auth.creds_path(Role.USER, "alice"))]
        submitted = subprocess.run(
            [*cli, "submit", "--gpus", "1", "--json", *endpoint, "--", python, "-c", "print('ok')"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr + logs()
        job_id = json.loads(submitted.stdout)["job_id"]
        deadline = time.monotonic() + READY_S
        status = None
        while status != "completed":
            listed = subprocess.run([*cli, "jobs", "--all", "--json", *endpoint, job_id], capture_output=True,
                                    text=True, timeout=60, check=False)  # fmt: skip
            jobs = json.loads(listed.stdout)["jobs"] if listed.returncode == 0 else []
            status = jobs[0]["status"] if jobs else None
            assert status != "failed", f"the job failed:\n{logs()}"
            assert time.monotonic() < deadline, f"job {job_id} is {status}, not completed:\n{logs()}"
            time.sleep(0.2)
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        broker.stop()

    # The relative defaults resolved in the working directory, and nothing was written elsewhere.
    assert (homes["scheduler"] / ".roundhouse" / "roundhouse.db").is_file()
    assert (homes["worker-0"] / ".roundhouse" / "worker").is_dir()
    writable = [*homes.values(), checkpoints, *(root / n / "creds" for n in RUN)]
    for path in root.rglob("*"):
        if path.lstat().st_uid == UID:
            assert any(path == w or path.is_relative_to(w) for w in writable), f"uid {UID} wrote {path}"
