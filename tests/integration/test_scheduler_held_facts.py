"""A fact whose job.arrived a dead leader was holding is applied once that arrival comes back, not
dead-lettered as "never arrived" (issue 12).

A leader killed (or paused) with a fetched, unacked batch of arrivals leaves them ack-pending on the
server until the consumer's ``ack_wait`` has passed: the next leader's pull finds nothing to deliver
although they are not handled. Its acceptances, fetched meanwhile, must wait for them. Before, the
next leader dead-lettered such an acceptance at once (its arrivals' consumer "found nothing left"),
and the job stayed HELD for good once its arrival was redelivered (found by ``benchmarks.failover``
and ``tests/e2e/test_chaos.py``: 2 of 86 jobs held after 5 leader kills).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.jobs import JobAccepted, JobArrived
from schemas.subjects import JOB_ACCEPTED, JOB_ARRIVED
from services.runtime.broker import Broker
from services.runtime.consumer import ConsumerOptions
from services.scheduler.replica import CONSUMERS
from tests.integration import test_scheduler
from tests.integration.test_scheduler import cluster, running_jobs, spec, wait_for

ACK_WAIT_S = 2.0


async def test_an_acceptance_waits_for_an_arrival_a_dead_leader_held_instead_of_dead_lettering_it(
    broker: Broker, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(test_scheduler, "FAST", ConsumerOptions(fetch_timeout_s=0.1, retry_backoff_s=0.05,
                                                                ack_wait_s=ACK_WAIT_S))  # fmt: skip
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 1})
        first = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: first.is_leader, what="leader")
        await c.stop_scheduler(first)  # its durable consumers stay, with their acks
        # A leader that fetched the arrival and died before acking it (as kill -9 leaves it).
        await c.client.publish(JOB_ARRIVED, JobArrived(job_id="a", spec=spec("a")))
        held = await c.client.js.pull_subscribe_bind(
            durable=c.client.name(CONSUMERS[JOB_ARRIVED]), stream=c.client.stream_name
        )
        fetched = await held.fetch(1, timeout=5)
        assert [m.subject.rsplit(".", 3)[-3:] for m in fetched] == [["job", "arrived", "default"]]
        await c.client.publish(JOB_ACCEPTED, JobAccepted(job_id="a"))
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader, what="the next leader")
        # The arrival comes back after ack_wait; the acceptance waited for it and the job runs.
        await wait_for(lambda: "a" in running_jobs(s), timeout_s=ACK_WAIT_S + 20, what="a running")
        term = s._term
        assert term is not None
        assert term.consumer_for[JOB_ACCEPTED].stats.dead_lettered == 0
