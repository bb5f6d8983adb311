"""Small snapshots every registered policy is run on: ``SCENARIOS`` by name.

Each one is a state an owner (the scheduler or the simulator) could hand a policy: admitted jobs
(running ones hold their GPUs in the cluster, waiting ones hold none), jobs offered to admission
(HELD), and ``now``. Between them they cover what policies read: running and waiting jobs, jobs of
1 to 8 GPUs, jobs spanning nodes, elastic jobs (``max_gpus``), attained service from none to a lot,
suspended jobs, TE and BE classes, several users and models, declared durations and iterations
(and jobs without), iteration times, loss histories, long waits (starvation promotions), links
between GPUs and nodes on two switches. The hand-written ones have a purpose each (see their
docstrings); the random ones add combinations nobody thought of, from fixed seeds.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from schemas.job import JobClass, JobSpec
from services.core.state import ClusterState, Gpu, JobState, JobStatus, Node

NOW = 10_000.0


@dataclass
class Scenario:
    """One snapshot: ``jobs`` (admitted, unfinished), ``cluster``, ``offered`` (HELD) and ``now``."""

    name: str
    jobs: dict[str, JobState]
    cluster: ClusterState
    now: float = NOW
    offered: list[JobState] = field(default_factory=list)

    @property
    def running(self) -> list[JobState]:
        return [j for j in self.jobs.values() if j.is_running]

    @property
    def waiting(self) -> list[JobState]:
        return [j for j in self.jobs.values() if not j.is_running]


def make_cluster(
    shape: Sequence[int],
    *,
    switches: Sequence[str] | None = None,
    links: dict[tuple[int, int], float] | None = None,
    gpu_type: str = "generic",
) -> ClusterState:
    """Nodes with ``shape[i]`` GPUs each (ids dense in node order); ``switches[i]`` per node."""
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    first = 0
    for n, count in enumerate(shape):
        node_id = f"node-{n}"
        ids = tuple(range(first, first + count))
        first += count
        switch = switches[n] if switches else "switch-0"
        nodes.append(Node(node_id, ids, gpu_type=gpu_type, link_bandwidth_gbps=dict(links or {}), switch=switch))
        gpus.extend(Gpu(g, node_id, i, gpu_type) for i, g in enumerate(ids))
    return ClusterState(nodes, gpus)


def make_job(
    job_id: str,
    *,
    seq: int,
    gpus: int = 1,
    max_gpus: int | None = None,
    kind: str = "BE",
    user: str = "alice",
    model: str | None = None,
    submit: float = 0.0,
    duration: float | None = None,
    iterations: int | None = None,
    on: Iterable[int] = (),
    held: bool = False,
    service: float = 0.0,
    run_service: float = 0.0,
    started: float | None = None,
    first_started: float | None = None,
    resumed: float | None = None,
    preempted: float | None = None,
    preemptions: int = 0,
    queued_since: float | None = None,
    longest_wait: float = 0.0,
    iterations_done: int = 0,
    iteration_time: float | None = None,
    losses: Sequence[tuple[float, float]] = (),
) -> JobState:
    """A consistent ``JobState``: running when ``on`` names GPUs, HELD when ``held``, else waiting."""
    holding = tuple(on)
    spec = JobSpec(
        name=job_id,
        user=user,
        command=["python", "train.py"],
        gpus=gpus,
        max_gpus=max_gpus,
        job_class=JobClass(kind),
        model=model,
        expected_duration_s=duration,
        expected_iterations=iterations,
    )
    running = bool(holding)
    status = JobStatus.RUNNING if running else JobStatus.HELD if held else JobStatus.QUEUED
    history = list(losses)
    return JobState(
        job_id=job_id,
        spec=spec,
        submit_time=submit,
        status=status,
        admit_time=None if held else submit,
        first_start_time=(first_started if first_started is not None else started) if running or preemptions
        else None,
        last_start_time=started if running or preemptions else None,
        resumed_at=resumed if running else None,
        last_preempt_time=preempted,
        attained_service=service,
        executed_time=service / max(1, len(holding) or gpus),
        iterations_done=iterations_done,
        preemptions=preemptions,
        gpus=holding,
        loss=history[-1][1] if history else None,
        loss_history=history,
        iteration_time_s=iteration_time,
        seq=seq,
        queued_since=None if running or held else (queued_since if queued_since is not None else submit),
        longest_wait_s=longest_wait,
        run_start_service=run_service if running else None,
    )


def _losses(start: float, end: float, *, first: float, rate: float, samples: int = 8) -> list[tuple[float, float]]:
    step = (end - start) / samples
    return [(start + i * step, first * math.exp(-rate * i)) for i in range(samples)]


def _admit(jobs: Iterable[JobState], cluster: ClusterState) -> dict[str, JobState]:
    by_id = {}
    for job in jobs:
        if job.is_running:
            cluster.assign(job.job_id, job.gpus)
        by_id[job.job_id] = job
    return by_id


def waiting_only() -> Scenario:
    """Nothing runs yet: one 4-GPU node, jobs of 1, 2 and 4 GPUs waiting; two more offered."""
    cluster = make_cluster([4])
    jobs = [
        make_job("a", seq=0, submit=100.0, duration=3600.0),
        make_job("b", seq=1, gpus=2, kind="TE", submit=200.0, iterations=1000, iteration_time=0.5, user="bob"),
        make_job("c", seq=2, gpus=4, submit=300.0, model="resnet50",
                 losses=_losses(0.0, 0.0, first=2.0, rate=0.0, samples=1)),
    ]
    offered = [
        make_job("new-1", seq=3, submit=9_000.0, duration=600.0, held=True),
        make_job("new-2", seq=4, gpus=4, submit=9_500.0, user="bob", held=True),
    ]
    return Scenario("waiting-only", _admit(jobs, cluster), cluster, offered=offered)


def mixed() -> Scenario:
    """Two 4-GPU nodes: running jobs of 1, 2 and 4 GPUs (the 4-GPU one spans both nodes), one GPU free;
    waiting jobs new and suspended, TE and BE, with and without estimates; loss histories."""
    cluster = make_cluster([4, 4])
    jobs = [
        make_job("r-two", seq=0, gpus=2, on=(0, 1), submit=0.0, started=1_000.0, service=18_000.0,
                 run_service=0.0, duration=20_000.0, iterations=20_000, iterations_done=9_000, iteration_time=1.0,
                 losses=_losses(1_000.0, NOW, first=3.0, rate=0.2), model="vgg16"),
        make_job("r-one", seq=1, on=(4,), submit=500.0, started=8_000.0, service=2_500.0, run_service=500.0,
                 preemptions=1, preempted=6_000.0, first_started=2_000.0, duration=5_000.0, user="bob",
                 losses=_losses(2_000.0, NOW, first=1.5, rate=0.05)),
        make_job("r-wide", seq=2, gpus=4, on=(2, 3, 5, 6), submit=800.0, started=9_000.0, resumed=9_030.0,
                 service=3_880.0, run_service=0.0, iterations=50_000, iterations_done=1_000, iteration_time=0.97,
                 model="resnet50", user="carol"),
        make_job("w-te", seq=3, kind="TE", submit=9_500.0, duration=300.0, user="bob"),
        make_job("w-two", seq=4, gpus=2, submit=9_600.0, iterations=4_000, iteration_time=0.3, model="vgg16"),
        make_job("w-four", seq=5, gpus=4, submit=9_700.0, duration=7_200.0, user="carol"),
        make_job("w-suspended", seq=6, submit=100.0, preemptions=2, preempted=7_000.0, started=4_000.0,
                 service=4_000.0, queued_since=7_000.0, longest_wait=1_500.0, duration=10_000.0,
                 iterations_done=4_000, iteration_time=1.0, losses=_losses(100.0, 7_000.0, first=2.0, rate=0.3)),
    ]
    offered = [make_job("new-te", seq=7, kind="TE", submit=9_900.0, duration=60.0, held=True)]
    return Scenario("mixed-2x4", _admit(jobs, cluster), cluster, offered=offered)


def full_with_te() -> Scenario:
    """Four 2-GPU nodes, every GPU busy with BE jobs of long and short remaining time; TE jobs wait
    (FitGpp-style preemption: placement must suspend to launch anything)."""
    cluster = make_cluster([2, 2, 2, 2])
    jobs = [
        make_job("be-0", seq=0, gpus=2, on=(0, 1), submit=0.0, started=100.0, service=19_800.0, duration=40_000.0),
        make_job("be-1", seq=1, on=(2,), submit=10.0, started=5_000.0, service=5_000.0, duration=5_500.0, user="bob"),
        make_job("be-2", seq=2, on=(3,), submit=20.0, started=9_990.0, service=10.0, duration=100_000.0),
        make_job("be-3", seq=3, gpus=4, on=(4, 5, 6, 7), submit=30.0, started=9_000.0, service=4_000.0,
                 iterations=10_000, iterations_done=1_000, iteration_time=1.0, user="carol"),
        make_job("te-1", seq=4, kind="TE", submit=9_950.0, duration=120.0),
        make_job("te-2", seq=5, gpus=2, kind="TE", submit=9_960.0, duration=600.0, user="bob"),
        make_job("be-wait", seq=6, submit=1.0, queued_since=1.0, duration=1_000.0),
    ]
    offered = [make_job(f"new-{i}", seq=7 + i, gpus=1 + i, submit=9_990.0, held=True) for i in range(3)]
    return Scenario("full-4x2-te", _admit(jobs, cluster), cluster, offered=offered)


def elastic_links() -> Scenario:
    """Two 4-GPU nodes with NVLink pairs, elastic jobs (``max_gpus``) and models that prefer
    consolidation (vgg) or not; at a ``now`` late enough that one job has waited past the
    starvation thresholds (LAS, SRTF, Optimus: 1000 h)."""
    links = {(0, 1): 300.0, (2, 3): 300.0, (0, 2): 50.0, (1, 3): 50.0}
    cluster = make_cluster([4, 4], links=links)
    now = 5_000_000.0
    base = now - NOW
    jobs = [
        make_job("el-run", seq=0, gpus=1, max_gpus=4, on=(0,), submit=base, started=base + 5_000.0, service=5_000.0,
                 iterations=100_000, iterations_done=5_000, iteration_time=1.0, model="vgg16"),
        make_job("el-wait", seq=1, gpus=2, max_gpus=8, submit=base + 50.0, iterations=30_000, iteration_time=0.4,
                 model="resnet50", losses=_losses(base, base + 50.0, first=4.0, rate=0.0, samples=2)),
        make_job("vgg", seq=2, gpus=2, submit=base + 60.0, duration=2_000.0, model="vgg16"),
        make_job("alexnet", seq=3, gpus=3, submit=base + 70.0, duration=9_000.0, model="alexnet", user="bob"),
        make_job("starved", seq=4, submit=0.0, queued_since=100.0, service=100.0, preemptions=1, started=0.0,
                 preempted=100.0, duration=50_000.0, user="dave"),
    ]
    offered = [make_job("new-elastic", seq=5, gpus=2, max_gpus=4, submit=now - 1.0, held=True)]
    return Scenario("elastic-links", _admit(jobs, cluster), cluster, now=now, offered=offered)


def two_switches() -> Scenario:
    """Three nodes on two switches (8, 4 and 4 GPUs), an 8-GPU job running, wide jobs waiting; every
    job declares its duration (so the synthesizer's forward simulations run)."""
    cluster = make_cluster([8, 4, 4], switches=["sw-a", "sw-b", "sw-b"])
    jobs = [
        make_job("big", seq=0, gpus=8, on=range(8), submit=0.0, started=1_000.0, service=72_000.0,
                 duration=20_000.0),
        make_job("mid", seq=1, gpus=2, on=(8, 9), submit=10.0, started=9_000.0, service=2_000.0, user="bob",
                 duration=1_500.0),
        make_job("wide", seq=2, gpus=6, submit=20.0, duration=3_000.0),
        make_job("eight", seq=3, gpus=8, submit=30.0, duration=8_000.0, user="bob"),
        make_job("one", seq=4, submit=40.0, duration=30.0),
    ]
    return Scenario("two-switches", _admit(jobs, cluster), cluster)


def heterogeneous() -> Scenario:
    """Three GPU types on three 4-GPU nodes (k80, p100, v100; Gavel's cluster in miniature): jobs of
    Gavel's models, one with its own per-type throughputs, running on slow and fast types, waiting."""
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    for n, gpu_type in enumerate(("k80", "p100", "v100")):
        ids = tuple(range(4 * n, 4 * n + 4))
        nodes.append(Node(f"node-{n}", ids, gpu_type=gpu_type))
        gpus.extend(Gpu(g, f"node-{n}", i, gpu_type) for i, g in enumerate(ids))
    cluster = ClusterState(nodes, gpus)
    own = make_job("own-speeds", seq=4, gpus=2, submit=9_000.0, duration=4_000.0)
    own.spec = own.spec.model_copy(update={"gpu_throughputs": {"k80": 0.9, "p100": 1.0, "v100": 1.1}})
    jobs = [
        make_job("rec-on-v100", seq=0, on=(8,), submit=0.0, started=2_000.0, service=8_000.0, model="recoder",
                 duration=20_000.0),
        make_job("cyclegan-on-k80", seq=1, gpus=2, on=(0, 1), submit=100.0, started=5_000.0, service=10_000.0,
                 model="cyclegan", duration=30_000.0, user="bob"),
        make_job("resnet-wait", seq=2, gpus=4, submit=8_000.0, model="resnet50", duration=9_000.0),
        make_job("lstm-wait", seq=3, submit=9_500.0, model="lstm", user="carol"),
        own,
    ]
    offered = [make_job("new-a3c", seq=5, submit=9_900.0, model="a3c", held=True)]
    return Scenario("heterogeneous", _admit(jobs, cluster), cluster, offered=offered)


def goodput_jobs() -> Scenario:
    """Pollux's workload models (goodput profiles in ``services.core.goodput``) on two 4-GPU nodes:
    elastic jobs running and waiting, some that reported a gradient noise scale, one rigid."""
    cluster = make_cluster([4, 4])
    grown = make_job("cifar-grown", seq=0, gpus=1, max_gpus=8, on=(0, 1, 2), submit=1_000.0, started=2_000.0,
                     service=9_000.0, model="cifar10", preemptions=1)
    grown.grad_noise_scale, grown.batch_size = 4_000.0, 1_024
    jobs = [
        grown,
        make_job("bert-one", seq=1, gpus=1, max_gpus=8, on=(4,), submit=3_000.0, started=3_500.0, service=2_000.0,
                 model="bert", user="bob"),
        make_job("ncf-wait", seq=2, gpus=1, max_gpus=8, submit=8_000.0, model="ncf"),
        make_job("yolo-wait", seq=3, gpus=1, max_gpus=8, submit=9_000.0, model="yolov3", user="carol"),
        make_job("rigid-2", seq=4, gpus=2, submit=9_500.0, model="imagenet"),
    ]
    jobs[2].grad_noise_scale = 2.0e6
    offered = [make_job("new-deepspeech", seq=5, gpus=1, max_gpus=4, submit=9_990.0, model="deepspeech2", held=True)]
    return Scenario("goodput-jobs", _admit(jobs, cluster), cluster, offered=offered)


def random_scenario(seed: int) -> Scenario:
    """A random but consistent snapshot from ``seed``: 1-4 nodes of 1-8 GPUs, 0-14 jobs."""
    rng = random.Random(seed)
    shape = [rng.choice((1, 2, 4, 4, 8)) for _ in range(rng.randint(1, 4))]
    cluster = make_cluster(shape, switches=[rng.choice(("sw-a", "sw-b")) for _ in shape])
    total = sum(shape)
    free = list(range(total))
    rng.shuffle(free)
    jobs: list[JobState] = []
    models = (None, "vgg16", "resnet50", "alexnet", "bert")
    for i in range(rng.randint(0, 14)):
        gpus = rng.choice((1, 1, 1, 2, 2, 4, 8))
        if gpus > total:
            gpus = 1
        run = rng.random() < 0.45 and len(free) >= gpus
        submit = rng.uniform(0.0, NOW - 1.0)
        started = rng.uniform(submit, NOW) if run else None
        held_gpus = tuple(sorted(free.pop() for _ in range(gpus))) if run else ()
        suspended = not run and rng.random() < 0.3
        service = rng.choice((0.0, 10.0, 3_000.0, 50_000.0)) if run or suspended else 0.0
        duration = rng.choice((None, 60.0, 3_600.0, 86_400.0))
        iterations = rng.choice((None, 1_000, 100_000))
        jobs.append(make_job(
            f"j{i}", seq=i, gpus=gpus, max_gpus=rng.choice((None, None, gpus * 2)),
            kind=rng.choice(("BE", "BE", "TE")), user=rng.choice(("alice", "bob", "carol")),
            model=rng.choice(models), submit=submit, duration=duration, iterations=iterations, on=held_gpus,
            service=service, run_service=service * rng.choice((0.0, 0.5)) if run else 0.0,
            started=started if run else (submit + 1.0 if suspended else None),
            preemptions=rng.randint(1, 3) if suspended else 0, preempted=submit + 2.0 if suspended else None,
            queued_since=rng.uniform(submit, NOW) if not run else None,
            iterations_done=int(service) if iterations else 0,
            iteration_time=rng.choice((None, 0.2, 1.5)),
            losses=_losses(submit, NOW, first=rng.uniform(0.5, 5.0), rate=rng.uniform(0.0, 0.5),
                           samples=rng.randint(1, 10)) if rng.random() < 0.5 else (),
        ))
    offered = [
        make_job(f"new-{i}", seq=100 + i, gpus=rng.choice((1, 2, 4)) if total >= 4 else 1,
                 kind=rng.choice(("BE", "TE")), user=rng.choice(("alice", "bob")), submit=NOW - i,
                 duration=rng.choice((None, 600.0)), held=True)
        for i in range(rng.randint(0, 4))
    ]
    return Scenario(f"random-{seed}", _admit(jobs, cluster), cluster, offered=offered)


BUILDERS: dict[str, Callable[[], Scenario]] = {
    "waiting-only": waiting_only,
    "mixed-2x4": mixed,
    "full-4x2-te": full_with_te,
    "elastic-links": elastic_links,
    "two-switches": two_switches,
    "heterogeneous": heterogeneous,
    "goodput-jobs": goodput_jobs,
    **{f"random-{seed}": functools.partial(random_scenario, seed) for seed in range(6)},
}
"""Scenario name -> a function that builds it fresh (each test gets its own objects)."""
