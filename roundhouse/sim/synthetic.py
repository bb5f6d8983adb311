"""Synthetic workload generators, each seeded per random stream.

Every quantity (arrivals, durations, GPU counts, models, classes, grace periods) draws from its own
``random.Random`` seeded with ``"<seed>:<stream>"``, so adding a stream, or drawing one more value
from one, never shifts the others: the same seed gives the same arrivals whatever else changes.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path

from schemas.job import JobClass
from services.core.simulation.workload import TraceJob, WorkloadError

BLOX_MODELS: tuple[str, ...] = ("resnet18", "cyclegan", "resnet50", "lstm", "recoder", "transformer", "a3c")
"""Blox Table 2: the models Blox assigns at random to Philly-trace jobs."""

GAVEL_GPU_COUNTS: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
"""Blox's ``get_job_gpu_demand`` (after Gavel): P(1)=0.7, P(2)=0.1, P(4)=0.15, P(8)=0.05."""


def stream(seed: int, name: str) -> random.Random:
    """An independent generator for one named stream of one seed (stable across Python runs)."""
    return random.Random(f"{seed}:{name}")


def poisson_gap_s(rng: random.Random, jobs_per_hour: float) -> float:
    """Blox's ``poisson_next_arrival_time``: an exponential inter-arrival in hours, rounded up to a
    whole second."""
    return math.ceil(-math.log(1.0 - rng.random()) / jobs_per_hour * 3600.0)


def philly_duration_s(rng: random.Random) -> float:
    """Blox's ``get_gavel_like_iter``: ``60 * 10**U(1.5, 3)`` s w.p. 0.8, else ``60 * 10**U(3, 4)`` s."""
    if rng.random() >= 0.8:
        return 60.0 * 10 ** rng.uniform(3.0, 4.0)
    return 60.0 * 10 ** rng.uniform(1.5, 3.0)


class GpuCounts:
    """A discrete distribution of GPUs per job, sampled by inverse CDF."""

    def __init__(self, weights: Sequence[tuple[int, float]], label: str) -> None:
        total = sum(w for _, w in weights)
        if not weights or total <= 0:
            raise WorkloadError(f"GPU count distribution {label!r} is empty")
        self.label = label
        self.values = [v for v, _ in weights]
        acc = 0.0
        self.cdf: list[float] = []
        for _, w in weights:
            acc += w / total
            self.cdf.append(acc)
        self.cdf[-1] = 1.0
        self.mean = sum(v * w for v, w in weights) / total

    def sample(self, rng: random.Random) -> int:
        u = rng.random()
        for value, edge in zip(self.values, self.cdf, strict=True):
            if u < edge:
                return value
        return self.values[-1]

    @classmethod
    def single(cls) -> GpuCounts:
        return cls(((1, 1.0),), "1")

    @classmethod
    def gavel(cls) -> GpuCounts:
        return cls(GAVEL_GPU_COUNTS, "gavel")

    @classmethod
    def from_philly(cls, trace: Path) -> GpuCounts:
        """The empirical ``num_gpus`` distribution of ``philly-pollux.csv``."""
        from roundhouse.sim.traces import read_philly_gpu_counts

        counts = Counter(read_philly_gpu_counts(trace))
        return cls(sorted((g, float(n)) for g, n in counts.items()), "philly")


@dataclass(frozen=True, slots=True)
class PhillySynthetic:
    """Blox's Philly-derived synthetic workload (Blox §4, "Philly-Trace"; its ``jobs/workload.py``).

    * arrivals: Poisson at ``jobs_per_hour``; inter-arrival ``ceil(-ln(1-U) / lambda)`` hours, in
      whole seconds, as Blox's ``poisson_next_arrival_time`` computes it; the first job arrives one
      inter-arrival after t=0;
    * durations (Blox ``get_gavel_like_iter``, after Gavel): with probability 0.8,
      ``60 * 10**U(1.5, 3)`` s, else ``60 * 10**U(3, 4)`` s;
    * GPUs: 1 per job (Blox's default), or drawn from the Philly trace's GPU counts, or Gavel's
      {1, 2, 4, 8} distribution;
    * model: uniform over Blox Table 2; class: BE; user: ``default``;
    * rigid, unless ``elastic_max_gpus`` is set: then every job may use up to that many GPUs (its
      ``max_gpus``; a job that asks for more stays rigid), which Optimus' marginal-gain extras and
      Gandiva's grow-shrink use (Blox's Optimus hands free GPUs to every job). Draws nothing: the
      same seed gives the same jobs either way.

    Infinite unless ``num_jobs`` is set: the simulator stops once the tracked jobs are done.
    """

    jobs_per_hour: float
    seed: int = 0
    gpu_counts: GpuCounts | None = None
    num_jobs: int | None = None
    elastic_max_gpus: int | None = None

    def __post_init__(self) -> None:
        if not self.jobs_per_hour > 0:
            raise WorkloadError(f"jobs per hour must be positive, got {self.jobs_per_hour}")
        if self.elastic_max_gpus is not None and self.elastic_max_gpus < 1:
            raise WorkloadError(f"elastic jobs need at most >= 1 GPU, got {self.elastic_max_gpus}")

    def __iter__(self) -> Iterator[TraceJob]:
        arrivals = stream(self.seed, "arrivals")
        durations = stream(self.seed, "durations")
        gpus_rng = stream(self.seed, "gpus")
        models = stream(self.seed, "models")
        counts = self.gpu_counts or GpuCounts.single()
        rate = self.jobs_per_hour
        now = 0.0
        indexes = count() if self.num_jobs is None else iter(range(self.num_jobs))
        elastic = self.elastic_max_gpus
        for index in indexes:
            now += poisson_gap_s(arrivals, rate)
            duration = philly_duration_s(durations)
            gpus = counts.sample(gpus_rng)
            yield TraceJob(
                index=index,
                arrival_s=now,
                gpus=gpus,
                duration_s=duration,
                model=models.choice(BLOX_MODELS),
                max_gpus=elastic if elastic is not None and elastic > gpus else None,
            )


def _truncated_normal(rng: random.Random, mean: float, sigma: float, low: float, high: float) -> float:
    """A normal draw restricted to [low, high] by rejection (FitGpp Appendix A's "truncated")."""
    for _ in range(10_000):
        x = rng.gauss(mean, sigma)
        if low <= x <= high:
            return x
    raise WorkloadError(f"cannot draw from N({mean}, {sigma}) truncated to [{low}, {high}]")


@dataclass(frozen=True, slots=True)
class ClassShape:
    """Truncated-normal shape of one FitGpp job class (Appendix A fits one normal per quantity)."""

    duration_mean_s: float
    duration_sigma_s: float
    duration_max_s: float
    gpus_mean: float
    gpus_sigma: float
    cpus_mean: float
    cpus_sigma: float
    memory_mean_gb: float
    memory_sigma_gb: float


FITGPP_TE = ClassShape(300.0, 600.0, 1800.0, 1.0, 1.0, 4.0, 4.0, 32.0, 32.0)
FITGPP_BE = ClassShape(1800.0, 3.0 * 3600.0, 24 * 3600.0, 2.0, 2.0, 8.0, 8.0, 64.0, 64.0)

FITGPP_ARRIVALS: tuple[str, ...] = ("offered", "fifo")
"""How ``FitGppSynthetic`` reads "load 2.0": Poisson at offered load, or kept at that load under FIFO."""


@dataclass(frozen=True, slots=True)
class FitGppSynthetic:
    """FitGpp's synthetic workload (FitGpp §3 and Appendix A).

    From the paper: 30% TE jobs; execution times, CPUs, RAM and GPUs each fitted "with separate
    normal distributions" per class and drawn from truncated versions; execution-time means 5 min
    (TE) and 30 min (BE), truncated at 30 min and 24 h; grace periods N(3 min, .) truncated at
    20 min; single-task (one-node) jobs on nodes of 32 CPUs, 256 GB RAM and 8 GPUs; jobs "submitted
    at such a rate that the cluster load would be kept at 2.0 if they were scheduled by FIFO".

    The paper publishes neither the spreads nor the CPU/RAM/GPU fits (its Fig. 2 is not in the
    text), so these are Roundhouse's assumptions, fixed before any run and not tuned to results:

    * durations: sigma 10 min (TE) and 3 h (BE), lower truncation at 1 s;
    * GPUs: N(1, 1) (TE) and N(2, 2) (BE), rounded and truncated to [1, ``max_gpus``];
    * CPUs and RAM: drawn independently of the GPU count (the paper fits each quantity with its
      own normal), centred on the node's per-GPU share (32 CPUs / 8 GPUs = 4 CPUs and 32 GB per
      GPU) times the class's mean GPU count, sigma = mean: CPUs N(4, 4) (TE) and N(8, 8) (BE),
      rounded to whole cores in [1, ``node_cpus``]; RAM N(32, 32) GB (TE) and N(64, 64) GB (BE)
      in [1, ``node_memory_gb``] GB. Independent draws are what make the demand vector matter: a
      TE job may need more CPUs or RAM than one small BE job frees (Eq. 2's ``D_TE <= D_j + N``);
    * grace periods: sigma 1 min, lower truncation 5 s.

    Arrivals (``arrivals``), two readings of "load 2.0":

    * ``"offered"`` (the default): Poisson arrivals at ``load * total_gpus / E[gpus * duration]``,
      the expectation estimated from 20,000 draws of a dedicated stream. Above load 1 the queue
      grows without bound, so every waiting-time statistic grows with ``num_jobs``.
    * ``"fifo"`` (the FitGpp reproduction's reading: the load is *kept* at 2.0 under FIFO): the
      arrival times come from a reference FIFO run on the same cluster (``total_gpus //
      max_gpus`` nodes of ``max_gpus`` GPUs, ``node_cpus`` CPUs and ``node_memory_gb`` GB): at
      t = 0, and again after every completion, jobs are submitted until the GPUs demanded by the
      jobs in the system (running and queued) reach ``load`` times the cluster's GPUs. The
      reference FIFO starts the head of the queue on the node with the fewest free GPUs where its
      GPUs, CPUs and RAM fit (ties by node order) and blocks the queue when it does not fit, as
      Roundhouse's ``fifo`` ranking with the ``preempting`` placement does (no preemption), so
      that run sees the same load. Every policy then replays the same arrival times. With
      ``backfill=True`` (the greedy reading of "FIFO", as Kubernetes schedules) the reference run
      starts, after the head, every later queued job that fits, in queue order, like ``preempting``
      with ``backfill=True``; the arrival times then keep the load of *that* FIFO at ``load``.

    Every quantity draws from its own stream (durations and GPUs ``shapes``, CPUs and RAM
    ``demand``, ``classes``, ``grace``, ``arrivals``), so adding the CPU/RAM draws moved nothing else.
    """

    total_gpus: int
    load: float = 2.0
    num_jobs: int = 2**19
    te_fraction: float = 0.3
    max_gpus: int = 8
    seed: int = 0
    arrivals: str = "offered"
    node_cpus: float = 32.0
    node_memory_gb: float = 256.0
    backfill: bool = False
    """With ``arrivals="fifo"``: the reference FIFO backfills (starts later jobs that fit)."""

    def __post_init__(self) -> None:
        if not self.load > 0 or self.total_gpus < 1 or self.num_jobs < 1:
            raise WorkloadError("fitgpp-synthetic needs load > 0, total_gpus >= 1 and num_jobs >= 1")
        if self.arrivals not in FITGPP_ARRIVALS:
            raise WorkloadError(f"fitgpp-synthetic arrivals must be one of {FITGPP_ARRIVALS}, got {self.arrivals!r}")
        if self.node_cpus < 1 or self.node_memory_gb < 1:
            raise WorkloadError("fitgpp-synthetic nodes need at least 1 CPU and 1 GB of RAM")
        if self.arrivals == "fifo" and self.total_gpus % self.max_gpus:
            raise WorkloadError(
                f"arrivals='fifo' needs whole nodes: total_gpus {self.total_gpus} is not a multiple of {self.max_gpus}"
            )

    def _draw(self, rng: random.Random, te: bool) -> tuple[float, int]:
        shape = FITGPP_TE if te else FITGPP_BE
        duration = _truncated_normal(rng, shape.duration_mean_s, shape.duration_sigma_s, 1.0, shape.duration_max_s)
        gpus = round(_truncated_normal(rng, shape.gpus_mean, shape.gpus_sigma, 0.5, self.max_gpus + 0.49))
        return duration, max(1, min(self.max_gpus, gpus))

    def _demand(self, rng: random.Random, te: bool) -> tuple[float, float]:
        """(CPUs, RAM GB) of one job: whole cores, RAM in GB, both within one node."""
        shape = FITGPP_TE if te else FITGPP_BE
        top = math.floor(self.node_cpus)
        cpus = round(_truncated_normal(rng, shape.cpus_mean, shape.cpus_sigma, 0.5, top + 0.49))
        memory = _truncated_normal(rng, shape.memory_mean_gb, shape.memory_sigma_gb, 1.0, self.node_memory_gb)
        return float(max(1, min(top, cpus))), memory

    def mean_gpu_seconds(self) -> float:
        rng = stream(self.seed, "calibration")
        total = 0.0
        n = 20_000
        for _ in range(n):
            duration, gpus = self._draw(rng, rng.random() < self.te_fraction)
            total += duration * gpus
        return total / n

    def jobs(self) -> Iterator[TraceJob]:
        """The jobs in order with ``arrival_s`` = 0: everything but the arrival process."""
        classes = stream(self.seed, "classes")
        shapes = stream(self.seed, "shapes")
        demand = stream(self.seed, "demand")
        grace = stream(self.seed, "grace")
        for index in range(self.num_jobs):
            te = classes.random() < self.te_fraction
            duration, gpus = self._draw(shapes, te)
            cpus, memory = self._demand(demand, te)
            yield TraceJob(
                index=index,
                arrival_s=0.0,
                gpus=gpus,
                duration_s=duration,
                job_class=JobClass.TE if te else JobClass.BE,
                checkpoint_s=_truncated_normal(grace, 180.0, 60.0, 5.0, 1200.0),
                cpus=cpus,
                memory_gb=memory,
            )

    def __iter__(self) -> Iterator[TraceJob]:
        if self.arrivals == "fifo":
            yield from FifoLoadArrivals(
                nodes=self.total_gpus // self.max_gpus,
                node_gpus=self.max_gpus,
                node_cpus=self.node_cpus,
                node_memory_gb=self.node_memory_gb,
                load=self.load,
                backfill=self.backfill,
            ).timed(self.jobs())
            return
        rate_per_s = self.load * self.total_gpus / self.mean_gpu_seconds()
        arrivals = stream(self.seed, "arrivals")
        now = 0.0
        for job in self.jobs():
            now += arrivals.expovariate(rate_per_s)
            job.arrival_s = now
            yield job


@dataclass(frozen=True, slots=True)
class FifoLoadArrivals:
    """Arrival times that keep the GPU load of a FIFO cluster at ``load`` (FitGpp §3, Appendix A).

    A small FIFO simulation of its own (no policy objects, so it is fast and independent of the
    simulator): one queue, the head starts on the node with the fewest free GPUs where its GPUs,
    CPUs and RAM fit (ties by node order), else it blocks the queue; jobs run exactly their
    duration. A job is submitted at t = 0 or at a completion whenever the GPUs demanded by the jobs
    in the system are below ``load`` x the cluster's GPUs. ``backfill``: a job that does not fit
    blocks nobody; every later job that fits starts, in queue order (greedy FIFO).
    """

    nodes: int
    node_gpus: int
    node_cpus: float
    node_memory_gb: float
    load: float
    backfill: bool = False

    def timed(self, jobs: Iterable[TraceJob], finishes: dict[int, float] | None = None) -> Iterator[TraceJob]:
        """``jobs`` (in order) with their ``arrival_s`` set; the records are updated in place.

        ``finishes``, if given, receives every job's completion time in the reference FIFO run
        (by index; filled up to the last job once the stream is exhausted): a check that the
        simulator's FIFO run is the one whose load was kept."""
        n = self.nodes
        free_gpus = [self.node_gpus] * n
        free_cpus = [self.node_cpus] * n
        free_mem = [self.node_memory_gb] * n
        target = self.load * self.nodes * self.node_gpus
        queue: deque[TraceJob] = deque()
        running: list[tuple[float, int, int, TraceJob]] = []  # (finish, index, node, job)
        in_system = 0
        now = 0.0

        every_node = range(n)

        def best_node(job: TraceJob, candidates: Iterable[int] = every_node) -> int:
            """The node with the fewest free GPUs where ``job`` fits (ties by node order), or -1;
            ``candidates``: the nodes to look at, in node order."""
            g, c, m = job.gpus, job.cpus or 1.0, job.memory_gb or 4.0
            best = -1
            for node in candidates:
                have = free_gpus[node]
                if have < g or free_cpus[node] + 1e-9 < c or free_mem[node] + 1e-9 < m:
                    continue
                if best < 0 or have < free_gpus[best]:
                    best = node
            return best

        def start(job: TraceJob, node: int) -> None:
            free_gpus[node] -= job.gpus
            free_cpus[node] -= job.cpus or 1.0
            free_mem[node] -= job.memory_gb or 4.0
            heapq.heappush(running, (now + job.duration_s, job.index, node, job))

        def start_head() -> None:
            while queue:
                best = best_node(queue[0])
                if best < 0:
                    break
                start(queue.popleft(), best)
            if not self.backfill or not queue:
                return
            # Greedy FIFO: every later job that fits, in queue order (the head stays blocked).
            # Only nodes with a free GPU can take a job (every job needs one): usually a handful.
            open_nodes = [node for node in every_node if free_gpus[node]]
            if not open_nodes:
                return
            widest = max(free_gpus)
            kept: deque[TraceJob] = deque()
            while queue:
                job = queue.popleft()
                best = best_node(job, open_nodes) if job.gpus <= widest else -1
                if best < 0:
                    kept.append(job)
                    continue
                start(job, best)
                open_nodes = [node for node in open_nodes if free_gpus[node]]
                if not open_nodes:
                    break
                widest = max(free_gpus[node] for node in open_nodes)
            kept.extend(queue)
            queue.clear()
            queue.extend(kept)

        def next_completions() -> None:
            nonlocal now, in_system
            if not running:
                raise WorkloadError("the reference FIFO run is stuck: a queued job fits on no empty node")
            now = running[0][0]
            while running and running[0][0] <= now:
                _, index, node, done = heapq.heappop(running)
                free_gpus[node] += done.gpus
                free_cpus[node] += done.cpus or 1.0
                free_mem[node] += done.memory_gb or 4.0
                in_system -= done.gpus
                if finishes is not None:
                    finishes[index] = now
            start_head()

        for job in jobs:
            while in_system >= target:
                next_completions()
            job.arrival_s = now
            in_system += job.gpus
            queue.append(job)
            start_head()
            yield job
        while finishes is not None and (running or queue):
            next_completions()
