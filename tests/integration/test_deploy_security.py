"""The deploy configurations are secure as shipped (issue 13, items 1 and 6: "the deploy files do the
same for a real cluster, with TLS on"; "the bundled and deploy configurations are both tested").

The bundled nats-server runs ``deploy/nats-server.conf`` and ``deploy/nats-server-cluster.conf``
themselves: each file is copied into a temporary /etc/roundhouse-like folder and only its site-specific
values are rewritten (addresses and ports, the JetStream store, the certificate paths, the server name
and route hosts), each rewrite required to match, and no /etc or /var path may survive in a setting.
The ``include "auth/auth.conf"`` stays as shipped: beside the copy sits a credentials directory made
by ``AuthDirectory.init`` (what ``roundhouse auth init`` runs), and TLS uses a CA and a server
certificate made here with openssl. Clients are the services' own :class:`Bus`, trusting the CA
through ``SSL_CERT_FILE`` exactly as deploy/README.md tells an operator to.

Checked: no credentials, refused; valid credentials without TLS, refused; over TLS with credentials,
a role does what it may and the broker refuses what it may not (a user deleting the event stream, a
worker listening to another node's grants); the cluster file forms a 3-server cluster over mutual-TLS
routes, carries messages between servers and replicates the stream three times.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import nkeys
import pytest

from schemas.roles import Role
from services.runtime.auth import AuthDirectory
from services.runtime.broker import find_server_binary, free_ports
from services.runtime.bus import AuthenticationError, Bus, BusOptions
from tests.bus_probes import reaches
from tests.tls_certs import Pki, make_pki, openssl_binary

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
USERS = ("alice", "bob")
NODES = ("node-a", "node-b")
START_S = 20.0
"""Bound on a server's start (ports file written) and on the cluster's forming."""
WAIT_S = 1.0
"""How long a message the broker lets through takes at most to arrive (local servers)."""

pytestmark = pytest.mark.skipif(openssl_binary() is None, reason="needs the openssl binary to make test certificates")


# --- the deploy files, made local ------------------------------------------------------------------------
def rewrite(text: str, pattern: str, replacement: str | Callable[[re.Match[str]], str], count: int) -> str:
    """``text`` with ``pattern`` replaced; exactly ``count`` matches or the test fails (a deploy file that
    changed shape must be looked at, not silently tested in some other form)."""
    result, found = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert found == count, f"expected {count} match(es) of {pattern!r} in the deploy file, found {found}"
    return result


def settings_only(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def localize(
    text: str, *, etc: Path, tls: Path, store: Path, client_port: int, tls_paths: int, http_port: int | None = None
) -> str:
    """The rewrites both files need: client listener, store, certificate paths."""
    text = rewrite(text, r"^listen: 0\.0\.0\.0:4222$", f"listen: 127.0.0.1:{client_port}", 1)
    text = rewrite(text, r"^(\s*)store_dir: /var/lib/roundhouse/nats$", rf'\1store_dir: "{store}"', 1)
    # Loopback monitoring as shipped; a port of the server's choosing unless the test names one.
    text = rewrite(text, r"^http: 127\.0\.0\.1:8222$", f"http: 127.0.0.1:{http_port or -1}", 1)
    text = rewrite(text, r'"/etc/roundhouse/tls/', f'"{tls}/', tls_paths)
    # Kept as shipped, and it only works where it sits: beside the config, relative.
    assert re.search(r'^include "auth/auth\.conf"$', text, re.MULTILINE)
    assert (etc / "auth" / "auth.conf").is_file()
    return text


def assert_local(text: str) -> None:
    leftover = [line for line in settings_only(text).splitlines() if "/etc/" in line or "/var/" in line]
    assert not leftover, f"site-specific settings not rewritten: {leftover}"


@dataclass(slots=True)
class Server:
    """One nats-server running a rewritten deploy file."""

    config: Path
    client_port: int
    http_port: int | None = None
    route_port: int | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        # tls:// as deploy/README.md writes it; the server requires TLS either way.
        return f"tls://127.0.0.1:{self.client_port}"

    @property
    def log(self) -> Path:
        return self.config.with_name("nats-server.log")

    def start(self) -> None:
        ports_dir = self.config.parent / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        checked = subprocess.run(
            [str(find_server_binary()), "-t", "-c", str(self.config)], check=False, capture_output=True, text=True,
            timeout=30,
        )  # fmt: skip
        assert checked.returncode == 0, f"nats-server rejects the deploy configuration: {checked.stderr}"
        self.process = subprocess.Popen(
            [str(find_server_binary()), "-c", str(self.config),
             "--ports_file_dir", str(ports_dir), "-l", str(self.log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        # The server writes its ports file once every listener is up: readiness, not a guessed delay.
        deadline = time.monotonic() + START_S
        while not any(ports_dir.glob("*.ports")):
            if self.process.poll() is not None:
                stderr = self.process.stderr.read().decode() if self.process.stderr else ""
                raise AssertionError(f"nats-server exited ({self.process.returncode}): {stderr}{self.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"nats-server not listening within {START_S} s: {self.log_tail()}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stderr is not None:
            self.process.stderr.close()
        self.process = None

    def log_tail(self, lines: int = 8) -> str:
        try:
            return "\n" + "\n".join(self.log.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def monitor(self, path: str) -> tuple[int, dict[str, Any]]:
        """GET the monitoring endpoint ``path``: (status, JSON body); (0, {}) if it does not answer."""
        assert self.http_port is not None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=2) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, {}
        except (OSError, ValueError):
            return 0, {}


@dataclass(frozen=True, slots=True)
class Deployment:
    servers: list[Server]
    auth: AuthDirectory
    pki: Pki
    namespace: str

    def creds(self, role: Role, name: str | None = None) -> Path:
        return self.auth.creds_path(role, name or role.value)


def make_etc(root: Path, auth_source: AuthDirectory | None, namespace: str) -> tuple[Path, AuthDirectory]:
    """A folder laid out like /etc/roundhouse: ``auth/`` from ``roundhouse auth init`` (or a copy of the
    first server's, as an operator copies auth.conf to the other hosts)."""
    etc = root / "etc-roundhouse"
    etc.mkdir(parents=True)
    auth = AuthDirectory(etc / "auth")
    if auth_source is None:
        auth.init(namespace=namespace, users=USERS, nodes=NODES)
    else:
        auth.root.mkdir(mode=0o700)
        (auth.root / "auth.conf").write_text(auth_source.server_config_path.read_text())
        (auth.root / "auth.conf").chmod(0o600)
    return etc, auth


@contextlib.contextmanager
def running(servers: list[Server]) -> Iterator[list[Server]]:
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Deployment]:
    """deploy/nats-server.conf on a free port."""
    root = tmp_path_factory.mktemp("deploy-single")
    namespace = f"d{uuid.uuid4().hex[:12]}"
    etc, auth = make_etc(root, None, namespace)
    (port,) = free_ports(1)
    text = localize((DEPLOY / "nats-server.conf").read_text(), etc=etc, tls=pki.ca_cert.parent,
                    store=root / "jetstream", client_port=port, tls_paths=3)  # fmt: skip
    assert_local(text)
    config = etc / "nats-server.conf"
    config.write_text(text)
    with running([Server(config, port)]) as servers:
        yield Deployment(servers, auth, pki, namespace)


@pytest.fixture
def trust_ca(monkeypatch: pytest.MonkeyPatch, pki: Pki) -> None:
    """Services trust the private CA as deploy/README.md says: SSL_CERT_FILE (read by Python's default
    SSL context, which nats-py uses to verify the server)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_cert))


class ConnectAs(Protocol):
    """Connect to ``deployment`` (its first server unless ``server``) over TLS as one identity."""

    async def __call__(
        self, deployment: Deployment, role: Role, name: str | None = None, *,
        server: Server | None = None, provision: bool = False, replicas: int = 1,
    ) -> Bus: ...  # fmt: skip


@pytest.fixture
async def connect(trust_ca: None) -> AsyncIterator[ConnectAs]:
    opened: list[Bus] = []

    async def connect_as(deployment: Deployment, role: Role, name: str | None = None, *,
                         server: Server | None = None, provision: bool = False, replicas: int = 1) -> Bus:  # fmt: skip
        bus = await Bus.connect(
            (server or deployment.servers[0]).url, name=f"test-{role.value}", provision=provision,
            options=BusOptions(namespace=deployment.namespace, max_reconnect_attempts=1, publish_timeout_s=WAIT_S,
                               stream_replicas=replicas),
            creds=deployment.creds(role, name),
        )  # fmt: skip
        opened.append(bus)
        return bus

    yield connect_as
    for bus in opened:
        await bus.close()


async def answer_to_plain_text(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: bytes) -> bytes:
    """Send ``line`` in clear text and read all the server says until it closes the connection."""
    writer.write(line)
    await writer.drain()
    return await asyncio.wait_for(reader.read(), 5)


async def hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def delivered(listener: Bus, speaker: Bus, subject: str) -> bool:
    """Whether what ``speaker`` publishes on ``subject`` reaches ``listener``'s subscription."""
    return await reaches(listener, speaker, subject, WAIT_S)


async def violation(caplog: pytest.LogCaptureFixture, subject: str) -> str:
    """The broker's permissions violation naming ``subject`` as the bus logged it (bounded wait)."""
    deadline = time.monotonic() + 2 * WAIT_S
    while time.monotonic() < deadline:
        for record in caplog.records:
            text = record.getMessage()
            if "permission denied" in text and f'"{subject}"'.lower() in text.lower():
                return text
        await asyncio.sleep(0.02)
    raise AssertionError(f"no permissions violation for {subject!r}")


async def wait_until(check: Callable[[], bool], what: str, timeout_s: float = START_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.1)


# --- the shipped files -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["nats-server.conf", "nats-server-cluster.conf"])
def test_the_shipped_file_requires_tls_and_credentials(name: str) -> None:
    settings = settings_only((DEPLOY / name).read_text())
    assert "no_auth_user" not in settings, "anonymous access"
    assert re.search(r"^tls \{", settings, re.MULTILINE), "no TLS for clients"
    assert re.search(r'^include "auth/auth\.conf"$', settings, re.MULTILINE), "no generated authorization"
    assert not re.search(r"^\s*(authorization|accounts)\s*\{", settings, re.MULTILINE), "users written by hand"
    if name == "nats-server-cluster.conf":
        cluster = settings[settings.index("cluster {") :]
        assert re.search(r"tls \{[^}]*verify: true", cluster), "routes without mutual TLS"


# --- one server: deploy/nats-server.conf -----------------------------------------------------------------
async def test_a_client_without_credentials_is_refused(single: Deployment, trust_ca: None) -> None:
    with pytest.raises(AuthenticationError, match="requires credentials"):
        await Bus.connect(single.servers[0].url, provision=False,
                          options=BusOptions(namespace=single.namespace, max_reconnect_attempts=1))  # fmt: skip


async def test_valid_credentials_without_tls_are_refused(single: Deployment) -> None:
    """A client that speaks plain NATS, with alice's real key and a valid signature of the nonce: the
    server announces TLS as required and drops the connection instead of authenticating it."""
    creds = single.auth.credentials(Role.USER, "alice")
    reader, writer = await asyncio.open_connection("127.0.0.1", single.servers[0].client_port)
    try:
        info = json.loads((await asyncio.wait_for(reader.readline(), WAIT_S)).decode().removeprefix("INFO "))
        assert info.get("tls_required") is True
        assert info.get("auth_required") is True
        signed = nkeys.from_seed(bytearray(creds.seed.encode())).sign(info["nonce"].encode())
        connect = {"verbose": True, "pedantic": False, "tls_required": False, "nkey": creds.public_key,
                   "sig": base64.b64encode(signed).decode(), "protocol": 1}  # fmt: skip
        answer = await answer_to_plain_text(reader, writer, f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
    finally:
        await hang_up(writer)
    assert b"+OK" not in answer, answer
    assert b"PONG" not in answer, answer


async def test_a_user_over_tls_submits_as_itself_but_cannot_delete_the_stream(
    single: Deployment, connect: ConnectAs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="roundhouse.bus")
    scheduler = await connect(single, Role.SCHEDULER, provision=True)  # creates the event stream: its role may
    operator = await connect(single, Role.OPERATOR, "operator")
    alice = await connect(single, Role.USER, "alice")
    assert alice.nc.connected_url is not None
    assert alice.nc.connected_url.scheme == "tls"
    assert await delivered(operator, alice, "job.arrived.alice")  # her submissions: allowed
    assert not await delivered(operator, alice, "job.arrived.bob")  # as someone else: refused
    await violation(caplog, alice.wire("job.arrived.bob"))

    delete = f"$JS.API.STREAM.DELETE.{alice.stream_name}"
    await alice.nc.publish(delete, b"")
    await alice.nc.flush()
    await violation(caplog, delete)
    info = await operator.js.stream_info(scheduler.stream_name)
    assert info.config.name == scheduler.stream_name  # still there


async def test_a_worker_over_tls_hears_only_its_own_node(
    single: Deployment, connect: ConnectAs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="roundhouse.bus")
    scheduler = await connect(single, Role.SCHEDULER)
    worker = await connect(single, Role.WORKER, "node-a")
    assert await delivered(worker, scheduler, "lease.grant.node-a")  # its own grants: allowed
    assert not await delivered(worker, scheduler, "lease.grant.node-b")  # another node's: refused
    await violation(caplog, worker.wire("lease.grant.node-b"))
    assert not await delivered(scheduler, worker, "node.heartbeat.node-b")  # speaking for node-b: refused
    await violation(caplog, worker.wire("node.heartbeat.node-b"))


async def test_a_rotated_key_is_refused_after_a_reload(single: Deployment, connect: ConnectAs) -> None:
    """deploy/README.md's rotation: delete the creds file, `roundhouse auth init` again (a new key, the old
    one dropped from auth.conf), reload the broker: the old key's connection is closed and it cannot
    connect again, while the new file connects."""
    old = single.auth.credentials(Role.USER, "bob")
    session = await connect(single, Role.USER, "bob")
    single.auth.creds_path(Role.USER, "bob").unlink()
    single.auth.init(namespace=single.namespace, users=USERS, nodes=NODES)
    assert single.auth.credentials(Role.USER, "bob").public_key != old.public_key
    process = single.servers[0].process
    assert process is not None
    process.send_signal(signal.SIGHUP)  # what `systemctl reload roundhouse-nats` sends

    await wait_until(lambda: session.nc.is_closed, "the old key's connection closed", timeout_s=10)
    with pytest.raises(AuthenticationError, match="refused the credentials of user bob"):
        await Bus.connect(single.servers[0].url, provision=False, creds=old,
                          options=BusOptions(namespace=single.namespace, max_reconnect_attempts=1))  # fmt: skip
    await connect(single, Role.USER, "bob")  # the new file


# --- compose: container/compose-init.sh's output, used as compose.yaml mounts it ---------------------------
async def test_the_compose_init_output_runs_the_shipped_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """compose-init.sh (run here, outside Docker, on temporary folders) makes identities and certificates
    that the unchanged deploy/nats-server.conf accepts; a worker with only its node's copied file and the
    trust/ CA connects over TLS by the name `localhost`. Run twice: the second run keeps every key."""
    etc = tmp_path / "etc-roundhouse"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "AUTH_DIR": str(etc / "auth"), "PKI_DIR": str(tmp_path / "pki"), "NODES_DIR": str(tmp_path / "nodes"),
        "DB_DIR": str(tmp_path / "db"), "BROKER_DIR": str(tmp_path / "broker"),
        "NAMESPACE": "prod", "USERS": "alice", "NODES": "node-0 node-1", "TLS_NAMES": "nats localhost",
    }  # fmt: skip
    script = DEPLOY / "container" / "compose-init.sh"
    for _ in range(2):
        done = await asyncio.to_thread(
            subprocess.run, ["sh", str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
    assert "created" not in done.stdout  # the second run made nothing new
    node_creds = tmp_path / "nodes" / "node-0" / "node-0.creds"
    assert node_creds.read_text() == (etc / "auth" / "worker" / "node-0.creds").read_text()
    assert stat.S_IMODE(node_creds.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "pki" / "server" / "server.key").stat().st_mode) == 0o600

    (port,) = free_ports(1)
    text = localize((DEPLOY / "nats-server.conf").read_text(), etc=etc, tls=tmp_path / "pki" / "server",
                    store=tmp_path / "jetstream", client_port=port, tls_paths=3)  # fmt: skip
    config = etc / "nats-server.conf"
    config.write_text(text)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "pki" / "trust" / "ca.crt"))
    with running([Server(config, port)]):
        bus = await Bus.connect(f"tls://localhost:{port}", provision=False, creds=node_creds,
                                options=BusOptions(namespace="prod", max_reconnect_attempts=1))  # fmt: skip
        try:
            assert bus.identity == "node-0"
        finally:
            await bus.close()


# --- three servers: deploy/nats-server-cluster.conf ------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Deployment]:
    """deploy/nats-server-cluster.conf on three servers, free ports, routes to each other over TLS."""
    shipped = (DEPLOY / "nats-server-cluster.conf").read_text()
    namespace = f"c{uuid.uuid4().hex[:12]}"
    ports = free_ports(9)
    client_ports, http_ports, route_ports = ports[0:3], ports[3:6], ports[6:9]
    servers: list[Server] = []
    first_auth: AuthDirectory | None = None
    for index in range(3):
        root = tmp_path_factory.mktemp(f"deploy-nats-{index + 1}")
        etc, auth = make_etc(root, first_auth, namespace)
        first_auth = first_auth or auth
        text = localize(shipped, etc=etc, tls=pki.ca_cert.parent, store=root / "jetstream",
                        client_port=client_ports[index], tls_paths=6, http_port=http_ports[index])  # fmt: skip
        text = rewrite(text, r"^server_name: nats-1$", f"server_name: nats-{index + 1}", 1)
        text = rewrite(text, r"^(\s*)listen: 0\.0\.0\.0:6222$", rf"\g<1>listen: 127.0.0.1:{route_ports[index]}", 1)
        # The hosts' names become localhost (the test certificate's DNS name, which
        # verify_cert_and_check_known_urls matches against the route URLs).
        text = rewrite(text, r"nats-route://nats-(\d):6222",
                       lambda m: f"nats-route://localhost:{route_ports[int(m.group(1)) - 1]}", 3)  # fmt: skip
        assert_local(text)
        config = etc / "nats-server.conf"
        config.write_text(text)
        servers.append(Server(config, client_ports[index], http_ports[index], route_ports[index]))
    assert first_auth is not None
    with running(servers):
        yield Deployment(servers, first_auth, pki, namespace)


@pytest.mark.nats_cluster
async def test_the_cluster_file_forms_a_cluster_over_tls_routes(cluster: Deployment, connect: ConnectAs) -> None:
    def routed_and_healthy() -> bool:
        for index, server in enumerate(cluster.servers):
            # Route pooling opens several routes per peer: compare the peers' names.
            others = {f"nats-{i}" for i in (1, 2, 3)} - {f"nats-{index + 1}"}
            status, routes = server.monitor("/routez")
            if status != 200 or {route.get("remote_name") for route in routes.get("routes", [])} != others:
                return False
            if server.monitor("/healthz")[0] != 200:
                return False
        return True

    await wait_until(routed_and_healthy, "every server routed to the other two and healthy")
    for server in cluster.servers:
        _, varz = server.monitor("/varz")
        assert varz["tls_required"] is True  # clients
        assert varz["cluster"]["tls_required"] is True
        assert varz["cluster"]["tls_verify"] is True
        _, jsz = server.monitor("/jsz")
        assert jsz["meta_cluster"]["cluster_size"] == 3

    # A message crosses the routes: alice on server 1, the operator on server 3.
    alice = await connect(cluster, Role.USER, "alice", server=cluster.servers[0])
    operator = await connect(cluster, Role.OPERATOR, "operator", server=cluster.servers[2])
    assert await delivered(operator, alice, "job.arrived.alice")
    assert not await delivered(operator, alice, "job.arrived.bob")  # permissions hold on every server

    # JetStream replicates over them: the scheduler provisions an R3 stream from server 2.
    scheduler = await connect(cluster, Role.SCHEDULER, server=cluster.servers[1], provision=True,
                              replicas=3)  # fmt: skip
    info = await scheduler.js.stream_info(scheduler.stream_name)
    assert info.config.num_replicas == 3
    assert info.cluster is not None
    assert len(info.cluster.replicas or []) == 2


@pytest.mark.nats_cluster
async def test_a_route_without_tls_is_refused(cluster: Deployment) -> None:
    """Something that reaches the route port but does not speak TLS is not taken for a server: a route
    listener with TLS expects the handshake first (it sends no INFO in clear) and drops plain text."""
    route_port = cluster.servers[0].route_port
    assert route_port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", route_port)
    try:
        connect = b'CONNECT {"verbose":false,"pedantic":false,"tls_required":false,"name":"intruder"}\r\nPING\r\n'
        answer = await answer_to_plain_text(reader, writer, connect)
    finally:
        await hang_up(writer)
    assert b"INFO" not in answer, answer
    assert b"PONG" not in answer, answer
    _, routes = cluster.servers[0].monitor("/routez")
    assert {route.get("remote_name") for route in routes["routes"]} == {"nats-2", "nats-3"}
