"""Hand-computed simulations: tiny clusters, a few jobs, every number derived in the comments."""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator

import pytest

from roundhouse.sim.report import summarize
from roundhouse.sim.synthetic import GpuCounts, PhillySynthetic
from schemas.job import JobClass
from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.costs import CostModel, ModelCosts
from services.core.protocols import Trigger, is_sort_keyed
from services.core.simulation.engine import (
    GC_GEN0_THRESHOLD,
    InitialJob,
    Outcome,
    SimConfig,
    Simulator,
)
from services.core.simulation.workload import TraceJob, WorkloadError
from services.core.state import ClusterState, JobStatus

FREE = CostModel.free()


def simulate(
    jobs: list[TraceJob],
    *,
    nodes: int = 1,
    per_node: int = 1,
    scheduler: str = "fifo",
    placement: str = "consolidated",
    **config: object,
) -> Outcome:
    options: dict[str, object] = {"round_s": 100.0, "costs": FREE, "debug": True}
    options.update(config)
    sim = Simulator(
        jobs,
        ClusterState.uniform(nodes, per_node),
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create(scheduler),
        placement=PLACEMENT.create(placement),
        config=SimConfig(**options),  # type: ignore[arg-type]
    )
    return sim.run()


def tj(index: int, arrival: float, duration: float, gpus: int = 1, **kw: object) -> TraceJob:
    return TraceJob(index=index, arrival_s=arrival, gpus=gpus, duration_s=duration, **kw)  # type: ignore[arg-type]


def test_fifo_rounds_and_completions_inside_rounds() -> None:
    # A arrives at 10, B at 20; rounds every 100 s. Round 100: A starts (B waits, 1 GPU).
    # A ends at 150 (inside the round); the GPU idles until the round at 200, when B starts;
    # B ends at 230. JCT: A 140, B 210; responsiveness: A 90, B 180.
    out = simulate([tj(0, 10.0, 50.0), tj(1, 20.0, 30.0)])
    assert list(out.jct) == [140.0, 210.0]
    assert list(out.responsiveness) == [90.0, 180.0]
    assert list(out.run) == [50.0, 30.0]
    assert out.end_time == 230.0
    assert out.busy_gpu_s == 80.0
    report = summarize(out, wall_s=0.0, config={})
    assert report["makespan_s"] == 220.0
    assert report["utilization"] == pytest.approx(80.0 / 230.0)
    assert report["slowdown"]["BE"]["p50"] == pytest.approx((1 + 90 / 50 + 1 + 180 / 30) / 2)


def test_churn_triggered_rounds() -> None:
    # Same jobs, rounds also on completion: B starts when A ends at 150 and ends at 180.
    out = simulate([tj(0, 10.0, 50.0), tj(1, 20.0, 30.0)], extra_triggers=Trigger.COMPLETION)
    assert list(out.jct) == [140.0, 160.0]
    out = simulate([tj(0, 10.0, 50.0), tj(1, 20.0, 30.0)], extra_triggers=Trigger.CHURN)
    # On arrival too: A starts at 10 and ends at 60; B starts at 60 and ends at 90.
    assert list(out.jct) == [50.0, 70.0]


def test_las_preemption_with_checkpoint_restore_and_relaunch_costs() -> None:
    costs = CostModel(models={}, default=ModelCosts(checkpoint_s=10.0, restore_s=5.0, relaunch_s=5.0))
    # A (250 s of work) starts at 0. B arrives at 50. Round 100: A has 100 GPU-s, B 0 -> B preempts A.
    # A checkpoints until 110 (GPU busy), so B makes progress from 110 and ends at 210.
    # Round 200: B (90) still ranks above A (100). Round 300: A resumes, restore+relaunch 10 s,
    # progress from 310, 150 s left -> ends at 460. Lost work of A: 10 + 10 GPU-s.
    # B starts when it can run, at 110 (responsiveness 60, not the decision at 100). The GPU is busy
    # 0-110 for A (its checkpoint included), 110-210 for B and 300-460 for A: 370 GPU-s, each second
    # once (counting B from the decision at 100 counted A's checkpoint twice).
    out = simulate([tj(0, 0.0, 250.0), tj(1, 50.0, 100.0)], scheduler="las", costs=costs)
    jct = dict(zip([1, 0], out.jct, strict=True))  # B finishes first
    assert jct == {1: 160.0, 0: 460.0}
    assert list(out.preemptions) == [0, 1]
    assert list(out.lost_gpu_s) == [0.0, 20.0]
    assert list(out.responsiveness) == [60.0, 0.0]
    assert out.all_preemptions == 1
    assert out.busy_gpu_s == 370.0
    assert out.busy_gpu_s <= out.end_time * out.total_gpus


def test_free_preemption_costs_nothing() -> None:
    # Without costs B runs 100..200 and A resumes at 200 (a round), ending at 350.
    out = simulate([tj(0, 0.0, 250.0), tj(1, 50.0, 100.0)], scheduler="las")
    assert sorted(out.jct) == [150.0, 350.0]
    assert list(out.lost_gpu_s) == [0.0, 0.0]


def test_spread_placement_runs_slower() -> None:
    costs = CostModel(models={}, default=ModelCosts(spread_slowdown=1.5))
    # 2 nodes x 2 GPUs, first-free. J0 (1 GPU) takes GPU 0; J1 (2 GPUs) takes GPUs 1 and 2 on two
    # nodes, although one node could hold it: 1.5x slower, 100 s of work take 150 s.
    out = simulate(
        [tj(0, 0.0, 1000.0), tj(1, 0.0, 100.0, gpus=2)], nodes=2, per_node=2, placement="first-free", costs=costs
    )
    assert list(out.jct) == [150.0, 1000.0]
    # Consolidated placement puts J1 on node 1 whole: 100 s.
    out = simulate([tj(0, 0.0, 1000.0), tj(1, 0.0, 100.0, gpus=2)], nodes=2, per_node=2, costs=costs)
    assert list(out.jct) == [100.0, 1000.0]


def test_attained_service_counts_gpu_seconds() -> None:
    # LAS on 2 GPUs: W (2 GPUs, 300 s) and N (1 GPU, 500 s) at 0, X (1 GPU, 10 s) at 50. W and N
    # cannot run together, so they take turns at rounds as their attained service (GPU-seconds: W
    # earns 2 a second) crosses; each is suspended twice. X (no service) starts on arrival and
    # never yields. The exact outcomes pin that accounting; they come in completion order.
    out = simulate([tj(0, 0.0, 300.0, gpus=2), tj(1, 0.0, 500.0), tj(2, 50.0, 10.0)], per_node=2, scheduler="las")
    assert list(zip(out.jct, out.preemptions, strict=True)) == [(60.0, 0), (700.0, 2), (800.0, 2)]
    assert out.stalled is False


def test_track_window_measures_only_those_jobs_and_stops() -> None:
    out = simulate([tj(i, 10.0 * i, 5.0) for i in range(10)], track=(2, 4))
    assert out.measured_total == 3
    assert len(out.jct) == 3
    assert out.arrived <= 10


def test_jobs_larger_than_the_cluster_are_rejected() -> None:
    out = simulate([tj(0, 0.0, 10.0, gpus=4), tj(1, 0.0, 10.0)])
    assert out.rejected == 1
    assert list(out.jct) == [10.0]


def test_job_classes_are_reported_separately() -> None:
    out = simulate([tj(0, 0.0, 100.0, job_class=JobClass.BE), tj(1, 0.0, 50.0, job_class=JobClass.TE)])
    report = summarize(out, wall_s=0.0, config={})
    assert set(report["slowdown"]) == {"BE", "TE"}
    assert report["slowdown"]["BE"]["p50"] == 1.0
    assert report["slowdown"]["TE"]["p50"] == pytest.approx(1 + 100 / 50)


@pytest.mark.parametrize(
    ("scheduler", "placement"),
    [("las", "consolidated"), ("fifo", "first-free"), ("las", "first-free"), ("fifo", "consolidated"),
     ("las-time", "consolidated")],
)
def test_invariants_hold_on_every_event(scheduler: str, placement: str) -> None:
    workload = PhillySynthetic(jobs_per_hour=6.0, seed=3, gpu_counts=GpuCounts.gavel(), num_jobs=60)
    out = simulate(
        list(workload), nodes=2, per_node=4, scheduler=scheduler, placement=placement, round_s=300.0, costs=CostModel()
    )
    assert out.completed + out.rejected == 60
    assert all(j >= r for j, r in zip(out.jct, out.run, strict=True))
    assert out.busy_gpu_s >= out.productive_gpu_s > 0


def test_fast_paths_do_not_change_results() -> None:
    workload = list(PhillySynthetic(jobs_per_hour=3.0, seed=5, gpu_counts=GpuCounts.gavel(), num_jobs=100))
    # Every registered sort-keyed policy (the simulator keeps a KeyedOrder for those), not a hand-kept list.
    keyed = [name for name in SCHEDULING.names() if is_sort_keyed(SCHEDULING.create(name))]
    assert {"las", "fifo", "tiresias", "srtf"} <= set(keyed)
    for scheduler in keyed:
        fast = simulate(workload, nodes=4, per_node=4, scheduler=scheduler, round_s=300.0, debug=False)
        slow = simulate(
            workload, nodes=4, per_node=4, scheduler=scheduler, round_s=300.0, debug=False, fast_paths=False
        )
        assert list(fast.jct) == list(slow.jct)
        assert fast.all_preemptions == slow.all_preemptions


def test_workload_must_be_in_arrival_order() -> None:
    with pytest.raises(WorkloadError, match="before the previous"):
        simulate([tj(0, 10.0, 5.0), tj(1, 5.0, 5.0)])


def test_trace_job_validation() -> None:
    with pytest.raises(WorkloadError, match="at least 1 GPU"):
        tj(0, 0.0, 10.0, gpus=0)
    with pytest.raises(WorkloadError, match="positive"):
        tj(0, 0.0, math.nan)


def test_a_stale_completion_is_no_event() -> None:
    # LAS, rounds on the timer and on completions, every round through rank() (no fast-path skips).
    # A (250 s) starts at 0; B arrives at 50 and preempts A at 100; B ends at 200 and A resumes.
    # A's first completion event (t=250) went stale when it was suspended: it must not start a
    # round (rounds at 0, 100, 200, 300 on the timer and 350 on A's completion; none at 250) nor
    # count as an event.
    out = simulate(
        [tj(0, 0.0, 250.0), tj(1, 50.0, 100.0)], scheduler="las", extra_triggers=Trigger.COMPLETION, fast_paths=False
    )
    assert sorted(out.jct) == [150.0, 350.0]
    assert out.rounds == 5
    assert out.events == 4  # two arrivals, two completions


def test_a_preempted_job_restores_only_after_its_own_checkpoint() -> None:
    costs = CostModel(models={}, default=ModelCosts(checkpoint_s=40.0, restore_s=5.0, relaunch_s=5.0))
    # Three 1-GPU nodes. A (1000 s), D (110 s) and F (115 s) start at 0; C (500 s) arrives at 50.
    # Round 100 (LAS): C has no service, so the lowest of the three (F, the latest) is suspended and
    # checkpoints on its GPU until 140, where C then starts. D ends at 110; the completion round gives
    # F D's GPU at once, but F can restore only after its own checkpoint is written (140), then takes
    # 10 s to restore and relaunch and does its last 15 s: it ends at 165, not at 110 + 10 + 15 = 135.
    out = Simulator(
        [tj(0, 0.0, 1000.0), tj(1, 0.0, 110.0), tj(2, 0.0, 115.0), tj(3, 50.0, 500.0)],
        ClusterState.uniform(3, 1),
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("las"),
        placement=PLACEMENT.create("first-free"),
        config=SimConfig(round_s=100.0, costs=costs, debug=True, extra_triggers=Trigger.COMPLETION),
    ).run()
    assert out.all_preemptions == 1
    assert sorted(out.jct)[:2] == [110.0, 165.0]


def test_run_collects_garbage_less_often_and_restores_the_setting() -> None:
    # The loop raises the collector's first threshold (GC_GEN0_THRESHOLD) and puts the caller's
    # setting back afterwards; a caller that turned automatic collection off (0) keeps it off. The
    # workload is read inside the loop, so it sees the setting the loop runs with.
    seen: list[tuple[int, int, int]] = []

    def watching() -> Iterator[TraceJob]:
        seen.append(gc.get_threshold())
        yield tj(0, 10.0, 50.0)
        seen.append(gc.get_threshold())

    saved = gc.get_threshold()
    try:
        for first, during in ((700, GC_GEN0_THRESHOLD), (0, 0), (10**6, 10**6)):
            gc.set_threshold(first, 10, 10)
            seen.clear()
            sim = Simulator(
                watching(),
                ClusterState.uniform(1, 1),
                admission=ADMISSION.create("accept-all"),
                scheduling=SCHEDULING.create("fifo"),
                placement=PLACEMENT.create("consolidated"),
                config=SimConfig(round_s=100.0, costs=FREE),
            )
            assert sim.run().completed == 1
            assert seen == [(during, 10, 10)] * 2
            assert gc.get_threshold() == (first, 10, 10)
    finally:
        gc.set_threshold(*saved)


def test_gpu_time_is_counted_once_under_many_preemptions() -> None:
    # One GPU, 20 jobs of 5000 s at once, LAS with 300 s rounds and default costs: hundreds of swaps,
    # each with a checkpoint hold. Busy time stays within capacity (the debug run checks it at the
    # end) and equals productive time plus the preemption overheads paid on the GPU.
    out = simulate(
        [tj(i, 0.0, 5000.0) for i in range(20)], scheduler="las", round_s=300.0, costs=CostModel()
    )
    assert out.completed == 20
    assert out.all_preemptions > 300
    capacity = out.total_gpus * out.end_time
    assert out.busy_gpu_s <= capacity
    assert out.busy_gpu_s == pytest.approx(out.productive_gpu_s + out.all_lost_gpu_s, rel=1e-9)


def test_fill_rounds_start_jobs_on_free_gpus_between_ticks() -> None:
    # FIFO, one GPU, 100 s rounds. A (50 s) arrives at 10: the GPU is free, a fill round starts it at
    # 10 (not at the tick at 100); it ends at 60 and the completion's fill round starts B (30 s,
    # arrived at 20) at once; B ends at 90. JCT: A 50, B 70; responsiveness: A 0, B 40.
    out = simulate([tj(0, 10.0, 50.0), tj(1, 20.0, 30.0)], fill_between_rounds=True)
    assert list(out.jct) == [50.0, 70.0]
    assert list(out.responsiveness) == [0.0, 40.0]
    assert out.end_time == 90.0


def test_fill_rounds_never_preempt_and_leave_the_policys_rounds_alone() -> None:
    # LAS, one GPU, free preemption. A (250 s) starts at the tick at 0. B (80 s) arrives at 50: no GPU
    # is free, so the fill round does nothing and B waits for the policy's round at 100, which
    # preempts A (100 GPU-s) for B (0). B ends at 180; its completion's fill round resumes A at once
    # (not at the tick at 200): A's last 150 s end at 330. Without fill rounds A resumes at 200.
    jobs = [tj(0, 0.0, 250.0), tj(1, 50.0, 80.0)]
    filled = simulate(jobs, scheduler="las", fill_between_rounds=True)
    plain = simulate(jobs, scheduler="las")
    assert dict(zip([1, 0], filled.jct, strict=True)) == {1: 130.0, 0: 330.0}
    assert dict(zip([1, 0], plain.jct, strict=True)) == {1: 130.0, 0: 350.0}
    assert filled.all_preemptions == plain.all_preemptions == 1
    assert list(filled.responsiveness) == [50.0, 0.0]


def test_an_elastic_job_gets_the_free_gpus_optimus_gives_it() -> None:
    # Optimus gives a lone elastic job (1 GPU requested, up to 4) every free GPU of a 1x4 node at the
    # round at 0: it runs at (4/1) ** 0.8 (the cost model's sub-linear scaling) the speed of its
    # requested single GPU, so 1000 s of work take 1000 / 4 ** 0.8 = 329.9 s. A rigid job of the
    # same size keeps 1 GPU and takes 1000 s. The job's spec carries max_gpus from the workload.
    elastic = simulate([tj(0, 0.0, 1000.0, max_gpus=4)], per_node=4, scheduler="optimus")
    assert list(elastic.jct) == [pytest.approx(1000.0 / 4**0.8)]
    assert elastic.busy_gpu_s == pytest.approx(4 * 1000.0 / 4**0.8)
    rigid = simulate([tj(0, 0.0, 1000.0)], per_node=4, scheduler="optimus")
    assert list(rigid.jct) == [1000.0]
    # Capped by max_gpus: 2 of the 4 GPUs.
    capped = simulate([tj(0, 0.0, 1000.0, max_gpus=2)], per_node=4, scheduler="optimus")
    assert list(capped.jct) == [pytest.approx(1000.0 / 2**0.8)]


def test_start_from_a_state_running_waiting_held_and_rejected() -> None:
    # Two GPUs on one node, FIFO with 100 s rounds. At 0 the system holds: a, running on GPU 0 with
    # 300 of 1000 s done (700 s left, no restore: it goes on, ends at 700); b, running on GPU 0 too
    # (taken by a, so it waits); c, waiting; d, held (offered to admission at the first round); e,
    # needing 4 GPUs (rejected on arrival). The round at 0 starts b (submitted before c) on GPU 1:
    # it ends at 200; c starts on it at the round at 200 and ends at 300, d at 300 and ends at 400.
    sim = Simulator(
        [],
        ClusterState.uniform(1, 2),
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("fifo"),
        placement=PLACEMENT.create("consolidated"),
        config=SimConfig(round_s=100.0, costs=CostModel(), debug=True),
    )
    states = sim.start_from([
        InitialJob(trace=tj(0, 0.0, 1000.0), status=JobStatus.RUNNING, submit_time=-500.0, done_s=300.0,
                   executed_time=300.0, attained_service=300.0, gpus=(0,), first_start_time=-300.0),
        InitialJob(trace=tj(1, 0.0, 200.0), status=JobStatus.RUNNING, submit_time=-400.0, gpus=(0,)),
        InitialJob(trace=tj(2, 0.0, 100.0), status=JobStatus.QUEUED, submit_time=-50.0, queued_since=-50.0),
        InitialJob(trace=tj(3, 0.0, 100.0), status=JobStatus.HELD, submit_time=-10.0),
        InitialJob(trace=tj(4, 0.0, 100.0, gpus=4), status=JobStatus.QUEUED, submit_time=-5.0),
    ])
    assert states[4] is None
    a, b, c, d = (s for s in states if s is not None)
    assert [(s.status, s.gpus) for s in (a, b, c, d)] == [
        (JobStatus.RUNNING, (0,)), (JobStatus.QUEUED, ()), (JobStatus.QUEUED, ()), (JobStatus.HELD, ())
    ]
    out = sim.run()
    assert (out.rejected, out.completed) == (1, 4)
    assert [(s.finish_time, s.first_start_time) for s in (a, b, c, d)] == [
        (700.0, -300.0), (200.0, 0.0), (300.0, 200.0), (400.0, 300.0)
    ]
    assert a.lost_gpu_s == 0.0  # it went on, it was not resumed
    assert c.longest_wait_s == 250.0


def test_simulator_instances_keep_a_shared_key_dict() -> None:
    # CPython 3.11 shares an instance dict's keys among instances up to 29 attributes; at 30 the dict
    # becomes an ordinary one and every ``self.x`` of the engine's hot loop reads slower (~10%,
    # measured: case (a) of benchmarks/simulator.py lost 1% with a 30th attribute).
    sim = Simulator(
        [], ClusterState.uniform(1, 1), admission=ADMISSION.create("accept-all"), scheduling=SCHEDULING.create("las"),
        placement=PLACEMENT.create("consolidated"),
    )
    assert len(vars(sim)) <= 29
