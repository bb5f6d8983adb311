"""Forward simulation from a snapshot (Blox §5.2): state restored, metrics on the real clock, inputs untouched."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.costs import CostModel
from services.core.decisions import Ranking
from services.core.protocols import SchedulingPolicy, Trigger
from services.core.simulation.engine import SimConfig, Simulator
from services.core.simulation.forward import ForwardSettings, MissingDurationError, Snapshot, take_snapshot
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState, JobState, JobStatus
from services.scheduler.policies.candidates import forward_simulate, simulate_candidates
from services.scheduler.policies.synthesizer import CANDIDATES, Combination
from tests.unit.policies.builders import assert_unchanged, cluster, frozen, job, jobs_of

FREE = ForwardSettings(costs=CostModel.free(), triggers=Trigger.TIMER)
BY_LABEL = {str(c): c for c in CANDIDATES}


def started(state: JobState, at: float) -> JobState:
    state.first_start_time = at
    return state


@dataclass
class Case:
    name: str
    jobs: list[JobState]
    now: float
    candidate: str
    expect: Mapping[str, float]
    gpus: int = 1
    held: list[JobState] = field(default_factory=list)
    settings: ForwardSettings = FREE


CASES = [
    Case(
        # submitted at 0, running since 100 with 900 s done of 3000: 2100 s left from now=1000
        "a running job keeps running and finishes when its remaining work is done",
        [started(job("a", on=[0], duration=3000, executed=900, submit=0), 100)],
        1000,
        "fifo+accept-all",
        {"avg_jct_s": 3100, "avg_responsiveness_s": 100, "makespan_s": 2100, "finished": 1, "preemptions": 0},
    ),
    Case(
        # a ends at +2200; FIFO (timer rounds) starts b at the next round, +2400, for 500 s
        "FIFO: the waiting job starts at the first round after the running one ends",
        [
            started(job("a", on=[0], duration=3000, executed=800, submit=0, seq=1), 100),
            job("b", duration=500, submit=500, seq=2, queued_since=500),
        ],
        1000,
        "fifo+accept-all",
        {"avg_jct_s": (3200 + 3400) / 2, "avg_responsiveness_s": (100 + 2900) / 2, "preemptions": 0},
    ),
    Case(
        # SRTF ranks b (500 s left) over a (2100 s left): b runs now (JCT 500 + 500), a resumes at the
        # round after b ends, +600, and ends at +2700 (JCT 3700)
        "SRTF preempts the job with more remaining work",
        [
            started(job("a", on=[0], duration=3000, executed=900, submit=0, seq=1), 100),
            job("b", duration=500, submit=500, seq=2, queued_since=500),
        ],
        1000,
        "srtf+accept-all",
        {"avg_jct_s": (3700 + 1000) / 2, "preemptions": 1, "finished": 2},
    ),
    Case(
        # LAS reads the restored attained service: a has 900 GPU-s, b has 0, so b goes first
        "LAS sees the attained service the jobs had before the snapshot",
        [
            started(job("a", on=[0], duration=3000, executed=900, service=900, submit=0, seq=1), 100),
            job("b", duration=500, submit=500, seq=2, queued_since=500),
        ],
        1000,
        "las+accept-all",
        {"preemptions": 1, "finished": 2},
    ),
    Case(
        "a job unfinished at the horizon counts as finishing at the horizon",
        [started(job("a", on=[0], duration=10_000, executed=0, submit=0), 0)],
        0,
        "fifo+accept-all",
        {"avg_jct_s": 600, "finished": 0, "makespan_s": 600},
        settings=ForwardSettings(costs=CostModel.free(), horizon_s=600),
    ),
    Case(
        # 2 GPUs, 1.2x: admitted demand 2 <= 2.4 lets c in at t=0, then 3 > 2.4 holds d until a round
        # after a and b end (+1200); both then start
        "held jobs are offered to the candidate's admission policy",
        [
            started(job("a", on=[0], duration=1000, submit=0, seq=1), 0),
            started(job("b", on=[1], duration=1000, submit=0, seq=2), 0),
        ],
        0,
        "fifo+accept-1.2x",
        {"finished": 4, "avg_responsiveness_s": (0 + 0 + 1200 + 1200) / 4},
        gpus=2,
        held=[
            job("c", duration=1000, submit=0, seq=3, status=JobStatus.HELD),
            job("d", duration=1000, submit=0, seq=4, status=JobStatus.HELD),
        ],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_forward_case(case: Case) -> None:
    jobs = jobs_of(*case.jobs)
    state = cluster(nodes=1, per_node=case.gpus, running=[j for j in case.jobs if j.is_running])
    before = frozen(jobs, state)
    held_before = [(j.job_id, j.status) for j in case.held]
    candidate = BY_LABEL[case.candidate]
    results = forward_simulate(
        jobs, state, case.now, held=case.held, candidates=[candidate], settings=case.settings
    )
    assert_unchanged(before, jobs, state)
    assert [(j.job_id, j.status) for j in case.held] == held_before
    assert list(results) == [candidate]
    result = results[candidate]
    assert result.jobs == len(case.jobs) + len(case.held)
    for key, value in case.expect.items():
        assert getattr(result, key) == pytest.approx(value), key


def test_snapshot_orders_by_submit_time_and_keeps_real_ids() -> None:
    jobs = jobs_of(
        job("zeta", duration=100, submit=50, seq=7),
        started(job("alpha", on=[0], duration=300, executed=20, service=20, submit=10, seq=9), 10),
    )
    held = [job("mid", duration=200, submit=30, seq=8, status=JobStatus.HELD)]
    snap = take_snapshot(jobs, cluster(1, 2, running=[jobs["alpha"]]), 100.0, held=held)
    assert [(fj.job_id, fj.trace.index, fj.trace.job_id, fj.status) for fj in snap.jobs] == [
        ("alpha", 0, "0", JobStatus.RUNNING),
        ("mid", 1, "1", JobStatus.HELD),
        ("zeta", 2, "2", JobStatus.QUEUED),
    ]
    alpha = snap.jobs[0]
    assert (alpha.submit_time, alpha.first_start_time, alpha.remaining_s, alpha.gpus) == (-90, -90, 280, (0,))
    assert all(fj.trace.arrival_s == 0 for fj in snap.jobs)


def test_missing_duration_names_the_jobs() -> None:
    jobs = jobs_of(job("x", duration=None), job("y", duration=10), job("z", duration=None))
    with pytest.raises(MissingDurationError, match="x, z"):
        take_snapshot(jobs, cluster(1, 1), 0.0)


def test_admission_variants_share_a_run_without_held_jobs_but_not_with() -> None:
    jobs = jobs_of(job("a", duration=1000, seq=1), job("b", duration=2000, seq=2), job("c", duration=50, seq=3))
    results = forward_simulate(jobs, cluster(1, 1), 0.0, settings=FREE)
    assert list(results) == list(CANDIDATES)
    for c in CANDIDATES:
        assert results[c].avg_jct_s == results[BY_LABEL[f"{c.scheduling}+accept-all"]].avg_jct_s
    assert results[BY_LABEL["srtf+accept-all"]].avg_jct_s < results[BY_LABEL["fifo+accept-all"]].avg_jct_s


def test_parallel_workers_give_the_same_results() -> None:
    jobs = jobs_of(*(job(f"j{i}", duration=600 * (i + 1), seq=i, submit=i) for i in range(6)))
    held = [job("h", duration=900, seq=9, submit=9, status=JobStatus.HELD)]
    snap = take_snapshot(jobs, cluster(1, 2), 10.0, held=held)
    picked = [BY_LABEL["fifo+accept-all"], BY_LABEL["las+accept-1.2x"]]
    one = simulate_candidates(snap, candidates=picked, workers=1)
    two = simulate_candidates(snap, candidates=picked, workers=2)
    assert one == two


class Capture:
    """A scheduling policy that ranks like ``base`` and snapshots the state of the round at ``at``."""

    def __init__(self, base: SchedulingPolicy, at: float) -> None:
        self.base = base
        self.name = base.name
        self.triggers = base.triggers
        self.preemptive = getattr(base, "preemptive", True)
        self.at = at
        self.snapshot: Snapshot | None = None

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        if now == self.at:
            self.snapshot = take_snapshot(jobs, cluster, now)
        return self.base.rank(jobs, cluster, now)


WORKLOAD = [
    TraceJob(index=i, arrival_s=100.0 * i, gpus=1 + i % 2, duration_s=1500.0 + 1700.0 * (i % 4)) for i in range(8)
]


@pytest.mark.parametrize("scheduler", ["fifo", "las", "srtf"])
def test_forward_from_a_simulator_snapshot_reproduces_the_rest_of_the_run(scheduler: str) -> None:
    # Every job has arrived by t=900 and none has finished, so the forward run from the round at
    # t=900 sees every job: with the same policies it must end exactly as the original run did.
    capture = Capture(SCHEDULING.create(scheduler), at=900.0)
    original = Simulator(
        WORKLOAD,
        ClusterState.uniform(2, 2),
        admission=ADMISSION.create("accept-all"),
        scheduling=capture,  # type: ignore[arg-type]
        placement=PLACEMENT.create("consolidated"),
        config=SimConfig(),
    ).run()
    assert capture.snapshot is not None
    assert len(capture.snapshot.jobs) == len(WORKLOAD)
    assert original.completed == len(WORKLOAD)
    candidate = Combination(scheduler, "accept-all")
    result = simulate_candidates(capture.snapshot, candidates=[candidate], settings=ForwardSettings())[candidate]
    assert result.finished == len(WORKLOAD)
    assert result.avg_jct_s == pytest.approx(math.fsum(original.jct) / len(original.jct), abs=1e-6)
    assert result.avg_responsiveness_s == pytest.approx(
        math.fsum(original.responsiveness) / len(original.responsiveness), abs=1e-6
    )


def test_settings_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="round_s"):
        ForwardSettings(round_s=0)
    with pytest.raises(ValueError, match="horizon_s"):
        ForwardSettings(horizon_s=-1)
    with pytest.raises(ValueError, match="workers"):
        simulate_candidates(take_snapshot({}, cluster(1, 1), 0.0), workers=0)
