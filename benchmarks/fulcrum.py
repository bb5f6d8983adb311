"""Fulcrum (seed 002): decision cost and balls-and-bins quality of load-weighted random placement.

(a) Decision cost at 1,000 workers (target <= 20 us per decision, Fulcrum §3: "the scheduling
    overhead should be in the order of tens of microseconds"). One decision is Algorithm 1's
    GETWEIGHTEDRANDOM plus UPDATELOAD on the chosen worker, with a REFRESH (decay 0.5) every
    1,000 decisions; measured against uniform random choice (``random.randrange``) in the same
    run, and against the literal O(n) three-pass Algorithm 1 as the paper writes it. Also the
    cost per job of the whole ``fulcrum`` placement policy on a 1,000-node cluster.
(b) Balls and bins (Fulcrum §5.3, Figure 5): n tasks onto n empty workers; the expected maximum
    load over many seeds for uniform random, power-of-two choices and Fulcrum with fresh, stale
    and no load information (``roundhouse.reproduce.fulcrum``, shared with ``roundhouse reproduce``).

Usage: ``python -m benchmarks.fulcrum [--decisions N] [--seeds S]``. Prints one table per part.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from roundhouse.reproduce.fulcrum import balls_and_bins
from schemas.job import JobSpec
from services.core.decisions import Ranking
from services.core.state import ClusterState, JobState
from services.placement.policies.fulcrum import Fulcrum, FulcrumBalancer

WORKERS = 1000
TARGET_US = 20.0


def literal_algorithm1(load: list[float], rng: random.Random) -> int:
    """Algorithm 1's GETWEIGHTEDRANDOM exactly as printed: three O(n) passes."""
    max_load = 0.0
    for x in load:
        max_load = max(max_load, x)
    total = 0.0
    for x in load:
        total += max_load - x
    target = rng.uniform(0.0, total)
    acc = 0.0
    for i, x in enumerate(load):
        acc += max_load - x
        if acc >= target:
            return i
    return len(load) - 1


def _time_per_call(step: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - started) / calls * 1e6


def decision_cost(decisions: int) -> list[tuple[str, float]]:
    """Microseconds per decision at ``WORKERS`` workers, best of three runs each."""
    rows: list[tuple[str, float]] = []

    rng = random.Random(1)
    rows.append(("uniform random (randrange)", min(_time_per_call(lambda: rng.randrange(WORKERS), decisions)
                                                  for _ in range(3))))

    balancer = FulcrumBalancer(WORKERS, seed=1)
    counter = [0]

    def fulcrum_step() -> None:
        balancer.update_load(balancer.draw())
        counter[0] += 1
        if counter[0] % 1000 == 0:
            balancer.refresh(0.5)

    rows.append(("fulcrum draw + updateload (+refresh/1000)", min(_time_per_call(fulcrum_step, decisions)
                                                                  for _ in range(3))))

    inverse = FulcrumBalancer(WORKERS, seed=1, weight="inverse")
    rows.append(("fulcrum, weight g = 1/(1+load)", min(
        _time_per_call(lambda: inverse.update_load(inverse.draw()), decisions) for _ in range(3)
    )))

    load = [0.0] * WORKERS
    lrng = random.Random(1)

    def literal_step() -> None:
        i = literal_algorithm1(load, lrng)
        load[i] += 1.0

    rows.append(("literal Algorithm 1 (3 x O(n) passes)", min(
        _time_per_call(literal_step, max(1, decisions // 20)) for _ in range(3)
    )))

    cluster = ClusterState.uniform(WORKERS, 8)
    jobs = {
        f"j{i}": JobState(
            job_id=f"j{i}", spec=JobSpec(name=f"j{i}", command=["x"], gpus=1), submit_time=0.0, seq=i
        )
        for i in range(2000)
    }
    ranking = Ranking(order=tuple(jobs), running=(), waiting=tuple(jobs))
    policy = Fulcrum(seed=1)
    policy.place(ranking, jobs, cluster, 0.0)  # warm-up: builds the balancer
    started = time.perf_counter()
    rounds = 5
    for r in range(rounds):
        policy.place(ranking, jobs, cluster, float(r))
    per_job = (time.perf_counter() - started) / (rounds * len(jobs)) * 1e6
    rows.append(("fulcrum placement policy, per job (2000 jobs/round)", per_job))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decisions", type=int, default=200_000, help="decisions per timing run")
    parser.add_argument("--seeds", type=int, default=200, help="seeds per balls-and-bins point")
    args = parser.parse_args()

    print(f"(a) decision cost at {WORKERS} workers, us/decision (best of 3); target <= {TARGET_US} us")
    rows = decision_cost(args.decisions)
    uniform = rows[0][1]
    for label, us in rows:
        print(f"  {label:<52} {us:8.2f} us   {us / uniform:6.1f}x uniform")
    fulcrum_us = rows[1][1]
    verdict = "meets" if fulcrum_us <= TARGET_US else "MISSES"
    print(f"  -> fulcrum {verdict} the {TARGET_US} us target ({fulcrum_us:.2f} us)")

    print(f"\n(b) balls and bins: n tasks onto n workers, mean (worst) max load over {args.seeds} seeds")
    print("    (the same code as `roundhouse reproduce fulcrum`; see roundhouse/reproduce/fulcrum.py)")
    for n in (100, 1000):
        print(f"  n = {n}")
        for point in balls_and_bins(n, args.seeds):
            print(f"    {point.strategy:<40} {point.mean:6.2f} ({point.worst})")


if __name__ == "__main__":
    main()
