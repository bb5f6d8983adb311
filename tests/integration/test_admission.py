"""The admission service against a real nats-server: verdicts, malformed submissions, holding and
releasing under a load threshold, starting from the scheduler's store after a restart (not by
replaying the stream), and a child process.

Admission starts from what the leading scheduler stores (``query.admission``). Most tests here give
it :class:`StoreStub` instead of a scheduler (an answer from a fixed store); the restart test runs
the real scheduler with its SQLite store."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats.js.errors
import pytest
from nats.aio.subscription import Subscription

from schemas.base import Event
from schemas.control import AdmissionJob, AdmissionNode, AdmissionQuery, AdmissionReply
from schemas.job import JobSpec
from schemas.jobs import JobAccepted, JobArrived, JobCancel, JobCompleted, JobHeld, JobRejected
from schemas.subjects import QUERY_ADMISSION
from services.admission.service import AdmissionConfig, AdmissionService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from services.scheduler.config import SchedulerConfig
from services.scheduler.service import SchedulerService
from tests.helpers import eventually, fake_node

REPO = Path(__file__).resolve().parents[2]


def arrived(job_id: str, gpus: int = 1) -> JobArrived:
    return JobArrived(job_id=job_id, spec=JobSpec(name=job_id, command=["python", "train.py"], gpus=gpus))


def completed(job_id: str) -> JobCompleted:
    return JobCompleted(job_id=job_id, lease_id=f"lease-{job_id}", node_id="node-a", epoch=1, iteration=100)


class Verdicts:
    """Every verdict seen on the bus, in order, as (kind, job id, event)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Event]] = []

    async def start(self, bus: Bus) -> None:
        for subject, model in (("job.accepted", JobAccepted), ("job.held", JobHeld), ("job.rejected", JobRejected)):
            kind = subject.split(".")[1]

            async def on(event: JobAccepted | JobHeld | JobRejected, kind: str = kind) -> None:
                self.seen.append((kind, event.job_id, event))

            await bus.subscribe(subject, model, on)  # type: ignore[arg-type]

    def of(self, job_id: str) -> list[str]:
        return [kind for kind, job, _ in self.seen if job == job_id]

    def event(self, kind: str, job_id: str) -> Event:
        return next(e for k, j, e in self.seen if (k, j) == (kind, job_id))


@pytest.fixture
async def verdicts(bus: Bus) -> Verdicts:
    seen = Verdicts()
    await seen.start(bus)
    return seen


def config(broker: Broker, namespace: str, **extra: object) -> AdmissionConfig:
    return AdmissionConfig(nats=broker.url, namespace=namespace, reoffer_interval_s=60, **extra)


class StoreStub:
    """Answers ``query.admission`` as a leading scheduler with a fixed store would (no waiting for
    facts: nothing else writes this store)."""

    def __init__(self, jobs: list[AdmissionJob] | None = None, nodes: list[AdmissionNode] | None = None) -> None:
        self.jobs = jobs or []
        self.nodes = nodes or []
        self.queries: list[AdmissionQuery] = []
        self._sub: Subscription | None = None

    async def start(self, bus: Bus) -> None:
        self._sub = await bus.serve(QUERY_ADMISSION, AdmissionQuery, self._answer)

    async def _answer(self, query: AdmissionQuery) -> AdmissionReply:
        self.queries.append(query)
        after = query.after_seq if query.after_seq is not None else -1
        jobs = [j for j in self.jobs if j.seq > after]
        page = jobs[: query.limit]
        nodes = self.nodes if query.after_seq is None else []
        return AdmissionReply(jobs=page, nodes=nodes, truncated=len(page) < len(jobs), epoch=1)


def stub_node(node_id: str, gpus: int) -> AdmissionNode:
    return AdmissionNode(node_id=node_id, incarnation=uuid.uuid4(), hostname="127.0.0.1", gpus=list(range(gpus)))


@pytest.fixture
async def store(bus: Bus) -> StoreStub:
    stub = StoreStub()
    await stub.start(bus)
    return stub


async def consumer_exists(bus: Bus, durable: str, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await bus.js.consumer_info(bus.stream_name, bus.name(durable))
            return
        except nats.js.errors.NotFoundError:
            assert asyncio.get_running_loop().time() < deadline, f"no durable consumer {durable}"
            await asyncio.sleep(0.1)


async def started(service: AdmissionService, bus: Bus, timeout_s: float = 10.0) -> AdmissionService:
    await service.start(bus)
    await asyncio.wait_for(service.ready.wait(), timeout_s)
    return service


@pytest.fixture
async def accept_all(broker: Broker, bus: Bus, namespace: str, store: StoreStub) -> AsyncIterator[AdmissionService]:
    service = await started(AdmissionService(config(broker, namespace)), bus)
    yield service
    await service.stop()


async def test_accept_all_accepts_every_arrival_and_ignores_a_duplicate(
    bus: Bus, verdicts: Verdicts, accept_all: AdmissionService
) -> None:
    for job_id in ("a", "b"):
        await bus.publish("job.arrived.*", arrived(job_id))
    await bus.publish("job.arrived.*", arrived("a"))  # a retried submit: same job id, new event id
    await eventually(lambda: accept_all.counts["duplicates"] == 1 and len(verdicts.seen) == 2)
    assert [(k, j) for k, j, _ in verdicts.seen] == [("accepted", "a"), ("accepted", "b")]
    event = verdicts.event("accepted", "a")
    assert isinstance(event, JobAccepted)
    assert event.policy == "accept-all"


async def test_a_malformed_spec_gets_a_clear_rejection_and_nothing_else_is_disturbed(
    bus: Bus, namespace: str, verdicts: Verdicts, accept_all: AdmissionService
) -> None:
    good = json.loads(arrived("bad-1").model_dump_json())
    good["spec"]["gpus"] = 0
    anonymous = b'{"spec": "not even a job"}'
    for raw in (json.dumps(good).encode(), anonymous):
        await bus.js.publish(bus.wire("job.arrived.default"), raw, headers={"Nats-Msg-Id": uuid.uuid4().hex})
    await bus.publish("job.arrived.*", arrived("good-1"))
    await eventually(lambda: len(verdicts.seen) == 2)
    assert [(k, j) for k, j, _ in verdicts.seen] == [("rejected", "bad-1"), ("accepted", "good-1")]
    rejection = verdicts.event("rejected", "bad-1")
    assert isinstance(rejection, JobRejected)
    assert "spec.gpus" in rejection.reason
    assert "greater_than_equal" in rejection.reason
    assert accept_all.counts["malformed_rejected"] == 1
    assert accept_all._consumer is not None
    await eventually(lambda: accept_all._consumer is not None and accept_all._consumer.stats.dead_lettered == 2)
    # Both malformed messages are kept for inspection, and the consumer has nothing left to do.
    dead = await bus.js.stream_info(bus.stream_name, subjects_filter=bus.wire("deadletter.>"))
    assert dead.state.subjects == {bus.wire(f"deadletter.{namespace}_admission"): 2}
    assert await accept_all._consumer.pending() == 0
    # The user fixes the spec and resubmits under the same id: it is judged like any other job.
    await bus.publish("job.arrived.*", arrived("bad-1"))
    await eventually(lambda: verdicts.of("bad-1") == ["rejected", "accepted"])


async def test_load_threshold_holds_jobs_and_releases_them_in_order_as_capacity_frees(
    broker: Broker, bus: Bus, namespace: str, verdicts: Verdicts, store: StoreStub
) -> None:
    store.nodes = [stub_node("node-a", 4)]
    service = AdmissionService(config(broker, namespace, policy="load-threshold", policy_options={"factor": 1.0}))
    await started(service, bus)
    try:
        assert service.inventory.total_gpus == 4
        for job_id, gpus in (("j1", 4), ("j2", 2), ("j3", 1), ("j4", 1)):
            await bus.publish("job.arrived.*", arrived(job_id, gpus))
        await eventually(lambda: len(verdicts.seen) == 4)
        # Demand is checked before adding a job (Blox): j2 enters at demand 4 <= 4, j3 finds 6 > 4.
        assert [(k, j) for k, j, _ in verdicts.seen] == [
            ("accepted", "j1"), ("accepted", "j2"), ("held", "j3"), ("held", "j4"),
        ]  # fmt: skip
        held = verdicts.event("held", "j3")
        assert isinstance(held, JobHeld)
        assert held.policy == "load-threshold"
        assert "6 GPUs" in held.reason
        await bus.publish("job.completed.*", completed("j1"))
        await eventually(lambda: len(verdicts.seen) == 6)
        assert [(k, j) for k, j, _ in verdicts.seen[4:]] == [("accepted", "j3"), ("accepted", "j4")]
        assert service.stats()["released"] == 2
        assert service.stats()["held_now"] == 0
    finally:
        await service.stop()


async def test_starts_from_the_schedulers_store_after_a_restart(
    broker: Broker, bus: Bus, namespace: str, verdicts: Verdicts, tmp_path: Path
) -> None:
    """A real scheduler (SQLite) answers query.admission: admitted demand, the held queue in its order,
    an arrival stored while admission was down (no verdict yet) and the node inventory survive."""
    scheduler = SchedulerService(SchedulerConfig(
        nats=broker.url, namespace=namespace, db=str(tmp_path / "db"), policy="fifo", round_s=3600,
        leader_ttl_s=1.0, plan_timeout_s=0.5, log_format="text",
    ))  # fmt: skip
    scheduler_bus = await Bus.connect(broker.url, name="scheduler", options=bus.options)
    await scheduler.start(scheduler_bus)
    settings = config(broker, namespace, policy="load-threshold", policy_options={"factor": 1.0})
    try:
        await eventually(lambda: scheduler.is_leader, what="a leading scheduler")
        await bus.publish("node.register.*", fake_node("node-a", 2, gpu_name="Fake", memory_mib=1024))
        # Answered once the scheduler applied every fact up to the stream's end: the registration too.
        first = await started(AdmissionService(settings), bus)
        assert first.inventory.total_gpus == 2
        for job_id in ("j1", "j2", "j3", "j4", "j6"):
            await bus.publish("job.arrived.*", arrived(job_id, 1))
        await eventually(lambda: len(verdicts.seen) == 5)
        await first.stop()
        assert [(k, j) for k, j, _ in verdicts.seen] == [
            ("accepted", "j1"), ("accepted", "j2"), ("accepted", "j3"), ("held", "j4"), ("held", "j6"),
        ]  # fmt: skip

        await bus.publish("job.cancel.*", JobCancel(job_id="j1"))  # while admission is down
        await bus.publish("job.arrived.*", arrived("j5", 1))
        await eventually(lambda: scheduler.book.entry("j5") is not None and scheduler.book.entry("j1") is None,
                         what="the scheduler has j5 and no longer j1")  # fmt: skip
        second = await started(AdmissionService(settings), bus)
        try:
            await eventually(lambda: len(verdicts.seen) == 8)
            # From the store: j1 cancelled, so demand is 2 <= 2 GPUs: j4 (held first) is let in; j6
            # (held) and j5 (stored while admission was down, no verdict yet) then find 3 > 2, in
            # submission order: j6 is held again (the same event), j5 held for the first time.
            assert [(k, j) for k, j, _ in verdicts.seen[5:]] == [("accepted", "j4"), ("held", "j6"), ("held", "j5")]
            assert verdicts.seen[6][2].event_id == verdicts.seen[4][2].event_id
            assert set(second.ledger.admitted) == {"j2", "j3", "j4"}
            assert list(second.ledger.held) == ["j6", "j5"]
            assert second.inventory.total_gpus == 2
            assert (second.start_stats["held"], second.start_stats["admitted"]) == (3, 2)
            # j5's arrival, still unacked on the durable consumer, is delivered and known already.
            await eventually(lambda: second.counts["duplicates"] == 1, what="j5's arrival recognised")
            assert second.counts["accepted"] == 1  # nothing admitted before the restart was admitted again

            def status(job_id: str) -> str | None:
                entry = scheduler.book.entry(job_id)
                return entry.state.status.value if entry is not None else None

            await eventually(lambda: status("j4") == "queued", what="j4 let in, in the store too")
        finally:
            await second.stop()
    finally:
        await scheduler.stop()
        await scheduler_bus.close()


async def test_start_reads_from_the_streams_end_not_from_sequence_1(
    broker: Broker, bus: Bus, namespace: str, verdicts: Verdicts, store: StoreStub
) -> None:
    """Many old facts on the stream, arrivals without verdicts among them: admission starts from the
    store (here: empty) and follows from the stream's last sequence; nothing old is read or judged."""
    old = 3000
    events: list[tuple[str, Event]] = []
    for i in range(old):
        job_id = f"old-{i}"
        events.append(("job.arrived.*", arrived(job_id)))
        events.append(("job.completed.*", completed(job_id)))
    for subject, event in events:
        await bus.publish(subject, event)
    last = (await bus.js.stream_info(bus.stream_name)).state.last_seq
    assert last >= 2 * old
    service = AdmissionService(config(broker, namespace))
    began = asyncio.get_running_loop().time()
    await started(service, bus)
    took = asyncio.get_running_loop().time() - began
    try:
        assert service.start_stats["through_seq"] == last
        assert store.queries[0].through_seq == last
        assert service._follower is not None
        assert service._follower.stats.handled == 0
        consumer = await bus.js.consumer_info(bus.stream_name, bus.name("admission"))
        assert consumer.config.opt_start_seq == last + 1
        assert consumer.num_pending == 0
        await bus.publish("job.arrived.*", arrived("new"))
        await bus.publish("job.completed.*", completed("new"))
        await eventually(lambda: verdicts.of("new") == ["accepted"])
        await eventually(lambda: service._follower is not None and service._follower.stats.handled == 1)
        assert service._follower.stats.last_seq > last
        assert [j for _, j, _ in verdicts.seen] == ["new"]  # no old arrival was judged
        assert took < 5.0, f"start took {took:.1f} s"
    finally:
        await service.stop()


async def test_waits_for_a_leading_scheduler_and_stops_while_waiting(
    broker: Broker, bus: Bus, namespace: str, verdicts: Verdicts
) -> None:
    settings = config(broker, namespace, start_retry_max_s=0.2, start_timeout_s=0.5)
    never = AdmissionService(settings)
    await never.start(bus)  # returns at once: the start from the store waits in the background
    await asyncio.sleep(0.3)  # a moment into its (endless) wait for a scheduler; any moment will do
    await asyncio.wait_for(never.stop(), 2)  # stops while still waiting for a scheduler
    assert not never.ready.is_set()

    service = AdmissionService(settings)
    await service.start(bus)
    try:
        # Several of its retries (every <= 0.2 s) go unanswered: it must not become ready without a
        # scheduler. (A slow machine makes this check weaker, never wrong.)
        await asyncio.sleep(0.8)
        assert not service.ready.is_set()
        # Submitted while no scheduler leads; the scheduler that comes stored it (held, no verdict).
        early = arrived("early")
        await bus.publish("job.arrived.*", early)
        held = AdmissionJob(job_id="early", spec=early.spec, status="held", submit_time=early.ts, seq=1)
        await StoreStub(jobs=[held]).start(bus)
        await asyncio.wait_for(service.ready.wait(), 5)
        assert service.start_stats["attempts"] >= 2
        await eventually(lambda: verdicts.of("early") == ["accepted"])
    finally:
        await service.stop()


async def test_runs_as_a_child_process_and_stops_on_sigterm(
    broker: Broker, bus: Bus, namespace: str, verdicts: Verdicts, store: StoreStub
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.admission", "--nats", broker.url, "--namespace", namespace,
        "--policy", "user-quota", "--policy-options", '{"max_gpus": 2}', "--log-format", "text",
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        # Started (from the stub's empty store) once its durable consumer exists: arrivals stored
        # before that would be the store's to hold, and the stub stores nothing.
        await consumer_exists(bus, "admission", timeout_s=30)
        await bus.publish("job.arrived.*", arrived("small", 1))
        await bus.publish("job.arrived.*", arrived("huge", 8))
        await eventually(lambda: len(verdicts.seen) == 2, timeout_s=30)
        assert verdicts.of("small") == ["accepted"]
        assert verdicts.of("huge") == ["rejected"]
        rejection = verdicts.event("rejected", "huge")
        assert isinstance(rejection, JobRejected)
        assert "at most 2" in rejection.reason
        child.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(child.communicate(), 15)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    assert child.returncode == 0, stderr.decode()
    assert "admission service stopped" in stderr.decode()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"policy": "nope"}, "unknown admission policy 'nope'; valid: accept-1.2x"),
        ({"policy": "load-threshold", "policy_options": {"factr": 2}}, "unexpected keyword argument 'factr'"),
        ({"policy": "load-threshold", "policy_options": {"factor": 0}}, "factor must be > 0"),
    ],
)
def test_a_policy_that_cannot_be_built_is_a_configuration_error(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        AdmissionConfig(**settings)


def test_verdict_event_ids_are_uuid5_of_the_job_id_and_verdict() -> None:
    from services.admission.service import _VERDICT_IDS, verdict_event_id

    job_id = uuid.uuid4().hex
    for verdict in ("accepted", "held", "rejected"):
        expected = uuid.uuid5(_VERDICT_IDS, f"{job_id}:{verdict}")
        assert verdict_event_id(job_id, verdict) == expected
        assert verdict_event_id(job_id, verdict).version == 5


async def test_outbox_confirms_every_verdict_and_republishes_one_whose_ack_never_came(bus: Bus) -> None:
    from services.admission.outbox import VerdictOutbox

    outbox = VerdictOutbox(bus, ack_timeout_s=0.3)
    await outbox.start()
    accepted = [JobAccepted(job_id=f"j{i}", policy="accept-all") for i in range(50)]
    try:
        for event in accepted[:40]:
            await outbox.send("job.accepted", event)
        await asyncio.wait_for(outbox.flush(), 10)
        assert (outbox.sent, outbox.confirmed, outbox.retried, outbox.in_flight) == (40, 40, 0, 0)
        # Acks lost (as in a disconnect): every later verdict is republished once its time-out passed.
        outbox._prefix = "_INBOX.nobody-listens."
        for event in accepted[40:]:
            await outbox.send("job.accepted", event)
        assert outbox.in_flight == 10
        await asyncio.wait_for(outbox.flush(), 10)
        assert (outbox.sent, outbox.confirmed, outbox.retried, outbox.in_flight) == (50, 50, 10, 0)
    finally:
        await outbox.stop(1.0)
    info = await bus.js.stream_info(bus.stream_name, subjects_filter=bus.wire("job.accepted"))
    # Republished with the same Nats-Msg-Id: stored once each.
    assert info.state.messages == 50


async def test_applied_through_waits_until_every_fact_up_to_the_sequence_is_acked(bus: Bus) -> None:
    """What the scheduler checks before answering query.admission (``queries.applied_through``), on
    its durable consumers as the server sees them: here one, whose handler holds a fact unacked."""
    from schemas.subjects import JOB_CANCEL
    from services.runtime.consumer import ConsumerOptions
    from services.scheduler.queries import applied_through
    from services.scheduler.replica import CONSUMERS

    release = asyncio.Event()
    entered = asyncio.Event()
    handled: list[str] = []

    async def handler(event: JobCancel) -> None:
        entered.set()
        await release.wait()
        handled.append(event.job_id)

    await bus.publish("job.arrived.*", arrived("other"))  # another subject: not this consumer's
    assert await applied_through(bus, 1, subjects=[JOB_CANCEL]) is False  # no consumer yet: not known
    consumer = await bus.consume(JOB_CANCEL, JobCancel, handler, durable=CONSUMERS[JOB_CANCEL],
                                 options=ConsumerOptions(fetch_timeout_s=0.2))  # fmt: skip
    try:
        seq = (await bus.js.stream_info(bus.stream_name)).state.last_seq
        assert await applied_through(bus, seq, subjects=[JOB_CANCEL])  # nothing of its own up to seq
        await bus.publish("job.cancel.*", JobCancel(job_id="c1"))
        stored = (await bus.js.stream_info(bus.stream_name)).state.last_seq
        await asyncio.wait_for(entered.wait(), 10)  # delivered, held by the handler
        assert not await applied_through(bus, stored, subjects=[JOB_CANCEL])
        # Conservative: an unacked fact holds back any answer not past the ack floor (the server does
        # not say where the unacked ones lie), even one for a sequence before it.
        assert not await applied_through(bus, seq, subjects=[JOB_CANCEL])
        release.set()
        await eventually(lambda: handled == ["c1"])
        for _ in range(50):  # the ack travels to the server after the handler returned
            if await applied_through(bus, stored, subjects=[JOB_CANCEL]):
                break
            await asyncio.sleep(0.05)
        assert await applied_through(bus, stored, subjects=[JOB_CANCEL])
        await bus.publish("job.arrived.*", arrived("later"))  # later facts of other subjects change nothing
        assert await applied_through(bus, stored + 1, subjects=[JOB_CANCEL])
    finally:
        await consumer.stop()
