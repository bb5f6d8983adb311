"""A run lost past its checkpoint: the next run resumes from the checkpoint's iteration.

The second test: a run that wrote periodic checkpoints (``job.checkpointed``) and was then lost
resumes from the last of them, and only the progress past it is taken back.

Real nats-server, the scheduler service on a SQLite store, the metrics service (folding the agent's
``metrics.job.<id>`` samples into the ``job-metrics`` bucket the scheduler watches) and a real
worker agent process running a real training script (``roundhouse.train``: it checkpoints when its
lease stops it, and restores on resume). The job is suspended once with a checkpoint (the agent is
drained), resumes, runs well past that checkpoint, and then its node goes silent (the agent is
killed: no fact at all). The scheduler must requeue it at the checkpoint's iteration, persist
that, and grant the next run with ``resume_iteration`` = the checkpoint's iteration: with the
progress the metrics showed instead, the training client warns that the checkpoint holds another
iteration and the run's first progress (``resume.py``) is not recognised.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from roundhouse.train._checkpoint import load_checkpoint
from schemas.job import JobSpec
from schemas.jobs import JobCheckpointed, JobStarted, JobSuspended, SuspendReason
from services.core.state import JobStatus
from services.metrics.service import MetricsConfig, MetricsService
from services.runtime.broker import Broker
from services.scheduler.book import JobBook
from services.worker.channel import Channel
from tests.integration.test_scheduler import cluster, wait_for
from tests.integration.test_worker_checkpoints import write_periodic_script
from tests.integration.test_worker_harness import Facts, WorkerProcess, collect, write_script
from tests.integration.test_worker_orphans import assert_resumed_from

NODE = "ckpt-node"
LEASE_TTL_S = 2.0
PAST = 30
"""Iterations the resumed run is to report past its checkpoint before its node is lost."""


def worker(broker: Broker, namespace: str, work_dir: Path) -> WorkerProcess:
    return WorkerProcess(
        broker.url, namespace, NODE, work_dir, "--fake-gpus", "1", "--heartbeat-s", "0.2", "--metrics-s", "0.1",
        "--lease-ttl-s", str(LEASE_TTL_S), "--kill-after-s", "0.5",
    )  # fmt: skip


def started(facts: Facts, job_id: str, run: int) -> JobStarted | None:
    """The ``run``-th (from 1) ``job.started`` of ``job_id``, once seen."""
    runs: list[JobStarted] = facts.of(JobStarted, job_id)
    return runs[run - 1] if len(runs) >= run else None


async def test_a_run_lost_past_its_checkpoint_resumes_from_the_checkpoint_iteration(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    work_dir = tmp_path / "node"
    script = write_script(tmp_path)
    async with cluster(broker, namespace, tmp_path) as c:
        facts = await collect(c.client)
        metrics = MetricsService(MetricsConfig(nats=broker.url, namespace=namespace, flush_interval_s=0.05))
        await metrics.start(await c.connect("metrics"))
        agent = worker(broker, namespace, work_dir)
        try:
            await agent.start(facts)
            s = await c.start_scheduler(policy="fifo", round_s=0.3, lease_ttl_s=LEASE_TTL_S)
            await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with the node")
            spec = JobSpec(name="j", command=[sys.executable, str(script), "100000", "0.01"], grace_period_s=5.0)
            await c.submit("j", spec)

            # Run 1 makes progress, then the agent is drained: the job is suspended with a checkpoint.
            await wait_for(lambda: started(facts, "j", 1) is not None, timeout_s=15, what="run 1 started")
            await wait_for(lambda: (e := s.book.entry("j")) is not None and e.state.iterations_done >= 10,
                           timeout_s=15, what="run 1's progress in the job-metrics")  # fmt: skip
            assert await agent.stop() == 0
            suspended: JobSuspended = await facts.one(JobSuspended, "j")
            assert suspended.reason is SuspendReason.NODE_SHUTDOWN
            ckpt = suspended.checkpoint_iteration
            assert ckpt is not None
            assert ckpt >= 10
            entry = s.book.jobs["j"]
            await wait_for(lambda: entry.checkpoint_iteration == ckpt, what="the suspension applied")
            # Until its heartbeats are missed for lease_ttl the node still counts as live, and fill
            # rounds grant the job to it in vain: let that settle so the next run is the agent's.
            await wait_for(lambda: not s.inventory.is_live(NODE) and entry.lease is None,
                           timeout_s=LEASE_TTL_S + 5, what="the drained node left out")  # fmt: skip
            state = entry.state
            assert (state.status, state.iterations_done) == (JobStatus.QUEUED, ckpt)
            # One for the suspension; a vain grant still in flight when the node was declared dead
            # is released as a preemption too (its lease never started).
            preemptions = state.preemptions
            assert preemptions >= 1

            # Run 2 resumes from it and runs well past it: the metrics take iterations_done along.
            agent = worker(broker, namespace, work_dir)
            await agent.start(facts)
            await wait_for(lambda: started(facts, "j", 2) is not None, timeout_s=15, what="run 2 started")
            run2 = started(facts, "j", 2)
            assert run2 is not None
            assert (run2.iteration, run2.resumed_from) == (ckpt, suspended.checkpoint_path)
            await wait_for(lambda: entry.state.iterations_done >= ckpt + PAST, timeout_s=15,
                           what="run 2's progress past the checkpoint")  # fmt: skip
            assert JobBook.resume_iteration(entry) == ckpt  # the bug: this was iterations_done

            # Its node goes silent (no job.suspended, no checkpoint): after lease_ttl the run is lost.
            assert agent.process is not None
            agent.process.kill()
            await agent.process.wait()
            await wait_for(lambda: entry.state.status is JobStatus.QUEUED, timeout_s=LEASE_TTL_S + 5,
                           what="run 2 released as lost")  # fmt: skip
            assert entry.state.iterations_done == ckpt  # its progress past the checkpoint is to redo
            assert entry.state.preemptions == preemptions + 1
            assert s.store is not None
            record = await s.store.get_job("j")
            assert record is not None
            assert (record.iterations_done, record.checkpoint_iteration, record.checkpoint_path) == (
                ckpt, ckpt, suspended.checkpoint_path,
            )  # fmt: skip

            # Without its agent, run 2 stopped itself with a checkpoint (its lease's watchdog told
            # it), which the node's next agent reports (job.checkpointed for run 2's lease) before
            # it registers: run 3 resumes from that checkpoint's iteration, and its first
            # iteration counts as its progress.
            await wait_for((work_dir / "leases" / run2.lease_id / "orphaned.json").exists,
                           what="run 2 stopped without its agent")  # fmt: skip
            last = load_checkpoint(Path(suspended.checkpoint_path))["iteration"]
            assert last >= ckpt + PAST
            agent = worker(broker, namespace, work_dir)
            await agent.start(facts)
            await wait_for(lambda: started(facts, "j", 3) is not None, timeout_s=15, what="run 3 started")
            run3 = started(facts, "j", 3)
            assert run3 is not None
            assert run3.resumed_from == suspended.checkpoint_path
            lease = s.book.leases[run3.lease_id]
            assert lease.from_iteration == run3.iteration
            await wait_for(lambda: lease.progress_at is not None, timeout_s=15, what="run 3's progress seen")
            await wait_for(lambda: (entry.checkpoint_iteration or 0) >= last and entry.state.iterations_done > last,
                           what="run 3's progress in the book")  # fmt: skip
            # From `last` (or, had the report landed after the grant, from the file holding it).
            assert_resumed_from(run3, last, (work_dir / "leases" / run3.lease_id / "rank-0.log").read_text())
        finally:
            await agent.stop()
            await metrics.stop()


EVERY = 50
"""Iterations between periodic checkpoints (0.01 s each: one checkpoint every ~0.5 s)."""


async def test_a_run_lost_after_periodic_checkpoints_resumes_from_the_last_one(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    work_dir = tmp_path / "node"
    script = write_periodic_script(tmp_path)
    async with cluster(broker, namespace, tmp_path) as c:
        facts = await collect(c.client)
        metrics = MetricsService(MetricsConfig(nats=broker.url, namespace=namespace, flush_interval_s=0.05))
        await metrics.start(await c.connect("metrics"))
        agent = worker(broker, namespace, work_dir)
        try:
            await agent.start(facts)
            s = await c.start_scheduler(policy="fifo", round_s=0.3, lease_ttl_s=LEASE_TTL_S)
            await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with the node")
            command = [sys.executable, str(script), "100000", "0.01", str(EVERY)]
            await c.submit("j", JobSpec(name="j", command=command, grace_period_s=5.0))

            # Run 1 (a fresh start) writes periodic checkpoints; the scheduler keeps each one.
            await wait_for(lambda: started(facts, "j", 1) is not None, timeout_s=15, what="run 1 started")
            run1 = started(facts, "j", 1)
            assert run1 is not None
            entry = s.book.jobs["j"]
            await wait_for(lambda: (entry.checkpoint_iteration or 0) >= 2 * EVERY, timeout_s=15,
                           what="two periodic checkpoints applied")  # fmt: skip
            assert entry.state.preemptions == 0  # no stop so far: job.checkpointed alone told it

            # The node dies: freeze the training process (so it writes nothing the agent does not
            # see), let the agent report the checkpoint the frozen process left on disk, then kill both.
            channel = Channel.open(work_dir / "leases" / run1.lease_id / "rank-0.chan")
            group = channel.group
            assert group is not None
            path = str(work_dir / "checkpoints" / "j" / "checkpoint.pt")
            os.killpg(group, signal.SIGSTOP)
            on_disk = load_checkpoint(Path(path))["iteration"]  # frozen: the file changes no more
            for _ in range(20):
                # Frozen between writing the file and telling its channel (a few bytecodes): the agent
                # could never learn of that checkpoint. Let it run on a moment and freeze it again.
                if channel.checkpoint_iteration == on_disk:
                    break
                os.killpg(group, signal.SIGCONT)
                os.killpg(group, signal.SIGSTOP)
                on_disk = load_checkpoint(Path(path))["iteration"]
            assert channel.checkpoint_iteration == on_disk
            await wait_for(lambda: on_disk in [f.iteration for f in facts.of(JobCheckpointed, "j")], timeout_s=15,
                           what="the agent reported the checkpoint on disk")  # fmt: skip
            assert agent.process is not None
            agent.process.kill()
            await agent.process.wait()
            os.killpg(group, signal.SIGKILL)
            reported = [f.iteration for f in facts.of(JobCheckpointed, "j")]
            assert reported == sorted(set(reported)), reported  # once per checkpoint
            assert all(i % EVERY == 0 for i in reported), reported
            last = reported[-1]
            assert load_checkpoint(Path(path))["iteration"] == last == on_disk  # what the file holds
            await wait_for(lambda: entry.checkpoint_iteration == last, what="the last checkpoint applied")
            progress = entry.state.iterations_done
            assert progress >= last

            # Its lease expires with no stop fact: it is requeued at the last periodic checkpoint
            # (before job.checkpointed: at 0, the whole run redone).
            await wait_for(lambda: entry.state.status is JobStatus.QUEUED, timeout_s=LEASE_TTL_S + 5,
                           what="run 1 released as lost")  # fmt: skip
            assert (entry.state.iterations_done, entry.state.preemptions) == (last, 1)
            assert JobBook.resume_iteration(entry) == last
            assert s.store is not None
            record = await s.store.get_job("j")
            assert record is not None
            assert (record.iterations_done, record.checkpoint_iteration, record.checkpoint_path) == (last, last, path)

            # The node comes back: run 2 is granted resume_iteration = the last periodic checkpoint's.
            agent = worker(broker, namespace, work_dir)
            await agent.start(facts)
            await wait_for(lambda: started(facts, "j", 2) is not None, timeout_s=15, what="run 2 started")
            run2 = started(facts, "j", 2)
            assert run2 is not None
            assert (run2.iteration, run2.resumed_from) == (last, path)
            lease = s.book.leases[run2.lease_id]
            assert lease.from_iteration == last
            await wait_for(lambda: lease.progress_at is not None, timeout_s=15, what="run 2's progress seen")
            await wait_for(lambda: entry.state.iterations_done > last, what="run 2's progress in the book")
            log = (work_dir / "leases" / run2.lease_id / "rank-0.log").read_text()
            assert "the scheduler expected" not in log, log  # the checkpoint holds what the grant says
        finally:
            await agent.stop()
            await metrics.stop()
