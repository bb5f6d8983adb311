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

One ``up`` per state directory: :meth:`LocalCluster.start` takes an exclusive ``flock`` on
``<state>/up.lock`` (holding the pid) before anything starts, so a second one there refuses and names
the first's pid; the kernel drops the lock when its process ends, so a crashed ``up`` never leaves a
stale one, and the next ``up`` stops what a crashed one left running (``children.json``) before it
starts anything. A restart in the same directory reuses the namespace recorded in ``cluster.json``
(and the credentials in ``<state>/auth``, which ``AuthDirectory.init`` keeps), so the scheduler's
store, the broker's streams and the identities all stay one cluster's: a queued job is picked up again.

With ``dashboard`` (``roundhouse up`` turns it on; off by default here, so the many tests that start a
cluster do not pay for a web server they never load) a ``roundhouse dashboard`` child serves the web
page on loopback (``dashboard_port``, 0: a free one); it writes the URL it bound to
``<state>/dashboard.url``, which :meth:`LocalCluster.wait_ready` records in ``up.json`` as
``dashboard_url``. It holds no credentials of its own: visitors sign in as their own identity.

Each policy service gets its own options (``scheduler_options``, ``admission_options``,
``placement_options`` as ``--policy-options``); the policy names and options are checked against the
registries before anything starts. ``ROUNDHOUSE_POLICY`` and ``ROUNDHOUSE_POLICY_OPTIONS`` are not
passed to the children (they would apply to every service at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
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
from typing import Any, Final

from roundhouse.client import default_identity
from roundhouse.endpoint import UP_FILE, Endpoint
from schemas.ids import is_token
from schemas.roles import RESERVED_NAMES, Role
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING, Registry
from services.runtime.auth import CREDS_ENV, AuthDirectory, Credentials, read_creds
from services.runtime.broker import Broker
from services.runtime.bus import identity_settings
from services.scheduler.config import SchedulerConfig

log = logging.getLogger("roundhouse.up")

SERVICE_ORDER = ("metrics", "placement", "admission", "scheduler")
POLICY_REGISTRIES: Final[dict[str, Registry[Any]]] = {
    "scheduler": SCHEDULING, "admission": ADMISSION, "placement": PLACEMENT,
}  # fmt: skip
"""The services that run a policy, and where their policy names are registered."""
LOCK_FILE: Final = "up.lock"
STATE_FILE: Final = "cluster.json"
"""What a restart in the same state directory must reuse: the namespace."""
CHILDREN_FILE: Final = "children.json"
"""The pids of the running ``up``'s processes, so the next ``up`` can stop what a crashed one left."""
STATE_DIR_ENV: Final = "ROUNDHOUSE_UP_STATE_DIR"
"""Set in every child's environment: marks a process as this state directory's (see ``_stop_leftovers``)."""
DASHBOARD_URL_FILE: Final = "dashboard.url"
"""Where the dashboard child writes the URL it serves (it may bind a free port)."""
SHARED_POLICY_ENV: Final = ("ROUNDHOUSE_POLICY", "ROUNDHOUSE_POLICY_OPTIONS")
"""Environment settings every service would read alike; ``up`` sets each service's own instead."""


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
    servers = [url.strip() for url in endpoint.nats.split(",") if url.strip()]
    try:
        nc = await nats.connect(servers, allow_reconnect=False, connect_timeout=2,
                                **identity_settings(servers, creds))  # fmt: skip
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


class StateDirLocked(LocalClusterError):
    """Another ``up`` holds the state directory."""

    def __init__(self, state_dir: Path, pid: int | None) -> None:
        who = f"pid {pid}" if pid is not None else "a process whose pid it did not record yet"
        super().__init__(
            f"{state_dir} is in use by another `roundhouse up` ({who}); stop it first, or use another --state-dir"
        )
        self.pid = pid


class StateDirLock:
    """An exclusive ``flock`` on ``<state>/up.lock`` that holds the owner's pid. The kernel releases
    it when the owning process exits, however it exits, so a crash leaves no stale lock (the file may
    remain, unlocked, and is simply taken by the next ``up``, which first stops whatever the crashed
    one left running). The descriptor is not inherited by children: orphans of a crashed ``up`` do
    not hold it."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                pid = self._holder(fd)
            finally:
                os.close(fd)
            raise StateDirLocked(self.state_dir, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @staticmethod
    def _holder(fd: int, wait_s: float = 1.0) -> int | None:
        """The pid the holder wrote (it writes just after locking: wait a moment for it)."""
        deadline = time.monotonic() + wait_s
        while True:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if text.isdigit():
                return int(text)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # no pid left behind; the file stays (unlinking a lock file races)
        finally:
            os.close(fd)  # releases the flock


def check_policies(config: LocalClusterConfig) -> None:
    """Each policy service's name and options, built once from the registries: raise
    ``LocalClusterError`` (naming the valid policies, or the option refused) before anything starts."""
    for kind, registry in POLICY_REGISTRIES.items():
        name: str = getattr(config, kind)
        options: dict[str, Any] = getattr(config, f"{kind}_options")
        try:
            registry.check(name, options, label=f"--{kind}-options")
        except ValueError as exc:
            raise LocalClusterError(f"--{kind}: {exc}") from None


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
    scheduler_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the scheduling policy (the scheduler's ``--policy-options``), and so on:"""
    placement_options: dict[str, Any] = field(default_factory=dict)
    admission_options: dict[str, Any] = field(default_factory=dict)
    round_s: float = 30.0
    packing: bool = False
    """The scheduler accepts packed plans and grants shared leases (its ``--packing``): with a packing
    placement (``gandiva`` with profiles), several jobs share a GPU when their memory fits."""
    emulate: bool = False
    speedup: float = 1.0
    namespace: str = ""
    """"": the one recorded in the state directory by an earlier run, else a fresh one."""
    log_level: str = "INFO"
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    """Additional flags per service kind (e.g. {"scheduler": ["--lease-ttl-s", "5"]})."""
    auth: bool = True
    """Authenticate every connection and enforce roles (False: an open broker anyone local may use)."""
    user: str | None = None
    """The user whose credentials ``up.json`` names; None: $ROUNDHOUSE_USER, else the login name."""
    metrics: bool = True
    """Every service and worker serves ``/metrics`` on a free loopback port (``metrics_urls``)."""
    dashboard: bool = False
    """Run ``roundhouse dashboard`` too (``dashboard_url``); ``roundhouse up`` turns it on."""
    dashboard_port: int = 0
    """The dashboard's loopback port (0: a free one)."""


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
        self.dashboard_url: str | None = None
        """The web dashboard's URL, once ``wait_ready`` returned (None: no dashboard)."""
        self.state_lock = StateDirLock(self.state_dir)
        self.namespace_reused = False
        """Whether ``start`` took the namespace an earlier run recorded in the state directory."""

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

    def _recorded_namespace(self) -> str:
        """The namespace an earlier run here used: ``cluster.json``'s, else (a state directory from
        before it was recorded) the one ``up.json`` names."""
        for name in (STATE_FILE, UP_FILE):
            try:
                found = json.loads((self.state_dir / name).read_text())
            except (OSError, ValueError):
                continue
            namespace = found.get("namespace") if isinstance(found, dict) else None
            if isinstance(namespace, str) and namespace:
                return namespace
        return ""

    def _namespace(self) -> str:
        """This run's namespace, recorded for the next: the state directory's own if it has one."""
        recorded = self._recorded_namespace()
        wanted = self.config.namespace
        if recorded and wanted and wanted != recorded:
            raise LocalClusterError(
                f"{self.state_dir} holds the state (jobs, streams, credentials) of namespace {recorded!r}, not "
                f"{wanted!r}: leave out --namespace (or pass {recorded!r}) to go on with it, or use another --state-dir"
            )
        self.namespace_reused = bool(recorded)
        namespace = recorded or wanted or f"rh{uuid.uuid4().hex[:8]}"
        (self.state_dir / STATE_FILE).write_text(json.dumps({"namespace": namespace}) + "\n")
        return namespace

    def _start_broker(self) -> Endpoint:
        """Issue credentials (for the namespace), start the broker, write ``up.json``."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        namespace = self._namespace()
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

    def child_env(self) -> dict[str, str]:
        """The environment every child starts with (also what ``roundhouse.sim.live_config`` reads)."""
        # Each child gets its own --creds; the caller's ROUNDHOUSE_CREDS must not stand in for them.
        # ROUNDHOUSE_POLICY(_OPTIONS) would apply to every service alike; each gets its own flags instead.
        dropped = {CREDS_ENV, *SHARED_POLICY_ENV}
        env = {key: value for key, value in os.environ.items() if key not in dropped}
        return {**env, "PYTHONUNBUFFERED": "1", STATE_DIR_ENV: str(self.state_dir)}

    def _spawn(self, name: str, args: list[str]) -> Child:
        log_path = self.state_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "roundhouse", *args],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
                env=self.child_env(),
            )  # fmt: skip
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def service_args(self, kind: str) -> list[str]:
        """The ``roundhouse`` command line of service ``kind``: the one source of its settings, which a
        simulation of this cluster reads too (``roundhouse.sim.live_config``)."""
        assert self.endpoint is not None
        config = self.config
        args = [
            "service",
            kind,
            "--nats",
            self.endpoint.nats,
            "--namespace",
            self.endpoint.namespace,
            "--log-level",
            config.log_level,
            "--instance",
            f"{kind}-local",
        ]
        policy = {"scheduler": config.scheduler, "placement": config.placement, "admission": config.admission}
        if kind in policy:
            options = getattr(config, f"{kind}_options")
            args += ["--policy", policy[kind], "--policy-options", json.dumps(options)]
        if kind == "scheduler":
            round_s = config.round_s / config.speedup if config.emulate else config.round_s
            args += ["--db", str(self.state_dir / "scheduler"), "--round-s", str(round_s)]
            # The ETA simulates the placement this cluster runs, and emulated jobs at their speed-up.
            args += [
                "--eta-placement",
                config.placement,
                "--eta-placement-options",
                json.dumps(config.placement_options),
            ]
            if config.emulate:
                args += ["--eta-time-scale", str(config.speedup)]
            if config.packing:
                args.append("--packing")
            if self.auth is not None and "operators" in SchedulerConfig.model_fields:
                args += ["--operators", json.dumps([self.OPERATOR])]
        args += self._creds_args(Role(kind)) + self._metrics_args()
        return args + config.extra_args.get(kind, [])

    def worker_args(self, index: int) -> list[str]:
        """The ``roundhouse`` command line of worker ``index``."""
        assert self.endpoint is not None
        config = self.config
        node_id = f"node-{index}"
        args = [
            "service",
            "worker",
            "--nats",
            self.endpoint.nats,
            "--namespace",
            self.endpoint.namespace,
            "--log-level",
            config.log_level,
            "--instance",
            node_id,
            "--node-id",
            node_id,
            "--work-dir",
            str(self.state_dir / "workers" / node_id),
            # One checkpoint root for every local worker, as a shared file system gives a real
            # cluster: a job suspended on one node resumes on another from its checkpoint (each
            # worker confines resume paths to <root>/<job id>, so a private root would start it over).
            "--checkpoint-root",
            str(self.state_dir / "checkpoints"),
        ]
        if not config.real_gpus:
            args += ["--fake-gpus", str(config.gpus_per_worker)]
        if config.emulate:
            args += ["--emulate", "--speedup", str(config.speedup)]
        args += self._creds_args(Role.WORKER, node_id) + self._metrics_args()
        return args + config.extra_args.get("worker", [])

    def _dashboard_args(self) -> list[str]:
        assert self.endpoint is not None
        # No --creds: visitors sign in with their own; an open cluster's page is open too.
        args = [
            "dashboard",
            "--nats",
            self.endpoint.nats,
            "--namespace",
            self.endpoint.namespace,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.config.dashboard_port),
            "--state-dir",
            str(self.state_dir),
            "--url-file",
            str(self.state_dir / DASHBOARD_URL_FILE),
        ]
        return args + (["--insecure"] if self.auth is None else []) + self.config.extra_args.get("dashboard", [])

    def start(self) -> Endpoint:
        """Check the policies, lock the state directory, start the broker, the services and the workers.

        Raises ``LocalClusterError`` (``StateDirLocked`` when another ``up`` runs here) with nothing left
        running."""
        check_policies(self.config)
        for name in SHARED_POLICY_ENV:
            if name in os.environ:
                log.warning("%s is ignored by up (it would apply to every service): use --scheduler-options, "
                            "--admission-options or --placement-options", name)  # fmt: skip
        self.state_lock.acquire()
        try:
            self._stop_leftovers()
            self._start_broker()
            assert self.endpoint is not None
            for kind in SERVICE_ORDER:
                self._spawn(kind, self.service_args(kind))
            for index in range(len(self.node_ids)):
                self._spawn(f"worker-{index}", self.worker_args(index))
            if self.config.dashboard:
                (self.state_dir / DASHBOARD_URL_FILE).unlink(missing_ok=True)  # an earlier run's port
                self._spawn("dashboard", self._dashboard_args())
            self._record_children()
        except BaseException:
            self.stop()
            raise
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
            dashboard_url = self._read_dashboard_url()
            if all(found.get(kind, 0) >= count for kind, count in want.items()) and (
                dashboard_url is not None or not self.config.dashboard
            ):
                self.metrics_urls = dict(sorted(urls.items()))
                self.dashboard_url = dashboard_url
                self._record_metrics_urls()
                return
            if time.monotonic() > deadline:
                raise LocalClusterError(f"not ready after {timeout_s:.0f} s: answering {found}, want {want}")
            time.sleep(0.2)

    def _read_dashboard_url(self) -> str | None:
        try:
            url = (self.state_dir / DASHBOARD_URL_FILE).read_text().strip()
        except OSError:
            return None
        return url or None

    def _record_metrics_urls(self) -> None:
        """Add ``metrics_urls`` (and ``dashboard_url``) to ``up.json`` (commands that find the cluster
        read only their keys)."""
        path = self.state_dir / UP_FILE
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        found["metrics_urls"] = self.metrics_urls
        if self.dashboard_url is not None:
            found["dashboard_url"] = self.dashboard_url
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

    # --- what a crashed `up` left running --------------------------------------------------------------
    def _record_children(self) -> None:
        pids = {child.name: child.process.pid for child in self.children}
        if self.broker.pid is not None:
            pids["broker"] = self.broker.pid
        (self.state_dir / CHILDREN_FILE).write_text(json.dumps(pids) + "\n")

    def _is_ours(self, pid: int) -> bool:
        """Whether ``pid`` is a live process of this state directory: a child ``up`` started (marked in
        its environment) or the broker (its JetStream directory is under the state directory). A pid
        reused by an unrelated process, or a zombie, is not."""
        proc = Path("/proc") / str(pid)
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        marker = f"{STATE_DIR_ENV}={self.state_dir}".encode()
        return marker in environ or str(self.state_dir / "nats" / "jetstream").encode() in cmdline

    def _stop_leftovers(self, timeout_s: float = 20.0) -> list[int]:
        """Stop the processes a crashed ``up`` here left running (its lock went with it, but its broker
        would share the JetStream store with ours, its services the database): workers first, then
        the services, then the broker, as :meth:`stop` does. Returns their pids."""
        path = self.state_dir / CHILDREN_FILE
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(recorded, dict):
            return []
        alive = {str(name): int(pid) for name, pid in recorded.items() if isinstance(pid, int) and self._is_ours(pid)}
        groups = [
            [pid for name, pid in alive.items() if name.startswith("worker-")],
            [pid for name, pid in alive.items() if not name.startswith("worker-") and name != "broker"],
            [pid for name, pid in alive.items() if name == "broker"],
        ]
        if alive:
            log.warning("stopping what an earlier `up` in %s left running: %s", self.state_dir,
                        ", ".join(f"{name} (pid {pid})" for name, pid in alive.items()))  # fmt: skip
        for group in groups:
            for pid in group:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while any(self._is_ours(pid) for pid in group) and time.monotonic() < deadline:
                time.sleep(0.05)
            for pid in group:
                if self._is_ours(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            while any(self._is_ours(pid) for pid in group) and time.monotonic() < deadline + 5:
                time.sleep(0.05)
        path.unlink(missing_ok=True)
        return list(alive.values())

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
        try:
            self.broker.stop()
            if self.state_lock.held:
                (self.state_dir / CHILDREN_FILE).unlink(missing_ok=True)
        finally:
            self.state_lock.release()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
