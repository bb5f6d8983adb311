"""FitGpp §3's rescheduling intervals (``Outcome.reschedule_s`` / ``suspended_s``), the greedy-backfill
reading of "FIFO" (reference arrivals and simulator agree job for job) and the reproduction's new keys."""

from __future__ import annotations

import itertools
import math

import pytest

from roundhouse.reproduce import Options
from roundhouse.reproduce.fitgpp import PolicyCase, experiment, interval_stats
from roundhouse.sim.synthetic import FifoLoadArrivals, FitGppSynthetic
from schemas.job import JobClass
from services.core.costs import CostModel
from services.core.protocols import Trigger
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.engine import SimConfig, Simulator
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState

TE, BE = JobClass.TE, JobClass.BE

# The flow of test_fitgpp.py: a (BE, 4 GPUs, grace 50 s) runs from 0, b (BE, 4 GPUs) queues, TE
# jobs t1 at 123.4 and t2 at 300 (1 GPU, 100 s each) on one node of 4 GPUs.
FLOW = [
    TraceJob(0, 0.0, 4, 1000.0, BE, checkpoint_s=50.0),
    TraceJob(1, 10.0, 4, 1000.0, BE, checkpoint_s=50.0),
    TraceJob(2, 123.4, 1, 100.0, TE, checkpoint_s=30.0),
    TraceJob(3, 300.0, 1, 100.0, TE, checkpoint_s=30.0),
]

INTERVAL_CASES: list[tuple[str, PolicyCase, list[float], list[float]]] = [
    (
        # t1 preempts a at 123.4; a's grace period ends at 173.4; t1 runs 173.4-273.4 and a is
        # launched again at 273.4: 150 s from the prompt, 100 s off its GPUs after the grace period
        "fitgpp with P = 1: one preemption",
        PolicyCase("fitgpp", "fitgpp", {"victim": "fitgpp", "s": 4.0, "max_preemptions": 1}),
        [150.0], [100.0],
    ),
    (
        # and LRTP preempts a again at 300 for t2 (350-450): relaunched at 450, the same intervals
        "lrtp: two preemptions of one job",
        PolicyCase("lrtp", "fitgpp", {"victim": "lrtp"}),
        [150.0, 150.0], [100.0, 100.0],
    ),
    ("fifo never preempts: no interval", PolicyCase("fifo", "fifo", {"preempt_for": ()}), [], []),
]


def simulate(trace: list[TraceJob], case: PolicyCase, *, record: bool = True) -> tuple[list[float], list[float]]:
    simulator = Simulator(
        trace, ClusterState.uniform(1, 4), admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create(case.scheduling), placement=PLACEMENT.create("preempting", **case.placement),
        config=SimConfig(extra_triggers=Trigger.CHURN, costs=CostModel.free(), record_reschedules=record),
    )
    out = simulator.run()
    assert out.unfinished == 0
    return list(out.reschedule_s), list(out.suspended_s)


@pytest.mark.parametrize(
    ("case", "reschedule", "suspended"), [c[1:] for c in INTERVAL_CASES], ids=[c[0] for c in INTERVAL_CASES]
)
def test_rescheduling_intervals(case: PolicyCase, reschedule: list[float], suspended: list[float]) -> None:
    got_reschedule, got_suspended = simulate(FLOW, case)
    assert got_reschedule == pytest.approx(reschedule)
    assert got_suspended == pytest.approx(suspended)


def test_intervals_are_recorded_only_when_asked() -> None:
    case = INTERVAL_CASES[1][1]
    assert simulate(FLOW, case, record=False) == ([], [])


def test_interval_stats() -> None:
    assert interval_stats([]) == {"count": 0, "mean": None, "p50": None, "p95": None}
    stats = interval_stats([30.0, 10.0, 20.0])
    assert stats["count"] == 3
    assert stats["mean"] == pytest.approx(20.0)
    assert stats["p50"] == pytest.approx(20.0)
    assert stats["p95"] == pytest.approx(29.0)


def test_backfill_arrivals_are_the_simulators_greedy_fifo_job_for_job() -> None:
    finishes: dict[int, float] = {}
    workload = FitGppSynthetic(total_gpus=32, num_jobs=1500, seed=4, arrivals="fifo", backfill=True)
    reference = FifoLoadArrivals(nodes=4, node_gpus=8, node_cpus=32, node_memory_gb=256, load=2.0, backfill=True)
    jobs = list(reference.timed(workload.jobs(), finishes))
    assert [(j.index, j.arrival_s) for j in jobs] == [(j.index, j.arrival_s) for j in workload]
    strict = list(FitGppSynthetic(total_gpus=32, num_jobs=1500, seed=4, arrivals="fifo"))
    assert [j.arrival_s for j in strict] != [j.arrival_s for j in jobs]  # a different FIFO keeps the load
    # at every sampled arrival instant the GPUs demanded by the jobs in the system reach 2.0 x 32
    instants = sorted({j.arrival_s for j in jobs})
    for t in instants[:: max(1, len(instants) // 100)]:
        arrived = [j for j in jobs if j.arrival_s <= t]
        demand = sum(j.gpus for j in arrived if finishes[j.index] > t)
        assert demand >= 64
        assert demand - arrived[-1].gpus < 64
    sim = Simulator(
        iter(jobs), ClusterState.uniform(4, 8), admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("fifo"), placement=PLACEMENT.create("preempting", preempt_for=(), backfill=True),
        config=SimConfig(extra_triggers=Trigger.CHURN),
    )
    out = sim.run()
    expected = sorted(finishes[j.index] - j.arrival_s for j in jobs)
    assert sorted(out.jct) == pytest.approx(expected, abs=1e-6)
    # and a job that does not fit blocks nobody: some job started before an earlier-submitted one
    starts = sorted(jobs, key=lambda j: finishes[j.index] - j.duration_s)
    assert any(a.index > b.index for a, b in itertools.pairwise(starts))


INTERVAL_KEYS = {
    f"reschedule_interval_{stat}_vs_{other}" for stat in ("p50", "p95") for other in ("lrtp", "rand")
}


@pytest.mark.parametrize("backfill", [False, True], ids=["strict FIFO", "greedy-backfill FIFO"])
def test_quick_run_reports_the_intervals(backfill: bool) -> None:
    data = experiment(Options(quick=True, seed=0), backfill=backfill).to_json()
    assert set(data["metrics"]) >= INTERVAL_KEYS
    assert data["details"]["setup"]["backfill"] is backfill
    for key in INTERVAL_KEYS:
        assert math.isfinite(data["metrics"][key]["ours"])
        assert data["metrics"][key]["paper"] in (0.5, 0.8, 0.67)
    cases = data["details"]["cases"]
    for label in ("fitgpp", "lrtp", "rand-0"):
        intervals = cases[label]["reschedule_interval_s"]
        # every suspension is followed by a relaunch (all jobs finish)
        assert intervals["count"] == cases[label]["suspensions"] > 0
        assert cases[label]["suspended_interval_s"]["count"] == intervals["count"]
    assert cases["fifo"]["reschedule_interval_s"]["count"] == 0
    assert ("--backfill" in data["command"]) is backfill
