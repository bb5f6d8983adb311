"""A whole Roundhouse on one machine: the bundled broker, the five services, local workers.

Used by ``roundhouse up`` (and the end-to-end tests). Every part is a real child process talking
over NATS exactly as in a deployment; logs go to ``<state>/logs/<name>.log``.

Secure by default: the broker authenticates every connection and enforces each role's permissions
(``schemas.roles``). The identities (every service, one per worker node, an operator, and the user
who ran ``up``) are generated into ``<state>/auth/`` (0700, creds files 0600), each child gets its
own ``--creds``, and ``up.json`` names the user's creds file so commands run there find it. Stopping goes in the
reverse order of dependence: workers first (their jobs checkpoint and report), then the services
(they ack what they handled), then the broker.

Every service and worker serves Prometheus ``/metrics`` on a free loopback port (``--metrics-port
0``); each announces its URL in its ``$SRV.PING`` metadata, which :meth:`LocalCluster.wait_ready`
collects into ``metrics_urls`` (by service kind, workers by node id) and records in ``up.json``.
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

from roundhouse.client import default_identity
from roundhouse.endpoint import UP_FILE, Endpoint
from schemas.ids import is_token
from schemas.roles import RESERVED_NAMES, Role, inbox_prefix
from services.runtime.auth import CREDS_ENV, AuthDirectory, Credentials, read_creds
from services.runtime.broker import Broker
from services.scheduler.config import SchedulerConfig

log = logging.getLogger("roundhouse.up")

SERVICE_ORDER = ("metrics", "placement", "admission", "scheduler")


async def _ping_counts(
    endpoint: Endpoint,
    kinds: dict[str, int],
    creds: Credentials | None = None,
    metrics_urls: dict[str, str] | None = None,
) -> dict[str, int]:
    """How many instances of each service kind in ``endpoint``'s namespace answer a services-API ping
    (asked as ``creds``: an operator, since no other role may ping every service). The ``/metrics``
    URLs the answers announce go into ``metrics_urls``: by kind, a worker's by its node id."""
    import nats

    counts: dict[str, int] = {}
    auth: dict[str, str] = {}
    if creds is not None:
        auth = {"nkeys_seed_str": creds.seed, "inbox_prefix": inbox_prefix(creds.role, creds.identity)}
    try:
        nc = await nats.connect(endpoint.nats, allow_reconnect=False, connect_timeout=2, **auth)
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
                metadata = json.loads(msg.data).get("metadata", {})
                if metadata.get("namespace") == endpoint.namespace:
                    counts[kind] = counts.get(kind, 0) + 1
                    url = metadata.get("metrics_url")
                    if metrics_urls is not None and url:
                        metrics_urls[metadata.get("instance", kind) if kind == "worker" else kind] = url
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
    auth: bool = True
    """Authenticate every connection and enforce roles (False: an open broker anyone local may use)."""
    user: str | None = None
    """The user whose credentials ``up.json`` names; None: $ROUNDHOUSE_USER, else the login name."""
    metrics: bool = True
    """Every service and worker serves ``/metrics`` on a free loopback port (``metrics_urls``)."""


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
        self.auth: AuthDirectory | None = AuthDirectory(self.state_dir / "auth") if config.auth else None
        """The cluster's identities (None: no authentication)."""
        self.metrics_urls: dict[str, str] = {}
        """``/metrics`` of each service (by kind) and worker (by node id), once ``wait_ready`` returned."""

    # --- identities -----------------------------------------------------------------------------------
    OPERATOR = "operator"

    @property
    def node_ids(self) -> list[str]:
        workers = 1 if self.config.real_gpus else self.config.workers
        return [f"node-{index}" for index in range(workers)]

    @property
    def user(self) -> str | None:
        """The user identity issued for whoever runs ``up``; None when that name cannot be one (not a
        valid subject token, or a role's name): commands there then act as the operator."""
        name = self.config.user or default_identity()
        if not is_token(name) or name in RESERVED_NAMES or name == self.OPERATOR or name in self.node_ids:
            return None
        return name

    def creds_of(self, role: Role, name: str | None = None) -> Path | None:
        """The credentials file of one identity (services: their role's name); None without auth."""
        if self.auth is None:
            return None
        return self.auth.creds_path(role, name or role.value)

    @property
    def operator_creds(self) -> Path | None:
        return self.creds_of(Role.OPERATOR, self.OPERATOR)

    @property
    def user_creds(self) -> Path | None:
        """What commands run here connect with (``up.json``): the user's, else the operator's."""
        user = self.user
        return self.creds_of(Role.USER, user) if user is not None else self.operator_creds

    def _issue_credentials(self, namespace: str) -> None:
        """Every identity this cluster needs, created where missing, and the broker's auth.conf."""
        assert self.auth is not None
        user = self.user
        self.auth.init(
            namespace=namespace, operators=(self.OPERATOR,), users=(user,) if user else (), nodes=self.node_ids
        )
        self.broker.authorization = self.auth.server_config_path

    def _start_broker(self) -> Endpoint:
        """Issue credentials (for the namespace), start the broker, write ``up.json``."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        namespace = self.config.namespace or f"rh{uuid.uuid4().hex[:8]}"
        if self.auth is not None:
            self._issue_credentials(namespace)
        url = self.broker.start()
        self.endpoint = Endpoint(url, namespace, self.user_creds)
        self.endpoint.write(self.state_dir)
        return self.endpoint

    def _creds_args(self, role: Role, name: str | None = None) -> list[str]:
        path = self.creds_of(role, name)
        return ["--creds", str(path)] if path is not None else []

    def _metrics_args(self) -> list[str]:
        # Port 0: each picks a free one and announces it (no race between choosing and binding).
        return ["--metrics-port", "0"] if self.config.metrics else []

    @staticmethod
    def _child_env() -> dict[str, str]:
        # Each child gets its own --creds; the caller's ROUNDHOUSE_CREDS must not stand in for them.
        env = {key: value for key, value in os.environ.items() if key != CREDS_ENV}
        return {**env, "PYTHONUNBUFFERED": "1"}

    def _spawn(self, name: str, args: list[str]) -> Child:
        log_path = self.state_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "roundhouse", *args],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
                env=self._child_env(),
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
            if self.auth is not None and "operators" in SchedulerConfig.model_fields:
                args += ["--operators", json.dumps([self.OPERATOR])]
        args += self._creds_args(Role(kind)) + self._metrics_args()
        return args + config.extra_args.get(kind, [])

    def _worker_args(self, index: int) -> list[str]:
        assert self.endpoint is not None
        config = self.config
        node_id = f"node-{index}"
        args = ["service", "worker", "--nats", self.endpoint.nats, "--namespace", self.endpoint.namespace,
                "--log-level", config.log_level, "--instance", node_id, "--node-id", node_id,
                "--work-dir", str(self.state_dir / "workers" / node_id),
                # One checkpoint root for every local worker, as a shared file system gives a real
                # cluster: a job suspended on one node resumes on another from its checkpoint (each
                # worker confines resume paths to <root>/<job id>, so a private root would start it over).
                "--checkpoint-root", str(self.state_dir / "checkpoints")]
        if not config.real_gpus:
            args += ["--fake-gpus", str(config.gpus_per_worker)]
        if config.emulate:
            args += ["--emulate", "--speedup", str(config.speedup)]
        args += self._creds_args(Role.WORKER, node_id) + self._metrics_args()
        return args + config.extra_args.get("worker", [])

    def start(self) -> Endpoint:
        self._start_broker()
        assert self.endpoint is not None
        for kind in SERVICE_ORDER:
            self._spawn(kind, self._service_args(kind))
        for index in range(len(self.node_ids)):
            self._spawn(f"worker-{index}", self._worker_args(index))
        return self.endpoint

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until every service and worker answers ``$SRV.PING`` (or raise with the logs)."""
        assert self.endpoint is not None
        want = self.wanted_answers()
        operator = read_creds(self.operator_creds) if self.operator_creds is not None else None
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            urls: dict[str, str] = {}
            found = asyncio.run(_ping_counts(self.endpoint, want, operator, urls))
            if all(found.get(kind, 0) >= count for kind, count in want.items()):
                self.metrics_urls = dict(sorted(urls.items()))
                self._record_metrics_urls()
                return
            if time.monotonic() > deadline:
                raise LocalClusterError(f"not ready after {timeout_s:.0f} s: answering {found}, want {want}")
            time.sleep(0.2)

    def _record_metrics_urls(self) -> None:
        """Add ``metrics_urls`` to ``up.json`` (commands that find the cluster read only their keys)."""
        path = self.state_dir / UP_FILE
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        found["metrics_urls"] = self.metrics_urls
        path.write_text(json.dumps(found) + "\n")

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
