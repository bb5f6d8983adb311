"""deploy/compose.yaml and the Dockerfile, read as Docker would run them (issue 16, items 2 and 6).

No Docker daemon is needed: the compose file is checked against what each service reads (its
settings model: every ``ROUNDHOUSE_*`` variable and ``--flag`` is a setting of the service the
container runs), against the Dockerfile (every volume a container writes is mounted on a folder the
image declares writable, owned by its user, so a new named volume takes that owner; the root
filesystem is read-only), and against the security the issue asks for: a 3-server NATS cluster at
R3 running deploy/nats-server-cluster.conf whose route hosts are the compose service names, nothing
published to the host, each container with its own creds only, workers sharing one checkpoint
volume, PostgreSQL reachable by the scheduler only.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY
from tests.deploy.settings import SERVICE_MODELS, flag_setting, reads_setting

COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
DOCKERFILE = (DEPLOY / "container" / "Dockerfile").read_text()
NATS_SERVERS = ("nats-1", "nats-2", "nats-3")
CLI_READS = {"ROUNDHOUSE_NATS", "ROUNDHOUSE_NAMESPACE", "ROUNDHOUSE_CREDS", "ROUNDHOUSE_USER"}
"""What the roundhouse CLI reads (roundhouse/endpoint.py, roundhouse/client.py)."""


def roundhouse_services() -> dict[str, str]:
    """Compose service -> the Roundhouse service kind it runs (``service KIND``)."""
    out = {}
    for name, service in SERVICES.items():
        command = service.get("command") or []
        if command[:1] == ["service"]:
            out[name] = command[1]
    return out


def mounts(service: dict[str, Any]) -> list[dict[str, Any]]:
    """The service's volumes in long form."""
    out = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target, *mode = volume.split(":")
            out.append({"type": "bind" if source.startswith((".", "/")) else "volume", "source": source,
                        "target": target, "read_only": mode == ["ro"]})  # fmt: skip
        else:
            out.append(volume)
    return out


def mount_of(service: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The deepest mount holding ``path``."""
    found = [m for m in mounts(service) if PurePosixPath(path).is_relative_to(m["target"])]
    return max(found, key=lambda m: len(m["target"]), default=None)


def image_writable_dirs() -> set[str]:
    """Folders the Dockerfile creates owned by the roundhouse user (``install -d -o roundhouse ...``)."""
    text = DOCKERFILE.replace("\\\n", " ")
    (line,) = [ln for ln in text.splitlines() if "install -d -o roundhouse" in ln]
    words = shlex.split(line.split("install -d -o roundhouse", 1)[1].split("&&", 1)[0])
    return {w for w in words if w.startswith("/")}


def image_workdir() -> str:
    workdirs: list[str] = re.findall(r"^WORKDIR (\S+)$", DOCKERFILE, re.MULTILINE)
    return workdirs[-1]


def flags(command: list[str]) -> dict[str, str]:
    return {command[i]: command[i + 1] for i in range(len(command) - 1) if command[i].startswith("--")}


@pytest.mark.parametrize("name", sorted(roundhouse_services()))
def test_every_setting_a_container_passes_is_one_its_service_reads(name: str) -> None:
    service, kind = SERVICES[name], roundhouse_services()[name]
    assert kind in SERVICE_MODELS
    for flag in flags(service["command"]):
        assert flag_setting(kind, flag), f"{name}: `roundhouse service {kind}` has no {flag}"
    for variable in service["environment"]:
        if variable.startswith("ROUNDHOUSE_"):
            assert reads_setting(kind, variable), f"{name}: {kind} reads no {variable}"


def test_the_cli_container_passes_only_what_the_cli_reads() -> None:
    assert {v for v in SERVICES["cli"]["environment"] if v.startswith("ROUNDHOUSE_")} <= CLI_READS


@pytest.mark.parametrize("name", sorted(roundhouse_services()))
def test_each_container_holds_only_its_own_credentials_and_the_ca(name: str) -> None:
    service, kind = SERVICES[name], roundhouse_services()[name]
    creds = flags(service["command"])["--creds"]
    mount = mount_of(service, creds)
    assert mount is not None, f"{name}: {creds} is on no volume"
    assert mount["read_only"] is True
    identity = PurePosixPath(creds).stem
    if kind == "worker":
        assert mount["source"] == "nodes"
        assert mount["volume"]["subpath"] == identity == flags(service["command"])["--node-id"]
    else:
        assert mount["source"] == "auth"
        assert mount["volume"]["subpath"] == kind == identity
    assert all(m["source"] != "auth" or m.get("volume", {}).get("subpath") for m in mounts(service))
    trust = mount_of(service, service["environment"]["SSL_CERT_FILE"])
    assert trust is not None
    assert trust["volume"]["subpath"] == "trust"


def test_nats_is_a_three_server_cluster_at_r3_that_nothing_outside_reaches() -> None:
    for name, service in SERVICES.items():
        assert "ports" not in service, f"{name} publishes ports to the host"
        assert service.get("network_mode") in (None, "none"), name
    conf = (DEPLOY / "nats-server-cluster.conf").read_text()
    routes = set(re.findall(r"nats-route://([\w-]+):6222", conf))
    assert routes == set(NATS_SERVERS)
    init_names = SERVICES["init"]["environment"]["TLS_NAMES"].split()
    for server in NATS_SERVERS:
        service = SERVICES[server]
        assert service["command"][-2:] == ["--name", server]
        (config,) = [m for m in mounts(service) if m["target"] == "/etc/roundhouse/nats-server.conf"]
        assert config["source"] == "./nats-server-cluster.conf"
        assert server in init_names  # the route check wants the host in the shared certificate
        # The brokers see auth.conf, not the creds files.
        auth = mount_of(service, "/etc/roundhouse/auth/auth.conf")
        assert auth is not None
        assert auth["source"] == "broker-auth"
        assert "healthcheck" in service
    for name in roundhouse_services():
        env = SERVICES[name]["environment"]
        assert env["ROUNDHOUSE_STREAM_REPLICAS"] == "3"
        assert {u.split("//")[1].split(":")[0] for u in env["ROUNDHOUSE_NATS"].split(",")} == set(NATS_SERVERS)
        assert all(u.startswith("tls://") for u in env["ROUNDHOUSE_NATS"].split(","))


def test_every_written_path_is_a_volume_on_a_folder_the_image_makes_writable() -> None:
    writable = image_writable_dirs()
    workdir = image_workdir()
    assert workdir in writable
    for name, service in SERVICES.items():
        if "build" not in service:
            continue  # not this Dockerfile's image (postgres, prometheus): its own folders and user
        assert service.get("read_only") is True, f"{name}: root filesystem not read-only"
        for mount in mounts(service):
            if mount["type"] == "volume" and not mount.get("read_only"):
                assert mount["target"] in writable, f"{name}: volume on {mount['target']}, not an image folder"
    for name, kind in roundhouse_services().items():
        service = SERVICES[name]
        env = service["environment"]
        paths = []
        if kind == "scheduler":
            assert env["ROUNDHOUSE_DB"].startswith("postgresql://")
        if kind == "worker":
            paths += [env["ROUNDHOUSE_CHECKPOINT_ROOT"], f"{workdir}/.roundhouse/worker"]  # work_dir's default
        for path in paths:
            holder = mount_of(service, path)
            assert holder is not None, f"{name} writes {path} on the read-only root filesystem"
            assert not holder.get("read_only"), (name, path)


def test_workers_share_one_checkpoint_volume_and_run_the_worker_image() -> None:
    workers = [n for n, k in roundhouse_services().items() if k == "worker"]
    assert len(workers) >= 2
    sources = set()
    for name in workers:
        service = SERVICES[name]
        assert service["build"]["target"] == "worker"
        mount = mount_of(service, service["environment"]["ROUNDHOUSE_CHECKPOINT_ROOT"])
        assert mount is not None
        sources.add((mount["source"], mount["target"]))
        assert flags(service["command"])["--host"] == service["hostname"]  # peers reach its ranks
    assert len(sources) == 1


def test_postgresql_is_the_schedulers_alone() -> None:
    scheduler, postgres = SERVICES["scheduler"], SERVICES["postgres"]
    url = scheduler["environment"]["ROUNDHOUSE_DB"]
    assert "@postgres:" in url
    assert ":" not in url.split("//")[1].split("@")[0]  # no password in the URL
    assert mount_of(scheduler, scheduler["environment"]["PGPASSFILE"]) is not None
    assert mount_of(postgres, postgres["environment"]["POSTGRES_PASSWORD_FILE"]) is not None
    on_db = {n for n, s in SERVICES.items() if "db" in s.get("networks", [])}
    assert on_db == {"scheduler", "postgres"}


def test_volumes_and_dependencies_are_declared() -> None:
    declared = set(COMPOSE["volumes"])
    used = {m["source"] for s in SERVICES.values() for m in mounts(s) if m["type"] == "volume"}
    assert used == declared
    for name, service in SERVICES.items():
        assert set(service.get("depends_on", {})) <= set(SERVICES), name


def test_the_dockerfile_pins_its_base_runs_as_non_root_and_checks_health() -> None:
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE, re.MULTILINE)
    # A full version and a Debian release (or a digest), never a moving tag such as 3.11-slim.
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, re.MULTILINE)
    assert users[-1] == "10001:10001"
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD \[\"roundhouse-healthcheck\"", DOCKERFILE, re.MULTILINE)
    assert re.search(r"^FROM control-plane AS worker$", DOCKERFILE, re.MULTILINE)
    assert "COPY examples /opt/roundhouse/examples" in DOCKERFILE
    assert "torch==${TORCH_VERSION}" in DOCKERFILE
