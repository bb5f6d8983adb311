"""Periodic checkpoints of a running job become ``job.checkpointed`` facts, once per new checkpoint.

A real worker agent process and a real training script that checkpoints every few iterations
(``roundhouse.train``'s ``checkpoint_every``); the test plays the scheduler. The checkpoint written
when the lease stops the job goes with ``job.suspended`` only, and a resumed run does not report
the checkpoint it resumed from again.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path

from schemas.jobs import JobCheckpointed, JobCompleted, JobStarted, JobSuspended
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from tests.integration.test_worker_harness import Scheduler, WorkerProcess, collect, wait_for

NODE = "periodic-node"
EVERY = 10

PERIODIC_SCRIPT = textwrap.dedent("""
    import sys, time
    from roundhouse import train

    class Counter:  # the "model": its state is the number of steps taken (pickled, no torch)
        def __init__(self): self.steps = 0
        def state_dict(self): return {"steps": self.steps}
        def load_state_dict(self, state): self.steps = state["steps"]

    iterations, sleep_s, every = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    job = train.attach()
    model = Counter()
    job.restore(model)
    for _ in job.iterate(range(10**9), model=model, max_iterations=iterations, checkpoint_every=every):
        time.sleep(sleep_s)
        model.steps += 1
        job.report(loss=1.0, batch_size=8)
    job.close()
""")


def write_periodic_script(tmp: Path) -> Path:
    """A training script: ``<iterations> <sleep_s> <checkpoint_every>``; checkpoints every N, at a stop, at the end."""
    path = tmp / "periodic_job.py"
    path.write_text(PERIODIC_SCRIPT)
    return path


def checkpoints(facts: list[JobCheckpointed], lease_id: str) -> list[int]:
    return [f.iteration for f in facts if f.lease_id == lease_id]


async def test_each_periodic_checkpoint_is_reported_once_and_a_stop_checkpoint_is_not(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    work_dir = tmp_path / "node"
    # Metrics (and so checkpoints) sampled every 0.05 s: several samples per checkpoint (every 10
    # iterations of 0.02 s), so a fact reported more than once would show.
    agent = WorkerProcess(broker.url, namespace, NODE, work_dir, "--fake-gpus", "1", "--heartbeat-s", "0.2",
                          "--metrics-s", "0.05", "--kill-after-s", "0.5")  # fmt: skip
    script = write_periodic_script(tmp_path)
    sched = Scheduler(bus)
    job = f"job-{uuid.uuid4().hex[:8]}"
    path = str(work_dir / "checkpoints" / job / "checkpoint.pt")
    await agent.start(facts)
    try:
        # Run 1: periodic checkpoints, then a revoke stops it (with a checkpoint of its own).
        grant = sched.grant(NODE, job, [sys.executable, str(script), "100000", "0.02", str(EVERY)])
        assert (await sched.send(grant)).accepted
        await facts.one(JobStarted, job)
        await wait_for(lambda: len(checkpoints(facts.of(JobCheckpointed, job), grant.lease_id)) >= 3,
                       what="three periodic checkpoints reported")  # fmt: skip
        assert (await sched.revoke(grant)).accepted
        suspended = await facts.end(job)
        assert isinstance(suspended, JobSuspended), suspended
        assert suspended.checkpoint_iteration is not None
        seen = facts.of(JobCheckpointed, job)
        run1 = checkpoints(seen, grant.lease_id)
        assert run1 == sorted(set(run1)), run1  # once per checkpoint, in order
        assert all(i > 0 and i % EVERY == 0 for i in run1), run1  # periodic ones only
        assert run1[-1] <= suspended.checkpoint_iteration
        for fact in seen:
            assert (fact.node_id, fact.epoch, fact.checkpoint_path) == (NODE, grant.epoch, path)
        # Nothing after the stop: the stop's checkpoint is job.suspended's alone (the outbox keeps
        # the order, so a late job.checkpointed would come after it here).
        after = facts.events[facts.events.index(suspended):]
        assert not [e for e in after if isinstance(e, JobCheckpointed)]

        # Run 2 resumes from it and runs to the end: only checkpoints newer than the resumed one.
        second = sched.grant(NODE, job, [sys.executable, str(script), str(suspended.checkpoint_iteration + 45),
                                         "0.02", str(EVERY)], resume=suspended)  # fmt: skip
        assert (await sched.send(second)).accepted
        end = await wait_for(lambda: [e for e in facts.end_of(job) if getattr(e, "lease_id", None) == second.lease_id],
                             30, "run 2's end")  # fmt: skip
        assert isinstance(end[0], JobCompleted), end
        run2 = checkpoints(facts.of(JobCheckpointed, job), second.lease_id)
        assert len(run2) >= 2, run2
        assert run2 == sorted(set(run2)), run2
        assert run2[0] > suspended.checkpoint_iteration, (run2, suspended.checkpoint_iteration)
        assert run2[-1] <= end[0].iteration
    finally:
        assert await agent.stop() == 0, agent.log_text()
