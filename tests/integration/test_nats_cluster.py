"""Roundhouse on a real 3-server NATS cluster with replicated JetStream (issue 12, replication).

``services.runtime.broker.BrokerCluster`` runs three routed nats-servers on free 127.0.0.1 ports.
The services provision an R3 stream and R3 buckets when told to (``stream_replicas=3``), and a
provisioning with fewer replicas never shrinks them. Then the server leading the stream is killed
(kill -9) while jobs flow through admission, the scheduler, placement and fake workers: every job
must still complete, exactly once, and the time work stalled is printed (``pytest -s``).

Select these tests with ``-m nats_cluster``; leave them out with ``-m "not nats_cluster"``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
from nats.js import JetStreamContext
from nats.js.api import ClusterInfo

from schemas.control import JobsQuery, JobsReply
from schemas.job import JobSpec
from schemas.jobs import JobArrived, JobCompleted
from schemas.subjects import JOB_ARRIVED, JOB_COMPLETED, QUERY_JOBS
from services.admission.service import AdmissionConfig, AdmissionService
from services.metrics.aggregates import JOB_BUCKET
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import BrokerCluster
from services.runtime.bus import Bus, BusOptions, PublishError
from services.scheduler.config import SchedulerConfig
from services.scheduler.leader import BUCKET as LEADER_BUCKET
from services.scheduler.service import SchedulerService
from tests.fake_workers import FakeWorkers
from tests.helpers import eventually

pytestmark = pytest.mark.nats_cluster

REPO = Path(__file__).resolve().parents[2]
REPLICAS = 3


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerCluster]:
    with BrokerCluster(tmp_path_factory.mktemp("nats-cluster")) as running:
        yield running


@pytest.fixture
def cluster(nats_cluster: BrokerCluster) -> BrokerCluster:
    """The module's cluster with all three servers up (a test that killed one restarted it)."""
    for name in nats_cluster.names:
        if name not in nats_cluster.running:
            nats_cluster.restart(name)
    return nats_cluster


def _namespace() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


def peers(cluster: ClusterInfo | None) -> set[str]:
    """The servers that hold a stream or consumer: its leader and its replicas (all of them are
    listed as replicas while it has no leader yet)."""
    if cluster is None:
        return set()
    names = [cluster.leader, *(peer.name for peer in cluster.replicas or [])]
    return {name for name in names if name}


async def stream_replicas(js: JetStreamContext, stream: str) -> tuple[int, int]:
    """(configured replicas, servers that hold it)."""
    info = await js.stream_info(stream)
    return int(info.config.num_replicas or 1), len(peers(info.cluster))


def kv_stream(bus: Bus, bucket: str) -> str:
    return f"KV_{bus.name(bucket)}"


def test_the_cluster_is_three_routed_servers_with_one_meta_leader(cluster: BrokerCluster) -> None:
    assert cluster.names == ["n0", "n1", "n2"]
    assert len(cluster.urls.split(",")) == 3
    assert len({url.rsplit(":", 1)[1] for url in cluster.url_list}) == 3
    assert cluster.meta_leader() in cluster.names


@dataclass(slots=True)
class ServiceProcess:
    """A service run as ``python -m services.<kind>``, its log in a file (a pipe could fill up)."""

    process: asyncio.subprocess.Process
    log: Path

    async def stop(self) -> str:
        """SIGTERM (SIGKILL past 20 s); return its log."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 20)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        return self.log.read_text(errors="replace")

    def check(self, kind: str) -> None:
        if self.process.returncode is not None:
            raise AssertionError(f"{kind} exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")


async def service_process(cluster: BrokerCluster, kind: str, namespace: str, logs: Path, *flags: str) -> ServiceProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("ROUNDHOUSE_STREAM_REPLICAS", None)
    log = logs / f"{kind}.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", f"services.{kind}", "--nats", cluster.urls, "--namespace", namespace,
            "--log-format", "text", *flags,
            cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=out,
        )  # fmt: skip
    return ServiceProcess(process, log)


async def _exists(js: JetStreamContext, stream: str, consumer: str | None = None) -> bool:
    try:
        if consumer is None:
            await js.stream_info(stream)
        else:
            await js.consumer_info(stream, consumer)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def _until(predicate: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.1)


async def test_services_told_r3_create_r3_stream_and_buckets_and_r1_never_shrinks_them(
    cluster: BrokerCluster, tmp_path: Path
) -> None:
    namespace = _namespace()
    watcher = await Bus.connect(cluster.url_list, name="watcher", options=BusOptions(namespace=namespace),
                                provision=False)  # fmt: skip
    # The test's own questions to the cluster's JetStream API get 30 s, not nats-py's 5 s: three
    # servers on a loaded 2-core machine answered a consumer_info later than that once.
    js = watcher.nc.jetstream(timeout=30)
    stream = watcher.stream_name
    buckets = [kv_stream(watcher, LEADER_BUCKET), kv_stream(watcher, JOB_BUCKET)]
    # A scheduler process told --stream-replicas 3 creates the stream and, leading, its two buckets.
    scheduler = await service_process(
        cluster, "scheduler", namespace, tmp_path,
        "--stream-replicas", "3", "--db", str(tmp_path / "db"), "--policy", "fifo",
    )  # fmt: skip
    admission: ServiceProcess | None = None
    try:

        async def scheduler_provisioned() -> bool:
            scheduler.check("scheduler")
            return all([await _exists(js, name) for name in (stream, *buckets)])

        await _until(scheduler_provisioned, "the stream and the scheduler's buckets created")
        for name in (stream, *buckets):
            assert await stream_replicas(js, name) == (REPLICAS, REPLICAS), name

        # An admission process with the defaults (R1) provisions the same stream: it stays R3.
        admission = await service_process(cluster, "admission", namespace, tmp_path)

        async def admission_consuming() -> bool:
            assert admission is not None
            admission.check("admission")
            return await _exists(js, stream, watcher.name("admission"))

        await _until(admission_consuming, "admission's durable consumer created")
        assert await stream_replicas(js, stream) == (REPLICAS, REPLICAS)

        # So does an R1 bus provisioning again in this process, and opening the buckets with R1;
        # only a bucket that does not exist yet gets the replicas asked for.
        r1 = await Bus.connect(cluster.url_list, name="r1", options=BusOptions(namespace=namespace))
        try:
            await r1.provision()
            await r1.kv(LEADER_BUCKET)
            await r1.kv(JOB_BUCKET)
            await r1.kv("fresh")
            for name in (stream, *buckets):
                assert await stream_replicas(js, name) == (REPLICAS, REPLICAS), name
            assert await stream_replicas(js, kv_stream(r1, "fresh")) == (1, 1)
        finally:
            await r1.close()
        # The durable consumers follow the stream's replicas (R3 too, so they survive a server's loss).
        consumer = await js.consumer_info(stream, watcher.name("admission"))
        assert len(peers(consumer.cluster)) == REPLICAS
    finally:
        scheduler_log = await scheduler.stop()
        if admission is not None:
            await admission.stop()
        await watcher.close()
    assert scheduler.process.returncode == 0, scheduler_log[-2000:]
    assert "scheduler service stopped" in scheduler_log


# --- the stream leader killed mid-run -----------------------------------------------------------

JOBS = 30
SUBMIT_EVERY_S = 0.15
RUN_S = 0.3
KILL_AFTER_COMPLETIONS = 8
NODES = {"node-a": 2, "node-b": 2}


@dataclass(slots=True)
class Run:
    """What the test's submitter and fake job completions saw, with monotonic times."""

    submitted: dict[str, float] = field(default_factory=dict)
    completed: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    """job id -> (time its job.completed was stored, lease id), one per completion reported."""
    publish_failures: Counter[str] = field(default_factory=Counter)
    """PublishError (no JetStream ack after every retry) by subject: each was published again."""

    def progress(self, workers: FakeWorkers) -> list[float]:
        """Times of every grant a worker accepted and every completion stored, in order."""
        grants = [t for t, what, _ in workers.timeline if what == "grant"]
        return sorted(grants + [t for done in self.completed.values() for t, _ in done])


async def publish_until_stored(bus: Bus, subject: str, event: JobArrived | JobCompleted, run: Run) -> None:
    """What a client or a worker's outbox does: publish again (same event id, stored once) until acked."""
    while True:
        try:
            await bus.publish(subject, event)
            return
        except PublishError:
            run.publish_failures[subject] += 1


async def submit_jobs(bus: Bus, run: Run) -> None:
    for i in range(JOBS):
        job_id = f"job-{i:02d}"
        spec = JobSpec(name=job_id, command=["python", "train.py"], gpus=1, grace_period_s=1.0)
        await publish_until_stored(bus, JOB_ARRIVED, JobArrived(job_id=job_id, spec=spec), run)
        run.submitted[job_id] = time.monotonic()
        await asyncio.sleep(SUBMIT_EVERY_S)


async def complete_jobs(workers: FakeWorkers, run: Run) -> None:
    """Each lease's job runs ``RUN_S``, then its worker reports ``job.completed`` and frees the GPUs."""
    seen: dict[str, float] = {}
    tasks: set[asyncio.Task[None]] = set()

    async def complete(node_id: str, lease_id: str) -> None:
        node = workers.nodes[node_id]
        grant = node.leases[lease_id].grant
        fact = JobCompleted(job_id=grant.job_id, lease_id=lease_id, node_id=node_id, epoch=grant.epoch, iteration=10)
        await publish_until_stored(workers.bus, JOB_COMPLETED, fact, run)
        run.completed.setdefault(grant.job_id, []).append((time.monotonic(), lease_id))
        node.leases.pop(lease_id, None)
        workers.running.get(grant.job_id, set()).discard(lease_id)

    try:
        while True:
            now = time.monotonic()
            for node in workers.nodes.values():
                for lease_id, held in node.leases.items():
                    started = seen.setdefault(lease_id, now)
                    if not held.stopping and now - started >= RUN_S:
                        held.stopping = True  # a revoke now is answered as a duplicate
                        task = asyncio.create_task(complete(node.node_id, lease_id))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
            await asyncio.sleep(0.02)
    finally:
        for task in tasks:
            task.cancel()


@asynccontextmanager
async def services(
    cluster: BrokerCluster, namespace: str, db: Path
) -> AsyncIterator[tuple[Bus, FakeWorkers, SchedulerService]]:
    """Admission, one scheduler replica, placement and fake workers, each on its own connection given
    all three servers, provisioning R3."""
    options = BusOptions(namespace=namespace, stream_replicas=REPLICAS)
    buses: list[Bus] = []

    async def connect(name: str) -> Bus:
        bus = await Bus.connect(cluster.url_list, name=name, options=options)
        buses.append(bus)
        return bus

    common: dict[str, Any] = {
        "nats": cluster.urls, "namespace": namespace, "stream_replicas": REPLICAS, "log_format": "text",
    }  # fmt: skip
    admission = AdmissionService(AdmissionConfig(**common, reoffer_interval_s=60))
    scheduler = SchedulerService(
        SchedulerConfig(
            **common, db=str(db), policy="fifo", round_s=0.3, plan_timeout_s=2.0,
            request_timeout_s=0.5, revoke_margin_s=0.5, lease_ttl_s=30.0,
        ),
    )  # fmt: skip
    placement = PlacementService(PlacementConfig(**common))
    client = await connect("client")
    workers = FakeWorkers(await connect("workers"), NODES)
    started: list[AdmissionService | SchedulerService | PlacementService] = []
    try:
        await admission.start(await connect("admission"))
        started.append(admission)
        await workers.start(heartbeat_s=1.0)
        await placement.start(await connect("placement"))
        started.append(placement)
        await scheduler.start(await connect("scheduler"))
        started.append(scheduler)
        yield client, workers, scheduler
    finally:
        for service in reversed(started):
            await service.stop()
        await workers.stop()
        for bus in buses:
            await bus.close()


async def test_killing_the_stream_leader_mid_run_loses_and_duplicates_no_job(
    cluster: BrokerCluster, tmp_path: Path
) -> None:
    namespace = _namespace()
    run = Run()
    async with services(cluster, namespace, tmp_path / "db") as (client, workers, scheduler):
        stream = client.stream_name
        await eventually(lambda: scheduler.is_leader and len(scheduler.inventory) == len(NODES), timeout_s=20,
                         what="a leading scheduler that knows both nodes")  # fmt: skip
        submitter = asyncio.create_task(submit_jobs(client, run))
        completer = asyncio.create_task(complete_jobs(workers, run))
        try:
            await eventually(lambda: len(run.completed) >= KILL_AFTER_COMPLETIONS, timeout_s=30,
                             what=f"{KILL_AFTER_COMPLETIONS} jobs completed before the kill")  # fmt: skip
            leader = await cluster.stream_leader(stream)
            meta_leader = cluster.meta_leader()
            killed_at = time.monotonic()
            cluster.kill(leader)
            new_leader = await cluster.stream_leader(stream, not_on=leader, timeout_s=30)
            elected_s = time.monotonic() - killed_at
            await eventually(lambda: len(run.completed) == JOBS, timeout_s=60, what="every job completed")
            await submitter
        finally:
            submitter.cancel()
            completer.cancel()
        # The scheduler agrees: every job completed (its reply may wait for a round or a new term).
        ids = sorted(run.submitted)
        reply: JobsReply | None = None
        deadline = time.monotonic() + 20
        while True:
            try:
                reply = await client.request(
                    QUERY_JOBS, JobsQuery(job_ids=ids, include_finished=True), JobsReply, timeout_s=2.0
                )
                if [v.status for v in reply.jobs] == ["completed"] * JOBS:
                    break
            except (TimeoutError, nats.errors.Error):
                pass
            assert time.monotonic() < deadline, f"the scheduler does not show every job completed: {reply}"
            await asyncio.sleep(0.2)
        stored = await client.js.stream_info(stream, subjects_filter=client.wire("deadletter.>"))
        dead_letters = dict(stored.state.subjects or {})
        # The killed server comes back and catches up (healthy: its streams and consumers current).
        restarted_at = time.monotonic()
        await cluster.arestart(leader)
        caught_up_s = time.monotonic() - restarted_at
        assert await stream_replicas(client.js, stream) == (REPLICAS, REPLICAS)

    grants = Counter(job for _, what, job in workers.timeline if what == "grant")
    completions = {job: len(done) for job, done in run.completed.items()}
    progress = run.progress(workers)
    before = [t for t in progress if t <= killed_at]
    after = [t for t in progress if t > killed_at]
    # The longest pause in grants and completions from the kill on (the pause the kill falls in
    # included), against the longest one before it, while jobs were arriving all along.
    pauses = [b - a for a, b in itertools.pairwise(before[-1:] + after)]
    stall_s = max(pauses, default=float("nan"))
    steady_s = max((b - a for a, b in itertools.pairwise(before)), default=0.0)
    print(
        f"\n[nats-cluster] killed stream leader {leader} (meta leader was {meta_leader}); "
        f"new stream leader {new_leader} after {elected_s:.1f} s; work stalled {stall_s:.1f} s "
        f"(longest pause in grants and completions from the kill on; before it at most {steady_s:.2f} s); "
        f"restarted server caught up in {caught_up_s:.1f} s; durable publishes that gave up (then repeated): "
        f"{dict(run.publish_failures)}; refused lease commands: {len(workers.refused)}; "
        f"epochs of grants: {sorted({epoch for cmd, _, _, epoch in workers.log if cmd == 'grant'})}"
    )
    assert set(run.completed) == set(run.submitted) == {f"job-{i:02d}" for i in range(JOBS)}
    assert completions == dict.fromkeys(run.submitted, 1), "a job completed more than once"
    assert grants == Counter(dict.fromkeys(run.submitted, 1)), f"a job was granted more than once: {grants}"
    assert workers.max_concurrent_runs == 1
    assert not dead_letters, f"dead-lettered: {dead_letters}"
