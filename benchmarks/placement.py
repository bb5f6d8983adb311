"""Placement speed: one heavy preemptive round, per placement policy (issue 3).

The live scheduler must finish a round for 10,000 GPUs and 20,000 queued jobs (LAS + consolidated)
in <= 250 ms end to end, so placement alone must take well under 100 ms. The round built here:

* 1250 nodes x 8 GPUs; about 2,700 running jobs on about 6,600 GPUs, placed node by node at random
  (so free GPUs are scattered, as after hours of churn); 20,000 queued jobs;
* GPU counts {1: 40%, 2: 25%, 4: 25%, 8: 10%}; models drawn from a list that includes VGG (so
  ``tiresias-skew`` consolidates some jobs and spreads the rest);
* LAS-style ranking: attained service uniform over [0, 10^5] GPU-s for running jobs; a queued job
  is new (0) with probability 1/2, else a suspended job with service uniform over [0, 10^5], so
  about half of the queue outranks most running jobs and the walk preempts heavily.

The ranking is a plain ``Ranking(order=...)``, exactly what the placement service builds from a
``schedule.round`` message (no fast-path hints), and, as a second line, the lazy ranking of
``services.core.ordering.KeyedOrder`` that the simulator uses. Each policy is timed over a few
calls on the same snapshot (policies never mutate it); the best and median are printed, with the
launches and suspensions of the plan (the same for both rankings).

Usage: ``python benchmarks/placement.py [--repeat N] [--policy NAME ...] [--seed S]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.job import JobSpec
from services.core.decisions import Ranking
from services.core.ordering import KeyedOrder
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState, JobStatus
from services.scheduler.policies.las import Las

NODES = 1250
GPUS_PER_NODE = 8
TARGET_USED_GPUS = 6_645
QUEUED = 20_000
SIZES = ((1, 0.4), (2, 0.25), (4, 0.25), (8, 0.1))
MODELS = ("resnet50", "vgg16", "bert", "lstm", "alexnet", "transformer")
POLICIES = ("consolidated", "first-free", "bandwidth-aware", "tiresias-skew")
NOW = 1_000_000.0


def _size(rng: random.Random) -> int:
    u = rng.random()
    for gpus, weight in SIZES:
        if u < weight:
            return gpus
        u -= weight
    return SIZES[-1][0]


def _spec(index: int, gpus: int, model: str) -> JobSpec:
    return JobSpec(name=f"job-{index}", command=["train"], gpus=gpus, model=model)


@dataclass(frozen=True, slots=True)
class HeavyRound:
    jobs: dict[str, JobState]
    cluster: ClusterState

    @property
    def running(self) -> int:
        return sum(1 for j in self.jobs.values() if j.is_running)


def heavy_round(seed: int = 0, *, nodes: int = NODES, per_node: int = GPUS_PER_NODE,
                used_gpus: int = TARGET_USED_GPUS, queued: int = QUEUED) -> HeavyRound:
    """The snapshot described in the module docstring (deterministic per ``seed``)."""
    rng = random.Random(seed)
    cluster = ClusterState.uniform(nodes, per_node)
    jobs: dict[str, JobState] = {}
    free = {n: list(range(n * per_node, (n + 1) * per_node)) for n in range(nodes)}
    used = 0
    index = 0
    misses = 0
    while used < used_gpus and misses < 100_000:
        gpus = _size(rng)
        node = rng.randrange(nodes)
        if len(free[node]) < gpus:
            misses += 1
            continue
        held = tuple(free[node][:gpus])
        del free[node][:gpus]
        job = JobState(
            job_id=f"r{index}", spec=_spec(index, gpus, rng.choice(MODELS)), submit_time=rng.uniform(0, NOW),
            status=JobStatus.RUNNING, attained_service=rng.uniform(0, 1e5), gpus=held, seq=index,
        )
        cluster.assign(job.job_id, held)
        jobs[job.job_id] = job
        used += gpus
        index += 1
    for _ in range(queued):
        gpus = _size(rng)
        service = 0.0 if rng.random() < 0.5 else rng.uniform(0, 1e5)
        job = JobState(
            job_id=f"q{index}", spec=_spec(index, gpus, rng.choice(MODELS)), submit_time=rng.uniform(0, NOW),
            attained_service=service, seq=index, queued_since=NOW - 10.0,
        )
        jobs[job.job_id] = job
        index += 1
    return HeavyRound(jobs, cluster)


def _line(job: JobState) -> tuple[float, float]:
    # Time stands still at NOW in this snapshot: every running job is productive and its service
    # is a + gpus x NOW.
    return job.attained_service - len(job.gpus) * NOW, NOW - 1.0


def keyed_ranking(snapshot: HeavyRound, policy: Las) -> Ranking:
    order = KeyedOrder(policy, service_line=_line)
    for job in snapshot.jobs.values():
        if job.is_running:
            order.mark_running(job)
        else:
            order.push(job, NOW)
    return order.ranking(snapshot.jobs, NOW)


def time_policy(name: str, snapshot: HeavyRound, ranking_of: object, repeat: int) -> tuple[list[float], int, int]:
    policy = PLACEMENT.create(name)
    times: list[float] = []
    launches = suspends = 0
    for _ in range(repeat):
        ranking = ranking_of()  # type: ignore[operator]
        started = time.perf_counter()
        placement = policy.place(ranking, snapshot.jobs, snapshot.cluster, NOW)
        times.append(time.perf_counter() - started)
        assert placement.plan is not None
        launches, suspends = len(placement.plan.launch), len(placement.plan.suspend)
    return times, launches, suspends


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", action="append", choices=POLICIES)
    args = parser.parse_args(argv)
    snapshot = heavy_round(args.seed)
    las = Las()
    running = snapshot.running
    used = snapshot.cluster.total_gpus - snapshot.cluster.free_gpu_count
    print(f"heavy round: {NODES} nodes x {GPUS_PER_NODE} GPUs, {running} running jobs on {used} GPUs, "
          f"{len(snapshot.jobs) - running} queued; LAS ranking")
    started = time.perf_counter()
    plain = las.rank(snapshot.jobs, snapshot.cluster, NOW)
    print(f"  las.rank(): {(time.perf_counter() - started) * 1000:.0f} ms (scheduler side, not placement)")
    for name in args.policy or POLICIES:
        rankings = (("plain ranking", lambda: plain), ("keyed ranking", lambda: keyed_ranking(snapshot, las)))
        for label, ranking_of in rankings:
            times, launches, suspends = time_policy(name, snapshot, ranking_of, args.repeat)
            print(f"  {name:16s} {label}: best {min(times) * 1000:7.1f} ms, median "
                  f"{statistics.median(times) * 1000:7.1f} ms per call; {launches} launches, {suspends} suspensions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
