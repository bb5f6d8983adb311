"""``SimJobState``: the spec is built from the workload record only when something reads it."""

from __future__ import annotations

import pytest

from roundhouse.sim.costs import CostModel
from roundhouse.sim.engine import SimConfig, Simulator
from roundhouse.sim.jobs import SimClock, SimJobState, spec_for
from roundhouse.sim.synthetic import FitGppSynthetic
from roundhouse.sim.workload import TraceJob
from schemas.job import JobClass
from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.state import ClusterState, JobStatus


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
