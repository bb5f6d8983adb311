"""A fact that cannot be applied yet never blocks the others (issue 12): acceptances and cancels of
jobs that never arrived are dead-lettered with the reason within seconds, once the arrivals'
consumer has nothing left to deliver, while a legitimate job submitted beside a flood of them is
accepted and runs at once; an acceptance that overtakes its own job.arrived still applies."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from schemas.jobs import JobAccepted, JobArrived, JobCancel
from schemas.subjects import JOB_ACCEPTED, JOB_ARRIVED, JOB_CANCEL
from services.runtime.broker import Broker
from services.scheduler.replica import CONSUMERS
from tests.integration.test_scheduler import cluster, running_jobs, spec, wait_for

FORGED = 1_200
"""More than JetStream's default max_ack_pending (1,000): before, they held every slot."""


async def test_a_flood_of_facts_about_jobs_that_never_arrived_delays_no_real_job(
    broker: Broker, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real job waits only for the flood to be judged once, never for its facts' retries: before,
    each forged fact was retried ``max_deliver`` times (about 22 s of back-off) while holding one of
    the consumer's ack-pending slots, so the real job's acceptance was not even delivered until they
    were given up. How long judging 1,250 facts takes depends on the machine (4 s quiet, 14 s beside
    other work), so the test checks the mechanism, not a time: no forged fact is given up after
    retries, each is dead-lettered as unapplicable."""
    caplog.set_level(logging.WARNING, logger="roundhouse.consumer")
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 2})
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 1, what="leader")
        await c.client.publish_many(JOB_ACCEPTED, [JobAccepted(job_id=f"ghost-{i}") for i in range(FORGED)])
        await c.client.publish_many(JOB_CANCEL, [JobCancel(job_id=f"phantom-{i}") for i in range(50)])
        began = time.monotonic()
        await c.submit("real", spec("real"))
        await wait_for(lambda: "real" in running_jobs(s), what="the real job running", timeout_s=90)
        started_after = time.monotonic() - began
        term = s._term
        assert term is not None
        accepted = term.consumer_for[JOB_ACCEPTED]
        cancels = term.consumer_for[JOB_CANCEL]
        await wait_for(lambda: accepted.stats.dead_lettered == FORGED and cancels.stats.dead_lettered == 50,
                       what="every forged fact dead-lettered", timeout_s=30)  # fmt: skip
        dead_within = time.monotonic() - began
        # Nothing the forged facts named exists anywhere, and nothing was applied twice.
        assert all(s.book.entry(f"ghost-{i}") is None for i in range(0, FORGED, 97))
        assert s.book.entry("real") is not None
        print(f"real job running after {started_after:.2f} s; {FORGED + 50} forged facts dead-lettered "
              f"within {dead_within:.1f} s")  # fmt: skip
        given_up = [r.getMessage() for r in caplog.records if "giving up on" in r.getMessage()]
        assert given_up == [], given_up[:3]
        unapplicable = [r for r in caplog.records if "dead-lettering job.accepted" in r.getMessage()]
        assert len(unapplicable) == FORGED
        # The dead letters say why.
        info = await c.client.js.stream_info(c.client.stream_name)
        assert info.state.messages > 0
        assert CONSUMERS[JOB_ACCEPTED] in accepted.durable


async def test_facts_stored_before_the_scheduler_started_apply_whichever_consumer_runs_first(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    """After a restart the acceptances' consumer may run before the arrivals' one has delivered the
    arrivals stored before them: those acceptances wait for them (never dead-lettered)."""
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 2})
        for i in range(40):
            await c.client.publish(JOB_ARRIVED, JobArrived(job_id=f"early-{i}", spec=spec(f"early-{i}")))
        await c.client.publish_many(JOB_ACCEPTED, [JobAccepted(job_id=f"early-{i}") for i in range(40)])
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader, what="leader")
        await wait_for(lambda: all(s.book.entry(f"early-{i}") is not None
                                   and s.book.entry(f"early-{i}").state.status.value != "held"  # type: ignore[union-attr]
                                   for i in range(40)), what="every early job accepted")  # fmt: skip
        term = s._term
        assert term is not None
        assert term.consumer_for[JOB_ACCEPTED].stats.dead_lettered == 0
        await wait_for(lambda: len(running_jobs(s)) == 2, what="two running")
