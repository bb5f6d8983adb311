"""A whole Roundhouse on one machine: the bundled broker, the five services, local workers.

Used by ``roundhouse up`` (and the end-to-end tests). Every part is a real child process talking
over NATS exactly as in a deployment; logs go to ``<state>/logs/<name>.log``. Stopping goes in the
reverse order of dependence: workers first (their jobs checkpoint and report), then the services
(they ack what they handled), then the broker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from roundhouse.endpoint import Endpoint
from services.runtime.broker import Broker

log = logging.getLogger("roundhouse.up")

SERVICE_ORDER = ("metrics", "placement", "admission", "scheduler")


async def _ping_counts(endpoint: Endpoint, kinds: dict[str, int]) -> dict[str, int]:
    """How many instances of each service kind in ``endpoint``'s namespace answer a services-API ping."""
    import nats

    counts: dict[str, int] = {}
    try:
        nc = await nats.connect(endpoint.nats, allow_reconnect=False, connect_timeout=2)
    except (OSError, nats.errors.Error):
        return counts
    try:
        for kind in kinds:
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            await nc.publish(f"$SRV.PING.roundhouse-{kind}", b"", reply=inbox)
            await nc.flush()
            await asyncio.sleep(0.15)
            while True:
                try:
                    msg = await sub.next_msg(timeout=0.01)
                except nats.errors.TimeoutError:
                    break
                if not msg.data:  # a "no responders" status: nobody of this kind is up yet
                    continue
                if json.loads(msg.data).get("metadata", {}).get("namespace") == endpoint.namespace:
                    counts[kind] = counts.get(kind, 0) + 1
            await sub.unsubscribe()
    finally:
        await nc.close()
    return counts


class LocalClusterError(RuntimeError):
    """A part of the local cluster failed to start or died."""


def detect_gpus() -> int:
    """GPUs NVML can see here (0 without a driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, no driver, no device: all mean "no GPUs"
        return 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalClusterConfig:
    state_dir: Path = Path(".roundhouse")
    workers: int = 2
    gpus_per_worker: int = 4
    real_gpus: bool = False
    """Run one worker on the GPUs NVML finds instead of fake ones."""
    scheduler: str = "las"
    placement: str = "consolidated"
    admission: str = "accept-all"
    round_s: float = 30.0
    emulate: bool = False
    speedup: float = 1.0
    namespace: str = ""
    log_level: str = "INFO"
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    """Additional flags per service kind (e.g. {"scheduler": ["--lease-ttl-s", "5"]})."""


@dataclass(slots=True)
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LocalCluster:
    def __init__(self, config: LocalClusterConfig) -> None:
        self.config = config
        self.state_dir = config.state_dir.resolve()
        self.broker = Broker(self.state_dir / "nats")
        self.children: list[Child] = []
        self.endpoint: Endpoint | None = None

    def _spawn(self, name: str, args: list[str]) -> Child:
        log_path = self.state_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "roundhouse", *args],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def _service_args(self, kind: str) -> list[str]:
        assert self.endpoint is not None
        config = self.config
        args = ["service", kind, "--nats", self.endpoint.nats, "--namespace", self.endpoint.namespace,
                "--log-level", config.log_level, "--instance", f"{kind}-local"]
        policy = {"scheduler": config.scheduler, "placement": config.placement, "admission": config.admission}
        if kind in policy:
            args += ["--policy", policy[kind]]
        if kind == "scheduler":
            round_s = config.round_s / config.speedup if config.emulate else config.round_s
            args += ["--db", str(self.state_dir / "scheduler"), "--round-s", str(round_s)]
        return args + config.extra_args.get(kind, [])

    def _worker_args(self, index: int) -> list[str]:
        assert self.endpoint is not None
        config = self.config
        node_id = f"node-{index}"
        args = ["service", "worker", "--nats", self.endpoint.nats, "--namespace", self.endpoint.namespace,
                "--log-level", config.log_level, "--instance", node_id, "--node-id", node_id,
                "--work-dir", str(self.state_dir / "workers" / node_id)]
        if not config.real_gpus:
            args += ["--fake-gpus", str(config.gpus_per_worker)]
        if config.emulate:
            args += ["--emulate", "--speedup", str(config.speedup)]
        return args + config.extra_args.get("worker", [])

    def start(self) -> Endpoint:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        url = self.broker.start()
        namespace = self.config.namespace or f"rh{uuid.uuid4().hex[:8]}"
        self.endpoint = Endpoint(url, namespace)
        self.endpoint.write(self.state_dir)
        for kind in SERVICE_ORDER:
            self._spawn(kind, self._service_args(kind))
        workers = 1 if self.config.real_gpus else self.config.workers
        for index in range(workers):
            self._spawn(f"worker-{index}", self._worker_args(index))
        return self.endpoint

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until every service and worker answers ``$SRV.PING`` (or raise with the logs)."""
        assert self.endpoint is not None
        want = self.wanted_answers()
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            found = asyncio.run(_ping_counts(self.endpoint, want))
            if all(found.get(kind, 0) >= count for kind, count in want.items()):
                return
            if time.monotonic() > deadline:
                raise LocalClusterError(f"not ready after {timeout_s:.0f} s: answering {found}, want {want}")
            time.sleep(0.2)

    def wanted_answers(self) -> dict[str, int]:
        """How many instances of each kind must answer ``$SRV.PING`` before the cluster is ready."""
        workers = 1 if self.config.real_gpus else self.config.workers
        return {**dict.fromkeys(SERVICE_ORDER, 1), "worker": workers}

    def check(self) -> None:
        """Raise if a child has exited (with its log tail)."""
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                raise LocalClusterError(f"{child.name} exited with code {code}; last log lines:\n{child.log_tail()}")

    def stop(self, timeout_s: float = 20.0) -> None:
        workers = [c for c in self.children if c.name.startswith("worker-")]
        services = [c for c in self.children if not c.name.startswith("worker-")]
        for group in (workers, list(reversed(services))):
            for child in group:
                if child.process.poll() is None:
                    child.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for child in group:
                try:
                    child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in time; killing it", child.name)
                    child.process.kill()
                    child.process.wait()
        self.children.clear()
        self.broker.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
