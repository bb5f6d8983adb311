"""Fidelity: the same trace through the simulator and through ``roundhouse up --emulate`` (issue 4).

Target: average JCT within 5% of the simulator's (Blox §6 reports 6.1% between its simulator and
its cluster runs).

1. **Simulator**: ``run_case`` on the case in-process (LAS, consolidated placement, 300 s rounds,
   accept-all, the simulator's default preemption costs); its ``avg_jct_s``.
2. **Emulated cluster**: a ``LocalCluster`` (bundled broker, the five services, one emulating worker
   per node with the trace's node size: 32 workers x 4 fake GPUs) with the same policies. Its
   round is 300 s of *simulated* time: ``LocalCluster`` divides ``round_s`` by ``speedup`` when
   ``emulate`` is set, and each worker's emulator runs a job's ``expected_duration_s`` (the trace
   duration) and its model's checkpoint cost divided by the same speed-up. Jobs are submitted at
   their trace arrival divided by the speed-up; JCT is measured from the scheduler's own job
   records (``JobView.finish_time - submit_time``, real seconds) and multiplied by the speed-up.
3. Both averages, the relative difference and whether it is within 5% are printed.

**Round phase.** The simulator's rounds fall on the grid 0, 300, 600, ... with the first arrival at
0; the scheduler service's timer starts when it is elected and skips empty rounds silently. Left
alone, the replay would start at a random phase of the service's timer and every job would see a
different round grid (with 300 s rounds and ~180 s jobs the round wait *is* half of the JCT). So a
probe job (1 GPU, 1 simulated second) is submitted first; the ``schedule.round`` message that ranks
it marks a round edge R, and the replay's time 0 is put at the next edge, R + round. Arrivals are
submitted ``--lead`` real seconds early (default 0.1 s) so that a job the trace submits exactly on
a round edge (job 0 at t=0) is accepted before that round starts, as in the simulator, where an
arrival at t precedes the round at t. Besides the system's JCT, a *trace-referenced* JCT
(finish minus the job's trace arrival on the aligned grid, i.e. the simulator's definition, immune
to submission latency and to the lead) is reported.

**Speed-up.** Every control-plane latency (bus hops, placement, lease grant, the worker's
completion report) is multiplied by the speed-up when converted to simulated seconds, and this
machine has 2 cores for 32 workers + 5 services + the broker. The defaults keep a run well under
8 minutes: ``tiresias`` (60 jobs over ~3,300 simulated s) at 20x runs ~165 s of replay, rounds of
15 s real, so 0.1 s of control-plane latency costs ~2 s of ~320 s average JCT (<1%); ``philly``
(Blox's generator at 8 jobs/h, 1 GPU each; 200 jobs arrive over ~23.5 simulated hours but the
generator's 10^(3..4)-minute tail makes the simulator's makespan ~580,000 s, 161 h, with one
519,250 s job) needs 2000x to fit (~290 s of replay; rounds of 0.15 s real; 0.1 s of latency = 200
simulated seconds, small against its ~41,500 s average JCT). ``--max-wall`` stops a replay that
overruns; unfinished jobs are reported and fail the target.

    .venv/bin/python -m benchmarks.fidelity --trace tiresias [--speedup 20] [--json out.json]
    .venv/bin/python -m benchmarks.fidelity --trace philly --jobs 200 --speedup 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roundhouse.client import Client
from roundhouse.local import LocalCluster, LocalClusterConfig
from roundhouse.sim.case import Case, build_cluster, build_workload, default_traces_dir, run_case
from schemas.control import JobsQuery, JobView
from schemas.job import JobSpec
from schemas.rounds import ScheduleRound
from schemas.subjects import SCHEDULE_ROUND
from services.core.simulation.workload import TraceJob

TARGET = 0.05
DEFAULT_SPEEDUP = {"tiresias": 20.0, "philly": 2000.0}
TERMINAL = ("completed", "failed", "cancelled")


class FidelityError(RuntimeError):
    """The emulated run could not be carried out (a job was not accepted, the cluster died, ...)."""


def make_case(trace: str, jobs: int | None, jobs_per_hour: float, seed: int) -> Case:
    """The simulation case for ``trace`` (``tiresias``: the 60-job trace on its 32x4 cluster file)."""
    traces = default_traces_dir()
    if trace == "tiresias":
        path, spec = traces / "tiresias-60job.csv", traces / "tiresias-cluster-n32g4.csv"
        for needed in (path, spec):
            if not needed.exists():
                raise FileNotFoundError(f"{needed} is missing: the traces live in <repo>/../shared/data/traces")
        return Case(workload=None, trace=str(path), format="tiresias", cluster_spec=str(spec), num_jobs=jobs,
                    scheduler="las", placement="consolidated", admission="accept-all", round_s=300.0)
    if trace == "philly":
        return Case(workload="philly-synthetic", cluster="32x4", jobs_per_hour=jobs_per_hour, gpus="1",
                    num_jobs=jobs or 200, seed=seed, scheduler="las", placement="consolidated",
                    admission="accept-all", round_s=300.0)
    raise ValueError(f"--trace must be tiresias or philly, got {trace!r}")


def node_shape(case: Case) -> tuple[int, int]:
    """(nodes, GPUs per node) of the case's cluster; the emulated cluster gets one worker per node."""
    cluster = build_cluster(case)
    sizes = {len(node.gpu_ids) for node in cluster.nodes.values()}
    if len(sizes) != 1:
        raise ValueError(f"the emulated cluster needs equal nodes; this case has node sizes {sorted(sizes)}")
    return len(cluster.nodes), sizes.pop()


@dataclass(frozen=True, slots=True)
class EmulatedResult:
    jobs: list[JobView]
    arrivals_s: dict[str, float]
    """job id -> trace arrival (simulated seconds)."""
    origin: float
    """Wall time of simulated t=0 (a round edge of the service's timer)."""
    speedup: float
    rounds: list[tuple[float, str]]
    """(simulated time from the origin, trigger) of each ``schedule.round`` message seen."""
    submit_lag_s: list[float]
    """Real seconds between the planned and the actual submission of each job."""
    timed_out: bool


async def _wait_jobs(
    client: Client, ids: list[str], deadline: float, cluster: LocalCluster
) -> tuple[list[JobView], bool]:
    reply_jobs: list[JobView] = []
    while True:
        cluster.check()
        found: list[JobView] = []
        try:
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                reply = await client.jobs(JobsQuery(job_ids=chunk, include_finished=True, limit=len(chunk)))
                found.extend(reply.jobs)
            reply_jobs = found
        except TimeoutError:  # the scheduler may be busy or still electing itself
            pass
        if len(reply_jobs) == len(ids) and all(job.status in TERMINAL for job in reply_jobs):
            return reply_jobs, False
        if time.monotonic() > deadline:
            return reply_jobs, True
        await asyncio.sleep(0.5)


async def replay(
    cluster: LocalCluster, trace_jobs: list[TraceJob], *, speedup: float, round_s: float, lead_s: float,
    max_wall_s: float,
) -> EmulatedResult:
    """Submit ``trace_jobs`` at their arrivals / speedup on a round-aligned origin; wait for all."""
    assert cluster.endpoint is not None
    client = await Client.connect(
        cluster.endpoint.nats, namespace=cluster.endpoint.namespace, name="fidelity", creds=cluster.operator_creds
    )
    seen: list[tuple[float, ScheduleRound]] = []

    async def on_round(message: ScheduleRound) -> None:
        seen.append((time.time(), message))

    sub = await client.bus.subscribe(SCHEDULE_ROUND, ScheduleRound, on_round)
    await client.bus.nc.flush()
    try:
        # Probe: find a round edge of the scheduler's timer.
        probe = JobSpec(name="fidelity-probe", command=["emulated"], gpus=1, expected_duration_s=1.0)
        verdict = await client.submit(probe, timeout_s=60)
        if verdict.outcome != "accepted":
            raise FidelityError(f"the probe job was {verdict.outcome}: {verdict.reason}")
        real_round = round_s / speedup
        wait_until = time.monotonic() + 3 * real_round + 60
        edge: float | None = None
        while edge is None:
            edge = next((t for t, m in seen if verdict.job_id in m.ranked), None)
            if edge is None:
                if time.monotonic() > wait_until:
                    raise FidelityError("no schedule.round ranked the probe job; is the scheduler running?")
                await asyncio.sleep(0.005)
        # The message leaves a little after the timer fired; its reception is the best edge we see.
        origin = edge + real_round * max(1, math.ceil((time.time() + 1.0 - edge) / real_round))
        await _wait_jobs(client, [verdict.job_id], time.monotonic() + 30, cluster)
        arrivals: dict[str, float] = {}
        lags: list[float] = []
        for job in trace_jobs:
            planned = origin + job.arrival_s / speedup - lead_s
            delay = planned - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(time.time() - planned)
            spec = JobSpec(name=f"fidelity-{job.index}", command=["emulated"], gpus=job.gpus, model=job.model,
                           expected_duration_s=job.duration_s, job_class=job.job_class)
            submitted = await client.submit(spec, wait=False)
            arrivals[submitted.job_id] = job.arrival_s
        deadline = time.monotonic() + max(1.0, max_wall_s - (time.time() - origin))
        views, timed_out = await _wait_jobs(client, list(arrivals), deadline, cluster)
        rounds = [((t - origin) * speedup, str(m.trigger)) for t, m in seen if t >= origin - real_round / 2]
        return EmulatedResult(views, arrivals, origin, speedup, rounds, lags, timed_out)
    finally:
        await sub.unsubscribe()
        await client.close()


def summarize_emulated(result: EmulatedResult) -> dict[str, Any]:
    """System JCT (scheduler's records) and trace-referenced JCT, both in simulated seconds."""
    done = [j for j in result.jobs if j.status == "completed" and j.finish_time is not None]
    system = [(j.finish_time - j.submit_time) * result.speedup for j in done if j.finish_time is not None]
    referenced = [
        (j.finish_time - result.origin) * result.speedup - result.arrivals_s[j.job_id]
        for j in done if j.finish_time is not None
    ]  # fmt: skip
    waits = [
        (j.first_start_time - j.submit_time) * result.speedup for j in done if j.first_start_time is not None
    ]  # fmt: skip
    return {
        "jobs": len(result.arrivals_s),
        "completed": len(done),
        "unfinished": len(result.arrivals_s) - len(done),
        "timed_out": result.timed_out,
        "statuses": {s: sum(1 for j in result.jobs if j.status == s) for s in sorted({j.status for j in result.jobs})},
        "avg_jct_s": statistics.fmean(system) if system else math.nan,
        "median_jct_s": statistics.median(system) if system else math.nan,
        "avg_jct_trace_referenced_s": statistics.fmean(referenced) if referenced else math.nan,
        "avg_responsiveness_s": statistics.fmean(waits) if waits else math.nan,
        "preemptions": sum(j.preemptions for j in result.jobs),
        "preempted": {j.name: j.preemptions for j in result.jobs if j.preemptions},
        "per_job": [
            {"name": j.name, "gpus": j.gpus, "arrival_s": result.arrivals_s[j.job_id], "preemptions": j.preemptions,
             "jct_s": (j.finish_time - j.submit_time) * result.speedup if j.finish_time is not None else None}
            for j in sorted(result.jobs, key=lambda j: result.arrivals_s[j.job_id])
        ],
        "rounds_seen": [[round(t, 1), trigger] for t, trigger in result.rounds],
        "max_submit_lag_real_s": max(result.submit_lag_s, default=0.0),
        "speedup": result.speedup,
    }


def run_emulated(case: Case, trace_jobs: list[TraceJob], *, speedup: float, lead_s: float,
                 max_wall_s: float) -> dict[str, Any]:
    nodes, gpus = node_shape(case)
    with tempfile.TemporaryDirectory(prefix="rh-fidelity-") as tmp:
        config = LocalClusterConfig(
            state_dir=Path(tmp) / "state", workers=nodes, gpus_per_worker=gpus, scheduler=case.scheduler,
            placement=case.placement, admission=case.admission, round_s=case.round_s, emulate=True,
            speedup=speedup, log_level="WARNING",
        )  # fmt: skip
        cluster = LocalCluster(config)
        started = time.perf_counter()
        cluster.start()
        try:
            cluster.wait_ready(timeout_s=180)
            ready_s = time.perf_counter() - started
            result = asyncio.run(replay(cluster, trace_jobs, speedup=speedup, round_s=case.round_s,
                                        lead_s=lead_s, max_wall_s=max_wall_s))
            cluster.check()
        finally:
            cluster.stop()
    summary = summarize_emulated(result)
    summary["startup_wall_s"] = round(ready_s, 1)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    summary["workers"] = nodes
    summary["gpus_per_worker"] = gpus
    return summary


def relative(a: float, b: float) -> float:
    return (a - b) / b if b else math.inf


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trace", choices=("tiresias", "philly"), default="tiresias")
    parser.add_argument("--jobs", type=int, default=None, help="first N jobs (philly: default 200)")
    parser.add_argument("--speedup", type=float, default=None,
                        help=f"emulation clock speed-up (default {DEFAULT_SPEEDUP})")
    parser.add_argument("--jobs-per-hour", type=float, default=8.0, help="philly-synthetic arrival rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lead", type=float, default=0.1, help="submit this many real seconds early")
    parser.add_argument("--max-wall", type=float, default=420.0, help="give up on the replay after this (real s)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    speedup = args.speedup or DEFAULT_SPEEDUP[args.trace]

    case = make_case(args.trace, args.jobs, args.jobs_per_hour, args.seed)
    sim = run_case(case).report
    trace_jobs = list(build_workload(case, build_cluster(case)))
    print(f"simulator: {sim['jobs']} jobs, avg JCT {sim['avg_jct_s']:.1f} s, makespan {sim['makespan_s']:.0f} s, "
          f"{sim['preemptions']} preemptions", flush=True)
    print(f"emulated: {len(trace_jobs)} jobs at {speedup:g}x (about {sim['makespan_s'] / speedup:.0f} s of replay)",
          flush=True)
    emu = run_emulated(case, trace_jobs, speedup=speedup, lead_s=args.lead, max_wall_s=args.max_wall)
    diff = relative(emu["avg_jct_s"], sim["avg_jct_s"])
    diff_ref = relative(emu["avg_jct_trace_referenced_s"], sim["avg_jct_s"])
    within = emu["unfinished"] == 0 and abs(diff) <= TARGET
    print(f"emulated: {emu['completed']}/{emu['jobs']} completed, avg JCT {emu['avg_jct_s']:.1f} s "
          f"(trace-referenced {emu['avg_jct_trace_referenced_s']:.1f} s), {emu['preemptions']} preemptions, "
          f"startup {emu['startup_wall_s']} s, wall {emu['wall_s']} s")
    print(f"avg JCT: simulator {sim['avg_jct_s']:.1f} s, emulated {emu['avg_jct_s']:.1f} s, "
          f"difference {diff:+.1%} (trace-referenced {diff_ref:+.1%}); target |diff| <= {TARGET:.0%}: "
          f"{'PASS' if within else 'FAIL'}")
    if args.json is not None:
        simulator = {k: v for k, v in sim.items() if k != "config"}
        args.json.write_text(json.dumps(
            {"trace": args.trace, "speedup": speedup, "simulator": simulator, "emulated": emu,
             "relative_difference": diff, "relative_difference_trace_referenced": diff_ref,
             "target": TARGET, "within_target": within, "case": sim["config"]}, indent=2) + "\n")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
