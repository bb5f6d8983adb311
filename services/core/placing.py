"""The placement walk shared by placement policies: follow the ranking, fill free GPUs, preempt.

Blox's placement (its ``placement/placement.py``) walks the ranked jobs in order: a running job
keeps its GPUs; a waiting job takes free GPUs if its placement rule finds some, and otherwise
suspends running jobs from the *bottom* of the ranking, one at a time, until it fits; the first job
that cannot be placed ends the round. ``place_in_order`` implements that walk once, so a placement
policy only supplies its ``fit`` rule (which free GPUs a job of ``need`` GPUs should take). Two
corrections over Blox: victims suspended for a job that still does not fit are given back (Blox
leaves them suspended), and victims whose GPUs the job did not use keep running.

Cost: the walk reads ``Ranking.order`` lazily and stops as soon as nothing further can change (no
free GPU left and every running job seen, or the first blocked job in strict mode), so a round
costs time proportional to the jobs looked at, not to the queue. With ``Ranking.preempt`` False it
reads only ``Ranking.waiting``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from services.core.decisions import Placement, Plan, Ranking
from services.core.state import ClusterState, JobState

FreeMap = dict[int, set[int]]
"""Free GPUs by node position (``ClusterState.node_ids`` index); nodes without free GPUs absent."""

Fit = Callable[[JobState, int, FreeMap, ClusterState], "tuple[int, ...] | None"]
"""``fit(job, need, free, cluster)``: the GPUs (from ``free``) a job needing ``need`` GPUs should
take, or None if this rule finds no acceptable placement. Must not mutate ``free``."""


class _Walk:
    """Scratch state of one placement walk."""

    __slots__ = ("cluster", "free", "free_total")

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.free: FreeMap = cluster.free_by_node()
        self.free_total = cluster.free_gpu_count

    def take(self, gpus: tuple[int, ...]) -> None:
        free = self.free
        node_of = self.cluster.node_position_of_gpu
        for g in gpus:
            node = node_of(g)
            bucket = free[node]
            bucket.remove(g)
            if not bucket:
                del free[node]
        self.free_total -= len(gpus)

    def give(self, gpus: tuple[int, ...]) -> None:
        free = self.free
        node_of = self.cluster.node_position_of_gpu
        for g in gpus:
            free.setdefault(node_of(g), set()).add(g)
        self.free_total += len(gpus)

    def all_free(self, gpus: tuple[int, ...]) -> bool:
        free = self.free
        node_of = self.cluster.node_position_of_gpu
        return all(g in free.get(node_of(g), ()) for g in gpus)


def place_in_order(
    ranking: Ranking,
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    fit: Fit,
    *,
    backfill: bool = False,
) -> Placement:
    """Walk ``ranking`` and place jobs with ``fit``; see the module docstring for the rules.

    ``backfill`` lets lower-ranked jobs use GPUs that a blocked higher-ranked job cannot use (the
    walk then continues past a blocked job; without it the first blocked job ends the round, as in
    Blox). Backfilling may read deep into the queue while a few GPUs stay free, so it costs more.
    """
    walk = _Walk(cluster)
    launch: dict[str, tuple[int, ...]] = {}
    suspended: dict[str, None] = {}  # insertion-ordered set
    terminate = ranking.terminate
    targets = ranking.gpu_targets
    for job_id in terminate:
        job = jobs.get(job_id)
        if job is not None and job.is_running:
            walk.give(job.gpus)

    def try_fit(job: JobState, need: int) -> tuple[int, ...] | None:
        if need > walk.free_total:
            return None
        return fit(job, need, walk.free, cluster)

    if not ranking.preempt and not targets:
        waiting = ranking.waiting
        if waiting is None:
            waiting = [j for j in ranking.order if not jobs[j].is_running]
        for job_id in waiting:
            if walk.free_total <= 0:
                break
            if job_id in terminate:
                continue
            job = jobs[job_id]
            gpus = try_fit(job, job.spec.gpus)
            if gpus is None:
                if backfill:
                    continue
                break
            walk.take(gpus)
            launch[job_id] = gpus
        return _result(ranking, jobs, launch, suspended)

    if ranking.key is not None and ranking.running is not None and ranking.waiting is not None and not targets:
        _two_pointer(
            ranking=ranking, jobs=jobs, walk=walk, try_fit=try_fit, launch=launch, suspended=suspended,
            backfill=backfill,
        )
        return _result(ranking, jobs, launch, suspended)

    running: Sequence[str] = ranking.running if ranking.running is not None else [
        j for j in ranking.order if jobs[j].is_running
    ]
    # Unseen running jobs are running[seen:]; victims come from the end (lowest-ranked first).
    position = {job_id: i for i, job_id in enumerate(running)}
    seen = 0
    low = len(running)
    remaining = len(running) - sum(1 for j in terminate if j in position)

    for job_id in ranking.order:
        if walk.free_total <= 0 and remaining <= 0:
            break
        if job_id in terminate:
            if job_id in position:
                seen += 1
            continue
        job = jobs[job_id]
        if job.is_running:
            seen += 1
            if job_id in suspended:
                continue
            remaining -= 1
            target = targets.get(job_id)
            if target is None or target == len(job.gpus):
                continue
            # Elastic resize: give the GPUs back and place the job again with its new count.
            walk.give(job.gpus)
            gpus = try_fit(job, target)
            if gpus is None:
                suspended[job_id] = None
                continue
            walk.take(gpus)
            if tuple(sorted(gpus)) != tuple(sorted(job.gpus)):
                suspended[job_id] = None
                launch[job_id] = gpus
            continue
        need = targets.get(job_id, job.spec.gpus)
        gpus = try_fit(job, need)
        if gpus is None and ranking.preempt:
            taken: list[int] = []
            low_before = low
            while low > seen and gpus is None:
                low -= 1
                victim_id = running[low]
                if victim_id in suspended or victim_id in terminate:
                    continue
                victim = jobs[victim_id]
                walk.give(victim.gpus)
                suspended[victim_id] = None
                remaining -= 1
                taken.append(low)
                gpus = try_fit(job, need)
            if gpus is None:
                for index in taken:  # nothing gained: every victim keeps running
                    _restore(walk, jobs[running[index]], suspended)
                remaining += len(taken)
                low = low_before
            else:
                walk.take(gpus)
                launch[job_id] = gpus
                for index in reversed(taken):  # highest-ranked victim first
                    victim = jobs[running[index]]
                    if walk.all_free(victim.gpus):
                        _restore(walk, victim, suspended)
                        remaining += 1
                        low = max(low, index + 1)
                continue
        if gpus is None:
            if backfill:
                continue
            break
        walk.take(gpus)
        launch[job_id] = gpus
    return _result(ranking, jobs, launch, suspended)


def _two_pointer(
    *,
    ranking: Ranking,
    jobs: Mapping[str, JobState],
    walk: _Walk,
    try_fit: Callable[[JobState, int], tuple[int, ...] | None],
    launch: dict[str, tuple[int, ...]],
    suspended: dict[str, None],
    backfill: bool,
) -> None:
    """The same walk, driven by waiting jobs (upwards) and victims (downwards) with ``ranking.key``.

    Running jobs that keep their GPUs are never visited: a waiting job may only displace running jobs
    ranked below it, which are exactly the victims whose key is larger than its own.
    """
    key = ranking.key
    assert key is not None
    assert ranking.running is not None
    assert ranking.waiting is not None
    terminate = ranking.terminate
    victims = reversed(ranking.running)
    returned: list[str] = []  # victims given back, lowest-ranked last (a stack)

    def peek() -> str | None:
        while True:
            if returned:
                return returned[-1]
            victim_id = next(victims, None)
            if victim_id is None:
                return None
            if victim_id not in terminate:
                returned.append(victim_id)

    for job_id in ranking.waiting:
        if job_id in terminate:
            continue
        rank = key(job_id)
        if walk.free_total <= 0:
            victim_id = peek()
            if victim_id is None or not ranking.preempt or not key(victim_id) > rank:
                break
        job = jobs[job_id]
        gpus = try_fit(job, job.spec.gpus)
        if gpus is None and ranking.preempt:
            taken: list[str] = []
            while True:
                victim_id = peek()
                if victim_id is None or not key(victim_id) > rank:
                    break
                returned.pop()
                victim = jobs[victim_id]
                walk.give(victim.gpus)
                suspended[victim_id] = None
                taken.append(victim_id)
                gpus = try_fit(job, job.spec.gpus)
                if gpus is not None:
                    break
            if gpus is None:
                for victim_id in reversed(taken):
                    _restore(walk, jobs[victim_id], suspended)
                    returned.append(victim_id)
            else:
                walk.take(gpus)
                launch[job_id] = gpus
                for victim_id in reversed(taken):  # highest-ranked victim first
                    victim = jobs[victim_id]
                    if walk.all_free(victim.gpus):  # its GPUs were not needed after all
                        _restore(walk, victim, suspended)
                        returned.append(victim_id)
                continue
        if gpus is None:
            if backfill:
                continue
            break
        walk.take(gpus)
        launch[job_id] = gpus


def _restore(walk: _Walk, victim: JobState, suspended: dict[str, None]) -> None:
    walk.take(victim.gpus)
    del suspended[victim.job_id]


def _result(
    ranking: Ranking,
    jobs: Mapping[str, JobState],
    launch: dict[str, tuple[int, ...]],
    suspended: dict[str, None],
) -> Placement:
    plan = Plan(launch=launch, suspend=tuple(suspended), terminate=dict(ranking.terminate))
    return Placement(allocation=_Allocation(ranking, jobs, launch, suspended), plan=plan)


class _Allocation(Mapping[str, tuple[int, ...]]):
    """The target allocation as a view: running jobs that keep their GPUs, plus the launches."""

    def __init__(
        self,
        ranking: Ranking,
        jobs: Mapping[str, JobState],
        launch: Mapping[str, tuple[int, ...]],
        suspended: Mapping[str, None],
    ) -> None:
        self._ranking = ranking
        self._jobs = jobs
        self._launch = launch
        self._gone = set(suspended) | set(ranking.terminate)

    def __getitem__(self, job_id: str) -> tuple[int, ...]:
        gpus = self._launch.get(job_id)
        if gpus is not None:
            return gpus
        job = self._jobs.get(job_id)
        if job is None or not job.is_running or job_id in self._gone:
            raise KeyError(job_id)
        return job.gpus

    def _kept(self) -> Iterator[str]:
        running = self._ranking.running
        if running is None:
            running = [j for j in self._ranking.order if self._jobs[j].is_running]
        return (j for j in running if j not in self._gone and j not in self._launch)

    def __iter__(self) -> Iterator[str]:
        yield from self._kept()
        yield from self._launch

    def __len__(self) -> int:
        return sum(1 for _ in self._kept()) + len(self._launch)


def nodes_by_position(free: FreeMap) -> list[int]:
    """Node positions with free GPUs, in cluster order."""
    return sorted(free)
