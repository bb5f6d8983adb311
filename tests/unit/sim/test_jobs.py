"""``SimJobState``: the spec is built from the workload record only when something reads it."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from roundhouse.sim.synthetic import FitGppSynthetic, GpuCounts, PhillySynthetic
from schemas.job import JobClass
from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.costs import CostModel
from services.core.decisions import Ranking
from services.core.simulation.engine import SimConfig, Simulator
from services.core.simulation.jobs import SimClock, SimJobState, spec_for
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState, JobState, JobStatus


def _state(trace: TraceJob) -> SimJobState:
    costs = CostModel().for_model(trace.model)
    return SimJobState(
        job_id=trace.job_id, spec=None, trace=trace, submit_time=trace.arrival_s, status=JobStatus.QUEUED,
        clock=SimClock(), work_s=trace.duration_s, costs=costs, checkpoint_s=costs.checkpoint_s, measured=True,
        total_iterations=trace.iterations,
    )


def test_spec_is_built_on_first_read_and_kept() -> None:
    trace = TraceJob(index=7, arrival_s=3.0, gpus=4, duration_s=120.0, job_class=JobClass.TE, model="vgg16",
                     iterations=50, checkpoint_s=12.0)
    job = _state(trace)
    assert job.gpus_requested == 4  # answered from the trace
    assert job._spec is None
    spec = job.spec
    assert spec == spec_for(trace)
    assert (spec.gpus, spec.model, spec.job_class, spec.grace_period_s) == (4, "vgg16", JobClass.TE, 12.0)
    assert job.spec is spec
    assert job.job_class is JobClass.TE


def test_a_state_without_trace_or_spec_says_so() -> None:
    trace = TraceJob(index=0, arrival_s=0.0, gpus=1, duration_s=1.0)
    job = _state(trace)
    job.trace = None
    with pytest.raises(AttributeError, match="neither a spec nor a trace"):
        _ = job.spec


def test_fifo_run_leaves_most_queued_specs_unbuilt() -> None:
    # An overloaded FIFO queue: placement reads only the head of the queue, so the specs of the
    # jobs still waiting at the end were (almost) never built. This is what bounds memory at 2^19 jobs.
    cluster = ClusterState.uniform(2, 8)
    workload = FitGppSynthetic(total_gpus=16, load=2.0, num_jobs=600, seed=1)
    sim = Simulator(
        workload, cluster, admission=ADMISSION.create("accept-all"), scheduling=SCHEDULING.create("fifo"),
        placement=PLACEMENT.create("consolidated"), config=SimConfig(max_time_s=2 * 24 * 3600.0),
    )
    out = sim.run()
    waiting = [j for j in sim.active.values() if isinstance(j, SimJobState) and not j.is_running]
    assert out.completed > 0
    assert len(waiting) > 50
    assert sum(1 for j in waiting if j._spec is not None) <= 1


def test_spec_carries_cpu_and_memory_demand_when_the_trace_gives_them() -> None:
    plain = spec_for(TraceJob(index=0, arrival_s=0.0, gpus=1, duration_s=10.0))
    demanding = spec_for(TraceJob(index=1, arrival_s=0.0, gpus=2, duration_s=10.0, cpus=12.0, memory_gb=96.0))
    assert (plain.cpus, plain.memory_gb) == (1.0, 4.0)  # JobSpec's defaults
    assert (demanding.cpus, demanding.memory_gb) == (12.0, 96.0)


@pytest.mark.parametrize("field", ["cpus", "memory_gb"])
def test_a_non_positive_cpu_or_memory_demand_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TraceJob(index=3, arrival_s=0.0, gpus=1, duration_s=10.0, **{field: 0.0})


class _Recording:
    """LAS, recording what each round's snapshot says of every job's current run."""

    name = "las"

    def __init__(self) -> None:
        self.inner = SCHEDULING.create("las")
        self.triggers = self.inner.triggers
        self.seen: list[tuple[bool, float | None, float, float | None, int, float]] = []

    def rank(self, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Ranking:
        for job in jobs.values():
            self.seen.append((job.is_running, job.run_start_service, job.attained_service, job.resumed_at,
                              len(job.gpus), now))
        ranking: Ranking = self.inner.rank(jobs, cluster, now)
        return ranking


def test_a_running_job_reports_the_service_its_run_began_with() -> None:
    # LAS on 4 GPUs with Gavel's GPU mix preempts and resumes jobs; every snapshot of a running job
    # must satisfy service now = service at the run's start + GPUs x productive time of this run.
    policy = _Recording()
    sim = Simulator(
        PhillySynthetic(jobs_per_hour=6.0, seed=2, gpu_counts=GpuCounts.gavel(), num_jobs=40),
        ClusterState.uniform(1, 4), admission=ADMISSION.create("accept-all"), scheduling=policy,
        placement=PLACEMENT.create("consolidated"), config=SimConfig(fast_paths=False),
    )
    assert sim.run().all_preemptions > 0
    running = [s for s in policy.seen if s[0]]
    assert running
    assert all(s[1] is None for s in policy.seen if not s[0])
    resumed = 0
    for _, start_service, service, resumed_at, gpus, now in running:
        assert start_service is not None
        assert resumed_at is not None
        assert service == pytest.approx(start_service + gpus * max(0.0, now - resumed_at))
        resumed += start_service > 0
    assert resumed > 0  # runs that resumed with service earned before
