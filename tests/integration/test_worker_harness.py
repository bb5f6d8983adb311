"""A harness for worker tests: real worker processes, a test acting as the scheduler over the real bus.

Also the most basic worker test: it registers its (fake) inventory and heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schemas.base import Event
from schemas.control import LeaseStopAt
from schemas.job import JobSpec
from schemas.jobs import JobCheckpointed, JobCompleted, JobFailed, JobStarted, JobSuspended
from schemas.leases import LeaseAck, LeaseGrant, LeaseRevoke, RevokeReason, WorldInfo
from schemas.metrics import JobMetrics
from schemas.nodes import NodeHeartbeat, NodeRegister
from schemas.subjects import lease_grant, lease_revoke, lease_stop
from services.runtime.bus import Bus, BusOptions
from services.worker.channel import Channel

REPO = Path(__file__).resolve().parents[2]


async def wait_for(predicate: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition") -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.01)


@dataclass
class Facts:
    """Everything the workers report, collected from core subscriptions."""

    events: list[Event] = field(default_factory=list)

    def of(self, model: type[Any], job_id: str | None = None) -> list[Any]:
        return [e for e in self.events if isinstance(e, model) and (job_id is None or e.job_id == job_id)]

    async def one(self, model: type[Any], job_id: str, timeout_s: float = 15.0) -> Any:
        return (await wait_for(lambda: self.of(model, job_id), timeout_s, f"{model.__name__} for {job_id}"))[0]

    def end_of(self, job_id: str) -> list[Event]:
        return [e for e in self.events if isinstance(e, JobSuspended | JobCompleted | JobFailed)
                and e.job_id == job_id]  # fmt: skip

    async def end(self, job_id: str, timeout_s: float = 15.0) -> Event:
        return (await wait_for(lambda: self.end_of(job_id), timeout_s, f"the end of {job_id}"))[0]


async def collect(bus: Bus) -> Facts:
    facts = Facts()

    async def keep(event: Event) -> None:
        facts.events.append(event)

    for subject, model in (("job.started.*", JobStarted), ("job.checkpointed.*", JobCheckpointed),
                           ("job.suspended.*", JobSuspended),
                           ("job.completed.*", JobCompleted), ("job.failed.*", JobFailed),
                           ("node.register.*", NodeRegister), ("node.heartbeat.*", NodeHeartbeat),
                           ("metrics.job.*", JobMetrics)):  # fmt: skip
        await bus.subscribe(subject, model, keep)  # type: ignore[arg-type]
    await bus.nc.flush()
    return facts


class WorkerProcess:
    """``python -m services.worker`` as a child process."""

    def __init__(self, nats: str, namespace: str, node_id: str, work_dir: Path, *extra: str) -> None:
        self.args = [sys.executable, "-m", "services.worker", "--nats", nats, "--namespace", namespace,
                     "--node-id", node_id, "--instance", node_id, "--work-dir", str(work_dir),
                     "--log-format", "text", "--log-level", "INFO", *extra]  # fmt: skip
        self.node_id = node_id
        self.log = work_dir.parent / f"{node_id}.log"
        self.process: asyncio.subprocess.Process | None = None
        self.incarnation: uuid.UUID | None = None
        """The incarnation this process registered as (set by :meth:`start`)."""

    async def start(self, facts: Facts) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        # Only this incarnation's register counts: an earlier agent of the same node registered too.
        earlier = {e.incarnation for e in facts.of(NodeRegister) if e.node_id == self.node_id}
        with self.log.open("ab") as out:
            self.process = await asyncio.create_subprocess_exec(
                *self.args, env=env, cwd=str(REPO), stdout=out, stderr=out
            )
        registered = await wait_for(
            lambda: [e for e in facts.of(NodeRegister) if e.node_id == self.node_id and e.incarnation not in earlier],
            20, f"{self.node_id}'s new incarnation registered",
        )  # fmt: skip
        self.incarnation = registered[0].incarnation

    async def stop(self, timeout_s: float = 15.0) -> int:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout_s)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        return self.process.returncode or 0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


# --- a tiny training script (pure Python: no torch import, so it starts in ~0.1 s) --------------------
LOOP_SCRIPT = textwrap.dedent("""
    import os, sys, time, signal
    from roundhouse import train

    iterations, sleep_s = int(sys.argv[1]), float(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "obey"
    job = train.attach()
    restored = job.restore()
    state = {"sum": restored.extra["sum"] if restored else 0}
    log = open(os.path.join(os.environ["ROUNDHOUSE_CHECKPOINT_DIR"], f"steps-rank{job.rank}.txt"), "a")
    if mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:  # never checks the lease; checkpoints every 5 iterations
            time.sleep(sleep_s)
            job.iteration_done(loss=1.0)
            if job.iteration % 5 == 0:
                job.checkpoint(extra={"sum": 0})
    crash_rank = int(sys.argv[4]) if len(sys.argv) > 4 else job.rank
    if mode == "crash" and crash_rank == job.rank:
        for _ in job.iterate(range(10**9), max_iterations=3):
            time.sleep(sleep_s)
        sys.stderr.write("boom: out of patience\\n")
        sys.exit(3)
    for i in job.iterate(range(max(iterations, 1)), max_iterations=iterations, epochs=1):
        time.sleep(sleep_s)
        state["sum"] += i
        log.write(f"{i}\\n"); log.flush()
        job.report(loss=1.0 / (1 + i), batch_size=8)
    if job.stopping or job.iteration == iterations:
        job.checkpoint(extra=state)
    job.close()
""")


@contextlib.asynccontextmanager
async def one_worker(broker_url: str, tmp: Path, node: str) -> AsyncIterator[tuple[Bus, Facts, WorkerProcess, Path]]:
    """A fresh namespace with a bus standing in for the scheduler, what it hears, and one real worker
    agent on 2 fake GPUs with fast heartbeats; the agent must exit cleanly at the end."""
    namespace = f"t{uuid.uuid4().hex[:12]}"
    bus = await Bus.connect(broker_url, name="test-scheduler", options=BusOptions(namespace=namespace))
    facts = await collect(bus)
    work_dir = tmp / "node"
    worker = WorkerProcess(broker_url, namespace, node, work_dir, "--fake-gpus", "2", "--heartbeat-s", "0.2",
                           "--metrics-s", "0.1", "--kill-after-s", "0.5")  # fmt: skip
    await worker.start(facts)
    try:
        yield bus, facts, worker, work_dir
    finally:
        code = await worker.stop()
        await bus.close()
        assert code == 0, worker.log_text()


def job_id() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


def write_script(tmp: Path) -> Path:
    path = tmp / "loop_job.py"
    path.write_text(LOOP_SCRIPT)
    return path


def spec(*command: str, grace_s: float = 5.0, name: str = "loop") -> JobSpec:
    return JobSpec(name=name, command=list(command), grace_period_s=grace_s)


class Scheduler:
    """The test's side of the lease protocol."""

    def __init__(self, bus: Bus, epoch: int = 5) -> None:
        self.bus = bus
        self.epoch = epoch

    def grant(
        self,
        node: str,
        job_id: str,
        command: list[str],
        *,
        gpus: list[int] | None = None,
        lease_id: str | None = None,
        world: WorldInfo | None = None,
        epoch: int | None = None,
        resume: JobSuspended | None = None,
        grace_s: float = 5.0,
    ) -> LeaseGrant:
        return LeaseGrant(
            epoch=self.epoch if epoch is None else epoch, lease_id=lease_id or f"l-{uuid.uuid4().hex[:10]}",
            job_id=job_id, node_id=node, gpus=gpus or [0], spec=spec(*command, grace_s=grace_s), world=world,
            resume_from=resume.checkpoint_path if resume else None,
            resume_iteration=resume.checkpoint_iteration if resume else None,
        )  # fmt: skip

    async def send(self, grant: LeaseGrant) -> LeaseAck:
        return await self.bus.request(lease_grant(grant.node_id), grant, LeaseAck, timeout_s=5)

    async def revoke(
        self, grant: LeaseGrant, *, grace_s: float = 5.0, epoch: int | None = None, node: str | None = None
    ) -> LeaseAck:
        revoke = LeaseRevoke(epoch=self.epoch if epoch is None else epoch, lease_id=grant.lease_id,
                             job_id=grant.job_id, node_id=node or grant.node_id, reason=RevokeReason.PREEMPT,
                             grace_s=grace_s)  # fmt: skip
        return await self.bus.request(lease_revoke(revoke.node_id), revoke, LeaseAck, timeout_s=5)

    async def stop_at(self, grant: LeaseGrant, stop_at: int, *, epoch: int) -> LeaseAck:
        command = LeaseStopAt(
            epoch=epoch, lease_id=grant.lease_id, job_id=grant.job_id, node_id=grant.node_id, stop_at=stop_at, grace_s=5
        )
        return await self.bus.request(lease_stop(grant.node_id), command, LeaseAck, timeout_s=5)


def steps(checkpoint_dir: Path, rank: int = 0) -> list[int]:
    path = checkpoint_dir / f"steps-rank{rank}.txt"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def test_worker_registers_its_fake_inventory_and_heartbeats(
    broker: Any, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    worker = WorkerProcess(
        broker.url, namespace, "reg-node", tmp_path / "w", "--fake-gpus", "3", "--heartbeat-s", "0.2"
    )
    await worker.start(facts)
    try:
        register = next(e for e in facts.of(NodeRegister) if e.node_id == "reg-node")
        assert [g.index for g in register.gpus] == [0, 1, 2]
        assert len({g.uuid for g in register.gpus}) == 3
        assert register.lease_ttl_s == 30.0
        beats = await wait_for(
            lambda: [e for e in facts.of(NodeHeartbeat) if e.node_id == "reg-node"][2:], 5, "three heartbeats"
        )
        seqs = [b.seq for b in facts.of(NodeHeartbeat) if b.node_id == "reg-node"]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == len(seqs)
        assert all(b.incarnation == register.incarnation for b in beats)
        assert beats[-1].leases == []
    finally:
        assert await worker.stop() == 0, worker.log_text()


async def test_a_restarted_worker_kills_the_jobs_its_predecessor_left_running(
    broker: Any, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    work_dir = tmp_path / "w"
    first = WorkerProcess(broker.url, namespace, "orphan-node", work_dir, "--fake-gpus", "1")
    await first.start(facts)
    sched = Scheduler(bus)
    grant = sched.grant("orphan-node", "orphan-job", [sys.executable, "-c", "import time; time.sleep(60)"])
    assert (await sched.send(grant)).accepted
    started = await facts.one(JobStarted, "orphan-job")
    assert started.lease_id == grant.lease_id
    group = Channel.open(work_dir / "leases" / grant.lease_id / "rank-0.chan").group
    assert group is not None
    assert first.process is not None
    first.process.kill()  # the agent dies without draining; its job keeps running
    await first.process.wait()
    os.kill(group, 0)  # still alive
    second = WorkerProcess(broker.url, namespace, "orphan-node", work_dir, "--fake-gpus", "1")
    await second.start(facts)
    try:

        def gone() -> bool:
            try:
                os.kill(group, 0)
            except ProcessLookupError:
                return True
            return False

        await wait_for(gone, 10, "the orphan killed")
        assert "left running by a previous agent" in second.log_text()
    finally:
        assert await second.stop() == 0, second.log_text()
