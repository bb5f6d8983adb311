"""Fidelity: the same trace through the simulator and through a live ``roundhouse up`` (issues 4, 18).

Target: average JCT within 5% of the simulator's (Blox §6 reports 6.1% between its simulator and
its cluster runs).

Two modes:

``--mode trace`` (default): a trace replayed on an emulated live cluster, and simulated.
    1. **Live, emulated**: a ``LocalCluster`` (bundled broker, the five services, one emulating
       worker per node with the case's node size) with the case's policies. Its round is the case's
       round of *simulated* time (``LocalCluster`` divides ``round_s`` by ``speedup``) and each
       worker's emulator runs a job's ``expected_duration_s`` (the trace duration) and its model's
       checkpoint cost divided by the same speed-up. Jobs are submitted at their trace arrival
       divided by the speed-up; JCT is measured from the scheduler's own job records
       (``JobView.finish_time - submit_time``, real seconds) and multiplied by the speed-up.
    2. **Simulator, from the live settings**: ``roundhouse.sim.live_config`` parses the flags the
       cluster started its services and workers with into their settings models and derives the
       simulation from them (round length, fill rounds, policies and options, the emulator's
       preemption costs), so the two worlds cannot drift apart again: the old benchmark simulated
       Blox's defaults (no fill rounds) while the live scheduler fills free GPUs between rounds,
       and read -39%. The control plane's **start latency** (submit to start on an idle cluster,
       from the scheduler's records) is measured by ``--probes`` probe jobs before the replay, and
       so is its stop latency (work done to completion recorded, minus the emulated run);
       the simulation models both (``SimConfig.start_latency_s``/``stop_latency_s``: the probes'
       medians times the speed-up). ``--no-latency`` leaves them out; ``--start-latency S`` sets one.
    3. Average JCTs, their relative difference (target: within 5%), and per-job differences of
       first-start times (median, p90 of the absolute difference, simulated seconds) are printed.

``--mode replay``: real jobs (``examples/train_mlp.py`` under ``roundhouse.train``, on the CPU,
    speed-up 1) run on a live ``LocalCluster``; their finished records are exported with
    ``roundhouse history`` (``roundhouse.commands.history``: arrival, GPUs, run time excluding
    queueing) and that trace is replayed by the simulator built from the same live settings. This
    is issue 14's "replay your own cluster": how well a simulation of a team's own history predicts
    what the cluster did (target within 5%).

**Round phase (trace mode).** The simulator's rounds fall on the grid 0, round, 2 round, ... with the
first arrival at 0; the scheduler service's timer starts when it is elected. A probe job that runs
through a round boundary is submitted first; the first *timer* ``schedule.round`` (not a fill round)
that ranks it marks an edge R, and the replay's time 0 is put at a later edge. Arrivals are submitted
``--lead`` real seconds early (default 0.1 s) so that a job the trace submits exactly on a round edge
is accepted before that round starts, as in the simulator, where an arrival at t precedes the round
at t. Besides the system's JCT, a *trace-referenced* JCT (finish minus the job's trace arrival on the
aligned grid) is reported.

**Speed-up.** Every control-plane latency not modelled is multiplied by the speed-up when converted
to simulated seconds, and this machine has 2 cores for the workers, five services and the broker.
``tiresias`` (60 jobs over ~3,300 simulated s on 32x4) at 20x runs ~165 s of replay; ``philly``
(200 jobs) needs 2000x to fit in minutes; lower speed-ups are closer to a real cluster.

    .venv/bin/python -m benchmarks.fidelity --trace tiresias [--speedup 20] [--json out.json]
    .venv/bin/python -m benchmarks.fidelity --trace tiresias --jobs 20 --cluster 2x4 --speedup 10
    .venv/bin/python -m benchmarks.fidelity --mode replay --jobs 12 [--cluster 2x2]
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from roundhouse.client import Client
from roundhouse.local import LocalCluster, LocalClusterConfig
from roundhouse.sim.case import Case, build_cluster, build_workload, default_traces_dir, run_case
from roundhouse.sim.live_config import LiveSettings, LiveSimulation, local_cluster_settings, simulation_from_live
from roundhouse.sim.per_job import JobRecord, job_records
from roundhouse.sim.report import summarize
from schemas.control import JobsQuery, JobView
from schemas.job import JobSpec
from schemas.rounds import RoundTrigger, ScheduleRound
from schemas.subjects import SCHEDULE_ROUND
from services.core.simulation.workload import TraceJob

TARGET = 0.05
DEFAULT_SPEEDUP = {"tiresias": 20.0, "philly": 2000.0}
TERMINAL = ("completed", "failed", "cancelled")
PROBE_S = 1.0
"""Simulated run time of a latency probe job."""


class FidelityError(RuntimeError):
    """The live run could not be carried out (a job was not accepted, the cluster died, ...)."""


def make_case(trace: str, jobs: int | None, jobs_per_hour: float, seed: int, cluster: str | None = None) -> Case:
    """The simulation case for ``trace`` (``tiresias``: the 60-job trace on its 32x4 cluster file;
    ``cluster`` ``NxG``: on N nodes of G GPUs instead). Its policies are what the live cluster is
    started with; the simulation itself is derived from the live settings."""
    traces = default_traces_dir()
    if trace == "tiresias":
        path, spec = traces / "tiresias-60job.csv", traces / "tiresias-cluster-n32g4.csv"
        for needed in (path, spec):
            if not needed.exists():
                raise FileNotFoundError(f"{needed} is missing: the traces live in <repo>/../shared/data/traces")
        return Case(
            workload=None,
            trace=str(path),
            format="tiresias",
            num_jobs=jobs,
            cluster_spec=None if cluster else str(spec),
            cluster=cluster or "32x4",
            scheduler="las",
            placement="consolidated",
            admission="accept-all",
            round_s=300.0,
        )
    if trace == "philly":
        return Case(
            workload="philly-synthetic",
            cluster=cluster or "32x4",
            jobs_per_hour=jobs_per_hour,
            gpus="1",
            num_jobs=jobs or 200,
            seed=seed,
            scheduler="las",
            placement="consolidated",
            admission="accept-all",
            round_s=300.0,
        )
    raise ValueError(f"--trace must be tiresias or philly, got {trace!r}")


def node_shape(case: Case) -> tuple[int, int]:
    """(nodes, GPUs per node) of the case's cluster; the emulated cluster gets one worker per node."""
    cluster = build_cluster(case)
    sizes = {len(node.gpu_ids) for node in cluster.nodes.values()}
    if len(sizes) != 1:
        raise ValueError(f"the emulated cluster needs equal nodes; this case has node sizes {sorted(sizes)}")
    return len(cluster.nodes), sizes.pop()


@dataclass(frozen=True, slots=True)
class Latencies:
    """Control-plane latencies measured on the live cluster, in real seconds."""

    start_s: list[float] = field(default_factory=list)
    """Per probe: submit to first start on an idle cluster (the scheduler's records)."""
    stop_s: list[float] = field(default_factory=list)
    """Per probe: first start to finish, minus the probe's own (emulated) run time."""

    def summary(self) -> dict[str, Any]:
        def stats(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            return {"median": statistics.median(values), "min": min(values), "max": max(values)}

        return {
            "start_s": stats(self.start_s),
            "stop_s": stats(self.stop_s),
            "start_samples_s": self.start_s,
            "stop_samples_s": self.stop_s,
        }


@dataclass(frozen=True, slots=True)
class EmulatedResult:
    jobs: list[JobView]
    arrivals_s: dict[str, float]
    """job id -> trace arrival (simulated seconds)."""
    index: dict[str, int]
    """job id -> trace index."""
    origin: float
    """Wall time of simulated t=0 (a round edge of the service's timer)."""
    speedup: float
    rounds: list[tuple[float, str]]
    """(simulated time from the origin, trigger) of each ``schedule.round`` message seen."""
    submit_lag_s: list[float]
    """Real seconds between the planned and the actual submission of each job."""
    timed_out: bool
    latencies: Latencies


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
        await asyncio.sleep(0.05 if len(ids) == 1 else 0.5)


async def _probe(client: Client, cluster: LocalCluster, name: str, duration_s: float) -> JobView:
    """Submit one probe job and wait until it is finished; its record."""
    spec = JobSpec(name=name, command=["emulated"], gpus=1, expected_duration_s=duration_s)
    verdict = await client.submit(spec, timeout_s=60)
    if verdict.outcome != "accepted":
        raise FidelityError(f"probe {name} was {verdict.outcome}: {verdict.reason}")
    views, timed_out = await _wait_jobs(client, [verdict.job_id], time.monotonic() + 120, cluster)
    if timed_out or views[0].status != "completed" or views[0].first_start_time is None:
        raise FidelityError(f"probe {name} did not complete: {views}")
    return views[0]


async def measure_latencies(client: Client, cluster: LocalCluster, speedup: float, probes: int) -> Latencies:
    """``probes`` short jobs one after another on the idle cluster (fill rounds start each at once)."""
    start: list[float] = []
    stop: list[float] = []
    for i in range(probes):
        view = await _probe(client, cluster, f"fidelity-latency-{i}", PROBE_S)
        assert view.first_start_time is not None
        assert view.finish_time is not None
        start.append(view.first_start_time - view.submit_time)
        stop.append(max(0.0, view.finish_time - view.first_start_time - PROBE_S / speedup))
    return Latencies(start, stop)


async def replay(
    cluster: LocalCluster,
    trace_jobs: list[TraceJob],
    *,
    speedup: float,
    round_s: float,
    lead_s: float,
    max_wall_s: float,
    probes: int,
) -> EmulatedResult:
    """Measure the latencies, find a timer round edge, submit ``trace_jobs`` at their arrivals /
    speedup on the round-aligned origin; wait for all."""
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
        latencies = await measure_latencies(client, cluster, speedup, probes)
        # Edge probe: a job that runs through a round boundary, so a timer round ranks it (fill
        # rounds, which start jobs between rounds, are off the timer's grid).
        real_round = round_s / speedup
        spec = JobSpec(name="fidelity-edge", command=["emulated"], gpus=1, expected_duration_s=1.2 * round_s)
        verdict = await client.submit(spec, timeout_s=60)
        if verdict.outcome != "accepted":
            raise FidelityError(f"the edge probe was {verdict.outcome}: {verdict.reason}")
        wait_until = time.monotonic() + 3 * real_round + 60
        edge: float | None = None
        while edge is None:
            edge = next(
                (
                    t
                    for t, m in seen
                    if verdict.job_id in m.ranked and m.trigger == RoundTrigger.TIMER and not m.fill_only
                ),
                None,
            )
            if edge is None:
                cluster.check()
                if time.monotonic() > wait_until:
                    raise FidelityError("no timer schedule.round ranked the probe job; is the scheduler running?")
                await asyncio.sleep(0.005)
        await _wait_jobs(client, [verdict.job_id], time.monotonic() + 3 * real_round + 60, cluster)
        # The message leaves a little after the timer fired; its reception is the best edge we see.
        origin = edge + real_round * max(1, math.ceil((time.time() + 1.0 - edge) / real_round))
        arrivals: dict[str, float] = {}
        index: dict[str, int] = {}
        lags: list[float] = []
        # Submissions are planned on the monotonic clock (a wall-clock step must not stall them);
        # the origin stays a wall time, the scheduler's records' clock.
        mono_origin = time.monotonic() + (origin - time.time())
        for job in trace_jobs:
            planned = mono_origin + job.arrival_s / speedup - lead_s
            delay = planned - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(time.monotonic() - planned)
            spec = JobSpec(
                name=f"fidelity-{job.index}",
                command=["emulated"],
                gpus=job.gpus,
                model=job.model,
                expected_duration_s=job.duration_s,
                job_class=job.job_class,
            )
            submitted = await client.submit(spec, wait=False)
            arrivals[submitted.job_id] = job.arrival_s
            index[submitted.job_id] = job.index
        deadline = time.monotonic() + max(1.0, max_wall_s - (time.time() - origin))
        views, timed_out = await _wait_jobs(client, list(arrivals), deadline, cluster)
        rounds = [((t - origin) * speedup, str(m.trigger)) for t, m in seen if t >= origin - real_round / 2]
        return EmulatedResult(views, arrivals, index, origin, speedup, rounds, lags, timed_out, latencies)
    finally:
        await sub.unsubscribe()
        await client.close()


def summarize_emulated(result: EmulatedResult) -> dict[str, Any]:
    """System JCT (scheduler's records) and trace-referenced JCT, both in simulated seconds."""
    done = [j for j in result.jobs if j.status == "completed" and j.finish_time is not None]
    system = [(j.finish_time - j.submit_time) * result.speedup for j in done if j.finish_time is not None]
    referenced = [
        (j.finish_time - result.origin) * result.speedup - result.arrivals_s[j.job_id]
        for j in done
        if j.finish_time is not None
    ]
    waits = [(j.first_start_time - j.submit_time) * result.speedup for j in done if j.first_start_time is not None]
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
            {
                "job": result.index[j.job_id],
                "name": j.name,
                "gpus": j.gpus,
                "arrival_s": result.arrivals_s[j.job_id],
                "preemptions": j.preemptions,
                "first_start_s": (j.first_start_time - result.origin) * result.speedup
                if j.first_start_time is not None
                else None,
                "jct_s": (j.finish_time - j.submit_time) * result.speedup if j.finish_time is not None else None,
            }
            for j in sorted(result.jobs, key=lambda j: result.arrivals_s[j.job_id])
        ],
        "rounds_seen": [[round(t, 1), trigger] for t, trigger in result.rounds],
        "max_submit_lag_real_s": max(result.submit_lag_s, default=0.0),
        "speedup": result.speedup,
        "latencies_real": result.latencies.summary(),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank (nan when empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def per_job_differences(live: Sequence[dict[str, Any]], simulated: Sequence[JobRecord]) -> dict[str, Any]:
    """Live minus simulated first-start time and JCT, job by job (matched by trace index): the
    median and p90 of the absolute differences and the mean signed one (simulated seconds)."""
    sim = {record.job: record for record in simulated}
    starts: list[float] = []
    jcts: list[float] = []
    for row in live:
        record = sim.get(row["job"])
        if record is None or row.get("first_start_s") is None or row.get("jct_s") is None:
            continue
        starts.append(row["first_start_s"] - record.first_start_s)
        jcts.append(row["jct_s"] - record.jct_s)

    def stats(diffs: list[float]) -> dict[str, float]:
        absolute = [abs(d) for d in diffs]
        return {
            "median_abs_s": statistics.median(absolute) if absolute else math.nan,
            "p90_abs_s": percentile(absolute, 0.9),
            "mean_s": statistics.fmean(diffs) if diffs else math.nan,
        }

    return {"matched": len(starts), "first_start": stats(starts), "jct": stats(jcts)}


def simulate_live(
    live: LiveSimulation, case: Case, trace_jobs: list[TraceJob]
) -> tuple[dict[str, Any], list[JobRecord]]:
    """Run ``trace_jobs`` on the case's cluster with the live-derived simulation; report and records."""
    started = time.perf_counter()
    outcome = live.simulator(trace_jobs, build_cluster(case)).run()
    report = summarize(outcome, wall_s=time.perf_counter() - started, config=live.describe())
    return report, list(job_records(outcome))


@dataclass(slots=True)
class RunningCluster:
    """A local cluster :func:`running_cluster` started, and when."""

    cluster: LocalCluster
    settings: LiveSettings
    """What it runs its services and workers with (the simulation is configured from these)."""
    started: float
    """``time.perf_counter()`` when it was started: a run's wall time counts from here."""
    ready_s: float
    """Seconds from start until it was ready."""


@contextmanager
def running_cluster(config: LocalClusterConfig) -> Iterator[RunningCluster]:
    """Start a local cluster from ``config`` and wait until it is ready; on leaving, check that none of
    its processes failed (when the body succeeded) and stop it, whatever happened."""
    cluster = LocalCluster(config)
    started = time.perf_counter()
    cluster.start()
    try:
        settings = local_cluster_settings(cluster)
        cluster.wait_ready(timeout_s=180)
        yield RunningCluster(cluster, settings, started, time.perf_counter() - started)
        cluster.check()
    finally:
        cluster.stop()


def run_emulated(
    case: Case,
    trace_jobs: list[TraceJob],
    *,
    speedup: float,
    lead_s: float,
    max_wall_s: float,
    probes: int,
    start_latency_s: float | None,
    stop_latency_s: float | None,
    with_latency: bool = True,
) -> dict[str, Any]:
    """The live (emulated) run and its simulation from the live settings; a JSON-ready report."""
    nodes, gpus = node_shape(case)
    with tempfile.TemporaryDirectory(prefix="rh-fidelity-") as tmp:
        config = LocalClusterConfig(
            state_dir=Path(tmp) / "state",
            workers=nodes,
            gpus_per_worker=gpus,
            scheduler=case.scheduler,
            placement=case.placement,
            admission=case.admission,
            round_s=case.round_s,
            emulate=True,
            speedup=speedup,
            log_level="WARNING",
            metrics=False,
            scheduler_options=dict(case.scheduler_options),
            placement_options=dict(case.placement_options),
            admission_options=dict(case.admission_options),
        )
        with running_cluster(config) as running:
            result = asyncio.run(
                replay(
                    running.cluster,
                    trace_jobs,
                    speedup=speedup,
                    round_s=case.round_s,
                    lead_s=lead_s,
                    max_wall_s=max_wall_s,
                    probes=probes,
                )
            )
    settings = running.settings
    emu = summarize_emulated(result)
    emu["startup_wall_s"] = round(running.ready_s, 1)
    emu["wall_s"] = round(time.perf_counter() - running.started, 1)
    emu["workers"] = nodes
    emu["gpus_per_worker"] = gpus
    latencies = result.latencies
    start = 0.0
    stop = 0.0
    if with_latency:
        # The probes' median, one constant: on a loaded machine one probe in a few can take several
        # times the others, and as per-job samples that outlier (x the speed-up) lands on real jobs.
        start = (
            start_latency_s
            if start_latency_s is not None
            else (statistics.median(latencies.start_s) if latencies.start_s else 0.0)
        )
        stop = (
            stop_latency_s
            if stop_latency_s is not None
            else (statistics.median(latencies.stop_s) if latencies.stop_s else 0.0)
        )
    live = simulation_from_live(settings, start_latency_s=start, stop_latency_s=stop, record_jobs=True)
    no_latency = simulation_from_live(settings, record_jobs=True)
    if live.time_scale != speedup or not math.isclose(live.config.round_s, case.round_s, rel_tol=1e-9):
        raise FidelityError(
            f"the live settings give time scale {live.time_scale} and round {live.config.round_s} s, "
            f"not {speedup} and {case.round_s} s"
        )
    sim, records = simulate_live(live, case, trace_jobs)
    bare, _ = simulate_live(no_latency, case, trace_jobs)
    return {
        "emulated": emu,
        "simulator": sim,
        "simulator_without_latency": bare,
        "per_job": per_job_differences(emu["per_job"], records),
        "sim_config": live.describe(),
    }


def relative(a: float, b: float) -> float:
    return (a - b) / b if b else math.inf


def compare(live_avg: float, sim_avg: float, unfinished: int) -> tuple[float, bool]:
    diff = relative(live_avg, sim_avg)
    return diff, unfinished == 0 and abs(diff) <= TARGET


def trace_mode(args: argparse.Namespace) -> dict[str, Any]:
    speedup = args.speedup or DEFAULT_SPEEDUP[args.trace]
    case = make_case(args.trace, args.jobs, args.jobs_per_hour, args.seed, args.cluster)
    if args.round_s is not None:
        case = replace(case, round_s=args.round_s)
    trace_jobs = list(build_workload(case, build_cluster(case)))
    defaults = run_case(case).report  # the simulator's own defaults (Blox: no fill rounds), for reference
    print(
        f"{len(trace_jobs)} jobs on {case.cluster_spec or case.cluster} at {speedup:g}x (about "
        f"{defaults['makespan_s'] / speedup:.0f} s of replay)",
        flush=True,
    )
    out = run_emulated(
        case,
        trace_jobs,
        speedup=speedup,
        lead_s=args.lead,
        max_wall_s=args.max_wall,
        probes=args.probes,
        start_latency_s=args.start_latency,
        stop_latency_s=args.stop_latency,
        with_latency=not args.no_latency,
    )
    emu, sim, bare, per_job = out["emulated"], out["simulator"], out["simulator_without_latency"], out["per_job"]
    diff, within = compare(emu["avg_jct_s"], sim["avg_jct_s"], emu["unfinished"])
    lat = emu["latencies_real"]
    print(f"live settings: {json.dumps(out['sim_config'])}")
    if lat["start_s"] is not None:
        print(
            f"measured latency (real s, {args.probes} probes): start median {lat['start_s']['median']:.3f}, "
            f"stop median {lat['stop_s']['median']:.3f}"
        )
    print(
        f"live: {emu['completed']}/{emu['jobs']} completed, avg JCT {emu['avg_jct_s']:.1f} s (trace-referenced "
        f"{emu['avg_jct_trace_referenced_s']:.1f} s), {emu['preemptions']} preemptions, startup "
        f"{emu['startup_wall_s']} s, wall {emu['wall_s']} s"
    )
    print(
        f"simulator (live settings): avg JCT {sim['avg_jct_s']:.1f} s with latencies, {bare['avg_jct_s']:.1f} s "
        f"without ({relative(emu['avg_jct_s'], bare['avg_jct_s']):+.1%}); simulator defaults "
        f"{defaults['avg_jct_s']:.1f} s ({relative(emu['avg_jct_s'], defaults['avg_jct_s']):+.1%})"
    )
    print(
        f"per job (live - sim, {per_job['matched']} jobs): first start |diff| median "
        f"{per_job['first_start']['median_abs_s']:.1f} s, p90 {per_job['first_start']['p90_abs_s']:.1f} s; "
        f"JCT |diff| median {per_job['jct']['median_abs_s']:.1f} s, p90 {per_job['jct']['p90_abs_s']:.1f} s"
    )
    print(
        f"avg JCT: simulator {sim['avg_jct_s']:.1f} s, live {emu['avg_jct_s']:.1f} s, difference {diff:+.1%}; "
        f"target |diff| <= {TARGET:.0%}: {'PASS' if within else 'FAIL'}"
    )
    simulator = {k: v for k, v in sim.items() if k != "config"}
    return {
        "mode": "trace",
        "trace": args.trace,
        "speedup": speedup,
        "simulator": simulator,
        "simulator_without_latency_avg_jct_s": bare["avg_jct_s"],
        "simulator_defaults_avg_jct_s": defaults["avg_jct_s"],
        "emulated": emu,
        "per_job": per_job,
        "relative_difference": diff,
        "target": TARGET,
        "within_target": within,
        "sim_config": out["sim_config"],
        "case": defaults["config"],
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--mode",
        choices=("trace", "replay"),
        default="trace",
        help="trace: a trace live (emulated) vs simulated; replay: real jobs live vs their exported history simulated",
    )
    parser.add_argument("--trace", choices=("tiresias", "philly"), default="tiresias")
    parser.add_argument("--cluster", default=None, help="NxG uniform cluster instead of the trace's")
    parser.add_argument("--round", type=float, default=None, dest="round_s", help="round length (simulated s)")
    parser.add_argument("--jobs", type=int, default=None, help="first N jobs (philly: default 200)")
    parser.add_argument(
        "--speedup", type=float, default=None, help=f"emulation clock speed-up (default {DEFAULT_SPEEDUP})"
    )
    parser.add_argument("--jobs-per-hour", type=float, default=8.0, help="philly-synthetic arrival rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lead", type=float, default=0.1, help="submit this many real seconds early")
    parser.add_argument("--max-wall", type=float, default=420.0, help="give up on the replay after this (real s)")
    parser.add_argument("--probes", type=int, default=5, help="latency probe jobs before the replay")
    parser.add_argument(
        "--start-latency",
        type=float,
        default=None,
        help="control-plane start latency to simulate (real s; default: measured by the probes)",
    )
    parser.add_argument(
        "--stop-latency",
        type=float,
        default=None,
        help="control-plane stop latency to simulate (real s; default: measured by the probes)",
    )
    parser.add_argument("--no-latency", action="store_true", help="simulate no control-plane latency")
    parser.add_argument("--json", type=Path, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.mode == "replay":
        from benchmarks.fidelity_replay import replay_mode

        result = replay_mode(args)
    else:
        result = trace_mode(args)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
