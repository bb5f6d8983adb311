"""Goodput jobs in the simulator, the Pollux workload formats and ``roundhouse reproduce pollux --quick``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roundhouse.cli import main
from roundhouse.sim.case import default_traces_dir
from roundhouse.sim.traces import read_trace
from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.costs import CostModel
from services.core.goodput import PROFILES
from services.core.simulation.engine import InitialJob, SimConfig, Simulator
from services.core.simulation.workload import TraceJob, WorkloadError
from services.core.state import ClusterState, JobStatus

WORKLOAD = default_traces_dir() / "pollux-workload-1.csv"
needs_traces = pytest.mark.skipif(not WORKLOAD.is_file(), reason=f"{WORKLOAD} absent (../shared/data/traces)")


def simulate(jobs: list[TraceJob], policy: str, nodes: int = 1, gpus: int = 4) -> Simulator:
    sim = Simulator(
        jobs, ClusterState.uniform(nodes, gpus), admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create(policy), placement=PLACEMENT.create("consolidated", backfill=True),
        config=SimConfig(round_s=60.0, costs=CostModel.free(), record_jobs=True),
    )  # fmt: skip
    sim.run()
    return sim


def test_a_lone_goodput_job_grows_and_runs_at_its_goodput() -> None:
    cifar = PROFILES["cifar10"]
    job = TraceJob(index=0, arrival_s=0.0, gpus=1, duration_s=cifar.seconds(1, 1), model="cifar10", max_gpus=4,
                   goodput=True)  # fmt: skip
    sim = simulate([job], "pollux")
    (jct,) = sim.out.jct
    # Early in training (noise scale 72) cifar10 gains nothing from a second GPU, so Pollux starts
    # it on one; as its reported noise scale grows it moves it to the node's 4 GPUs once (no
    # preemption cost here). Its run time is close to the goodput model's on 4 GPUs throughout,
    # far below its one-GPU duration, and never below the 4-GPU bound.
    assert sim.out.all_preemptions == 1
    assert cifar.seconds(1, 4) <= jct < 1.1 * cifar.seconds(1, 4)
    assert jct < 0.4 * job.duration_s


def test_the_same_job_without_goodput_keeps_the_cost_model() -> None:
    cifar = PROFILES["cifar10"]
    plain = TraceJob(index=0, arrival_s=0.0, gpus=1, duration_s=cifar.seconds(1, 1), model="cifar10")
    (jct,) = simulate([plain], "fifo").out.jct
    assert jct == pytest.approx(plain.duration_s)  # rigid, one GPU: exactly its duration


def test_a_goodput_job_needs_a_profile() -> None:
    with pytest.raises(WorkloadError, match="no goodput profile"):
        TraceJob(index=0, arrival_s=0.0, gpus=1, duration_s=10.0, model="resnet50", goodput=True)


def test_a_simulated_goodput_job_reports_its_noise_scale_as_it_trains() -> None:
    cifar = PROFILES["cifar10"]
    job = TraceJob(index=0, arrival_s=0.0, gpus=1, duration_s=cifar.seconds(1, 1), model="cifar10", goodput=True)
    sim = Simulator(
        [], ClusterState.uniform(1, 1), admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("fifo"), placement=PLACEMENT.create("consolidated"),
    )  # fmt: skip
    halfway = job.duration_s - cifar.remaining_seconds(1, 1, 0.5)  # one-GPU seconds to half its progress
    (state,) = sim.start_from([InitialJob(trace=job, status=JobStatus.QUEUED, submit_time=0.0, done_s=halfway)])
    assert state is not None
    assert state.grad_noise_scale == pytest.approx(cifar.noise_scale_at(0.5))
    plain = TraceJob(index=1, arrival_s=0.0, gpus=1, duration_s=10.0, model="cifar10")
    (other,) = sim.start_from([InitialJob(trace=plain, status=JobStatus.QUEUED, submit_time=0.0)])
    assert other is not None
    assert other.grad_noise_scale is None  # only goodput jobs report one


@needs_traces
def test_the_workload_formats() -> None:
    goodput = read_trace(WORKLOAD, "pollux-goodput")
    tuned = read_trace(WORKLOAD, "pollux-tuned")
    assert len(goodput) == len(tuned) == 160
    assert [j.arrival_s for j in goodput] == sorted(j.arrival_s for j in goodput)
    assert all(j.goodput and j.gpus == 1 for j in goodput)
    assert not any(j.goodput for j in tuned)
    assert {j.model for j in tuned} == {"cifar10", "ncf", "deepspeech2", "bert", "imagenet", "yolov3"}
    first = tuned[0]  # cifar10-0: 6 replicas at batch 2048, on two 4-GPU nodes
    assert (first.model, first.gpus) == ("cifar10", 6)
    assert first.duration_s == pytest.approx(PROFILES["cifar10"].seconds(2, 6, 2048))
    assert goodput[0].duration_s == pytest.approx(PROFILES["cifar10"].seconds(1, 1))


@needs_traces
def test_quick_reproduction(tmp_path: Path) -> None:
    out = tmp_path / "pollux.json"
    assert main(["reproduce", "pollux", "--quick", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    metrics = report["metrics"]
    assert metrics["avg_jct_pollux_w6"]["paper"] == 2446
    assert metrics["avg_jct_tiresias_w6"]["paper"] == 3470
    runs = {r["policy"]: r for r in report["details"]["runs"]}
    assert set(runs) == {"pollux", "tiresias", "fifo"}
    # Pollux beats both baselines on the artifact's fidelity workload, as in the paper
    assert runs["pollux"]["avg_jct_s"] < runs["tiresias"]["avg_jct_s"] < runs["fifo"]["avg_jct_s"]
    assert metrics["pollux_vs_tiresias"]["ours"] < 0
