"""Gandiva packing on the live cluster (issue 17): two jobs share one GPU and both complete.

Real processes throughout: the bundled nats-server, the five services (``rr`` ranking, ``gandiva``
placement with the packing profiles of ``services.core.packing``, the scheduler with ``--packing``)
and one worker agent with one fake GPU. The jobs are ``curve_job.py`` processes of model ``a3c``
(utilization 0.25 and 1.5 GB each: a pair fits and its utilizations sum to 0.5, so gandiva packs
it). The placement homes the second job on the first one's GPU (oversubscription) and packs it
there; the scheduler keeps that launch (``validate_plan`` with packing) and grants it marked
``shared``, as it marked the first; the agent runs both leases on GPU 0 at once.

What shows the packing: both jobs complete with every iteration run once and no preemption, and
their iterations interleave in time (each job ran iterations while the other was between its own
first and last): without packing the second job would wait for the GPU (``rr`` with a 60 s
quantum and jobs of ~6 s: it would start after the first one ended).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from roundhouse.local import LocalClusterConfig
from services.core.packing import PackingModel
from tests.e2e.live_cluster import curve_spec, iterations, live_cluster, read_log

ITERATIONS = 120
"""0.05 s each: ~6 s of work per job."""


def span(log: list[dict[str, float]]) -> tuple[float, float]:
    times = [rec["t"] for rec in log if "i" in rec]
    return min(times), max(times)


@pytest.mark.timeout(150)
async def test_two_packed_jobs_share_one_gpu_and_both_complete(tmp_path: Path) -> None:
    config = LocalClusterConfig(
        state_dir=tmp_path / "state", workers=1, gpus_per_worker=1, scheduler="rr", placement="gandiva",
        scheduler_options={"quantum_s": 60.0}, placement_options={"profiles": PackingModel().policy_profiles()},
        round_s=1.0, packing=True, extra_args={"worker": ["--heartbeat-s", "0.5"]},
    )  # fmt: skip
    async with live_cluster(tmp_path, config) as live:
        ids = {
            name: await live.submit(curve_spec(live, name, iterations=ITERATIONS, model="a3c", grace_period_s=10))
            for name in ("first", "second")
        }
        final = await live.wait_finished(list(ids.values()), timeout_s=90)

    by_name = {name: final[job_id] for name, job_id in ids.items()}
    assert all(v.status == "completed" for v in by_name.values()), by_name
    assert all(v.preemptions == 0 for v in by_name.values()), by_name
    logs = {name: read_log(live.log_of(name)) for name in ids}
    for name in ids:
        assert iterations(logs[name]) == list(range(ITERATIONS)), f"{name}: iterations lost or repeated"
    (a0, a1), (b0, b1) = span(logs["first"]), span(logs["second"])
    overlap = min(a1, b1) - max(a0, b0)
    assert overlap > 0.5 * min(a1 - a0, b1 - b0), f"the jobs did not run side by side: {(a0, a1)}, {(b0, b1)}"
