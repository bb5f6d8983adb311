"""``benchmarks.fidelity --mode replay``: real jobs live, then their exported history simulated (issue 14, item 8).

1. A ``LocalCluster`` (no emulation: real child processes) with ``--cluster NxG`` fake GPUs and the
   policies of the trace mode, round ``--round`` seconds (default 60).
2. Latency probes (``python -c pass`` jobs, one at a time on the idle cluster): submit to first
   start, from the scheduler's records.
3. ``--jobs`` real training jobs (``examples/train_mlp.py`` under ``roundhouse.train``, on the CPU),
   a seeded workload: arrivals ~ exponential gaps (mean ``GAP_S``), 1 or 2 GPUs, a few seconds of
   iterations each; submitted at their arrival times; waited for.
4. ``roundhouse history --trace FILE`` (the CLI, as the operator) exports the finished jobs; the
   trace is read back with ``roundhouse.sim.traces`` (format ``roundhouse``) and simulated with the
   settings derived from the live cluster (``roundhouse.sim.live_config``, time scale 1) and the
   probes' start latency.
5. Average JCT live (the scheduler's ``finish - submit``) vs simulated, and the per-job differences.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.fidelity import TARGET, FidelityError, _wait_jobs, compare, per_job_differences, running_cluster
from roundhouse.client import Client
from roundhouse.local import LocalCluster, LocalClusterConfig
from roundhouse.sim.cluster import uniform_cluster
from roundhouse.sim.live_config import simulation_from_live
from roundhouse.sim.per_job import job_records
from roundhouse.sim.report import summarize
from roundhouse.sim.traces import read_trace
from schemas.control import JobView
from schemas.job import JobSpec
from services.core.costs import CostModel

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train_mlp.py"
GAP_S = 1.5
"""Mean seconds between arrivals: with jobs of a few seconds on 4 GPUs, some wait (queueing is what a
replay tests)."""


@dataclass(frozen=True, slots=True)
class RealJob:
    index: int
    arrival_s: float
    gpus: int
    iterations: int


def workload(jobs: int, seed: int) -> list[RealJob]:
    rng = random.Random(seed)
    arrival = 0.0
    out = []
    for index in range(jobs):
        out.append(RealJob(index, arrival, rng.choice((1, 1, 2)), rng.randint(20, 60)))
        arrival += rng.expovariate(1.0 / GAP_S)
    return out


def job_spec(job: RealJob) -> JobSpec:
    # --sleep 0.03: ~0.6-1.8 s of iterations besides torch's start-up; checkpoints only when told to.
    command = [
        sys.executable,
        str(TRAIN),
        "--iterations",
        str(job.iterations),
        "--sleep",
        "0.03",
        "--device",
        "cpu",
        "--log-every",
        "1000",
        "--seed",
        str(job.index),
    ]
    return JobSpec(
        name=f"replay-{job.index}",
        command=command,
        gpus=job.gpus,
        cpus=0.1,
        memory_gb=0.1,
        workdir=str(REPO),
        expected_duration_s=job.iterations * 0.03 + 2.0,
    )


async def _live(
    cluster: LocalCluster, jobs: list[RealJob], probes: int, max_wall_s: float
) -> tuple[list[JobView], list[JobView], bool]:
    """The probes' records, then the workload's (and whether waiting for it timed out)."""
    assert cluster.endpoint is not None
    client = await Client.connect(
        cluster.endpoint.nats,
        namespace=cluster.endpoint.namespace,
        name="fidelity-replay",
        creds=cluster.operator_creds,
    )
    try:
        probed: list[JobView] = []
        for i in range(probes):
            spec = JobSpec(name=f"probe-{i}", command=[sys.executable, "-c", "pass"], gpus=1, cpus=0.1, memory_gb=0.1)
            verdict = await client.submit(spec, timeout_s=60)
            if verdict.outcome != "accepted":
                raise FidelityError(f"probe {i} was {verdict.outcome}: {verdict.reason}")
            views, timed_out = await _wait_jobs(client, [verdict.job_id], time.monotonic() + 120, cluster)
            first = views[0].first_start_time if views else None
            if timed_out or first is None:
                raise FidelityError(f"probe {i} did not run: {views}")
            probed.append(views[0])
        origin = time.monotonic() + 0.5
        ids: list[str] = []
        for job in jobs:
            delay = origin + job.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            verdict = await client.submit(job_spec(job), wait=False)
            ids.append(verdict.job_id)
        views, timed_out = await _wait_jobs(client, ids, time.monotonic() + max_wall_s, cluster)
        return probed, views, timed_out
    finally:
        await client.close()


def export_history(cluster: LocalCluster, path: Path) -> None:
    """``roundhouse history --trace PATH`` as the operator, through the CLI."""
    assert cluster.endpoint is not None
    command = [
        sys.executable,
        "-m",
        "roundhouse",
        "history",
        "--trace",
        str(path),
        "--nats",
        cluster.endpoint.nats,
        "--namespace",
        cluster.endpoint.namespace,
    ]
    if cluster.operator_creds is not None:
        command += ["--creds", str(cluster.operator_creds)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise FidelityError(f"roundhouse history failed ({done.returncode}): {done.stderr.strip()}")


def replay_mode(args: argparse.Namespace) -> dict[str, Any]:
    shape = args.cluster or "2x2"
    nodes, _, gpus = shape.partition("x")
    round_s = args.round_s or 60.0
    jobs = workload(args.jobs or 12, args.seed)
    with tempfile.TemporaryDirectory(prefix="rh-fidelity-replay-") as tmp:
        config = LocalClusterConfig(
            state_dir=Path(tmp) / "state",
            workers=int(nodes),
            gpus_per_worker=int(gpus),
            scheduler="las",
            placement="consolidated",
            admission="accept-all",
            round_s=round_s,
            log_level="WARNING",
            metrics=False,
        )
        with running_cluster(config) as running:
            probed, views, timed_out = asyncio.run(_live(running.cluster, jobs, args.probes, args.max_wall))
            trace_path = Path(tmp) / "history.csv"
            export_history(running.cluster, trace_path)
        exported = read_trace(trace_path, "roundhouse")
    settings = running.settings
    wall = time.perf_counter() - running.started
    latencies = [v.first_start_time - v.submit_time for v in probed if v.first_start_time is not None]
    done = sorted(
        (v for v in views if v.status == "completed" and v.finish_time is not None),
        key=lambda v: (v.submit_time, v.job_id),
    )
    # The exported trace holds the probes too (finished jobs of this cluster, submitted first): the
    # replay simulates them as well, and the comparison is over the workload's jobs. Trace rows are in
    # submission order, from the first probe's submission: row k is the k-th job submitted.
    probe_count = len(probed)
    if len(exported) != probe_count + len(done):
        raise FidelityError(f"history exported {len(exported)} jobs; {probe_count} probes + {len(done)} completed")
    first_submit = probed[0].submit_time if probed else done[0].submit_time
    # The exported run times include what each live preemption cost (checkpoint, restart): free here.
    live = simulation_from_live(settings, start_latency_s=latencies or 0.0, record_jobs=True, costs=CostModel.free())
    outcome = live.simulator(exported, uniform_cluster(shape)).run()
    report = summarize(outcome, wall_s=0.0, config=live.describe())
    rows = []
    for k, view in enumerate(done):
        assert view.finish_time is not None
        started_at = view.first_start_time if view.first_start_time is not None else view.finish_time
        rows.append(
            {
                "job": probe_count + k,
                "first_start_s": started_at - first_submit,
                "jct_s": view.finish_time - view.submit_time,
            }
        )
    sim_rows = [r for r in job_records(outcome) if r.job >= probe_count]
    sim_avg = statistics.fmean(r.jct_s for r in sim_rows) if sim_rows else float("nan")
    live_avg = statistics.fmean(r["jct_s"] for r in rows) if rows else float("nan")
    diff, within = compare(live_avg, sim_avg, len(jobs) - len(done) + (1 if timed_out else 0))
    per_job = per_job_differences(rows, sim_rows)
    print(
        f"replay: {len(done)}/{len(jobs)} real jobs completed on {shape} ({round_s:g} s rounds), wall {wall:.0f} s; "
        f"start latency median {statistics.median(latencies) if latencies else 0:.3f} s over {len(latencies)} probes; "
        f"preemptions live {sum(v.preemptions for v in done)}, replay {report['preemptions']}"
    )
    print(
        f"per job (live - replay): first start |diff| median {per_job['first_start']['median_abs_s']:.2f} s, "
        f"p90 {per_job['first_start']['p90_abs_s']:.2f} s; JCT |diff| median {per_job['jct']['median_abs_s']:.2f} s"
    )
    print(
        f"avg JCT: live {live_avg:.2f} s, replay in the simulator {sim_avg:.2f} s, difference {diff:+.1%}; "
        f"target |diff| <= {TARGET:.0%}: {'PASS' if within else 'FAIL'}"
    )
    return {
        "mode": "replay",
        "cluster": shape,
        "round_s": round_s,
        "jobs": len(jobs),
        "completed": len(done),
        "timed_out": timed_out,
        "live_avg_jct_s": live_avg,
        "replay_avg_jct_s": sim_avg,
        "relative_difference": diff,
        "target": TARGET,
        "within_target": within,
        "per_job": per_job,
        "start_latency_s": latencies,
        "live_preemptions": sum(v.preemptions for v in done),
        "sim_config": live.describe(),
        "simulator": {k: v for k, v in report.items() if k != "config"},
        "wall_s": round(wall, 1),
    }
