"""No agent, no job (DESIGN, Trust and failure): a job whose agent is gone stops before its lease TTL.

Real worker agent processes (``python -m services.worker``), real job processes, the real bus; the
test plays the scheduler, except where a real scheduler decides (no double run, resume after a
restart). The agent is killed with SIGKILL (or frozen with SIGSTOP), so nothing of it runs: what
stops the job is the lease's watchdog and the training client. Waits are on facts (processes gone,
files, events), each bounded; the budget asserted is the one the scheduler's rule allows: a dead
node's GPUs (and its jobs) are given again ``lease_ttl_s`` after its last heartbeat, so a job must be
gone ``lease_ttl_s - heartbeat_s`` after its agent's death at the latest.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
import uuid
from pathlib import Path

from roundhouse.train import load_checkpoint
from schemas.job import JobSpec
from schemas.jobs import JobCheckpointed, JobCompleted, JobFailed, JobStarted, JobSuspended, SuspendReason
from schemas.nodes import NodeRegister
from services.core.state import JobStatus
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from services.worker.channel import Channel, ClientStatus
from services.worker.orphans import budget
from services.worker.records import LeaseRecord
from tests.integration.test_scheduler import cluster
from tests.integration.test_worker_checkpoints import write_periodic_script
from tests.integration.test_worker_harness import Facts, Scheduler, WorkerProcess, collect, wait_for

TTL = 4.0
HEARTBEAT = 0.2
KILL_AFTER = 0.5
GRACE = 5.0
EVERY = 10
"""Iterations between periodic checkpoints (0.01 s each)."""
DEADLINE_S = TTL - HEARTBEAT
"""After the agent's death, the job must be gone by then: the scheduler may run it elsewhere."""


def agent(broker: Broker, namespace: str, node: str, work_dir: Path, *extra: str) -> WorkerProcess:
    return WorkerProcess(broker.url, namespace, node, work_dir, "--fake-gpus", "1", "--heartbeat-s", str(HEARTBEAT),
                         "--metrics-s", "0.05", "--kill-after-s", str(KILL_AFTER), "--lease-ttl-s", str(TTL),
                         *extra)  # fmt: skip


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it waits only to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZXx"


def lease_pids(lease_dir: Path) -> list[int]:
    """Every running process started under the lease: ranks, their children, its watchdog (a process
    on its way out may no longer show its environment: wait on its pid as well where it is known)."""
    mark = f"ROUNDHOUSE_CHANNEL={lease_dir}/".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(mark) for item in environ.split(b"\x00")):
            pids.append(int(entry.name))
    watchdog = lease_dir / "watchdog.pid"
    if watchdog.exists() and alive(int(watchdog.read_text())):
        pids.append(int(watchdog.read_text()))
    return pids


async def kill(worker: WorkerProcess) -> float:
    """SIGKILL the agent (no drain, nothing of it runs on); returns when, on the monotonic clock."""
    assert worker.process is not None
    worker.process.kill()
    at = time.monotonic()
    await worker.process.wait()
    return at


async def restart(worker: WorkerProcess, facts: Facts) -> None:
    """Start an agent on a node that had one: returns once *this* incarnation registered."""
    before = len(facts.events)
    await worker.start(facts)  # satisfied by the predecessor's registration already
    await wait_for(lambda: [e for e in facts.events[before:] if isinstance(e, NodeRegister)
                            and e.node_id == worker.node_id], 60, "the new incarnation registered")  # fmt: skip


def orphaned(lease_dir: Path) -> dict[str, object]:
    return json.loads((lease_dir / "orphaned.json").read_text())  # type: ignore[no-any-return]


async def test_a_training_job_whose_agent_is_killed_checkpoints_and_exits_well_within_the_ttl(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    work_dir = tmp_path / "node"
    worker = agent(broker, namespace, "lonely", work_dir)
    await worker.start(facts)
    job = f"j-{uuid.uuid4().hex[:8]}"
    sched = Scheduler(bus)
    grant = sched.grant("lonely", job, [sys.executable, str(write_periodic_script(tmp_path)), "1000000", "0.01",
                                        str(EVERY)], grace_s=GRACE)  # fmt: skip
    assert (await sched.send(grant)).accepted
    await facts.one(JobStarted, job)
    await wait_for(lambda: len(facts.of(JobCheckpointed, job)) >= 2, what="two periodic checkpoints reported")
    lease_dir = work_dir / "leases" / grant.lease_id
    reported = facts.of(JobCheckpointed, job)[-1].iteration
    # What the agent knows of the lease is on disk as well (written before the fact goes out).
    record = LeaseRecord.read(lease_dir)
    assert (record.job_id, record.epoch, record.ranks) == (job, grant.epoch, 1)
    assert record.checkpoint_iteration is not None
    assert record.checkpoint_iteration >= reported
    channel = Channel.open(lease_dir / "rank-0.chan")
    await wait_for((lease_dir / "watchdog.pid").exists, what="the lease's watchdog")
    pids = lease_pids(lease_dir)
    assert len(pids) == 2  # the job and its watchdog

    killed_at = await kill(worker)
    await wait_for(lambda: not any(alive(pid) for pid in pids) and not lease_pids(lease_dir), DEADLINE_S,
                   "no process of the lease left")  # fmt: skip
    gone_s = time.monotonic() - killed_at
    assert gone_s < DEADLINE_S
    # It stopped on its own at an iteration boundary, after its checkpoint: no signal was needed.
    outcome = orphaned(lease_dir)
    assert (outcome["reason"], outcome["how"]) == ("agent_died", "exited"), outcome
    orphan_budget = budget(lease_ttl_s=TTL, heartbeat_s=HEARTBEAT, kill_after_s=KILL_AFTER, grace_period_s=GRACE)
    assert gone_s < orphan_budget.grace_s
    final = load_checkpoint(work_dir / "checkpoints" / job / "checkpoint.pt")["iteration"]
    assert channel.status is ClientStatus.STOPPED
    assert final == channel.checkpoint_iteration == channel.iteration
    assert final >= reported
    assert "the worker agent is gone" in (lease_dir / "rank-0.log").read_text()
    channel.close()


PLAIN_SCRIPT = textwrap.dedent("""
    # Knows nothing of Roundhouse: ignores SIGTERM, has a child in its process group and a grandchild
    # that left the group (its own session) and ignores SIGTERM too.
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    escaped = subprocess.Popen([sys.executable, "-c",
                                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
                               start_new_session=True)
    path = os.path.join(os.environ["ROUNDHOUSE_CHECKPOINT_DIR"], "pids")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {child.pid} {escaped.pid}")
    os.replace(path + ".tmp", path)
    while True:
        time.sleep(1)
""")


async def test_a_job_that_ignores_the_protocol_is_killed_with_all_its_processes_before_the_ttl(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    facts = await collect(bus)
    work_dir = tmp_path / "node"
    worker = agent(broker, namespace, "plain", work_dir)
    await worker.start(facts)
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    job = f"j-{uuid.uuid4().hex[:8]}"
    sched = Scheduler(bus)
    grant = sched.grant("plain", job, [sys.executable, str(script)], grace_s=GRACE)
    assert (await sched.send(grant)).accepted
    await facts.one(JobStarted, job)
    pids_file = work_dir / "checkpoints" / job / "pids"
    await wait_for(pids_file.exists, what="the job's processes started")
    pids = [int(p) for p in pids_file.read_text().split()]
    assert all(alive(pid) for pid in pids)
    lease_dir = work_dir / "leases" / grant.lease_id

    killed_at = await kill(worker)
    await wait_for(lambda: not any(alive(pid) for pid in pids) and not lease_pids(lease_dir), DEADLINE_S,
                   "no process of the lease left")  # fmt: skip
    gone_s = time.monotonic() - killed_at
    assert gone_s < DEADLINE_S
    # It had its grace period, then SIGTERM (ignored), then SIGKILL: all within the budget.
    orphan_budget = budget(lease_ttl_s=TTL, heartbeat_s=HEARTBEAT, kill_after_s=KILL_AFTER, grace_period_s=GRACE)
    assert gone_s >= orphan_budget.grace_s + orphan_budget.kill_after_s
    await wait_for((lease_dir / "orphaned.json").exists, what="the watchdog's record")
    outcome = orphaned(lease_dir)
    assert (outcome["reason"], outcome["how"], outcome["left"]) == ("agent_died", "killed", []), outcome


async def test_a_job_whose_agent_is_frozen_stops_and_the_agent_back_reports_a_suspension(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    """SIGSTOP: the agent neither heartbeats nor keeps its watchdogs alive; after half the TTL the
    watchdog stops the job as for a dead agent. Continued, the agent reports a suspension (lease
    expired, with the job's checkpoint), not a failure or a completion."""
    facts = await collect(bus)
    work_dir = tmp_path / "node"
    worker = agent(broker, namespace, "frozen", work_dir)
    await worker.start(facts)
    job = f"j-{uuid.uuid4().hex[:8]}"
    sched = Scheduler(bus)
    grant = sched.grant("frozen", job, [sys.executable, str(write_periodic_script(tmp_path)), "1000000", "0.01",
                                        str(EVERY)], grace_s=GRACE)  # fmt: skip
    assert (await sched.send(grant)).accepted
    await facts.one(JobStarted, job)
    await wait_for(lambda: facts.of(JobCheckpointed, job), what="a periodic checkpoint")
    lease_dir = work_dir / "leases" / grant.lease_id
    pids = lease_pids(lease_dir)
    assert worker.process is not None
    try:
        worker.process.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        await wait_for(lambda: not any(alive(pid) for pid in pids) and not lease_pids(lease_dir), DEADLINE_S,
                       "no process of the lease left")  # fmt: skip
        assert time.monotonic() - frozen_at < DEADLINE_S
    finally:
        worker.process.send_signal(signal.SIGCONT)
    assert (orphaned(lease_dir)["reason"], orphaned(lease_dir)["how"]) == ("agent_silent", "exited")
    final = load_checkpoint(work_dir / "checkpoints" / job / "checkpoint.pt")["iteration"]
    end = await facts.end(job)
    assert isinstance(end, JobSuspended), end
    assert (end.reason, end.checkpoint_iteration, end.grace_expired) == (SuspendReason.LEASE_EXPIRED, final, False)
    assert not facts.of(JobFailed, job)
    assert not facts.of(JobCompleted, job)
    assert await worker.stop() == 0, worker.log_text()


async def test_a_restarted_agent_reports_its_predecessors_newest_checkpoint_before_it_registers(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    """The job cannot checkpoint once its agent is gone (frozen): what survives is the periodic
    checkpoint the dead agent knew of, which the next agent reports (with the old lease) first."""
    facts = await collect(bus)
    work_dir = tmp_path / "node"
    first = agent(broker, namespace, "phoenix", work_dir)
    await first.start(facts)
    job = f"j-{uuid.uuid4().hex[:8]}"
    sched = Scheduler(bus)
    grant = sched.grant("phoenix", job, [sys.executable, str(write_periodic_script(tmp_path)), "1000000", "0.01",
                                         str(EVERY)], grace_s=GRACE)  # fmt: skip
    assert (await sched.send(grant)).accepted
    await facts.one(JobStarted, job)
    await wait_for(lambda: len(facts.of(JobCheckpointed, job)) >= 2, what="two periodic checkpoints reported")
    lease_dir = work_dir / "leases" / grant.lease_id
    group = Channel.open(lease_dir / "rank-0.chan").group
    assert group is not None
    os.killpg(group, signal.SIGSTOP)  # it writes nothing more; the watchdog will have to kill it
    newest = Channel.open(lease_dir / "rank-0.chan").checkpoint_iteration
    assert newest is not None
    await kill(first)
    before = len(facts.events)

    second = agent(broker, namespace, "phoenix", work_dir)
    await restart(second, facts)
    try:
        assert not alive(group)  # it registered only once its predecessor's job was gone
        after = facts.events[before:]
        register = next(i for i, e in enumerate(after) if isinstance(e, NodeRegister))
        reports = [e for e in after[:register] if isinstance(e, JobCheckpointed)]
        assert [(r.lease_id, r.iteration, r.node_id, r.epoch) for r in reports] == [
            (grant.lease_id, newest, "phoenix", grant.epoch)
        ]
        assert Path(reports[0].checkpoint_path) == (work_dir / "checkpoints" / job / "checkpoint.pt").resolve()
        assert load_checkpoint(Path(reports[0].checkpoint_path))["iteration"] == newest
        # Reported once: the record goes once the fact is out; a third agent reports nothing.
        await wait_for(lambda: not (lease_dir / "lease.json").exists(), what="the record forgotten")
    finally:
        assert await second.stop() == 0, second.log_text()
    third = agent(broker, namespace, "phoenix", work_dir)
    before = len(facts.events)
    await restart(third, facts)
    assert await third.stop() == 0, third.log_text()
    assert not [e for e in facts.events[before:] if isinstance(e, JobCheckpointed)]


# --- with the real scheduler --------------------------------------------------------------------------
def assert_resumed_from(run: JobStarted, newest: int, log: str) -> None:
    """``run`` continued from the checkpoint holding ``newest``.

    Granted so when the scheduler applied the restarted agent's ``job.checkpointed`` before the
    release its ``node.register`` causes (published first, but the scheduler's durable consumers are
    not ordered with each other; docs/worker.md, *Agent restart*). Otherwise the grant names the
    previous checkpoint's iteration for the same file, and the client restores what the file holds:
    the newest (and warns).
    """
    if run.iteration == newest:
        assert "the scheduler expected" not in log, log
    else:
        assert run.iteration is not None
        assert run.iteration < newest
        assert f"holds iteration {newest}; the scheduler expected {run.iteration}" in log, log


def started(facts: Facts, job_id: str, run: int) -> JobStarted | None:
    runs: list[JobStarted] = facts.of(JobStarted, job_id)
    return runs[run - 1] if len(runs) >= run else None


async def test_no_double_run_when_an_agent_dies_and_never_returns(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    """Node a's agent dies for good; after the TTL the scheduler runs the job on node b. Run 1's
    processes were gone (with a checkpoint) long before run 2's began; run 2 resumes from the last
    periodic checkpoint the scheduler was told of (shared checkpoint storage), not from 0."""
    shared = tmp_path / "shared-checkpoints"
    script = write_periodic_script(tmp_path)
    async with cluster(broker, namespace, tmp_path) as c:
        facts = await collect(c.client)
        node_a = agent(broker, namespace, "node-a", tmp_path / "a", "--checkpoint-root", str(shared))
        node_b = agent(broker, namespace, "node-b", tmp_path / "b", "--checkpoint-root", str(shared))
        try:
            await node_a.start(facts)
            s = await c.start_scheduler(policy="fifo", round_s=0.3, lease_ttl_s=TTL)
            await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with node a")
            command = [sys.executable, str(script), "1000000", "0.01", str(EVERY)]
            await c.submit("j", JobSpec(name="j", command=command, grace_period_s=GRACE))
            await wait_for(lambda: started(facts, "j", 1) is not None, what="run 1 started")
            run1 = started(facts, "j", 1)
            assert run1 is not None
            assert run1.node_id == "node-a"
            entry = s.book.jobs["j"]
            await wait_for(lambda: (entry.checkpoint_iteration or 0) >= 2 * EVERY, what="periodic checkpoints applied")
            await node_b.start(facts)
            await wait_for(lambda: len(s.inventory) == 2, what="node b known")
            lease_a = tmp_path / "a" / "leases" / run1.lease_id
            pids = lease_pids(lease_a)

            killed_at = await kill(node_a)
            gone_at: float | None = None

            def watch() -> bool:
                nonlocal gone_at
                if gone_at is None and not any(alive(pid) for pid in pids) and not lease_pids(lease_a):
                    gone_at = time.time()
                return started(facts, "j", 2) is not None

            await wait_for(watch, TTL + 10, "run 2 started")
            assert gone_at is not None, "run 2 started while run 1 still ran"
            run2 = started(facts, "j", 2)
            assert run2 is not None
            assert run2.node_id == "node-b"
            # Run 1's processes were gone before node b even received run 2's grant (job.started's
            # time less its grant-to-running time), and the scheduler waited for the TTL.
            assert run2.startup_s is not None
            assert gone_at < run2.ts - run2.startup_s
            assert time.monotonic() - killed_at >= TTL - HEARTBEAT
            # Run 2 resumes from the last checkpoint the scheduler knew, not from 0; the file on the
            # shared storage holds run 1's final one (written when it found its agent gone).
            assert run2.iteration is not None
            assert run2.iteration >= 2 * EVERY
            assert run2.resumed_from == str(shared.resolve() / "j" / "checkpoint.pt")
            assert orphaned(lease_a)["how"] == "exited"
            await wait_for(lambda: entry.state.status is JobStatus.RUNNING and entry.lease is not None
                           and entry.lease.lease_id == run2.lease_id, what="run 2 in the book")  # fmt: skip
        finally:
            await node_b.stop()
            if node_a.process is not None and node_a.process.returncode is None:
                await node_a.stop()


async def test_an_agent_restarted_after_periodic_checkpoints_has_the_job_resume_from_the_newest(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    """The agent dies and is back at once (well within the TTL): the scheduler releases the old
    incarnation's lease when the new one registers; the next run resumes from the newest checkpoint
    run 1 completed (its last periodic one or the one it wrote when its agent was gone), not 0."""
    script = write_periodic_script(tmp_path)
    work_dir = tmp_path / "node"
    async with cluster(broker, namespace, tmp_path) as c:
        facts = await collect(c.client)
        worker = agent(broker, namespace, "node-r", work_dir)
        try:
            await worker.start(facts)
            s = await c.start_scheduler(policy="fifo", round_s=0.3, lease_ttl_s=TTL)
            await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader with the node")
            command = [sys.executable, str(script), "1000000", "0.01", str(EVERY)]
            await c.submit("j", JobSpec(name="j", command=command, grace_period_s=GRACE))
            await wait_for(lambda: started(facts, "j", 1) is not None, what="run 1 started")
            run1 = started(facts, "j", 1)
            assert run1 is not None
            entry = s.book.jobs["j"]
            await wait_for(lambda: (entry.checkpoint_iteration or 0) >= 2 * EVERY, what="periodic checkpoints applied")
            lease_dir = work_dir / "leases" / run1.lease_id
            group = Channel.open(lease_dir / "rank-0.chan").group
            assert group is not None

            await kill(worker)
            worker = agent(broker, namespace, "node-r", work_dir)
            await restart(worker, facts)
            newest = load_checkpoint(work_dir / "checkpoints" / "j" / "checkpoint.pt")["iteration"]
            assert newest >= 2 * EVERY
            await wait_for(lambda: started(facts, "j", 2) is not None, what="run 2 started")
            run2 = started(facts, "j", 2)
            assert run2 is not None
            assert not alive(group)
            assert run2.resumed_from == str(work_dir.resolve() / "checkpoints" / "j" / "checkpoint.pt")
            # The scheduler knows the newest checkpoint (the restarted agent's report, or else the
            # new run's agent reporting the checkpoint it restored) and the job runs past it.
            await wait_for(lambda: (entry.checkpoint_iteration or 0) >= newest and entry.state.iterations_done > newest,
                           what="run 2's progress past the newest checkpoint")  # fmt: skip
            assert_resumed_from(run2, newest, (work_dir / "leases" / run2.lease_id / "rank-0.log").read_text())
        finally:
            await worker.stop()
