"""Workload generators (per-stream seeding, Blox's formulas) and trace readers."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from roundhouse.sim.cluster import ClusterSpecError, parse_shape, read_tiresias_spec
from roundhouse.sim.synthetic import FifoLoadArrivals, FitGppSynthetic, GpuCounts, PhillySynthetic, stream
from roundhouse.sim.traces import read_trace
from schemas.job import JobClass
from services.core.protocols import Trigger
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.engine import SimConfig, Simulator
from services.core.simulation.workload import WorkloadError
from services.core.state import ClusterState

TRACES = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces"


def _needs_traces() -> None:
    if not TRACES.is_dir():
        pytest.skip(f"real traces not found at {TRACES} (see the project README)")


def test_philly_synthetic_follows_bloxs_formulas() -> None:
    jobs = list(itertools.islice(PhillySynthetic(jobs_per_hour=8.0, seed=1), 4000))
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(jobs)]
    assert all(g == int(g) and g >= 1 for g in gaps)  # ceil'd whole seconds
    assert sum(gaps) / len(gaps) == pytest.approx(3600 / 8, rel=0.06)
    minutes = [j.duration_s / 60 for j in jobs]
    assert all(10**1.5 <= m <= 10**4 for m in minutes)
    long_share = sum(1 for m in minutes if m > 1000) / len(minutes)
    assert long_share == pytest.approx(0.2, abs=0.03)
    assert {j.gpus for j in jobs} == {1}
    assert [j.index for j in jobs[:3]] == [0, 1, 2]


def test_streams_are_independent() -> None:
    # Changing the GPU-count distribution must not move arrivals or durations.
    single = list(itertools.islice(PhillySynthetic(jobs_per_hour=5.0, seed=7), 200))
    gavel = list(itertools.islice(PhillySynthetic(jobs_per_hour=5.0, seed=7, gpu_counts=GpuCounts.gavel()), 200))
    assert [(j.arrival_s, j.duration_s) for j in single] == [(j.arrival_s, j.duration_s) for j in gavel]
    assert {j.gpus for j in gavel} <= {1, 2, 4, 8}
    assert stream(1, "a").random() != stream(1, "b").random()
    assert stream(1, "a").random() == stream(1, "a").random()


def test_elastic_philly_jobs_are_the_same_jobs_with_a_gpu_ceiling() -> None:
    rigid = list(itertools.islice(PhillySynthetic(jobs_per_hour=5.0, seed=3, gpu_counts=GpuCounts.gavel()), 300))
    elastic = list(
        itertools.islice(
            PhillySynthetic(jobs_per_hour=5.0, seed=3, gpu_counts=GpuCounts.gavel(), elastic_max_gpus=4), 300
        )
    )
    same = [(j.arrival_s, j.gpus, j.duration_s, j.model) for j in rigid]
    assert [(j.arrival_s, j.gpus, j.duration_s, j.model) for j in elastic] == same
    assert all(j.max_gpus is None for j in rigid)
    # Up to 4 GPUs for the jobs that ask for fewer; an 8-GPU job stays rigid.
    assert {(j.gpus, j.max_gpus) for j in elastic} == {(1, 4), (2, 4), (4, None), (8, None)}
    with pytest.raises(WorkloadError, match="at most >= 1 GPU"):
        PhillySynthetic(jobs_per_hour=5.0, elastic_max_gpus=0)


def test_gavel_gpu_counts() -> None:
    counts = GpuCounts.gavel()
    rng = stream(0, "test")
    draws = [counts.sample(rng) for _ in range(20_000)]
    assert draws.count(1) / len(draws) == pytest.approx(0.7, abs=0.02)
    assert counts.mean == pytest.approx(0.7 + 0.2 + 0.6 + 0.4)


def test_fitgpp_synthetic_shape() -> None:
    workload = FitGppSynthetic(total_gpus=64, load=2.0, num_jobs=3000, seed=2)
    jobs = list(workload)
    te = [j for j in jobs if j.job_class is JobClass.TE]
    assert len(te) / len(jobs) == pytest.approx(0.3, abs=0.03)
    assert max(j.duration_s for j in te) <= 1800
    assert max(j.duration_s for j in jobs) <= 24 * 3600
    assert all(1 <= j.gpus <= 8 for j in jobs)
    assert all(j.checkpoint_s is not None and 5 <= j.checkpoint_s <= 1200 for j in jobs)
    offered = sum(j.gpus * j.duration_s for j in jobs) / (64 * jobs[-1].arrival_s)
    assert offered == pytest.approx(2.0, rel=0.15)


def test_fitgpp_synthetic_cpu_and_ram_demand() -> None:
    offered = list(FitGppSynthetic(total_gpus=64, num_jobs=4000, seed=3))
    assert all(j.cpus is not None and j.memory_gb is not None for j in offered)
    assert all(1 <= j.cpus <= 32 and j.cpus == int(j.cpus) for j in offered if j.cpus is not None)
    assert all(1 <= j.memory_gb <= 256 for j in offered if j.memory_gb is not None)
    te = [j for j in offered if j.job_class is JobClass.TE]
    be = [j for j in offered if j.job_class is JobClass.BE]
    # BE jobs are centred on twice the TE demand (N(8, 8) vs N(4, 4) CPUs, N(64, 64) vs N(32, 32) GB)
    assert sum(j.cpus or 0 for j in be) / len(be) > 1.5 * sum(j.cpus or 0 for j in te) / len(te)
    assert sum(j.memory_gb or 0 for j in be) / len(be) > 1.5 * sum(j.memory_gb or 0 for j in te) / len(te)
    # the CPU/RAM draws have their own stream: the same seed gives the same jobs, whichever arrivals
    fifo = list(FitGppSynthetic(total_gpus=64, num_jobs=4000, seed=3, arrivals="fifo"))
    fields = [(j.gpus, j.duration_s, j.job_class, j.checkpoint_s, j.cpus, j.memory_gb) for j in offered]
    assert fields == [(j.gpus, j.duration_s, j.job_class, j.checkpoint_s, j.cpus, j.memory_gb) for j in fifo]
    # and the arrivals are the Poisson stream alone: recomputing it from its stream gives the same times
    workload = FitGppSynthetic(total_gpus=64, num_jobs=4000, seed=3)
    rate, rng, now = 2.0 * 64 / workload.mean_gpu_seconds(), stream(3, "arrivals"), 0.0
    for j in offered[:50]:
        now += rng.expovariate(rate)
        assert j.arrival_s == now


def test_fitgpp_synthetic_fifo_arrivals_keep_the_load() -> None:
    finishes: dict[int, float] = {}
    workload = FitGppSynthetic(total_gpus=32, num_jobs=1500, seed=4, arrivals="fifo")
    jobs = list(FifoLoadArrivals(nodes=4, node_gpus=8, node_cpus=32, node_memory_gb=256, load=2.0).timed(
        workload.jobs(), finishes
    ))
    assert [(j.index, j.arrival_s) for j in jobs] == [(j.index, j.arrival_s) for j in workload]
    assert len(finishes) == len(jobs)
    # at every arrival instant, after its arrivals, the GPUs demanded by jobs in the system reach
    # 2.0 x 32 (and one job fewer would not)
    instants = sorted({j.arrival_s for j in jobs})
    for t in instants[:: max(1, len(instants) // 200)]:
        arrived = [j for j in jobs if j.arrival_s <= t]
        demand = sum(j.gpus for j in arrived if finishes[j.index] > t)
        assert demand >= 64
        assert demand - arrived[-1].gpus < 64
    # the simulator's FIFO on GPUs, CPUs and RAM is the reference run, job for job
    sim = Simulator(
        iter(jobs), ClusterState.uniform(4, 8), admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create("fifo"), placement=PLACEMENT.create("preempting", preempt_for=()),
        config=SimConfig(extra_triggers=Trigger.CHURN),
    )
    out = sim.run()
    expected = sorted(finishes[j.index] - j.arrival_s for j in jobs)
    assert sorted(out.jct) == pytest.approx(expected, abs=1e-6)


def test_fitgpp_synthetic_rejects_bad_options() -> None:
    with pytest.raises(WorkloadError, match="arrivals"):
        FitGppSynthetic(total_gpus=64, arrivals="closed")
    with pytest.raises(WorkloadError, match="whole nodes"):
        FitGppSynthetic(total_gpus=60, arrivals="fifo")


def test_roundhouse_csv(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text(
        "arrival_s,gpus,duration_s,iterations,iteration_s,class,user,model,checkpoint_s,max_gpus\n"
        "30,2,,100,1.5,TE,alice,resnet50,,\n"
        "10,1,600,,,BE,bob,,12,4\n",
        encoding="utf-8",
    )
    jobs = read_trace(path, "roundhouse")
    assert [(j.index, j.arrival_s, j.gpus, j.duration_s) for j in jobs] == [(0, 10.0, 1, 600.0), (1, 30.0, 2, 150.0)]
    assert jobs[1].job_class is JobClass.TE
    assert jobs[1].user == "alice"
    assert jobs[0].checkpoint_s == 12.0
    assert jobs[1].iterations == 100
    assert [j.max_gpus for j in jobs] == [4, None]  # elastic up to 4 GPUs / rigid


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arrival_s,gpus\n1,1\n", "duration_s"),
        ("arrival_s,gpus,duration_s,colour\n1,1,5,red\n", "unknown column"),
        ("arrival_s,gpus,duration_s\n1,x,5\n", "must be a number"),
        ("arrival_s,gpus,duration_s,class\n1,1,5,XX\n", "TE or BE"),
        ("arrival_s,gpus,duration_s\n1,0,5\n", "at least 1 GPU"),
        ("arrival_s,gpus,duration_s,max_gpus\n1,4,5,2\n", r"max_gpus \(2\) must be >= gpus \(4\)"),
    ],
)
def test_roundhouse_csv_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(WorkloadError, match=message):
        read_trace(path, "roundhouse")


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="valid: philly"):
        read_trace(tmp_path / "x.csv", "gavel")
    with pytest.raises(WorkloadError, match="does not exist"):
        read_trace(tmp_path / "x.csv", "tiresias")


@pytest.mark.traces
def test_tiresias_trace_and_cluster_spec() -> None:
    _needs_traces()
    jobs = read_trace(TRACES / "tiresias-60job.csv", "tiresias")
    assert len(jobs) == 60
    assert (jobs[0].gpus, jobs[0].duration_s, jobs[0].model, jobs[0].iterations) == (1, 164.0, "vgg19", 606)
    cluster = read_tiresias_spec(TRACES / "tiresias-cluster-n32g4.csv")
    assert (cluster.total_gpus, len(cluster.nodes), cluster.largest_node_gpus) == (128, 32, 4)


@pytest.mark.traces
def test_philly_trace_replay_keeps_real_times() -> None:
    _needs_traces()
    jobs = read_trace(TRACES / "philly-pollux.csv", "philly")
    assert len(jobs) == 82247
    assert jobs[0].arrival_s == 0.0
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(jobs[:5000]))
    # 2017-09-04 10:30:41 -> 2017-12-22 08:02:11: 109 days minus 2:28:30, with no daylight-saving hour
    assert jobs[-1].arrival_s == 109 * 86_400 - (2 * 3600 + 28 * 60 + 30)
    assert max(j.gpus for j in jobs) == 128
    pollux = read_trace(TRACES / "pollux-workload-1.csv", "pollux")
    assert len(pollux) == 160
    assert all(math.isfinite(j.duration_s) for j in pollux)


def test_cluster_shapes(tmp_path: Path) -> None:
    assert parse_shape("32x4") == (32, 4)
    with pytest.raises(ClusterSpecError, match="NODESxGPUS"):
        parse_shape("32*4")
    bad = tmp_path / "spec.csv"
    bad.write_text("num_switch,num_node_p_switch\n1,2\n", encoding="utf-8")
    with pytest.raises(ClusterSpecError, match="num_gpu_p_node"):
        read_tiresias_spec(bad)
