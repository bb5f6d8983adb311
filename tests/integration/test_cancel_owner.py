"""Issue 13, deliverable 3 (server side): only a job's owner or an operator may cancel or read it.

Real nats-server, real SQLite store, the real scheduler and placement services, fake workers. The
broker vouches for who asks (``job.cancel.<user>``, ``query.jobs.<user>``): the test publishes as
that user would. A refused cancel changes and persists nothing and the job keeps running; the owner's
and an operator's cancels are applied; ``query.jobs`` shows a user their own jobs only and refuses,
naming only the owner, a job of another user asked for by id. ``roundhouse cancel`` tells the user
why it refused to send a cancel.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from roundhouse.cli import main
from schemas.control import JobsQuery, JobsReply
from schemas.job import JobSpec
from schemas.jobs import JobCancel
from schemas.subjects import JOB_CANCEL, QUERY_JOBS
from services.core.state import JobStatus
from services.runtime.broker import Broker
from services.runtime.store import LeaseState
from services.scheduler.replica import CONSUMERS
from services.scheduler.service import SchedulerService
from tests.integration.test_scheduler import Cluster, cluster, running_jobs, wait_for


def owned(name: str, user: str) -> JobSpec:
    return JobSpec(name=name, user=user, command=["python", "train.py"], gpus=1, grace_period_s=1.0)


@asynccontextmanager
async def three_users(
    broker: Broker, namespace: str, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, SchedulerService]]:
    """``a-1`` (alice), ``b-1`` (bob) and ``c-1`` (carol) running on three 1-GPU nodes."""
    async with cluster(broker, namespace, tmp_path) as c:
        await c.start_workers({"n0": 1, "n1": 1, "n2": 1})
        s = await c.start_scheduler(policy="fifo")
        await wait_for(lambda: s.is_leader and len(s.inventory) == 3, what="leader with 3 nodes")
        for job_id, user in (("a-1", "alice"), ("b-1", "bob"), ("c-1", "carol")):
            await c.submit(job_id, owned(job_id, user))
        await wait_for(lambda: running_jobs(s) == {"a-1", "b-1", "c-1"}, what="three jobs running")
        yield c, s


async def ask(c: Cluster, requester: str, **fields: object) -> JobsReply:
    query = JobsQuery.model_validate({"requester": requester, **fields})
    return await c.client.request(QUERY_JOBS, query, JobsReply, timeout_s=2.0)


async def cancelled(s: SchedulerService, job_id: str) -> None:
    assert s.store is not None
    store = s.store
    status: list[JobStatus | None] = [None]

    async def poll() -> None:
        while status[0] is not JobStatus.CANCELLED:
            record = await store.get_job(job_id)
            status[0] = record.status if record is not None else None
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout=10)


async def test_only_the_owner_or_an_operator_may_cancel(broker: Broker, namespace: str, tmp_path: Path) -> None:
    async with three_users(broker, namespace, tmp_path) as (c, s):
        assert s.store is not None
        before = await s.store.get_job("a-1")
        assert before is not None
        forged = JobCancel(job_id="a-1", user="bob", reason="mine now")
        await c.client.publish(JOB_CANCEL, forged)
        await wait_for(lambda: s.replica.refusals.counts["job.cancel:permission_denied"] == 1, what="refusal")
        # Nothing changed or was persisted; alice's job keeps running under its lease.
        after = await s.store.get_job("a-1")
        assert after is not None
        assert (after.status, after.version) == (JobStatus.RUNNING, before.version)
        assert not await s.store.is_applied(forged.event_id, f"{namespace}_{CONSUMERS[JOB_CANCEL]}")
        lease = s.book.jobs["a-1"].lease
        assert lease is not None
        assert lease.state is LeaseState.GRANTED
        # The owner's cancel, and an operator's cancel of someone else's job, are applied.
        await c.client.publish(JOB_CANCEL, JobCancel(job_id="a-1", user="alice"))
        await c.client.publish(JOB_CANCEL, JobCancel(job_id="c-1", user="operator"))
        await cancelled(s, "a-1")
        await cancelled(s, "c-1")
        assert "b-1" in running_jobs(s)  # bob's own job, beside all this, runs on
        assert s.replica.refusals.counts["job.cancel:permission_denied"] == 1


async def test_query_jobs_shows_a_user_only_their_own_jobs(broker: Broker, namespace: str, tmp_path: Path) -> None:
    async with three_users(broker, namespace, tmp_path) as (c, _):
        mine = await ask(c, "bob")
        assert [view.job_id for view in mine.jobs] == ["b-1"]
        assert mine.refused == {}
        # Asking for alice's job by id: refused with the owner's name only, no view of it.
        named = await ask(c, "bob", job_ids=["a-1", "b-1", "nope"], include_finished=True)
        assert [view.job_id for view in named.jobs] == ["b-1"]
        assert named.refused == {"a-1": "permission denied: bob cannot read alice's job"}
        # Filtering by another user shows nothing either.
        assert (await ask(c, "bob", user="alice")).jobs == []
        everyone = await ask(c, "operator")
        assert [view.job_id for view in everyone.jobs] == ["a-1", "b-1", "c-1"]
        assert everyone.refused == {}


async def test_roundhouse_cancel_says_why_it_sends_no_cancel(
    broker: Broker, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with three_users(broker, namespace, tmp_path) as (_, s):
        endpoint = ("--nats", broker.url, "--namespace", namespace)
        monkeypatch.setenv("ROUNDHOUSE_USER", "bob")
        code = await asyncio.to_thread(main, ["cancel", *endpoint, "a-1", "ghost", "b-1"])
        captured = capsys.readouterr()
        assert code == 1
        assert "roundhouse cancel: permission denied: bob cannot cancel alice's job a-1" in captured.err
        assert "roundhouse cancel: no such job: ghost" in captured.err
        assert captured.out.splitlines() == ["b-1 cancel requested"]
        await cancelled(s, "b-1")
        # The CLI published nothing for a-1: the scheduler saw no cancel to refuse.
        assert s.replica.refusals.counts["job.cancel:permission_denied"] == 0
        assert "a-1" in running_jobs(s)


async def test_roundhouse_jobs_lists_a_users_own_jobs_and_says_whose_the_others_are(
    broker: Broker, namespace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with three_users(broker, namespace, tmp_path):
        endpoint = ("--nats", broker.url, "--namespace", namespace)
        monkeypatch.setenv("ROUNDHOUSE_USER", "bob")
        code = await asyncio.to_thread(main, ["jobs", *endpoint, "--json"])
        listed = json.loads(capsys.readouterr().out)
        assert code == 0
        assert [j["job_id"] for j in listed["jobs"]] == ["b-1"]
        code = await asyncio.to_thread(main, ["jobs", *endpoint, "a-1", "b-1"])
        captured = capsys.readouterr()
        assert code == 1
        assert "roundhouse jobs: a-1: permission denied: bob cannot read alice's job" in captured.err
        assert "b-1" in captured.out
        assert "a-1" not in captured.out
