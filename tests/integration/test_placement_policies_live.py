"""Every placement policy, and every victim policy behind ``preempting``, run once inside the real
placement service with a real scheduler, admission and emulating worker agents (issue 18, item 2).

One cluster per module half (the services and agents start once; each test swaps in a placement
service with its policy). Placement policies: jobs of 1 and 2 GPUs on two 2-GPU nodes all complete.
Victim policies: a TE job arriving on a full node preempts the BE job there (the victim policy's
choice), runs and completes; the BE job is then cancelled, leaving the node free for the next test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from schemas.job import JobClass
from services.core.registry import PLACEMENT, VICTIM
from services.runtime.broker import Broker
from tests.live_parts import LiveParts, emulated_job, live_parts

PLACEMENTS = sorted(set(PLACEMENT.names()) - {"preempting"})  # preempting runs below, once per victim policy


@pytest.fixture(scope="module")
async def fifo_cluster(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LiveParts]:
    async with live_parts(broker, tmp_path_factory.mktemp("fifo")) as parts:
        await parts.up({"node-a": 2, "node-b": 2})
        yield parts


@pytest.fixture(scope="module")
async def fitgpp_cluster(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LiveParts]:
    """FitGpp's ranking (every TE job ahead of every BE job), as ``preempting`` wants."""
    async with live_parts(broker, tmp_path_factory.mktemp("fitgpp")) as parts:
        await parts.up({"node-a": 2}, placement="preempting", policy="fitgpp")
        yield parts


def test_every_registered_policy_is_covered_here() -> None:
    assert "preempting" in PLACEMENT.names()
    assert len(PLACEMENTS) == len(PLACEMENT.names()) - 1
    assert VICTIM.names()  # a victim policy added later is picked up by the parametrization below


@pytest.mark.parametrize("policy", PLACEMENTS)
async def test_jobs_complete_under_placement_policy(policy: str, fifo_cluster: LiveParts) -> None:
    parts = fifo_cluster
    placement = await parts.swap_placement(policy)
    jobs = [await parts.submit(emulated_job(f"{policy}-{i}", gpus=gpus, seconds=30))
            for i, gpus in enumerate((1, 2, 1))]  # fmt: skip
    for job in jobs:
        await parts.until_status(job, "completed", timeout_s=60)
    seen = await parts.jobs(*jobs)
    assert [seen[job].status for job in jobs] == ["completed"] * 3
    assert [seen[job].gpus for job in jobs] == [1, 2, 1]
    assert placement.plans > 0  # this policy's service placed them


@pytest.mark.parametrize("victim", sorted(VICTIM.names()))
async def test_a_te_job_preempts_a_be_job_under_victim_policy(victim: str, fitgpp_cluster: LiveParts) -> None:
    parts = fitgpp_cluster
    await parts.swap_placement("preempting", victim=victim)
    be = await parts.submit(emulated_job(f"be-{victim}", gpus=2, seconds=3000, job_class=JobClass.BE))
    await parts.until_status(be, "running", timeout_s=30)
    te = await parts.submit(emulated_job(f"te-{victim}", gpus=1, seconds=20, job_class=JobClass.TE))
    await parts.until_status(te, "completed", timeout_s=60)
    seen = await parts.jobs(be, te)
    assert seen[te].preemptions == 0
    assert seen[be].preemptions == 1
    assert seen[be].first_start_time is not None
    assert seen[te].first_start_time is not None
    assert seen[be].first_start_time < seen[te].first_start_time
    await parts.client.cancel(be)
    await parts.until_status(be, "cancelled", timeout_s=30)
