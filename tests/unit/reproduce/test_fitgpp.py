"""``roundhouse reproduce fitgpp``: the simulated FitGpp flow (seed 000 §2.1) and the quick run's shape."""

from __future__ import annotations

import math
from typing import Any

import pytest

from roundhouse.reproduce import Options, get
from roundhouse.reproduce.fitgpp import PolicyCase
from schemas.job import JobClass
from services.core.costs import CostModel
from services.core.protocols import Trigger
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.engine import SimConfig, Simulator
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState

TE, BE = JobClass.TE, JobClass.BE


def finishes(trace: list[TraceJob], case: PolicyCase) -> dict[str, float]:
    """Finish time of every job (by id) on one node of 4 GPUs, 32 CPUs, 256 GB."""
    done: dict[str, float] = {}
    simulator = Simulator(
        trace, ClusterState.uniform(1, 4), admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create(case.scheduling), placement=PLACEMENT.create("preempting", **case.placement),
        config=SimConfig(extra_triggers=Trigger.CHURN, costs=CostModel.free(), debug=True),
    )
    end = simulator._end

    def record(job: Any, t: float, status: Any) -> None:
        done[job.job_id] = t
        end(job, t, status)

    simulator._end = record  # type: ignore[method-assign]
    out = simulator.run()
    assert out.unfinished == 0
    assert not out.stalled
    return done


# a (BE, 4 GPUs, 1000 s, grace 50 s) runs from 0; b (BE, 4 GPUs) queues at 10; t1 (TE, 1 GPU,
# 100 s) arrives at 123.4, off the 300 s round grid; t2 (TE, 1 GPU, 100 s, grace irrelevant) at 300.
FLOW = [
    TraceJob(0, 0.0, 4, 1000.0, BE, checkpoint_s=50.0),
    TraceJob(1, 10.0, 4, 1000.0, BE, checkpoint_s=50.0),
    TraceJob(2, 123.4, 1, 100.0, TE, checkpoint_s=30.0),
    TraceJob(3, 300.0, 1, 100.0, TE, checkpoint_s=30.0),
]

FLOW_CASES: list[tuple[str, PolicyCase, dict[str, float]]] = [
    (
        # t1 preempts a on arrival (123.4, not at a round edge) and starts after a's 50 s grace:
        # 173.4 + 100. a resumes at the head of the BE queue, ahead of b, when t1 is done (273.4),
        # with 1000 - 123.4 s left. P = 1: t2 cannot preempt a again and waits for a (1150).
        "fitgpp with P = 1",
        PolicyCase("fitgpp", "fitgpp", {"victim": "fitgpp", "s": 4.0, "max_preemptions": 1}),
        {"2": 273.4, "0": 1150.0, "3": 1250.0, "1": 2250.0},
    ),
    (
        # no P for LRTP: t2 preempts a again at 300 (a has 1000 - 123.4 - 26.6 = 850 s left), runs
        # 350-450; a resumes at 450 and ends at 1300; b after it.
        "lrtp without a preemption limit",
        PolicyCase("lrtp", "fitgpp", {"victim": "lrtp"}),
        {"2": 273.4, "3": 450.0, "0": 1300.0, "1": 2300.0},
    ),
    (
        "vanilla FIFO: no preemption, one queue in submit order",
        PolicyCase("fifo", "fifo", {"preempt_for": ()}),
        {"0": 1000.0, "1": 2000.0, "2": 2100.0, "3": 2100.0},
    ),
]


@pytest.mark.parametrize(("case", "expected"), [c[1:] for c in FLOW_CASES], ids=[c[0] for c in FLOW_CASES])
def test_simulated_fitgpp_flow(case: PolicyCase, expected: dict[str, float]) -> None:
    got = finishes(FLOW, case)
    assert got == pytest.approx(expected)


def test_quick_reproduction() -> None:
    result = get("fitgpp").run(Options(quick=True, seed=0))
    data = result.to_json()
    assert data["name"] == "fitgpp"
    assert data["quick"] is True
    keys = {
        "te_p95_slowdown_change", "be_median_slowdown_change", "be_p95_slowdown_change",
        "preempted_jobs_vs_lrtp", "preempted_jobs_vs_rand",
        "be_median_slowdown_change_from_preemption", "be_p95_slowdown_change_from_preemption",
        "reschedule_interval_p50_vs_lrtp", "reschedule_interval_p50_vs_rand",
        "reschedule_interval_p95_vs_lrtp", "reschedule_interval_p95_vs_rand",
    }
    assert set(data["metrics"]) == keys
    for metric in data["metrics"].values():
        assert metric["ours"] is not None
        assert math.isfinite(metric["ours"])
    cases = data["details"]["cases"]
    assert set(cases) == {"fifo", "te-first", "fitgpp", "lrtp", "rand-0"}
    for summary in cases.values():
        assert summary["unfinished"] == 0
        assert summary["jobs"] == data["details"]["setup"]["num_jobs"]
    # the directional claims that hold on the quick seed: FitGpp cuts the TE tail far below FIFO's,
    # FIFO never preempts, and FitGpp preempts each job at most once (P = 1)
    assert data["metrics"]["te_p95_slowdown_change"]["ours"] < -50.0
    assert cases["fitgpp"]["slowdown"]["TE"]["p95"] < cases["fifo"]["slowdown"]["TE"]["p95"]
    assert cases["fifo"]["suspensions"] == 0
    assert cases["te-first"]["suspensions"] == 0
    # the preemptions themselves cost the BE jobs (the paper's direction: +18.0% / +23.9% vs FIFO)
    assert data["metrics"]["be_median_slowdown_change_from_preemption"]["ours"] > 0
    assert cases["fitgpp"]["most_preemptions_of_a_job"] <= 1
    assert cases["fitgpp"]["suspensions"] == cases["fitgpp"]["preempted_jobs"]
