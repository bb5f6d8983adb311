"""Simulated loss (``services.core.simulation.loss``): curves, families, the lazily sampled bounded history of a
simulated job, loss-based termination and Hermes' quantum-sized rounds in the simulator."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping
from typing import ClassVar

import pytest

from services.core.costs import CostModel, ModelCosts
from services.core.decisions import Placement, Ranking
from services.core.protocols import SchedulingPolicy, Trigger
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.engine import Outcome, SimConfig, Simulator
from services.core.simulation.loss import (
    FAMILIES,
    HEAD_WINDOW_S,
    HISTORY_LIMIT,
    LossCurve,
    LossCurveError,
    family,
    goal_loss,
)
from services.core.simulation.workload import TraceJob, WorkloadError
from services.core.state import ClusterState, JobState
from services.scheduler.policies.hermes import Hermes

CURVE = LossCurve(initial=7.0, floor=2.0, decay=3.0)
SMALL_COSTS = CostModel(models={}, default=ModelCosts(checkpoint_s=1.0, restore_s=2.0, relaunch_s=0.0))
"""Preemption overheads of a second or two (Hermes Fig. 7): the default costs (tens of seconds)
would outlast a 10 s quantum."""


def test_curve_is_an_exponential_decay_and_progress_at_inverts_it() -> None:
    assert CURVE.at(0.0) == 7.0
    assert CURVE.at(1.0) == pytest.approx(2.0 + 5.0 * math.exp(-3.0))
    assert CURVE.at(2.0) == CURVE.at(1.0)  # progress is clamped
    values = [CURVE.at(p / 100) for p in range(101)]
    assert all(b < a for a, b in itertools.pairwise(values))
    for p in (0.1, 0.4, 0.9):
        assert CURVE.progress_at(CURVE.at(p)) == pytest.approx(p)
    assert CURVE.progress_at(8.0) == 0.0
    assert CURVE.progress_at(2.0) == math.inf
    assert CURVE.progress_at(CURVE.at(1.0) - 1e-6) == math.inf  # only reached after the job's end


def test_reaching_hits_the_target_at_the_asked_progress() -> None:
    curve = LossCurve.reaching(3.0, 0.4, initial=6.0, floor=1.0)
    assert curve.at(0.4) == pytest.approx(3.0)
    assert curve.progress_at(3.0) == pytest.approx(0.4)
    for target in (0.1, 0.3, 2.7, 3.0):  # reached at the very end despite rounding
        assert LossCurve.reaching(target, 1.0, initial=6.0, floor=0.0).progress_at(target) == pytest.approx(1.0)
    with pytest.raises(LossCurveError):
        LossCurve.reaching(0.5, 0.4, initial=6.0, floor=1.0)
    with pytest.raises(LossCurveError):
        LossCurve.reaching(3.0, 0.0, initial=6.0, floor=1.0)
    with pytest.raises(LossCurveError):
        LossCurve(initial=1.0, floor=2.0, decay=1.0)


def test_noise_is_deterministic_bounded_and_seeded() -> None:
    noisy = LossCurve(initial=7.0, floor=2.0, decay=3.0, noise=0.05, seed=3)
    again = LossCurve(initial=7.0, floor=2.0, decay=3.0, noise=0.05, seed=3)
    other = LossCurve(initial=7.0, floor=2.0, decay=3.0, noise=0.05, seed=4)
    ps = [k / 997 for k in range(998)]
    assert [noisy.at(p) for p in ps] == [again.at(p) for p in ps]
    assert [noisy.at(p) for p in ps] != [other.at(p) for p in ps]
    ratios = [noisy.at(p) / noisy.smooth(p) - 1 for p in ps]
    assert max(abs(r) for r in ratios) <= 0.05
    assert max(ratios) > 0.03
    assert min(ratios) < -0.03
    assert noisy.progress_at(4.0) == CURVE.progress_at(4.0)  # the target is judged on the smooth loss


def test_families_fit_hermes_fig2() -> None:
    rng = random.Random(1)
    goal = goal_loss(6.9, 3.0)
    assert goal == pytest.approx(6.9 - 0.9 * 3.9)
    for _ in range(50):
        fast = family("fast", rng, initial=6.9, optimum=3.0)
        moderate = family("moderate", rng, initial=6.9, optimum=3.0)
        slow = family("slow", rng, initial=6.9, optimum=3.0)
        assert 0.2 <= fast.progress_at(goal) <= 0.5
        assert 0.5 <= moderate.progress_at(goal) <= 0.95
        assert slow.progress_at(goal) == math.inf
        # fast combinations fall fastest at the start (what Hermes' C measures)
        assert fast.at(0.02) < slow.at(0.02)
    assert FAMILIES == ("fast", "moderate", "slow")


def test_trace_job_loss_fields_reach_the_spec() -> None:
    from services.core.simulation.jobs import spec_for

    job = TraceJob(0, 0.0, 1, 100.0, loss_curve=CURVE, loss_target=3.0)
    assert spec_for(job).loss_target == 3.0
    assert spec_for(TraceJob(0, 0.0, 1, 100.0)).loss_target is None
    with pytest.raises(WorkloadError):
        TraceJob(0, 0.0, 1, 100.0, loss_target=math.nan)


class Recorder:
    """FIFO or round robin, recording what each round sees of every job's loss."""

    name: ClassVar[str] = "recorder"
    triggers: ClassVar[Trigger] = Trigger.TIMER | Trigger.CHURN

    def __init__(self, base: str = "fifo", **options: float) -> None:
        self.base: SchedulingPolicy = SCHEDULING.create(base, **options)
        self.preemptive = getattr(self.base, "preemptive", True)
        self.seen: list[tuple[float, str, float | None, list[tuple[float, float]], bool]] = []

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        for job_id, job in sorted(jobs.items()):
            self.seen.append((now, job_id, job.loss, list(job.loss_history), job.is_running))
        return self.base.rank(jobs, cluster, now)


def simulate(jobs: list[TraceJob], policy: SchedulingPolicy, *, gpus: int = 1, round_s: float = 10.0,
             placement: str = "first-free", **config: object) -> Outcome:
    sim = Simulator(
        jobs,
        ClusterState.uniform(1, gpus),
        admission=ADMISSION.create("accept-all"),
        scheduling=policy,
        placement=PLACEMENT.create(placement),
        config=SimConfig(round_s=round_s, debug=True, costs=SMALL_COSTS, max_time_s=1e5,
                         **config),  # type: ignore[arg-type]
    )
    return sim.run()


def test_a_job_without_a_curve_reports_no_loss() -> None:
    recorder = Recorder()
    out = simulate([TraceJob(0, 0.0, 1, 50.0)], recorder)
    assert out.completed == 1
    assert out.loss_reached == {}
    assert recorder.seen
    assert all(loss is None and history == [] for _, _, loss, history, _ in recorder.seen)


def test_loss_and_history_are_exact_at_now_while_running() -> None:
    recorder = Recorder()
    out = simulate([TraceJob(0, 0.0, 1, 100.0, loss_curve=CURVE)], recorder)
    assert out.completed == 1
    seen = [(now, loss, history) for now, _, loss, history, running in recorder.seen if running]
    assert [now for now, _, _ in seen] == [10.0 * k for k in range(1, 10)]
    for now, loss, history in seen:
        assert loss == pytest.approx(CURVE.at(now / 100.0))
        assert [t for t, _ in history] == pytest.approx([float(k) for k in range(1, int(now) + 1)])
        assert [x for _, x in history] == pytest.approx([CURVE.at(k / 100.0) for k in range(1, int(now) + 1)])


def test_history_skips_suspensions_and_restores() -> None:
    """Round robin (30 s quantum) time-shares one GPU between two jobs; samples come only from
    productive time (after the restore of a resumed job) and the waiting job's loss stays put."""
    recorder = Recorder("rr", quantum_s=30.0)
    jobs = [TraceJob(i, 0.0, 1, 100.0, loss_curve=CURVE, model="resnet50") for i in range(2)]
    out = simulate(jobs, recorder, round_s=30.0, placement="hermes")
    assert out.completed == 2
    assert out.all_preemptions > 0
    last = {job_id: (now, loss, history) for now, job_id, loss, history, _ in recorder.seen}
    for now, loss, history in last.values():
        times = [t for t, _ in history]
        assert times == sorted(times)
        assert times[-1] <= now
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) > 30.0  # a suspension (plus restore) in between
        assert min(gaps) == pytest.approx(1.0)
        assert loss is not None
        assert loss <= history[-1][1] + 1e-9


def test_history_is_bounded_and_keeps_the_first_window() -> None:
    recorder = Recorder()
    simulate([TraceJob(0, 0.0, 1, 1000.0, loss_curve=CURVE)], recorder, round_s=100.0)
    now, _, _, history, _ = recorder.seen[-1]
    assert now == 900.0
    assert len(history) == HISTORY_LIMIT
    head = [t for t, _ in history if t < 1.0 + HEAD_WINDOW_S]
    assert head == [float(k) for k in range(1, 11)]
    assert history[-1][0] == 900.0
    assert history[10][0] == 900.0 - (HISTORY_LIMIT - 10) + 1


def test_loss_termination_ends_jobs_at_the_first_round_after_their_target() -> None:
    """Blox §5.3 in the simulator: each curve reaches its target at 40% of its work; the job ends
    at the next round (rounds every 60 s), not at its full duration. A job without a target runs on."""
    jobs = [
        TraceJob(i, 0.0, 1, 1000.0 * (i + 1), loss_curve=LossCurve.reaching(3.0, 0.4, initial=6.0, floor=1.0),
                 loss_target=3.0)
        for i in range(3)
    ] + [TraceJob(3, 0.0, 1, 500.0, loss_curve=CURVE)]
    policy = SCHEDULING.create("loss-termination", base="fifo", threshold=0.0)
    out = simulate(jobs, policy, gpus=4, round_s=60.0)
    assert out.completed == 4
    for i in range(3):
        assert out.loss_reached[i] == pytest.approx(400.0 * (i + 1))
    assert 3 not in out.loss_reached
    jcts = sorted(out.jct)
    assert jcts[0] == pytest.approx(420.0)  # reached at 400 s, ended by the round at 420 s
    assert jcts[1] == pytest.approx(500.0)  # the job without a target runs to its end
    assert jcts[2:] == pytest.approx([840.0, 1200.0])


class QuantumWatch:
    """The ``hermes`` placement, recording how long each job it suspends had been running and its
    quantum at that moment."""

    name: ClassVar[str] = "quantum-watch"
    keeps_running: ClassVar[bool] = True

    def __init__(self, policy: Hermes) -> None:
        self.inner = PLACEMENT.create("hermes")
        self.policy = policy
        self.suspended: list[tuple[float, float]] = []

    def place(self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Placement:
        placement = self.inner.place(ranking, jobs, cluster, now)
        assert placement.plan is not None
        for job_id in placement.plan.suspend:
            job = jobs[job_id]
            assert job.last_start_time is not None
            self.suspended.append((now - job.last_start_time, self.policy.quantum_of(job)))
        return placement


def test_hermes_runs_quantum_rounds_and_favours_fast_converging_jobs() -> None:
    """16 jobs on 4 GPUs (4 per GPU), rounds every 10 s: no job loses its GPU inside its quantum
    (10 s, growing at milestones), and the fast family reaches its goal sooner under Hermes than
    under round robin."""
    rng = random.Random(7)
    goal = goal_loss(6.9, 3.0)
    kinds = ["fast"] * 4 + ["slow"] * 12
    rng.shuffle(kinds)
    jobs = [
        TraceJob(i, 0.0, 1, 100.0, loss_curve=family(kind, rng, initial=6.9, optimum=3.0),  # type: ignore[arg-type]
                 loss_target=goal if kind == "fast" else None)
        for i, kind in enumerate(kinds)
    ]
    results = {}
    for name, options, round_s in (("hermes", {}, 10.0), ("rr", {"quantum_s": 30.0}, 30.0)):
        out = simulate(jobs, SCHEDULING.create(name, **options), gpus=4, round_s=round_s, placement="hermes")
        assert out.completed == 16
        assert not out.stalled
        assert sorted(out.loss_reached) == [i for i, kind in enumerate(kinds) if kind == "fast"]
        results[name] = sum(out.loss_reached.values()) / len(out.loss_reached)
    assert results["hermes"] < results["rr"]
    policy = Hermes()
    watch = QuantumWatch(policy)
    sim = Simulator(jobs, ClusterState.uniform(4, 1), admission=ADMISSION.create("accept-all"), scheduling=policy,
                    placement=watch, config=SimConfig(round_s=10.0, debug=True, costs=SMALL_COSTS))
    assert sim.run().completed == 16
    assert len(watch.suspended) > 16
    assert all(ran >= quantum - 1e-9 for ran, quantum in watch.suspended)
    assert any(quantum > 10.0 for _, quantum in watch.suspended)  # milestones grew some quanta


def test_loss_log_folds_runs_and_finds_the_target_in_a_later_run() -> None:
    """Direct ``LossLog`` use: a 4 s run, a pause, then a long run; the view at any time equals the
    bounded list of every sample so far (the head: samples within 10 s of the first one), and the
    target's time is exact even though it is crossed in the second run."""
    from services.core.simulation.loss import LossLog, Run

    curve = LossCurve(initial=7.0, floor=2.0, decay=3.0)
    target_p = 0.5
    log = LossLog(curve, curve.smooth(target_p))
    work = 1000.0
    first = Run(t0=0.0, done0=0.0, rate=1.0, work=work)
    log.fold(first, 4.5)
    assert log.reached_at is None
    second = Run(t0=100.0, done0=4.5, rate=2.0, work=work)
    every = [(float(k), curve.at(k / work)) for k in range(1, 5)]
    for now in (100.0, 103.0, 150.0, 400.0):
        every_now = every + [(100.0 + k, curve.at((4.5 + 2.0 * k) / work)) for k in range(1, int(now - 100.0) + 1)]
        view = log.view(second, now, version=int(now), running=True)
        if len(every_now) <= HISTORY_LIMIT:
            assert view == every_now
        else:
            head = [s for s in every_now[: HISTORY_LIMIT // 4] if s[0] < 1.0 + HEAD_WINDOW_S]
            assert view == head + every_now[len(every_now) - (HISTORY_LIMIT - len(head)):]
            assert [t for t, _ in head] == [1.0, 2.0, 3.0, 4.0]  # within 10 s of the first sample, by the clock
    assert log.view(second, 400.0, version=400, running=True) is log.view(second, 400.0, version=400, running=True)
    log.fold(second, 400.0)
    assert log.reached_at == pytest.approx(100.0 + (target_p * work - 4.5) / 2.0)
    assert log.count == 4 + 300
    assert len(log.view(second, 400.0, version=401, running=False)) == HISTORY_LIMIT
