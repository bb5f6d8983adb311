"""A local Roundhouse of real child processes, to break on purpose: kill -9, SIGSTOP, restart, audit.

Used by ``benchmarks.chaos``, ``benchmarks.failover`` and ``tests/e2e/test_chaos.py``. The cluster is
the one ``roundhouse up`` runs (``roundhouse.local.LocalCluster``: the bundled nats-server, the
services and worker agents as child processes in one namespace), with several scheduler replicas
sharing one store (the SQLite file of ``up``, or a PostgreSQL URL) and agents that emulate their jobs
(``--emulate --speedup X``), so a job costs seconds and no process of its own. Every part has a
name (``broker``, ``scheduler-0``, ``admission``, ``worker-1``, ...) and can be killed with SIGKILL,
frozen with SIGSTOP and restarted with the same arguments (the broker on the same port and data
directory). A part that exits without being told is a *crash*: it is recorded with its log tail and
restarted, as a supervisor (systemd ``Restart=always``) would.

What happened is judged from facts, not from the harness's own bookkeeping:

* the store (the scheduler's source of truth) says which jobs completed and which are still
  waiting or running;
* the workers' own facts (``job.started`` / ``job.suspended`` / ``job.completed`` /
  ``job.failed``, read back from the JetStream stream) give each lease's run as an interval on the
  agents' clock; an emulated run also ends when its agent process dies (the harness knows when it
  killed it). Two runs of one job under different leases whose intervals overlap are a *double run*.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from roundhouse.client import Client
from roundhouse.endpoint import Endpoint
from roundhouse.local import SERVICE_ORDER, Child, LocalCluster, LocalClusterConfig
from schemas.base import Event
from schemas.job import JobSpec
from schemas.jobs import JobCompleted, JobFailed, JobStarted, JobSuspended
from schemas.subjects import JOB_COMPLETED, JOB_FAILED, JOB_STARTED, JOB_SUSPENDED
from services.core.state import JobStatus
from services.runtime.bus import Bus
from services.runtime.replay import replay
from services.runtime.store import JobRecord, Store
from services.scheduler.leader import BUCKET as LEADER_BUCKET
from services.scheduler.leader import KEY as LEADER_KEY

log = logging.getLogger("roundhouse.chaos")

BROKER = "broker"
WAITING = (JobStatus.HELD, JobStatus.QUEUED, JobStatus.RUNNING)
POSTGRES_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
"""The local PostgreSQL (trust auth) a run may create its own database on."""


class ChaosError(RuntimeError):
    """The cluster could not be brought up, or a wait on a fact ran out of time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosConfig:
    state_dir: Path
    schedulers: int = 2
    """Scheduler replicas (one leads; the others campaign)."""
    workers: int = 3
    gpus_per_worker: int = 4
    db: str | None = None
    """The schedulers' store: None for the SQLite file ``roundhouse up`` uses (one file, shared by
    the replicas on this host), or a database URL (PostgreSQL)."""
    speedup: float = 50.0
    """Emulated seconds per real second (agents' ``--speedup``)."""
    round_s: float = 250.0
    """Round length in emulated seconds (``round_s / speedup`` real seconds)."""
    policy: str = "las"
    leader_ttl_s: float | None = None
    """The schedulers' ``--leader-ttl-s``; None: the default."""
    lease_ttl_s: float | None = None
    """``--lease-ttl-s`` of schedulers and agents alike; None: the default."""
    heartbeat_s: float | None = None
    log_level: str = "INFO"
    extra_args: dict[str, list[str]] = field(default_factory=dict)


@dataclass(slots=True)
class Part:
    """One process of the cluster, by name, with what the harness did to it."""

    name: str
    kind: str
    args: list[str]
    child: Child | None = None
    down: bool = False
    """Killed by the harness and not restarted yet."""
    paused: bool = False
    kills: list[float] = field(default_factory=list)
    """Wall times of the harness's SIGKILLs."""
    crashes: list[str] = field(default_factory=list)
    """Exits nobody asked for: code and log tail."""
    crash_times: list[float] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.child.process.pid if self.child is not None else None


class ChaosCluster(LocalCluster):
    """``LocalCluster`` with N scheduler replicas and every part killable, freezable and restartable."""

    def __init__(self, config: ChaosConfig) -> None:
        extra = {kind: list(args) for kind, args in config.extra_args.items()}
        scheduler = extra.setdefault("scheduler", [])
        worker = extra.setdefault("worker", [])
        if config.db is not None:
            scheduler += ["--db", config.db]
        if config.leader_ttl_s is not None:
            scheduler += ["--leader-ttl-s", str(config.leader_ttl_s)]
        if config.lease_ttl_s is not None:
            scheduler += ["--lease-ttl-s", str(config.lease_ttl_s)]
            worker += ["--lease-ttl-s", str(config.lease_ttl_s)]
        if config.heartbeat_s is not None:
            worker += ["--heartbeat-s", str(config.heartbeat_s)]
        super().__init__(
            LocalClusterConfig(
                state_dir=config.state_dir, workers=config.workers, gpus_per_worker=config.gpus_per_worker,
                scheduler=config.policy, round_s=config.round_s, emulate=True, speedup=config.speedup,
                log_level=config.log_level, extra_args=extra,
            )
        )  # fmt: skip
        self.chaos = config
        self.parts: dict[str, Part] = {}
        self.events: list[tuple[float, str, str]] = []
        """(wall time, what, part): every kill, restart, pause, resume and crash, in order."""
        self.lock = asyncio.Lock()
        """Held while a part is being killed, restarted or checked (one at a time)."""

    # --- the parts ------------------------------------------------------------------------------------
    @property
    def store_target(self) -> str:
        """What the schedulers were given as ``--db`` (a data directory or a URL)."""
        return self.chaos.db if self.chaos.db is not None else str(self.state_dir / "scheduler")

    def start(self) -> Endpoint:
        self.endpoint = self._start_broker()
        self.parts[BROKER] = Part(BROKER, BROKER, [])
        for kind in SERVICE_ORDER:
            if kind == "scheduler":
                for index in range(self.chaos.schedulers):
                    name = f"scheduler-{index}"
                    self._add(name, kind, [*self.service_args(kind), "--instance", name])
            else:
                self._add(kind, kind, self.service_args(kind))
        for index in range(self.chaos.workers):
            self._add(f"worker-{index}", "worker", self.worker_args(index))
        return self.endpoint

    def _add(self, name: str, kind: str, args: list[str]) -> None:
        part = Part(name, kind, args)
        part.child = self._spawn(name, args)
        self.parts[name] = part

    def names(self, kind: str | None = None) -> list[str]:
        return [name for name, part in self.parts.items() if kind is None or part.kind == kind]

    def part_of_instance(self, instance: str) -> Part:
        """The part a scheduler's ``--instance`` names (they are the same)."""
        return self.parts[instance]

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        super().wait_ready(timeout_s)

    def wanted_answers(self) -> dict[str, int]:
        """Every service replica and agent (scheduler: all replicas)."""
        return {**dict.fromkeys(SERVICE_ORDER, 1), "scheduler": self.chaos.schedulers, "worker": self.chaos.workers}

    def check(self) -> None:
        """Record and restart every part that exited without being told to (a crash)."""
        for part in self.parts.values():
            if part.kind == BROKER:
                if not part.down and not self.broker.running:
                    self._crashed(part, f"nats-server exited: {self.broker.log_path}")
                    self.broker.start()
                continue
            if part.down or part.child is None:
                continue
            code = part.child.process.poll()
            if code is not None:
                self._crashed(part, f"exited with code {code}; last log lines:\n{part.child.log_tail()}")
                self._forget(part.child)
                part.child = self._spawn(part.name, part.args)

    def _crashed(self, part: Part, why: str) -> None:
        log.warning("%s crashed: %s", part.name, why)
        part.crashes.append(why)
        part.crash_times.append(time.time())
        self.events.append((time.time(), "crash", part.name))

    def _forget(self, child: Child) -> None:
        with contextlib.suppress(ValueError):
            self.children.remove(child)

    def kill(self, name: str) -> float:
        """SIGKILL ``name`` (the broker: its nats-server) and reap it; the wall time of the kill."""
        part = self.parts[name]
        if part.down:
            raise ChaosError(f"{name} is down already")
        now = time.time()
        if part.kind == BROKER:
            self.broker.kill()
        else:
            assert part.child is not None
            process = part.child.process
            if part.paused:
                part.paused = False
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            process.wait()
            self._forget(part.child)
            part.child = None
        part.down = True
        part.kills.append(now)
        self.events.append((now, "kill", name))
        return now

    def restart(self, name: str) -> None:
        """Start a killed part again with the same arguments (the broker: same port, same data)."""
        part = self.parts[name]
        if not part.down:
            return
        if part.kind == BROKER:
            self.broker.start()
        else:
            part.child = self._spawn(part.name, part.args)
        part.down = False
        self.events.append((time.time(), "restart", name))

    def pause(self, name: str) -> float:
        """SIGSTOP ``name``: it runs nothing (no renewal, no handler) until :meth:`resume`."""
        part = self.parts[name]
        assert part.child is not None
        now = time.time()
        os.kill(part.child.process.pid, signal.SIGSTOP)
        part.paused = True
        self.events.append((now, "pause", name))
        return now

    def resume(self, name: str) -> float:
        part = self.parts[name]
        assert part.child is not None
        now = time.time()
        os.kill(part.child.process.pid, signal.SIGCONT)
        part.paused = False
        self.events.append((now, "resume", name))
        return now

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def log_records(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines ``name`` wrote (over all its restarts, appended to one file)."""
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return []
        records = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    records.append(record)
        return records

    def stop(self, timeout_s: float = 20.0) -> None:
        for part in self.parts.values():
            if part.paused and part.child is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(part.child.process.pid, signal.SIGCONT)
                part.paused = False
        super().stop(timeout_s)

    # --- counts ---------------------------------------------------------------------------------------
    def kill_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for part in self.parts.values():
            counts[part.kind] = counts.get(part.kind, 0) + len(part.kills)
        return counts

    def crash_reports(self) -> dict[str, list[str]]:
        return {part.name: part.crashes for part in self.parts.values() if part.crashes}

    def agent_deaths(self) -> dict[str, list[float]]:
        """node id -> wall times its agent died (killed by the harness, or crashed)."""
        deaths: dict[str, list[float]] = {}
        for name in self.names("worker"):
            part = self.parts[name]
            node_id = "node-" + name.rsplit("-", 1)[1]
            deaths[node_id] = sorted(part.kills + part.crash_times)
        return deaths


# --- talking to it -------------------------------------------------------------------------------------
async def connect(cluster: ChaosCluster, name: str) -> Client:
    """A client that rides out broker restarts (reconnects forever)."""
    assert cluster.endpoint is not None
    # As the operator: the harness reads the leader key and watches every grant and round.
    return await Client.connect(
        cluster.endpoint.nats, namespace=cluster.endpoint.namespace, name=name, attempts=-1,
        creds=cluster.operator_creds,
    )  # fmt: skip


async def leader(bus: Bus) -> tuple[str, int] | None:
    """The leading scheduler replica's instance and epoch, from the election key (None: none now)."""
    bucket = await bus.kv(LEADER_BUCKET)
    entry = await bucket.get(LEADER_KEY)
    if entry is None or not entry.value:
        return None
    value = json.loads(entry.value)
    if "epoch" not in value:
        return None
    return str(value["instance"]), int(value["epoch"])


class CommandWatch:
    """The leaders' commands as they travel: the first time each epoch was seen on a round or a grant.

    Subscribes (core NATS) to ``schedule.round.*`` and ``lease.grant.*`` / ``lease.revoke.*``; every
    one carries the epoch of the term that sent it. Reading them is what a worker or the placement
    service sees: a new leader counts as in charge once its first command is out.
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.first_seen: dict[int, float] = {}
        self._changed = asyncio.Event()
        self._subs: list[Any] = []

    async def start(self) -> None:
        for subject in ("schedule.round.*", "lease.grant.*", "lease.revoke.*"):
            self._subs.append(await self.bus.nc.subscribe(self.bus.wire(subject), cb=self._on_message))
        await self.bus.nc.flush()

    async def _on_message(self, msg: Msg) -> None:
        now = time.time()
        try:
            epoch = json.loads(msg.data).get("epoch")
        except ValueError:
            return
        if isinstance(epoch, int) and epoch not in self.first_seen:
            self.first_seen[epoch] = now
            self._changed.set()

    async def first_after(self, epoch: int, timeout_s: float) -> tuple[int, float]:
        """The first epoch above ``epoch`` seen on a command, and when it was first seen."""
        deadline = time.monotonic() + timeout_s
        while True:
            newer = [(seen, e) for e, seen in self.first_seen.items() if e > epoch]
            if newer:
                seen, e = min(newer)
                return e, seen
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChaosError(f"no command of an epoch above {epoch} within {timeout_s} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


class RenewalWatch:
    """Every write of the election key as it happens: the leader's renewals, and the gaps between them.

    A leader renews every ``leader_ttl_s / 3``; a longer gap (a stalled event loop, a slow broker, a
    loaded machine) eats into the TTL, and one of ``2/3`` of it loses the key. ``max_gap_s`` is what
    a shorter TTL must leave room for.
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.writes: list[tuple[float, int]] = []
        """(wall time, epoch) of every write seen (0: the create, before the epoch is in the value)."""
        self._watcher: Any = None

    async def start(self) -> None:
        bucket = await self.bus.kv(LEADER_BUCKET)
        self._watcher = await bucket.watch(LEADER_KEY, self._on_write)

    async def _on_write(self, entry: Any) -> None:
        if entry.deleted or not entry.value:
            return
        with contextlib.suppress(ValueError):
            self.writes.append((time.time(), int(json.loads(entry.value).get("epoch", 0))))

    def gaps(self) -> list[float]:
        """Seconds between consecutive renewals of one term."""
        out: list[float] = []
        for (t0, e0), (t1, e1) in itertools.pairwise(self.writes):
            if e0 == e1 and e0 != 0:
                out.append(t1 - t0)
        return out

    async def stop(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()


async def until(predicate: Callable[[], Awaitable[bool]], what: str, timeout_s: float, every_s: float = 0.1) -> None:
    """Poll ``predicate`` until true; ``ChaosError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise ChaosError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(every_s)


# --- jobs -------------------------------------------------------------------------------------------------
def short_job(index: int, rng: random.Random, config: ChaosConfig, real_s: tuple[float, float]) -> JobSpec:
    """A one-GPU emulated job of ``real_s`` (min, max) real seconds at the cluster's speed-up."""
    duration = rng.uniform(*real_s) * config.speedup
    return JobSpec(
        name=f"chaos-{index}", command=["true"], gpus=1, expected_duration_s=duration,
        expected_iterations=max(1, round(duration / 10)),
    )  # fmt: skip


@dataclass(slots=True)
class Submitter:
    """Publishes jobs (the durable ``job.arrived``) and remembers the ids JetStream acknowledged."""

    client: Client
    job_ids: list[str] = field(default_factory=list)
    retries: int = 0

    async def submit(self, spec: JobSpec, job_id: str, timeout_s: float = 120.0) -> None:
        """Publish until JetStream has it (the same job id each time: a job is one id)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                await self.client.submit(spec, job_id=job_id, wait=False)
            except Exception as exc:  # the broker is down past the publish's own retries: try again
                if time.monotonic() > deadline:
                    raise ChaosError(f"could not submit {job_id} within {timeout_s} s: {exc!r}") from exc
                self.retries += 1
                await asyncio.sleep(0.5)
                continue
            self.job_ids.append(job_id)
            return


# --- chaos -----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Monkey:
    """Kills random parts at random moments (seeded) and restarts each after a short random delay."""

    cluster: ChaosCluster
    rng: random.Random
    kinds: tuple[str, ...] = (BROKER, "scheduler", "admission", "placement", "metrics", "worker")
    mean_gap_s: float = 3.0
    """Mean seconds between kills (exponential gaps)."""
    down_s: tuple[float, float] = (0.5, 3.0)
    """A killed part comes back after a delay drawn from this range."""
    max_down: int = 2
    """At most this many parts down at once."""
    opening: tuple[str, ...] = ()
    """Kinds killed first, in this order (``leader``: the leading scheduler replica), then at random."""
    leader_of: Callable[[], Awaitable[str | None]] | None = None
    """Names the leading scheduler replica (for ``leader`` in ``opening``)."""
    restarts: set[asyncio.Task[None]] = field(default_factory=set)

    def candidates(self, kind: str | None = None) -> list[str]:
        kinds = self.kinds if kind is None else (kind,)
        parts = self.cluster.parts.values()
        return sorted(p.name for p in parts if p.kind in kinds and not p.down and not p.paused)

    async def choose(self, kind: str | None) -> str | None:
        if kind == "leader":
            name = await self.leader_of() if self.leader_of is not None else None
            return name if name in self.candidates("scheduler") else None
        candidates = self.candidates(kind)
        return self.rng.choice(candidates) if candidates else None

    async def run(self, stop: asyncio.Event) -> None:
        opening = list(self.opening)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.expovariate(1 / self.mean_gap_s))
            if stop.is_set():
                break
            if sum(1 for p in self.cluster.parts.values() if p.down) >= self.max_down:
                continue
            name = await self.choose(opening[0] if opening else None)
            if name is None:
                continue
            if opening:
                opening.pop(0)
            delay = self.rng.uniform(*self.down_s)
            async with self.cluster.lock:
                await asyncio.to_thread(self.cluster.kill, name)
            log.info("killed %s; back in %.1f s", name, delay)
            task = asyncio.create_task(self._restart_later(name, delay))
            self.restarts.add(task)
            task.add_done_callback(self.restarts.discard)

    async def _restart_later(self, name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        async with self.cluster.lock:
            await asyncio.to_thread(self.cluster.restart, name)

    async def settle(self) -> None:
        """Wait for every pending restart."""
        while self.restarts:
            await asyncio.gather(*list(self.restarts))


async def supervise(cluster: ChaosCluster, stop: asyncio.Event, every_s: float = 0.5) -> None:
    """Restart crashed parts (``ChaosCluster.check``) until ``stop``."""
    while not stop.is_set():
        async with cluster.lock:
            await asyncio.to_thread(cluster.check)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


# --- the audit -----------------------------------------------------------------------------------------
@dataclass(slots=True)
class Run:
    """One lease's run as its worker reported it."""

    job_id: str
    lease_id: str
    node_id: str
    start: float
    end: float | None = None
    """The lease's end fact's time, or its agent's death, whichever came first; None: still on."""
    ended_by: str = ""


@dataclass(slots=True)
class Audit:
    jobs: int
    completed: int
    lost: list[str]
    stuck: list[str]
    double_runs: list[tuple[str, str, str]]
    """(job, lease, lease) whose runs overlapped."""
    completed_twice: list[str]
    """Jobs with a job.completed fact from two different leases."""
    failed: list[str]
    statuses: dict[str, int]
    runs: int
    unended_runs: list[str]
    """Leases of finished jobs with no end fact and no agent death after their start."""


async def read_facts(bus: Bus) -> list[Event]:
    """Every worker fact about leases in the stream, oldest first."""
    facts: list[Event] = []

    async def keep(event: Event) -> None:
        facts.append(event)

    await replay(bus, [JOB_STARTED, JOB_SUSPENDED, JOB_COMPLETED, JOB_FAILED], keep)
    return facts


def lease_runs(facts: Iterable[Event], agent_deaths: dict[str, list[float]]) -> dict[str, Run]:
    """Each lease's run interval from the facts; an emulated run also ends when its agent dies."""
    runs: dict[str, Run] = {}
    ends: dict[str, tuple[float, str]] = {}
    for fact in facts:
        if isinstance(fact, JobStarted):
            runs.setdefault(fact.lease_id, Run(fact.job_id, fact.lease_id, fact.node_id, fact.ts))
        elif isinstance(fact, JobSuspended | JobCompleted | JobFailed) and fact.lease_id is not None:
            kind = type(fact).__name__
            if fact.lease_id not in ends or fact.ts < ends[fact.lease_id][0]:
                ends[fact.lease_id] = (fact.ts, kind)
    for lease_id, run in runs.items():
        candidates = [ends[lease_id]] if lease_id in ends else []
        deaths = [t for t in agent_deaths.get(run.node_id, []) if t >= run.start]
        if deaths:
            candidates.append((deaths[0], "agent died"))
        if candidates:
            run.end, run.ended_by = min(candidates)
    return runs


def overlapping(runs: Iterable[Run]) -> list[tuple[str, str, str]]:
    """Pairs of runs of one job, under different leases, that overlap in time."""
    by_job: dict[str, list[Run]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    doubles = []
    for job_id, job_runs in by_job.items():
        job_runs.sort(key=lambda r: r.start)
        for i, a in enumerate(job_runs):
            for b in job_runs[i + 1 :]:
                a_end = a.end if a.end is not None else float("inf")
                if b.start < a_end:
                    doubles.append((job_id, a.lease_id, b.lease_id))
    return doubles


async def store_jobs(target: str) -> dict[str, JobRecord]:
    store = await Store.open(target)
    try:
        return {record.job_id: record for record in await store.jobs_by_status(*JobStatus)}
    finally:
        await store.close()


async def wait_drained(target: str, job_ids: list[str], timeout_s: float, every_s: float = 0.5) -> bool:
    """Poll the store until every job is final; False at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = await store_jobs(target)
        except Exception as exc:  # a write lock held long, a restart of PostgreSQL: ask again
            log.warning("store read failed: %r", exc)
            records = {}
        if records and all(job_id in records and records[job_id].status.is_final for job_id in job_ids):
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every_s)


async def audit(cluster: ChaosCluster, bus: Bus, job_ids: list[str]) -> Audit:
    """Judge the run from the store and the workers' facts (see the module doc)."""
    records = await store_jobs(cluster.store_target)
    facts = await read_facts(bus)
    runs = lease_runs(facts, cluster.agent_deaths())
    wanted = set(job_ids)
    completions: dict[str, set[str]] = {}
    for fact in facts:
        if isinstance(fact, JobCompleted) and fact.job_id in wanted:
            completions.setdefault(fact.job_id, set()).add(fact.lease_id)
    statuses: dict[str, int] = {}
    lost, stuck, failed = [], [], []
    for job_id in job_ids:
        record = records.get(job_id)
        status = record.status.value if record is not None else "missing"
        statuses[status] = statuses.get(status, 0) + 1
        if record is not None and record.status in WAITING:
            stuck.append(job_id)
        elif record is None or record.status is not JobStatus.COMPLETED:
            lost.append(job_id)
            if record is not None and record.status is JobStatus.FAILED:
                failed.append(job_id)
    ours = [run for run in runs.values() if run.job_id in wanted]
    finished = {job_id for job_id, record in records.items() if record.status.is_final}
    return Audit(
        jobs=len(job_ids), completed=statuses.get("completed", 0), lost=lost, stuck=stuck,
        double_runs=overlapping(ours), completed_twice=sorted(j for j, ls in completions.items() if len(ls) > 1),
        failed=failed, statuses=statuses, runs=len(ours),
        unended_runs=sorted(r.lease_id for r in ours if r.end is None and r.job_id in finished),
    )  # fmt: skip


# --- one chaos run ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosPlan:
    """What a chaos run does to a started cluster."""

    jobs: int = 200
    seed: int = 0
    submit_every_s: float = 0.25
    """Mean gap between submissions (exponential)."""
    job_s: tuple[float, float] = (1.0, 4.0)
    """Each job's length in real seconds, drawn from this range."""
    chaos_after_s: float = 15.0
    """Keep killing this long after the last submission, then stop."""
    kinds: tuple[str, ...] = (BROKER, "scheduler", "admission", "placement", "metrics", "worker")
    mean_gap_s: float = 3.0
    down_s: tuple[float, float] = (0.5, 3.0)
    max_down: int = 2
    opening: tuple[str, ...] = ()
    """Kinds killed first, in this order (``leader``: the leading scheduler), then at random."""
    drain_timeout_s: float = 300.0


@dataclass(slots=True)
class ChaosResult:
    audit: Audit
    kills: dict[str, int]
    crashes: dict[str, list[str]]
    submit_s: float
    drain_s: float
    drained: bool
    submit_retries: int

    def summary(self) -> dict[str, Any]:
        """The benchmark's JSON: the issue's keys first, then details."""
        a = self.audit
        return {
            "jobs": a.jobs, "completed": a.completed, "lost": len(a.lost), "double_runs": len(a.double_runs),
            "stuck": len(a.stuck), "kills": sum(self.kills.values()), "drain_s": round(self.drain_s, 2),
            **{f"kills_{kind}": n for kind, n in sorted(self.kills.items())},
            "crashes": sum(len(c) for c in self.crashes.values()), "completed_twice": len(a.completed_twice),
            "failed": len(a.failed), "runs": a.runs, "submit_s": round(self.submit_s, 2),
            "submit_retries": self.submit_retries, "statuses": a.statuses,
            "lost_ids": a.lost, "stuck_ids": a.stuck, "double_run_leases": a.double_runs,
            "unended_runs": a.unended_runs, "crash_reports": self.crashes,
        }  # fmt: skip


async def run_chaos(cluster: ChaosCluster, plan: ChaosPlan) -> ChaosResult:
    """Submit ``plan.jobs`` short jobs while killing random parts, stop killing, wait for the drain,
    audit. ``drain_s``: from the moment the killing stopped and every part was back to every job
    final (or the deadline)."""
    rng = random.Random(plan.seed)
    client = await connect(cluster, "chaos")

    async def leading() -> str | None:
        try:
            found = await leader(client.bus)
        except Exception:  # the broker is down: no leader to name now
            return None
        return found[0] if found is not None else None

    monkey = Monkey(cluster, random.Random(plan.seed + 1), kinds=plan.kinds, mean_gap_s=plan.mean_gap_s,
                    down_s=plan.down_s, max_down=plan.max_down, opening=plan.opening, leader_of=leading)  # fmt: skip
    stop_chaos, stop_supervising = asyncio.Event(), asyncio.Event()
    supervisor = asyncio.create_task(supervise(cluster, stop_supervising))
    try:
        chaos = asyncio.create_task(monkey.run(stop_chaos))
        submitter = Submitter(client)
        began = time.monotonic()
        for index in range(plan.jobs):
            spec = short_job(index, rng, cluster.chaos, plan.job_s)
            await submitter.submit(spec, f"chaos-{index}-{rng.getrandbits(32):08x}")
            await asyncio.sleep(rng.expovariate(1 / plan.submit_every_s))
        submit_s = time.monotonic() - began
        await asyncio.sleep(plan.chaos_after_s)
        stop_chaos.set()
        await chaos
        await monkey.settle()
        calm = time.monotonic()
        drained = await wait_drained(cluster.store_target, submitter.job_ids, plan.drain_timeout_s)
        drain_s = time.monotonic() - calm
        result = await audit(cluster, client.bus, submitter.job_ids)
    finally:
        stop_chaos.set()
        stop_supervising.set()
        await supervisor
        await client.close()
    return ChaosResult(result, cluster.kill_counts(), cluster.crash_reports(), submit_s, drain_s, drained,
                       submitter.retries)  # fmt: skip


@contextlib.asynccontextmanager
async def running(config: ChaosConfig) -> AsyncIterator[ChaosCluster]:
    """Start ``config``'s cluster and wait until every part answers; stop it on exit."""
    cluster = ChaosCluster(config)
    try:
        await asyncio.to_thread(cluster.start)
        await asyncio.to_thread(cluster.wait_ready)
        yield cluster
    finally:
        await asyncio.to_thread(cluster.stop)


# --- PostgreSQL ---------------------------------------------------------------------------------------------
async def _admin(sql: str) -> None:
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(POSTGRES_ADMIN, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def create_database(prefix: str = "rh_chaos") -> str:
    """A fresh database on the local PostgreSQL; its SQLAlchemy URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    await _admin(f'CREATE DATABASE "{name}"')
    return f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"


async def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- small things ---------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(sorted(values), n=100, method="inclusive")[round(q * 100) - 1]


def machine_load() -> str:
    """``uptime``'s load averages (what else ran on the machine)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
