"""The typed bus against a real nats-server: pub/sub, request-reply, JetStream, KV, failures."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from schemas.codec import encode
from schemas.examples import example
from schemas.jobs import JobArrived
from schemas.leases import LeaseAck, LeaseGrant
from schemas.metrics import JobMetrics
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions, NoResponderError, RemoteError, WrongModelError
from services.runtime.consumer import ConsumerOptions
from services.runtime.kv import KVConflictError, KVEntry
from tests.helpers import eventually


def arrived(n: int) -> JobArrived:
    base = example(JobArrived)
    return base.model_copy(update={"event_id": uuid.uuid4(), "job_id": f"job-{n}"})


async def stream_messages(bus: Bus) -> int:
    info = await bus.js.stream_info(bus.stream_name)
    return int(info.state.messages)


# --- core pub/sub and request-reply --------------------------------------------------------------


async def test_typed_publish_subscribe_round_trips_the_model(bus: Bus) -> None:
    received: list[JobMetrics] = []

    async def handler(event: JobMetrics) -> None:
        received.append(event)

    await bus.subscribe("metrics.job.*", JobMetrics, handler)
    sent = [
        JobMetrics(job_id=f"j{i}", iteration=i, loss=1.0 / (i + 1), iteration_time_s=0.1) for i in range(20)
    ]
    for event in sent:
        await bus.publish(f"metrics.job.{event.job_id}", event)
    await eventually(lambda: len(received) == len(sent))
    assert received == sent


async def test_publishing_the_wrong_model_is_refused(bus: Bus) -> None:
    with pytest.raises(WrongModelError, match="carries JobMetrics"):
        await bus.publish("metrics.job.j1", arrived(1))


async def test_subject_token_must_match_the_payload(bus: Bus) -> None:
    received: list[JobMetrics] = []

    async def handler(event: JobMetrics) -> None:
        received.append(event)

    await bus.subscribe("metrics.job.*", JobMetrics, handler)
    # Published raw so the bus's own checks are bypassed: the receiver must still refuse it.
    await bus.nc.publish(bus.wire("metrics.job.other"), encode(JobMetrics(job_id="j1", iteration=1)))
    await bus.publish("metrics.job.j2", JobMetrics(job_id="j2", iteration=2))
    await eventually(lambda: len(received) == 1)
    assert received[0].job_id == "j2"
    assert bus.stats.malformed == 1


async def test_request_reply_is_typed_and_errors_travel_back(bus: Bus) -> None:
    grant = example(LeaseGrant)
    node = grant.node_id

    async def on_grant(event: LeaseGrant) -> LeaseAck:
        if event.job_id == "boom":
            raise RuntimeError("no such GPU")
        return LeaseAck(lease_id=event.lease_id, node_id=event.node_id, accepted=True, epoch_seen=event.epoch)

    await bus.serve(f"lease.grant.{node}", LeaseGrant, on_grant)
    ack = await bus.request(f"lease.grant.{node}", grant, LeaseAck)
    assert ack.accepted
    assert ack.lease_id == grant.lease_id
    assert ack.epoch_seen == grant.epoch

    with pytest.raises(RemoteError, match="RuntimeError: no such GPU"):
        await bus.request(f"lease.grant.{node}", grant.model_copy(update={"job_id": "boom"}), LeaseAck)

    # A malformed request gets a clear answer instead of a time-out.
    reply = await bus.nc.request(bus.wire(f"lease.grant.{node}"), b'{"lease_id": 5}', timeout=2)
    assert reply.headers is not None
    assert "malformed request" in reply.headers["Roundhouse-Error"]
    assert "lease_id" in reply.headers["Roundhouse-Error"]


async def test_a_request_nobody_serves_fails_at_once(bus: Bus) -> None:
    grant = example(LeaseGrant)
    began = time.monotonic()
    with pytest.raises(NoResponderError, match="nothing serves this subject"):
        await bus.request(f"lease.grant.{grant.node_id}", grant, LeaseAck, timeout_s=5.0)
    assert time.monotonic() - began < 2.0  # the broker says so; no waiting for the time-out


async def test_malformed_core_messages_are_dropped_and_the_subscription_keeps_going(bus: Bus) -> None:
    received: list[JobMetrics] = []

    async def handler(event: JobMetrics) -> None:
        received.append(event)

    await bus.subscribe("metrics.job.*", JobMetrics, handler)
    for garbage in (b"not json", b"{}", b'{"job_id": "j1", "iteration": -1}', b"\xff\xfe"):
        await bus.nc.publish(bus.wire("metrics.job.j1"), garbage)
    await bus.publish("metrics.job.j1", JobMetrics(job_id="j1", iteration=3))
    await eventually(lambda: len(received) == 1)
    assert received[0].iteration == 3
    assert bus.stats.malformed == 4


async def test_a_failing_handler_does_not_stop_the_subscription(bus: Bus) -> None:
    seen: list[int] = []

    async def handler(event: JobMetrics) -> None:
        seen.append(event.iteration)
        if event.iteration == 1:
            raise ValueError("bad day")

    await bus.subscribe("metrics.job.*", JobMetrics, handler)
    for i in (1, 2):
        await bus.publish("metrics.job.j", JobMetrics(job_id="j", iteration=i))
    await eventually(lambda: seen == [1, 2])
    assert bus.stats.handler_errors == 1


# --- JetStream ----------------------------------------------------------------------------------------


async def test_retried_publish_is_stored_once(bus: Bus) -> None:
    event = arrived(1)
    await bus.publish("job.arrived.*", event)
    await bus.publish("job.arrived.*", event)  # e.g. a retry after a lost ack: same event_id
    await bus.publish("job.arrived.*", arrived(2))
    assert await stream_messages(bus) == 2


async def test_publish_many_pipelines_and_dedups(bus: Bus) -> None:
    events = [arrived(i) for i in range(200)]
    await bus.publish_many("job.arrived.*", events)
    await bus.publish_many("job.arrived.*", events[:50])
    assert await stream_messages(bus) == 200


async def test_event_survives_a_consumer_crash_and_is_processed_exactly_once(
    broker: Broker, namespace: str
) -> None:
    """The first consumer dies mid-handler (before its ack); a restarted one gets the event again
    and an idempotent handler (keyed by event id, as the store does) applies it once."""
    options = BusOptions(namespace=namespace)
    fast = ConsumerOptions(ack_wait_s=1.0, fetch_timeout_s=0.2)
    crashed_on: list[JobArrived] = []
    delivered: list[JobArrived] = []  # every event the restarted consumer was handed, duplicates included
    applied: dict[uuid.UUID, JobArrived] = {}
    never = asyncio.Event()

    async def crashing(event: JobArrived) -> None:
        crashed_on.append(event)
        await never.wait()  # dies here, before committing or acking

    async def idempotent(event: JobArrived) -> None:
        delivered.append(event)
        applied.setdefault(event.event_id, event)  # the store's applied-event check, in miniature

    first = await Bus.connect(broker.url, name="crashing", options=options)
    events = [arrived(i) for i in range(5)]
    for event in events:
        await first.publish("job.arrived.*", event)
    await first.consume("job.arrived.*", JobArrived, crashing, durable="admission",
                        options=ConsumerOptions(ack_wait_s=1.0, fetch_timeout_s=0.2, stop_timeout_s=0.1))
    await eventually(lambda: bool(crashed_on))
    await first.nc.close()  # a crash: no drain, no ack
    with contextlib.suppress(Exception):
        await first.close()

    second = await Bus.connect(broker.url, name="restarted", options=options)
    try:
        consumer = await second.consume("job.arrived.*", JobArrived, idempotent, durable="admission",
                                        options=fast)
        await eventually(lambda: len(applied) == len(events))
        await eventually_async(consumer.pending, 0)  # everything acked, nothing left to deliver
        # What the bus handed the restarted consumer: the event in hand at the crash again, intact ...
        assert crashed_on[0] in delivered
        # ... and every published event, each as published (payload and id), nothing foreign.
        assert {e.event_id: e for e in delivered} == {e.event_id: e for e in events}
        assert all(applied[e.event_id] == e for e in events)
    finally:
        await second.close()


async def eventually_async(probe: Callable[[], Awaitable[int]], want: int, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (got := await probe()) != want:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"got {got}, want {want}")
        await asyncio.sleep(0.05)


async def test_malformed_lifecycle_message_is_dead_lettered_and_the_consumer_goes_on(bus: Bus) -> None:
    handled: list[str] = []

    async def handler(event: JobArrived) -> None:
        handled.append(event.job_id)

    told: list[tuple[bytes, str]] = []

    async def on_malformed(data: bytes, exc: Exception) -> None:
        told.append((data, str(exc)))

    consumer = await bus.consume("job.arrived.*", JobArrived, handler, durable="admission",
                                 options=ConsumerOptions(fetch_timeout_s=0.2), on_malformed=on_malformed)
    await bus.js.publish(bus.wire("job.arrived.default"), b'{"job_id": "x y", "spec": {}}')
    await bus.publish("job.arrived.*", arrived(7))
    await eventually(lambda: handled == ["job-7"])
    await eventually(lambda: consumer.stats.dead_lettered == 1)
    dead = await bus.js.get_last_msg(bus.stream_name, bus.wire("deadletter.*"))
    assert dead.headers is not None
    assert "malformed" in dead.headers["Roundhouse-Reason"]
    assert "job_id" in dead.headers["Roundhouse-Reason"]
    assert told[0][0] == b'{"job_id": "x y", "spec": {}}'
    assert "job_id" in told[0][1]


async def test_a_failing_handler_is_retried_then_dead_lettered(bus: Bus) -> None:
    attempts: list[int] = []

    async def handler(event: JobArrived) -> None:
        attempts.append(1)
        raise RuntimeError("database down")

    consumer = await bus.consume(
        "job.arrived.*", JobArrived, handler, durable="sched",
        options=ConsumerOptions(max_deliver=3, retry_backoff_s=0.01, fetch_timeout_s=0.2),
    )  # fmt: skip
    await bus.publish("job.arrived.*", arrived(1))
    await eventually(lambda: consumer.stats.dead_lettered == 1)
    assert len(attempts) == 3


# --- KV -------------------------------------------------------------------------------------------------


async def test_kv_compare_and_set(bus: Bus) -> None:
    kv = await bus.kv("leader")
    revision = await kv.create("scheduler", b"replica-a")
    with pytest.raises(KVConflictError, match="already exists"):
        await kv.create("scheduler", b"replica-b")
    newer = await kv.update("scheduler", b"replica-a:renewed", last=revision)
    with pytest.raises(KVConflictError, match="moved past"):
        await kv.update("scheduler", b"replica-b", last=revision)  # a stale read loses
    entry = await kv.get("scheduler")
    assert entry is not None
    assert (entry.value, entry.revision) == (b"replica-a:renewed", newer)
    with pytest.raises(ValueError, match="use create"):
        await kv.update("scheduler", b"x", last=0)


# --- broker restart ---------------------------------------------------------------------------------


async def test_broker_restart_mid_stream_loses_no_event_and_resumes_watchers(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "nats")
    broker.start()
    options = BusOptions(namespace="restart", reconnect_wait_s=0.05)
    publisher = await Bus.connect(broker.url, name="publisher", options=options)
    consumer_bus = await Bus.connect(broker.url, name="consumer", options=options)
    handled: dict[str, int] = {}
    watched: list[KVEntry] = []

    async def handler(event: JobArrived) -> None:
        handled[event.job_id] = handled.get(event.job_id, 0) + 1

    async def on_change(entry: KVEntry) -> None:
        watched.append(entry)

    try:
        await consumer_bus.consume("job.arrived.*", JobArrived, handler, durable="admission",
                                   options=ConsumerOptions(fetch_timeout_s=0.2, ack_wait_s=2.0))
        kv = await consumer_bus.kv("nodes")
        watcher = await kv.watch(">", on_change)
        await kv.put("node-a", b"up")
        await eventually(lambda: [e.value for e in watched] == [b"up"])

        total = 60
        for i in range(total // 2):
            await publisher.publish("job.arrived.*", arrived(i))
        await asyncio.to_thread(broker.restart)
        for i in range(total // 2, total):
            await publisher.publish("job.arrived.*", arrived(i))  # retries until the broker is back

        await eventually(lambda: len(handled) == total, timeout_s=20)
        writer = await publisher.kv("nodes")
        await writer.put("node-b", b"up")
        await eventually(lambda: any(e.key == "node-b" for e in watched), timeout_s=20)
        # Redelivery after the restart may hand a message over twice; none may be missing.
        assert set(handled) == {f"job-{i}" for i in range(total)}
        assert consumer_bus.stats.reconnects >= 1
        assert watcher.restarts >= 1
        assert [e.key for e in watched].count("node-a") == 1  # the re-created watcher skipped it
    finally:
        await publisher.close()
        await consumer_bus.close()
        broker.stop()


async def test_pipelined_commits_are_acked_in_order_after_they_resolve(bus: Bus) -> None:
    """Handlers that return their pending commit let a whole fetched batch share one commit."""
    handled: list[str] = []
    gate = asyncio.get_running_loop().create_future()

    async def commit_for(job_id: str) -> None:
        await gate  # one "transaction" for everything handled so far
        if job_id == "job-3":
            raise RuntimeError("constraint violated")

    async def handler(event: JobArrived) -> Awaitable[None]:
        handled.append(event.job_id)
        return commit_for(event.job_id)

    for i in range(6):
        await bus.publish("job.arrived.*", arrived(i))
    consumer = await bus.consume(
        "job.arrived.*", JobArrived, handler, durable="piped",
        options=ConsumerOptions(fetch_timeout_s=0.2, max_deliver=1),
    )  # fmt: skip
    await eventually(lambda: len(handled) == 6)  # all handlers ran before any commit landed
    assert consumer.stats.handled == 0
    gate.set_result(None)
    await eventually(lambda: consumer.stats.handled == 5)
    assert handled == [f"job-{i}" for i in range(6)]
    await eventually(lambda: consumer.stats.dead_lettered == 1)  # job-3's commit failed (max_deliver=1)


async def test_consumer_takes_a_backlog_in_full_batches_then_follows_new_messages(bus: Bus) -> None:
    """The consumer's own pull requests: a stored backlog comes in ``batch``-sized batches at once
    (no_wait); a message published later comes through a lingering request, handled when that
    request ends (here at its expiry: one message does not fill a batch, as with nats-py's fetch);
    after a stop nothing is left unacked."""
    batches: list[int] = []
    handled: list[str] = []

    async def handler(event: JobArrived) -> None:
        handled.append(event.job_id)

    await bus.publish_many("job.arrived.*", [arrived(i) for i in range(25)])
    consumer = await bus.consume(
        "job.arrived.*", JobArrived, handler, durable="batches", options=ConsumerOptions(batch=10, fetch_timeout_s=2.0)
    )
    original = consumer._handle_batch

    async def counting(msgs: list[Msg]) -> None:
        batches.append(len(msgs))
        await original(msgs)

    consumer._handle_batch = counting  # type: ignore[method-assign]
    await eventually(lambda: len(handled) == 25)
    # The first batch may have been taken before the wrapper was installed.
    assert all(size == 10 for size in batches[: len(batches) - 1])
    await asyncio.sleep(0.1)  # caught up: a lingering request is open now
    began = asyncio.get_running_loop().time()
    await bus.publish("job.arrived.*", arrived(99))
    await eventually(lambda: len(handled) == 26)
    # Up to one lingering request's expiry (2 s) for a batch that does not fill, as with fetch.
    assert asyncio.get_running_loop().time() - began < 2.6
    assert handled == [f"job-{i}" for i in range(25)] + ["job-99"]
    await consumer.stop()
    assert await consumer.pending() == 0
    assert consumer.stats.handled == 26
