"""Hermes on the live cluster (issue 5, Live services): loss reported by real jobs drives the order.

Real processes throughout: the bundled nats-server, the five services (``hermes`` ranking and
``hermes`` placement) and one worker agent with one fake GPU that the two jobs time-share. The jobs
are ``curve_job.py`` processes reporting their loss with ``Job.report``; the loss travels the live
path: the job's channel -> the worker agent (``metrics.job.<id>``) -> the metrics service (the
``job-metrics`` bucket, per-job ``loss_history``) -> the scheduler (``JobState.loss_history``) ->
the ranking (Eq. 2-4 of seed 003).

``slow`` is submitted first and converges slowly and steadily; ``fast`` converges quickly, then its
loss is flat (converged at iteration ``PLATEAU``). Hermes must (1) give ``fast`` the GPU once
``slow`` has been measured for one quantum (a job with no loss yet runs first to be measured), which
shows ``slow``'s loss reached the ranking (without it ``slow``, running, would keep the GPU); (2)
keep ``fast`` on the GPU through its fast phase, quanta after its own first one, while ``slow``
waits; (3) once ``fast``'s loss is flat, give the GPU back to ``slow``, whose loss still falls:
only ``fast``'s reported losses can make that happen (a job without loss samples ranks first).

The quantum is 2 s (the paper's is 10 s; shorter so the test stays short) and loss milestones are
off (``milestones: []``), so the convergence rank alone decides; quantum growth has unit tests.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from roundhouse.local import LocalClusterConfig
from tests.e2e.live_cluster import curve_spec, events, iterations, live_cluster, read_log

QUANTUM_S = 2.0
ITERATIONS = {"slow": 200, "fast": 340}
PLATEAU = 100
"""``fast`` converges by iteration 100 (5 s at 0.05 s an iteration); its loss is flat after that."""
RATES = {"slow": 0.0005, "fast": 0.02}
"""Per iteration: over one 0.25 s metrics interval ``slow`` loses ~0.005, ``fast`` ~0.19 at first."""


def runs(log: list[dict[str, Any]]) -> list[list[int]]:
    """The iterations each process of a job ran, in the order the processes started."""
    by_pid: dict[int, list[int]] = {}
    for rec in log:
        if "i" in rec:
            by_pid.setdefault(rec["pid"], []).append(rec["i"])
    return list(by_pid.values())


@pytest.mark.timeout(150)
async def test_loss_reported_by_real_jobs_orders_the_gpu_under_hermes(tmp_path: Path) -> None:
    options = json.dumps({"quantum_s": QUANTUM_S, "milestones": []})
    config = LocalClusterConfig(
        state_dir=tmp_path / "state", workers=1, gpus_per_worker=1, scheduler="hermes", placement="hermes",
        round_s=QUANTUM_S,
        extra_args={
            "scheduler": ["--policy-options", options],
            "metrics": ["--flush-interval-s", "0.25"],
            "worker": ["--heartbeat-s", "0.5", "--metrics-s", "0.25"],
        },
    )  # fmt: skip
    async with live_cluster(tmp_path, config) as live:
        ids = {
            "slow": await live.submit(curve_spec(live, "slow", iterations=ITERATIONS["slow"], rate=RATES["slow"],
                                                 grace_period_s=10)),
            "fast": await live.submit(curve_spec(live, "fast", iterations=ITERATIONS["fast"], rate=RATES["fast"],
                                                 plateau_at=PLATEAU, grace_period_s=10)),
        }  # fmt: skip
        final = await live.wait_finished(list(ids.values()), timeout_s=90)

        # The live path's middle: the metrics service kept each job's loss history in the bucket
        # the scheduler watches, with the losses the jobs reported.
        bucket = await live.client.bus.kv("job-metrics")
        history: dict[str, list[float]] = {}
        for name, job_id in ids.items():
            entry = await bucket.get(job_id)
            assert entry is not None, f"no job-metrics aggregate for {name}"
            history[name] = [loss for _, loss in json.loads(entry.value)["loss_history"]]

    by_name = {name: final[job_id] for name, job_id in ids.items()}
    assert all(v.status == "completed" for v in by_name.values()), by_name
    logs = {name: read_log(live.log_of(name)) for name in ids}
    for name, count in ITERATIONS.items():
        assert iterations(logs[name]) == list(range(count)), f"{name}: iterations lost or repeated"
    assert min(len(h) for h in history.values()) >= 20, history
    # The newest losses are the curves' (curve_job.py): fast flat at its converged value, slow still high.
    assert history["fast"][-1] == pytest.approx(0.1 + 1.9 * math.exp(-RATES["fast"] * PLATEAU))
    assert 1.6 < history["slow"][-1] < 2.0

    slow_runs, fast_runs = runs(logs["slow"]), runs(logs["fast"])
    slow_starts = events(logs["slow"], "start")
    fast_starts = events(logs["fast"], "start")
    # (1) slow, submitted first, ran first, for about one quantum; then the unmeasured fast job ran.
    assert slow_starts[0]["t"] < fast_starts[0]["t"]
    assert len(slow_runs[0]) < 0.5 * ITERATIONS["slow"], f"slow was not preempted after its quantum: {slow_runs}"
    assert by_name["slow"].preemptions >= 1
    # (2) fast kept the GPU through its whole fast phase, quanta past its own first one.
    assert fast_runs[0][0] == 0
    assert fast_runs[0][-1] >= PLATEAU, f"fast lost the GPU while its loss was still falling fast: {fast_runs}"
    # (3) converged, fast gave the GPU back to slow before finishing its iterations.
    assert by_name["fast"].preemptions >= 1, "fast kept the GPU after its loss went flat"
    assert fast_runs[0][-1] < ITERATIONS["fast"] - 1
    fast_first_end = max(r["t"] for r in logs["fast"] if "i" in r and r["pid"] == fast_starts[0]["pid"])
    assert slow_starts[1]["t"] > fast_first_end, "slow resumed while fast still held the GPU"
    print(f"\nslow runs: {[(r[0], r[-1]) for r in slow_runs]}; fast runs: {[(r[0], r[-1]) for r in fast_runs]}; "
          f"preemptions slow {by_name['slow'].preemptions}, fast {by_name['fast'].preemptions}")  # fmt: skip
