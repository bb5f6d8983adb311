"""Control-plane start and stop latencies in the simulator (``SimConfig.start_latency_s`` and
``stop_latency_s``, issue 18): hand-computed on one GPU, every number derived in the comments."""

from __future__ import annotations

import pytest

from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.costs import CostModel
from services.core.simulation.engine import Outcome, SimConfig, Simulator
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState


def simulate(jobs: list[TraceJob], **config: object) -> Outcome:
    options: dict[str, object] = {
        "round_s": 100.0,
        "costs": CostModel.free(),
        "debug": True,
        "fill_between_rounds": True,
        "record_jobs": True,
    }
    options.update(config)
    sim = Simulator(
        jobs, ClusterState.uniform(1, 1), admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("fifo"), placement=PLACEMENT.create("consolidated"),
        config=SimConfig(**options),  # type: ignore[arg-type]
    )  # fmt: skip
    return sim.run()


JOBS = [TraceJob(index=0, arrival_s=10.0, gpus=1, duration_s=50.0),
        TraceJob(index=1, arrival_s=20.0, gpus=1, duration_s=30.0)]  # fmt: skip


def test_no_latency_is_the_default() -> None:
    # A's arrival at 10 fills the free GPU: A runs 10-60. B (arrived 20) fills it at 60: 60-90.
    out = simulate(JOBS)
    assert list(out.jct) == [50.0, 70.0]
    assert list(out.first_start) == [10.0, 60.0]


def test_start_and_stop_latencies_delay_starts_and_completions() -> None:
    # Start 2 s, stop 3 s. A: decided at 10, runs 12-62, recorded done at 65 (JCT 55). B: the fill
    # round at A's completion (62) places it, but the GPU is held until 65 and B starts 2 s later,
    # at 67; it runs to 97, recorded at 100 (JCT 80). The GPU is busy 10-65 and 62(65)-100.
    out = simulate(JOBS, start_latency_s=2.0, stop_latency_s=3.0)
    assert list(out.jct) == [55.0, 80.0]
    assert list(out.first_start) == [12.0, 67.0]
    assert list(out.run) == [50.0, 30.0]
    assert out.productive_gpu_s == pytest.approx(80.0)


def test_measured_samples_are_taken_per_job() -> None:
    # Samples (4, 1): job seq 1 (A) takes sample 1 % 2 = 1 s, seq 2 (B) sample 0 = 4 s.
    # A runs 11-61; B starts at 61 + 4 = 65, runs to 95.
    out = simulate(JOBS, start_latency_s=(4.0, 1.0))
    assert list(out.first_start) == [11.0, 65.0]
    assert list(out.jct) == [51.0, 75.0]


@pytest.mark.parametrize(
    "bad", [{"start_latency_s": -1.0}, {"stop_latency_s": float("nan")}, {"start_latency_s": ()},
            {"start_latency_s": (1.0, -0.5)}],
)  # fmt: skip
def test_bad_latencies_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="latencies"):
        SimConfig(**bad)  # type: ignore[arg-type]
