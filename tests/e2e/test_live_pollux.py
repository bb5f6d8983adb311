"""Pollux on the live cluster (issue 17, item 3): elastic re-allocation by the real services.

Real parts throughout (``tests.live_parts``): the session's nats-server, a scheduler running the
``pollux`` policy, the placement and admission services, and one emulating worker agent with four
fake GPUs. Two elastic BERT jobs (1 to 4 GPUs each; ``bert`` has a goodput profile, and at its
starting noise scale 4 GPUs give it a 3.5x speed-up, ``services.core.goodput``):

1. ``first`` arrives alone: Pollux gives it all four GPUs.
2. ``second`` arrives: the fairness-weighted mean (p = -1) gives it GPUs, so ``first`` is
   suspended and restarted on fewer: its GPU count changes between runs, decided by the policy in
   the live scheduler, carried out by placement, the lease protocol and the agent.
3. ``second`` finishes: ``first`` grows back to four GPUs.

A second test runs a real training process (``jobs/noise_job.py``) on ``roundhouse up``'s cluster
and follows the gradient noise scale it estimates and reports to the metrics service's aggregate.

The restart delay is 1 s instead of Pollux's 30 s: emulated jobs run 100x faster than real time,
and with 30 s a job seconds old is penalised so much for moving that growing back would wait minutes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from roundhouse.local import LocalClusterConfig
from schemas.job import JobSpec
from schemas.jobs import JobStarted
from services.runtime.broker import Broker
from tests.e2e.live_cluster import live_cluster, read_log
from tests.helpers import eventually
from tests.live_parts import emulated_job, live_parts


def gpu_counts(starts: list[JobStarted]) -> list[int]:
    return [len(started.gpus) for started in starts]


@pytest.mark.timeout(120)
async def test_pollux_reallocates_an_elastic_job_between_runs(broker: Broker, tmp_path: Path) -> None:
    async with live_parts(broker, tmp_path) as parts:
        await parts.up({"node-a": 4}, policy="pollux", policy_options={"restart_delay_s": 1.0})
        first = await parts.submit(emulated_job("first", gpus=1, max_gpus=4, model="bert", seconds=100_000))
        await eventually(lambda: gpu_counts(parts.facts.of(JobStarted, first)) == [4], 30, "first on all 4 GPUs")

        second = await parts.submit(emulated_job("second", gpus=1, max_gpus=4, model="bert", seconds=800))
        await parts.until_status(second, "running", timeout_s=30)
        await eventually(lambda: len(parts.facts.of(JobStarted, first)) >= 2, 30, "first restarted on fewer GPUs")
        shrunk = gpu_counts(parts.facts.of(JobStarted, first))[1]
        assert 1 <= shrunk < 4
        # The two runs of ``second`` and ``first`` never hold more than the node's GPUs at once.
        assert shrunk + gpu_counts(parts.facts.of(JobStarted, second))[0] <= 4

        await parts.until_status(second, "completed", timeout_s=60)
        await eventually(lambda: gpu_counts(parts.facts.of(JobStarted, first))[-1] == 4, 30, "first back on 4 GPUs")
        view = (await parts.jobs(first))[first]
        assert view.status == "running"
        assert view.preemptions >= 2  # shrunk once, grown once: each a suspension and a relaunch
        await parts.client.cancel(first)
        await parts.until_status(first, "cancelled", timeout_s=30)
    counts = gpu_counts(parts.facts.of(JobStarted, first))
    print(f"\nfirst's GPU count per run: {counts}")


NOISE_JOB = Path(__file__).resolve().parent / "jobs" / "noise_job.py"


@pytest.mark.timeout(150)
async def test_a_real_job_s_gradient_noise_scale_reaches_the_metrics_bucket(tmp_path: Path) -> None:
    """The live path of the noise scale, every hop a real process: ``noise_job.py`` estimates it with
    ``roundhouse.train.GradientNoiseScale`` and reports it -> the worker agent (channel slot, then
    ``metrics.job.<id>``) -> the metrics service (the job's aggregate in ``job-metrics``), which the
    scheduler copies into ``JobState`` (``tests/unit/pollux/test_noise_scale.py``)."""
    config = LocalClusterConfig(
        state_dir=tmp_path / "state", workers=1, gpus_per_worker=2, scheduler="pollux", round_s=2.0,
        extra_args={"metrics": ["--flush-interval-s", "0.25"],
                    "worker": ["--heartbeat-s", "0.5", "--metrics-s", "0.25"]},
    )  # fmt: skip
    async with live_cluster(tmp_path, config) as live:
        log = live.log_of("noise")
        command = [sys.executable, str(NOISE_JOB), "--iterations", "150", "--log", str(log)]
        spec = JobSpec(name="noise", command=command, gpus=1, max_gpus=2, model="cifar10",
                       env={"PYTHONDONTWRITEBYTECODE": "1"})  # fmt: skip
        job_id = await live.submit(spec)
        final = await live.wait_finished([job_id], timeout_s=90)
        bucket = await live.client.bus.kv("job-metrics")
        entry = await bucket.get(job_id)
    assert final[job_id].status == "completed", final
    assert entry is not None, "no job-metrics aggregate for the job"
    aggregate = json.loads(entry.value)
    reported = [rec for rec in read_log(log) if rec.get("noise") is not None]
    assert len(reported) > 100
    # What the metrics service kept is a value the job reported (no hop changed it), with its batch size...
    assert aggregate["grad_noise_scale"] in {rec["noise"] for rec in reported}
    assert aggregate["batch_size"] == 64
    # ...and the estimator's, close to the synthetic problem's exact noise scale.
    assert aggregate["grad_noise_scale"] == pytest.approx(reported[0]["exact"], rel=0.3)
