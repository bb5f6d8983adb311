"""ETA accuracy: each queued job's predicted start (``roundhouse jobs`` ETA) against its actual start.

A live emulated cluster (``roundhouse up --emulate``: the bundled broker, the five services, one
emulating worker agent per node, ``LocalCluster`` as ``benchmarks/fidelity.py`` starts it) replays
a slice of the Tiresias 60-job trace (``../shared/data/traces``; or ``--synthetic`` jobs when it is
absent) with each job's ``expected_duration_s`` set to its trace duration, at ``--speedup`` times
real speed (the scheduler is told so: ``--eta-time-scale``). While it runs, the queue is read every
``--poll`` seconds; a job's ETA is *sampled at submission*: the first ETA ``jobs`` shows for it while
it is queued. Once every job finished, the error of each sampled job is its predicted start minus
its actual first start, in simulated seconds. Printed per policy: jobs sampled, median and p90 of
the absolute error, the median signed error (negative: the ETA was early) and, for scale, the
median and p90 of the actual wait from sampling to start. Jobs that started before any ETA was
computed (on free GPUs, by a fill round) have none to compare and are counted apart.

Why an ETA misses (what the numbers measure): jobs that arrive after the sample and are ranked
ahead of it (SRTF: shorter ones; FIFO never lets them pass, but they may take GPUs a wide job waits
for), the control plane's latencies (a fill round after a completion, the worker's start-up) scaled
by the speed-up, and round-grid effects.

    .venv/bin/python -m benchmarks.eta [--policies fifo,srtf] [--jobs 60] [--cluster 2x4] [--speedup 30]
                                       [--json FILE]

``--round-cost`` measures instead what the ETA costs the scheduler's rounds: ``benchmarks.round``
(10,000 GPUs, 20,000 queued jobs, LAS; no job declares a duration, so every ETA uses the fallback)
run twice in this process, with the ETA on (the default: a run whenever the book changed, at most
every 2 s) and off (``eta=False``), its steady rounds' wall time and the scheduler process's CPU
time compared. The ETA's simulation runs in a worker process, so it competes for the host's CPUs,
not for the event loop; its snapshot (on the loop) is taken between rounds.

    .venv/bin/python -m benchmarks.eta --round-cost [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roundhouse.client import Client
from roundhouse.local import LocalCluster, LocalClusterConfig
from schemas.control import JobsQuery, JobView
from schemas.job import JobClass, JobSpec
from services.core.simulation.workload import TraceJob

FINAL = frozenset({"completed", "failed", "cancelled"})


def tiresias_slice(jobs: int, cluster: str) -> list[TraceJob] | None:
    """The first ``jobs`` jobs of the Tiresias 60-job trace (None when the traces are absent)."""
    from roundhouse.sim.case import Case, build_cluster, build_workload, default_traces_dir

    path = default_traces_dir() / "tiresias-60job.csv"
    if not path.exists():
        return None
    case = Case(workload=None, trace=str(path), format="tiresias", num_jobs=jobs, cluster=cluster,
                scheduler="fifo", placement="consolidated", admission="accept-all", round_s=60.0)  # fmt: skip
    return list(build_workload(case, build_cluster(case)))[:jobs]


def synthetic(jobs: int, seed: int, gpus_per_node: int) -> list[TraceJob]:
    """Poisson arrivals (one a minute on average), 1-4 GPUs, log-uniform durations of 2-30 minutes."""
    rng = random.Random(seed)
    t = 0.0
    out: list[TraceJob] = []
    for i in range(jobs):
        t += rng.expovariate(1 / 60)
        out.append(TraceJob(index=i, arrival_s=t, gpus=min(gpus_per_node, rng.choice((1, 1, 2, 4))),
                            duration_s=math.exp(rng.uniform(math.log(120), math.log(1800))),
                            job_class=JobClass.BE))  # fmt: skip
    return out


@dataclass
class Run:
    policy: str
    speedup: float
    sampled: dict[str, tuple[float, float, str | None]] = field(default_factory=dict)
    """job id -> (predicted start, time of the sample, quality), wall clock."""
    views: dict[str, JobView] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)
    """job id -> trace index."""
    eta_reasons: dict[str, str] = field(default_factory=dict)
    """Why a queued job had no ETA when first seen (counted, for the report)."""

    def summary(self) -> dict[str, Any]:
        errors: list[float] = []
        waits: list[float] = []
        by_quality: dict[str, int] = {}
        for job_id, (predicted, at, quality) in self.sampled.items():
            view = self.views.get(job_id)
            if view is None or view.first_start_time is None:
                continue
            errors.append((predicted - view.first_start_time) * self.speedup)
            waits.append(max(0.0, view.first_start_time - at) * self.speedup)
            by_quality[quality or "?"] = by_quality.get(quality or "?", 0) + 1
        absolute = sorted(abs(e) for e in errors)
        started = [v for v in self.views.values() if v.first_start_time is not None]
        return {
            "policy": self.policy,
            "jobs": len(self.views),
            "completed": sum(1 for v in self.views.values() if v.status == "completed"),
            "sampled": len(errors),
            "started_before_an_eta": len(started) - len(errors),
            "quality": by_quality,
            "median_abs_error_s": statistics.median(absolute) if absolute else math.nan,
            "p90_abs_error_s": _p90(absolute),
            "median_signed_error_s": statistics.median(errors) if errors else math.nan,
            "median_wait_s": statistics.median(waits) if waits else math.nan,
            "p90_wait_s": _p90(sorted(waits)),
            "errors_s": [round(e, 1) for e in errors],
        }


def _p90(values: list[float]) -> float:
    if not values:
        return math.nan
    return values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)]


async def replay(cluster: LocalCluster, trace: list[TraceJob], run: Run, *, poll_s: float, max_wall_s: float) -> None:
    assert cluster.endpoint is not None
    client = await Client.connect(cluster.endpoint.nats, namespace=cluster.endpoint.namespace, name="eta-bench",
                                  creds=cluster.operator_creds)  # fmt: skip
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            try:
                reply = await client.jobs(JobsQuery(include_finished=True, limit=10_000))
            except TimeoutError:
                continue
            now = time.time()
            for view in reply.jobs:
                if view.job_id not in run.names:
                    continue
                run.views[view.job_id] = view
                if view.status == "queued" and view.job_id not in run.sampled:
                    if view.eta_time is not None:
                        run.sampled[view.job_id] = (view.eta_time, now, view.eta_quality)
                    elif view.eta_reason and view.job_id not in run.eta_reasons:
                        run.eta_reasons[view.job_id] = view.eta_reason
            await asyncio.sleep(poll_s)

    watcher = asyncio.create_task(watch())
    try:
        origin = time.time() + 1.0
        for job in trace:
            delay = origin + job.arrival_s / run.speedup - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            spec = JobSpec(name=f"eta-{job.index}", command=["emulated"], gpus=job.gpus, model=job.model,
                           expected_duration_s=job.duration_s, job_class=job.job_class)  # fmt: skip
            submitted = await client.submit(spec, wait=False)
            run.names[submitted.job_id] = job.index
        deadline = time.monotonic() + max_wall_s
        while not (len(run.views) == len(run.names) and all(v.status in FINAL for v in run.views.values())):
            cluster.check()
            if time.monotonic() > deadline:
                print(f"  {run.policy}: stopped after --max-wall {max_wall_s:.0f} s with jobs unfinished",
                      file=sys.stderr)  # fmt: skip
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await watcher
        await client.close()


def run_policy(policy: str, trace: list[TraceJob], *, nodes: int, gpus: int, speedup: float, round_s: float,
               poll_s: float, max_wall_s: float) -> dict[str, Any]:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rh-eta-") as tmp:
        config = LocalClusterConfig(
            state_dir=Path(tmp) / "state", workers=nodes, gpus_per_worker=gpus, scheduler=policy,
            placement="consolidated", admission="accept-all", round_s=round_s, emulate=True, speedup=speedup,
            log_level="WARNING", metrics=False,
            extra_args={"scheduler": ["--eta-time-scale", str(speedup), "--eta-interval-s", "0.25",
                                      "--eta-placement", "consolidated"]},
        )  # fmt: skip
        cluster = LocalCluster(config)
        cluster.start()
        try:
            cluster.wait_ready()
            run = Run(policy, speedup)
            began = time.monotonic()
            asyncio.run(replay(cluster, trace, run, poll_s=poll_s, max_wall_s=max_wall_s))
            summary = run.summary()
            summary["wall_s"] = round(time.monotonic() - began, 1)
            summary["no_eta_reasons"] = sorted(set(run.eta_reasons.values()))
            return summary
        finally:
            cluster.stop()


def round_cost(rounds: int, json_path: str | None) -> int:
    """``benchmarks.round`` with the ETA off, then on (module doc)."""
    from benchmarks import round as round_bench
    from services.scheduler.config import SchedulerConfig
    from services.scheduler.service import SchedulerService

    services: list[SchedulerService] = []

    class Recorded(SchedulerService):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            services.append(self)

    results: dict[str, Any] = {}
    for eta in (False, True):

        def config(**fields: Any) -> SchedulerConfig:
            return SchedulerConfig(**fields, eta=eta)  # noqa: B023 (called inside this iteration)

        round_bench.SchedulerConfig = config  # type: ignore[attr-defined,assignment]
        round_bench.SchedulerService = Recorded  # type: ignore[attr-defined]
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            print(f"--- benchmarks.round, ETA {'on' if eta else 'off'}", flush=True)
            asyncio.run(round_bench.run(1_250, 8, 20_000, rounds, 100, via_service=False, json_path=out.name))
            result = json.loads(Path(out.name).read_text())
        refresher = services[-1].eta.refresher
        table = refresher.table
        result["eta_runs"] = refresher.runs
        result["eta_last_take_ms"] = round(refresher.last_take_s * 1e3, 1)
        result["eta_last_run_s"] = round(table.elapsed_s, 2) if table is not None else None
        if eta:
            print(f"ETA: {refresher.runs} runs during the benchmark; last snapshot {result['eta_last_take_ms']} ms "
                  f"on the loop, last simulation {result['eta_last_run_s']} s in the worker", flush=True)  # fmt: skip
        results["on" if eta else "off"] = result
    off, on = results["off"], results["on"]
    print(f"steady round median: ETA off {off['steady_median_ms']:.0f} ms (CPU {off['steady_cpu_median_ms']:.0f} ms), "
          f"ETA on {on['steady_median_ms']:.0f} ms (CPU {on['steady_cpu_median_ms']:.0f} ms); "
          f"host load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", default="fifo,srtf", help="comma-separated scheduling policies")
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--cluster", default="2x4", help="NODESxGPUS (default 2x4: a queue builds up)")
    parser.add_argument("--speedup", type=float, default=30.0)
    parser.add_argument("--round", type=float, default=60.0, dest="round_s", help="simulated seconds per round")
    parser.add_argument("--poll", type=float, default=0.2, help="real seconds between reads of the queue")
    parser.add_argument("--synthetic", action="store_true", help="synthetic jobs instead of the Tiresias trace")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-wall", type=float, default=600.0, help="real seconds per policy at most")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--round-cost", action="store_true", help="the ETA's cost to rounds (benchmarks.round)")
    parser.add_argument("--rounds", type=int, default=5, help="steady rounds per --round-cost run")
    args = parser.parse_args(argv)
    if args.round_cost:
        return round_cost(args.rounds, args.json)
    nodes, gpus = (int(x) for x in args.cluster.lower().split("x"))
    trace = None if args.synthetic else tiresias_slice(args.jobs, args.cluster)
    source = "tiresias-60job"
    if trace is None:
        trace, source = synthetic(args.jobs, args.seed, gpus), f"synthetic (seed {args.seed})"
    results = []
    for policy in args.policies.split(","):
        print(f"{policy}: {len(trace)} jobs of {source} on {nodes}x{gpus} GPUs at {args.speedup:g}x ...", flush=True)
        result = run_policy(policy, trace, nodes=nodes, gpus=gpus, speedup=args.speedup, round_s=args.round_s,
                            poll_s=args.poll, max_wall_s=args.max_wall)  # fmt: skip
        results.append(result)
        print(f"  {result['sampled']} ETAs sampled ({result['started_before_an_eta']} jobs started before one; "
              f"quality {result['quality']}); |error| median {result['median_abs_error_s']:.0f} s, "
              f"p90 {result['p90_abs_error_s']:.0f} s; signed median {result['median_signed_error_s']:.0f} s; "
              f"actual wait median {result['median_wait_s']:.0f} s, p90 {result['p90_wait_s']:.0f} s "
              f"(simulated seconds; {result['completed']}/{result['jobs']} completed, {result['wall_s']:.0f} s wall)",
              flush=True)  # fmt: skip
    load = os.getloadavg()[0]
    print(f"host load average {load:.1f} on {os.cpu_count()} CPUs")
    if args.json:
        Path(args.json).write_text(json.dumps({"trace": source, "cluster": args.cluster, "speedup": args.speedup,
                                               "round_s": args.round_s, "results": results, "load_average": load},
                                              indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
