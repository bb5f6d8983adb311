"""``roundhouse reproduce gandiva``: the gandiva placement's time-slicing and migration in the simulator
(seed 001, "Scheduling Policy"), the exact time to first feedback, and the quick run's shape."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from roundhouse.reproduce import Options, get
from roundhouse.reproduce.gandiva import _FeedbackSimulator, jobs_per_hour, mean_duration_s
from services.core.costs import CostModel, ModelCosts
from services.core.packing import PackingModel
from services.core.protocols import Trigger
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.engine import SimConfig
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState

COSTS = ModelCosts(checkpoint_s=10.0, restore_s=10.0, relaunch_s=20.0)


def simulate(
    jobs: list[TraceJob], nodes: int, policy: str = "gandiva", feedback_work_s: float = 30.0, **placement: Any
) -> _FeedbackSimulator:
    ranking, place = ("rr", "gandiva") if policy == "gandiva" else ("fifo", "consolidated")
    scheduling = SCHEDULING.create("rr", quantum_s=60.0) if ranking == "rr" else SCHEDULING.create(ranking)
    sim = _FeedbackSimulator(
        jobs,
        ClusterState.uniform(nodes, 4),
        admission=ADMISSION.create("accept-all"),
        scheduling=scheduling,
        placement=PLACEMENT.create(place, **placement),
        config=SimConfig(
            round_s=60.0, extra_triggers=Trigger.CHURN, debug=True, costs=CostModel(models={}, default=COSTS)
        ),
        feedback_work_s=feedback_work_s,
    )
    out = sim.run()
    assert out.unfinished == 0
    assert not out.stalled
    return sim


def test_an_oversubscribed_server_time_slices_every_job_early() -> None:
    # 8 one-GPU jobs of an hour on one 4-GPU server: Gandiva homes two per GPU and rotates them
    jobs = [TraceJob(i, 0.0, 1, 3600.0) for i in range(8)]
    gandiva = simulate(jobs, 1)
    # jobs 0-3 run first (first launch: no restore); 4-7 launch at the 60 s round, progress after the
    # 10 s checkpoint of the job they replace, and reach 30 s of work at 100 s
    assert [round(gandiva.feedback[i], 6) for i in range(8)] == [30.0] * 4 + [100.0] * 4
    assert gandiva.out.all_preemptions > 8 * 3600 / 60 / 2  # every job rotates out about every other slice
    assert gandiva.migrations == 0
    # FIFO: the last four wait for the first four to finish
    fifo = simulate(jobs, 1, policy="fifo")
    assert [round(fifo.feedback[i], 6) for i in range(8)] == [30.0] * 4 + [3630.0] * 4
    assert fifo.out.all_preemptions == 0


def test_feedback_spanning_several_slices_pays_each_resume() -> None:
    # five 1-GPU jobs on one 4-GPU server: jobs 0 and 4 share GPU 0 and alternate every 60 s. A resumed
    # slice waits for the other job's 10 s checkpoint and its own 30 s restore + relaunch, so it does
    # 20 s of work. Feedback after 100 s of work: job 0 does 60 s in 0-60, then 20 s in each of the
    # slices 120-180 and 240-300 -> 300 s; job 4 does 50 s in 60-120 (after job 0's checkpoint),
    # 20 s in 180-240 and 300-360, and its last 10 s in the slice from 420 (progress from 460) -> 470 s.
    jobs = [TraceJob(i, 0.0, 1, 3600.0) for i in range(5)]
    sim = simulate(jobs, 1, feedback_work_s=100.0)
    assert sim.feedback[0] == pytest.approx(300.0)
    assert sim.feedback[4] == pytest.approx(470.0)
    assert sim.feedback[1] == pytest.approx(100.0)  # alone on its GPU


def test_a_time_sliced_job_moves_to_a_gpu_freed_later() -> None:
    # server of 4: three long jobs and a short one; a fifth long job shares GPU 0 with job 0. When the
    # short one ends (200 s), the waiting one of the pair takes its GPU and time-slicing stops.
    jobs = [TraceJob(i, 0.0, 1, 200.0 if i == 3 else 7200.0) for i in range(4)] + [TraceJob(4, 10.0, 1, 7200.0)]
    sim = simulate(jobs, 1)
    assert sim.out.all_preemptions <= 4  # before the fix: one every 60 s for the rest of the run (~230)
    assert sim.out.end_time < 7200.0 + 400.0


def test_a_job_wider_than_a_server_gets_its_turn_under_overload() -> None:
    # two full 4-GPU servers of long 1-GPU jobs; an 8-GPU job arrives at 30 s and is homed on all
    # eight GPUs (height 2): at the 60 s round it runs (progress after the 10 s checkpoints)
    jobs = [TraceJob(i, 0.0, 1, 3600.0) for i in range(8)] + [TraceJob(8, 30.0, 8, 3600.0)]
    sim = simulate(jobs, 2)
    assert sim.feedback[8] == pytest.approx(60.0 + 10.0 + 30.0 - 30.0)
    fifo = simulate(jobs, 2, policy="fifo")
    assert fifo.feedback[8] == pytest.approx(3600.0 + 30.0 - 30.0)


def test_defragmentation_migrates_a_lone_job_to_a_busier_server() -> None:
    # two servers of 4: jobs 0-3 fill server 0 (affinity 1), job 4 takes server 1 alone. When job 0
    # ends, server 1 (3 unhomed GPUs >= threshold 3) is emptied: job 4 migrates to GPU 0, paying
    # a checkpoint on its old GPU and a resume on the new one (10 s + 30 s lost; it restores only
    # once its checkpoint is written, so it finishes 40 s later), and server 1 is left idle for a
    # 4-GPU job.
    jobs = [TraceJob(i, 0.0, 1, 100.0 if i == 0 else 3600.0) for i in range(5)]
    sim = simulate(jobs, 2)
    assert sim.migrations == 1
    assert sim.out.all_preemptions == 1
    assert sim.out.all_lost_gpu_s == pytest.approx(40.0)
    assert sim.out.end_time == pytest.approx(3600.0 + 10.0 + 30.0)
    # without defragmentation nothing moves
    still = simulate(jobs, 2, defrag_threshold=None)
    assert still.migrations == 0
    assert still.out.end_time == pytest.approx(3600.0)


def test_offered_load_rate() -> None:
    # E[duration] of philly-synthetic ~ 16.8 h; Gavel mix 1.9 GPUs per job: load 2 on 128 GPUs ~ 8/h
    assert mean_duration_s() / 3600 == pytest.approx(16.77, abs=0.01)
    assert jobs_per_hour(128) == pytest.approx(2 * 128 * 3600 / (1.9 * mean_duration_s()))


@pytest.fixture(scope="module")
def quick() -> dict[str, Any]:
    result = get("gandiva").run(Options(quick=True))
    data: dict[str, Any] = json.loads(json.dumps(result.to_json()))
    return data


def test_quick_json_shape(quick: dict[str, Any]) -> None:
    assert quick["name"] == "gandiva"
    assert quick["quick"] is True
    metrics = quick["metrics"]
    assert {
        "feedback_mean_change_pct",
        "feedback_median_change_pct",
        "utilization_change_pct",
        "avg_jct_change_pct",
        "gandiva_preemptions",
    } <= set(metrics)
    for metric in metrics.values():
        assert set(metric) == {"paper", "ours", "unit", "description", "note"}
        assert metric["paper"] is None  # the seed summary states directions, no numbers
        assert metric["ours"] is not None
        assert math.isfinite(metric["ours"])
    runs = quick["details"]["runs"]
    assert {r["policy"] for r in runs} == {"gandiva", "fifo", "gandiva-packing", "gandiva-full"}
    assert all(r["jobs"] == quick["details"]["setup"]["jobs"] for r in runs)


def test_quick_gandiva_gives_earlier_feedback_than_fifo_under_overload(quick: dict[str, Any]) -> None:
    metrics = quick["metrics"]
    assert metrics["feedback_mean_change_pct"]["ours"] < -50
    assert metrics["feedback_median_change_pct"]["ours"] < 0
    assert metrics["gandiva_preemptions"]["ours"] > 0


def test_quick_packing_packs_and_counts_each_gpu_once(quick: dict[str, Any]) -> None:
    runs = {r["policy"]: r for r in quick["details"]["runs"]}
    packed, plain = runs["gandiva-packing"], runs["gandiva"]
    assert packed["packed_launches"] > 0
    assert plain["packed_launches"] == 0
    assert 0 < packed["productive_utilization"] <= packed["utilization"] <= 1
    assert 0 < packed["overload_productive_utilization"] <= packed["overload_utilization"] <= 1
    # fewer suspensions: a job that can share its home GPU runs instead of waiting for its slice
    assert packed["preemptions"] < plain["preemptions"]


def test_feedback_follows_a_packed_job_whose_rate_changes() -> None:
    # One GPU, free costs. A3C (500 s of work) and Recoder (1000 s) packed from 0: A3C at 1/1.09 of
    # its speed ends at 545 s; Recoder at 1/1.125 has done 484.44 s of work by then and runs alone at
    # full speed after: its 600 s of feedback work is done at 545 + (600 - 545 / 1.125) = 660.56 s.
    jobs = [TraceJob(0, 0.0, 1, 500.0, model="a3c"), TraceJob(1, 0.0, 1, 1000.0, model="recoder")]
    packing = PackingModel()
    sim = _FeedbackSimulator(
        jobs,
        ClusterState.uniform(1, 1),
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("rr", quantum_s=60.0),
        placement=PLACEMENT.create("gandiva", profiles=packing.policy_profiles()),
        config=SimConfig(round_s=60.0, extra_triggers=Trigger.CHURN, debug=True, costs=CostModel.free()),
        feedback_work_s=600.0,
        packing=packing,
    )
    sim.run()
    assert sim.packed_launches == 1
    assert sim.feedback[0] == pytest.approx(545.0)  # shorter than the target: feedback when it ends
    assert sim.feedback[1] == pytest.approx(545.0 + 600.0 - 545.0 / 1.125)
