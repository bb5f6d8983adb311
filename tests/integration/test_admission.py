"""The admission service against a real nats-server: verdicts, malformed submissions, holding and
releasing under a load threshold, rebuilding by replay after a restart, and a child process."""

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

import pytest

from schemas.base import Event
from schemas.job import JobSpec
from schemas.jobs import JobAccepted, JobArrived, JobCompleted, JobHeld, JobRejected
from services.admission.service import AdmissionConfig, AdmissionService
from services.runtime.broker import Broker
from services.runtime.bus import Bus
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


@pytest.fixture
async def accept_all(broker: Broker, bus: Bus, namespace: str) -> AsyncIterator[AdmissionService]:
    service = AdmissionService(config(broker, namespace))
    await service.start(bus)
    yield service
    await service.stop()


async def test_accept_all_accepts_every_arrival_and_ignores_a_duplicate(
    bus: Bus, verdicts: Verdicts, accept_all: AdmissionService
) -> None:
    for job_id in ("a", "b"):
        await bus.publish("job.arrived", arrived(job_id))
    await bus.publish("job.arrived", arrived("a"))  # a retried submit: same job id, new event id
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
        await bus.js.publish(bus.wire("job.arrived"), raw, headers={"Nats-Msg-Id": uuid.uuid4().hex})
    await bus.publish("job.arrived", arrived("good-1"))
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
    await bus.publish("job.arrived", arrived("bad-1"))
    await eventually(lambda: verdicts.of("bad-1") == ["rejected", "accepted"])


async def test_load_threshold_holds_jobs_and_releases_them_in_order_as_capacity_frees(
    broker: Broker, bus: Bus, namespace: str, verdicts: Verdicts
) -> None:
    await bus.publish("node.register", fake_node("node-a", 4, gpu_name="Fake", memory_mib=1024))
    service = AdmissionService(config(broker, namespace, policy="load-threshold", policy_options={"factor": 1.0}))
    await service.start(bus)
    try:
        assert service.inventory.total_gpus == 4
        for job_id, gpus in (("j1", 4), ("j2", 2), ("j3", 1), ("j4", 1)):
            await bus.publish("job.arrived", arrived(job_id, gpus))
        await eventually(lambda: len(verdicts.seen) == 4)
        # Demand is checked before adding a job (Blox): j2 enters at demand 4 <= 4, j3 finds 6 > 4.
        assert [(k, j) for k, j, _ in verdicts.seen] == [
            ("accepted", "j1"), ("accepted", "j2"), ("held", "j3"), ("held", "j4"),
        ]  # fmt: skip
        held = verdicts.event("held", "j3")
        assert isinstance(held, JobHeld)
        assert held.policy == "load-threshold"
        assert "6 GPUs" in held.reason
        await bus.publish("job.completed", completed("j1"))
        await eventually(lambda: len(verdicts.seen) == 6)
        assert [(k, j) for k, j, _ in verdicts.seen[4:]] == [("accepted", "j3"), ("accepted", "j4")]
        assert service.stats()["released"] == 2
        assert service.stats()["held_now"] == 0
    finally:
        await service.stop()


async def test_rebuilds_the_ledger_by_replay_after_a_restart(
    broker: Broker, bus: Bus, namespace: str, verdicts: Verdicts
) -> None:
    settings = config(broker, namespace, policy="load-threshold", policy_options={"factor": 1.0})
    await bus.publish("node.register", fake_node("node-a", 2, gpu_name="Fake", memory_mib=1024))
    first = AdmissionService(settings)
    await first.start(bus)
    for job_id in ("j1", "j2", "j3", "j4"):
        await bus.publish("job.arrived", arrived(job_id, 1))
    await eventually(lambda: len(verdicts.seen) == 4)
    await first.stop()
    assert [k for k, _, _ in verdicts.seen] == ["accepted", "accepted", "accepted", "held"]

    await bus.publish("job.completed", completed("j1"))  # while admission is down
    await bus.publish("job.arrived", arrived("j5", 1))
    second = AdmissionService(settings)
    await second.start(bus)
    try:
        await eventually(lambda: len(verdicts.seen) == 6)
        # Replayed: j1 finished, so demand is 2 <= 2 GPUs: j4 (held first) is released, and the
        # arrival stored while admission was down (j5) then finds 3 > 2 and is held.
        assert [(k, j) for k, j, _ in verdicts.seen[4:]] == [("accepted", "j4"), ("held", "j5")]
        assert set(second.ledger.admitted) == {"j2", "j3", "j4"}
        assert list(second.ledger.held) == ["j5"]
        assert second.inventory.total_gpus == 2
        assert second.counts["accepted"] == 1  # nothing decided before the restart was decided again
    finally:
        await second.stop()


async def test_runs_as_a_child_process_and_stops_on_sigterm(
    broker: Broker, bus: Bus, namespace: str, verdicts: Verdicts
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.admission", "--nats", broker.url, "--namespace", namespace,
        "--policy", "user-quota", "--policy-options", '{"max_gpus": 2}', "--log-format", "text",
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await bus.publish("job.arrived", arrived("small", 1))
        await bus.publish("job.arrived", arrived("huge", 8))
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


def test_verdict_event_ids_are_uuid5_of_the_arrival_and_verdict() -> None:
    from services.admission.service import _VERDICT_IDS, verdict_event_id

    arrival = uuid.uuid4()
    for verdict in ("accepted", "held", "rejected"):
        expected = uuid.uuid5(_VERDICT_IDS, f"{arrival}:{verdict}")
        assert verdict_event_id(arrival, verdict) == expected
        assert verdict_event_id(arrival, verdict).version == 5


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
