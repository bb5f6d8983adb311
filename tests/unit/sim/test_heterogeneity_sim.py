"""The simulator's heterogeneity model: a job's rate is its throughput on the slowest type it holds,
only when ``SimConfig.heterogeneity`` is on; GPU types come from typed cluster specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from roundhouse.sim.cluster import ClusterSpecError, cluster_from_text, parse_typed
from roundhouse.sim.traces import read_trace
from services.core import ADMISSION, PLACEMENT, SCHEDULING
from services.core.costs import CostModel
from services.core.heterogeneity import GAVEL_THROUGHPUTS
from services.core.simulation.engine import Outcome, SimConfig, Simulator
from services.core.simulation.workload import TraceJob, WorkloadError


def _run(cluster: str, jobs: list[TraceJob], *, heterogeneity: bool, placement: str = "consolidated") -> Outcome:
    return Simulator(
        jobs,
        cluster_from_text(cluster),
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("fifo"),
        placement=PLACEMENT.create(placement),
        config=SimConfig(round_s=10.0, costs=CostModel.free(), debug=True, heterogeneity=heterogeneity),
    ).run()


def test_a_job_on_a_k80_runs_at_its_k80_throughput_only_when_the_model_is_on() -> None:
    job = TraceJob(index=0, arrival_s=0.0, gpus=1, duration_s=1_000.0, model="cyclegan")
    slow = GAVEL_THROUGHPUTS["cyclegan"]["k80"]
    on = _run("k80:1x1", [job], heterogeneity=True)
    off = _run("k80:1x1", [job], heterogeneity=False)
    assert on.jct[0] == pytest.approx(1_000.0 / slow)
    assert off.jct[0] == pytest.approx(1_000.0)
    # On the reference type the trace's duration holds either way.
    assert _run("v100:1x1", [job], heterogeneity=True).jct[0] == pytest.approx(1_000.0)


def test_a_job_spread_over_two_types_runs_at_the_slowest_types_speed() -> None:
    # One 1-GPU node of each type: a 2-GPU job must take one of each (free costs: no spread slowdown).
    job = TraceJob(index=0, arrival_s=0.0, gpus=2, duration_s=1_000.0, model="resnet50")
    out = _run("k80:1x1,v100:1x1", [job], heterogeneity=True, placement="first-free")
    assert out.jct[0] == pytest.approx(1_000.0 / GAVEL_THROUGHPUTS["resnet50"]["k80"])


def test_an_unknown_model_uses_the_types_default_speed_and_generic_gpus_change_nothing() -> None:
    job = TraceJob(index=0, arrival_s=0.0, gpus=1, duration_s=100.0, model="no-such-model")
    assert _run("p100:1x1", [job], heterogeneity=True).jct[0] == pytest.approx(100.0 / 0.859)
    assert _run("1x1", [job], heterogeneity=True).jct[0] == pytest.approx(100.0)


def test_typed_cluster_specs() -> None:
    assert parse_typed("k80:2x4,NVIDIA A100-SXM4-80GB:1x8,3x2") == [("k80", 2, 4), ("a100", 1, 8), ("generic", 3, 2)]
    cluster = cluster_from_text("k80:2x4,v100:1x2")
    assert [n.gpu_type for n in cluster.nodes.values()] == ["k80", "k80", "v100"]
    assert [g.gpu_type for g in cluster.gpus] == ["k80"] * 8 + ["v100"] * 2
    assert cluster_from_text("4x2").gpus[0].gpu_type == "generic"  # the old syntax, unchanged
    for bad in ("k80:", "k80:2x4,,v100:1x1", ":2x2", "k80:0x4"):
        with pytest.raises(ClusterSpecError):
            cluster_from_text(bad)


def test_a_traces_own_throughputs_reach_the_simulated_rate(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("arrival_s,gpus,duration_s,model,throughputs\n0,1,100,cyclegan,k80=0.5;v100=1\n")
    jobs = read_trace(trace, "roundhouse")
    assert jobs[0].gpu_throughputs == {"k80": 0.5, "v100": 1.0}
    assert _run("k80:1x1", jobs, heterogeneity=True).jct[0] == pytest.approx(200.0)  # its own 0.5, not Gavel's
    trace.write_text("arrival_s,gpus,duration_s,throughputs\n0,1,100,k80=fast\n")
    with pytest.raises(WorkloadError, match=r"jobs\.csv:2: throughput of 'k80' is not a number"):
        read_trace(trace, "roundhouse")
