"""Round-robin time-slicing on the live cluster keeps a job that is still restoring its checkpoint.

Real processes throughout: the bundled nats-server, the five services (``rr`` ranking with a
0.5 s quantum) and one worker agent with one fake GPU that two ``curve_job.py`` jobs share. A
resumed run takes ``RESTORE_S`` (three quanta) to load its checkpoint before its first iteration.
The live scheduler learns that the run resumed only from its progress reports (the job's channel ->
the agent's ``metrics.job.<id>`` -> the metrics service's ``job-metrics`` bucket -> the scheduler;
``services/scheduler/resume.py``): the agent's samples from before the restore (iteration 0) and
right after it (the checkpoint's iteration) are no progress. Without that, ``rr`` revokes the
resumed run when its quantum ends, mid-restore, and the two-phase stop lets it finish exactly one
iteration (``stop_at = paused_at + 1``) after a 1.5 s restore, run after run: the livelock the
simulator found, but for that one iteration (measured with ``resumed_at`` left None: runs
``[(0, 17), (17, 1)]``). Kept until its first iteration is reported, the run is revoked while
running its second iteration or later, so it finishes at least two.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from roundhouse.local import LocalClusterConfig
from tests.e2e.live_cluster import Live, curve_spec, events, live_cluster, read_log

QUANTUM_S = 0.5
RESTORE_S = 1.5


def runs_of(log: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[int]]]:
    """Each process's start event with the iterations it ran, in the order the processes started."""
    return [(start, [r["i"] for r in log if "i" in r and r["pid"] == start["pid"]]) for start in events(log, "start")]


async def resumed_and_stopped(live: Live, name: str, timeout_s: float) -> list[tuple[dict[str, Any], list[int]]]:
    """``name``'s runs once a resumed run of it has been stopped by its lease (or the job finished)."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = read_log(live.log_of(name))
        resumed_pids = {s["pid"] for s in events(log, "start") if s["from"] > 0}
        ended = {e["pid"] for e in log if e.get("event") in ("stopped", "finished")}
        if resumed_pids & ended:
            return runs_of(log)
        if time.monotonic() > deadline:
            raise AssertionError(f"no resumed run of {name} ended within {timeout_s} s: {runs_of(log)}")
        live.cluster.check()
        await asyncio.sleep(0.1)


@pytest.mark.timeout(60)
async def test_a_resumed_job_restoring_longer_than_its_quantum_makes_progress_under_rr(tmp_path: Path) -> None:
    config = LocalClusterConfig(
        state_dir=tmp_path / "state", workers=1, gpus_per_worker=1, scheduler="rr", placement="consolidated",
        round_s=QUANTUM_S,
        extra_args={
            "scheduler": ["--policy-options", json.dumps({"quantum_s": QUANTUM_S})],
            "metrics": ["--flush-interval-s", "0.1"],
            "worker": ["--heartbeat-s", "0.5", "--metrics-s", "0.1"],
        },
    )  # fmt: skip
    async with live_cluster(tmp_path, config) as live:
        ids = [
            await live.submit(curve_spec(live, name, iterations=400, restore_s=RESTORE_S, grace_period_s=10))
            for name in ("a", "b")
        ]
        runs = await resumed_and_stopped(live, "a", timeout_s=30)
        for job_id in ids:
            await live.client.cancel(job_id)

    first, first_iterations = runs[0]
    assert first["from"] == 0
    assert first_iterations, "a's first run made no progress"
    resumed = [(start, done) for start, done in runs if start["from"] > 0]
    assert resumed, runs
    for start, done in resumed:
        # Each resumed run restored (RESTORE_S, three quanta), continued where the checkpoint left
        # off, and was not asked to stop before its first iteration had been reported.
        assert len(done) >= 2, f"a resumed run of a was asked to stop before it made progress: {runs}"
        assert done[0] == start["from"]
    print(f"\na's runs (from, iterations): {[(s['from'], len(d)) for s, d in runs]}")
