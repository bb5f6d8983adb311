"""The placement walk's fast victim search and free-GPU index against the walk as first written.

``reference_place`` below is ``services.core.placing.place_in_order`` before the per-node victim
search (kept here, not in the source, as the specification): it suspends victims one at a time and
calls ``fit`` after each, on a plain ``{node: set of free GPUs}`` map. On random clusters, rankings
(plain and incremental), GPU targets, terminations and every placement rule that uses the walk, the
new walk must give the same launches, the same suspensions in the same order, and the same
allocation. The ``single_node`` promises and the ``FreeIndex`` queries are checked directly too.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence

import pytest

from services.core.decisions import Ranking
from services.core.ordering import KeyedOrder
from services.core.placing import Fit, FreeIndex, FreeMap, PlacementError, SingleNode, place_in_order
from services.core.state import ClusterState, Gpu, JobState, JobStatus, Node
from services.placement.policies.bandwidth_aware import BandwidthAwarePlacement
from services.placement.policies.consolidated import consolidated_fit, consolidated_single_node
from services.placement.policies.first_free import first_free_fit, first_free_single_node
from services.placement.policies.tiresias_skew import TiresiasSkewPlacement, spread
from services.placement.policies.yarn import yarn_fit
from services.scheduler.policies.fifo import Fifo
from services.scheduler.policies.las import Las
from tests.unit.policies.builders import job

NOW = 1000.0


# --- the reference: the walk as first written ------------------------------------------------------
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


def reference_place(
    ranking: Ranking,
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    fit: Fit,
    *,
    backfill: bool = False,
) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
    """The walk as first written: one ``fit`` call after each victim (see the module docstring).

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
        return launch, tuple(suspended)

    if ranking.key is not None and ranking.running is not None and ranking.waiting is not None and not targets:
        _two_pointer(
            ranking=ranking, jobs=jobs, walk=walk, try_fit=try_fit, launch=launch, suspended=suspended,
            backfill=backfill,
        )
        return launch, tuple(suspended)

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
                for index in reversed(taken[:-1]):  # spare what it fits without, highest-ranked first
                    victim = jobs[running[index]]
                    walk.take(victim.gpus)
                    if try_fit(job, need) is None:
                        walk.give(victim.gpus)
                    else:
                        del suspended[victim.job_id]
                        remaining += 1
                        low = max(low, index + 1)
                        taken.remove(index)
                gpus = try_fit(job, need)
                assert gpus is not None
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
    return launch, tuple(suspended)


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
                # The victims it also fits without keep running (highest-ranked first, the last
                # one suspended excepted); they go back on the stack in their order.
                for victim_id in reversed(taken[:-1]):
                    victim = jobs[victim_id]
                    walk.take(victim.gpus)
                    if try_fit(job, job.spec.gpus) is None:
                        walk.give(victim.gpus)
                    else:
                        del suspended[victim_id]
                gpus = try_fit(job, job.spec.gpus)
                assert gpus is not None
                walk.take(gpus)
                launch[job_id] = gpus
                for victim_id in reversed(taken):  # highest-ranked victim first
                    victim = jobs[victim_id]
                    if victim_id in suspended and walk.all_free(victim.gpus):  # GPUs not needed after all
                        _restore(walk, victim, suspended)
                    if victim_id not in suspended:
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



# --- random cases ----------------------------------------------------------------------------------
MODELS = ("vgg16", "resnet50", None)


def _cluster(rng: random.Random) -> ClusterState:
    """Uniform or mixed node sizes; some nodes with intra-node link bandwidths."""
    sizes = [rng.choice((2, 4, 8))] * rng.randint(2, 6) if rng.random() < 0.5 else [
        rng.choice((2, 4, 8)) for _ in range(rng.randint(2, 6))
    ]
    nodes: list[Node] = []
    gpus: list[Gpu] = []
    for n, size in enumerate(sizes):
        ids = tuple(range(len(gpus), len(gpus) + size))
        links = {(i, j): float(rng.choice((10, 25, 50))) for i in range(size) for j in range(i + 1, size)
                 if rng.random() < 0.5} if rng.random() < 0.3 else {}
        nodes.append(Node(f"n{n}", ids, link_bandwidth_gbps=links))
        gpus.extend(Gpu(g, f"n{n}", i) for i, g in enumerate(ids))
    return ClusterState(nodes, gpus)


def _scenario(seed: int) -> tuple[dict[str, JobState], ClusterState]:
    rng = random.Random(seed)
    cluster = _cluster(rng)
    largest = cluster.largest_node_gpus
    free = list(range(cluster.total_gpus))
    jobs: dict[str, JobState] = {}
    for i in range(rng.randint(4, 40)):
        gpus = rng.choice((1, 1, 1, 2, 2, 3, 4, 8, largest, largest + 2))
        state = job(f"j{i}", gpus=gpus, submit=float(rng.randint(0, 9)), seq=i, model=rng.choice(MODELS),
                    service=float(rng.choice((0, 50, 100, 300, 1200, 5000))))
        if rng.random() < 0.6 and len(free) >= gpus:
            if rng.random() < 0.7:  # mostly packed on a node, sometimes scattered
                start = rng.randrange(len(free) - gpus + 1)
                held = free[start:start + gpus]
            else:
                held = rng.sample(free, gpus)
            for g in held:
                free.remove(g)
            state.gpus = tuple(sorted(held))
            state.status = JobStatus.RUNNING
            cluster.assign(state.job_id, state.gpus)
        else:
            state.queued_since = float(rng.randint(0, 900))
        jobs[state.job_id] = state
    return jobs, cluster


def _line(state: JobState) -> tuple[float, float]:
    return state.attained_service - len(state.gpus) * NOW, NOW - 1.0


def _rankings(seed: int, jobs: dict[str, JobState], cluster: ClusterState) -> Iterator[tuple[str, Ranking]]:
    rng = random.Random(seed * 7 + 1)
    terminate = {j: "converged" for j in jobs if rng.random() < 0.08}
    for policy in (Las(), Fifo()):
        plain = policy.rank(jobs, cluster, NOW)
        yield f"{policy.name}-plain", Ranking(order=plain.order, preempt=True, terminate=terminate)
        yield f"{policy.name}-plain-nonpreemptive", Ranking(order=plain.order, preempt=False)
        keyed = KeyedOrder(policy, service_line=_line)
        for state in jobs.values():
            if state.is_running:
                keyed.mark_running(state)
            else:
                keyed.push(state, NOW)
        lazy = keyed.ranking(jobs, NOW)
        yield f"{policy.name}-keyed", Ranking(order=lazy.order, preempt=True, running=lazy.running,
                                              waiting=lazy.waiting, key=lazy.key, terminate=terminate)
    targets = {j: rng.choice((1, 2, 4)) for j in jobs if rng.random() < 0.15}
    yield "las-targets", Ranking(order=Las().rank(jobs, cluster, NOW).order, terminate=terminate, gpu_targets=targets)


def _skew_rule(policy: TiresiasSkewPlacement) -> tuple[Fit, SingleNode]:
    def fit(state: JobState, need: int, free: FreeMap, c: ClusterState) -> tuple[int, ...] | None:
        return consolidated_fit(state, need, free, c) if policy.is_sensitive(state) else spread(free, need)

    def single_node(state: JobState, need: int, c: ClusterState) -> bool:
        return need <= c.largest_node_gpus and policy.is_sensitive(state)

    return fit, single_node


def _rules() -> Iterator[tuple[str, Fit, SingleNode | None]]:
    yield "consolidated", consolidated_fit, consolidated_single_node
    yield "first-free", first_free_fit, first_free_single_node
    yield "consolidated-no-promise", consolidated_fit, None
    yield "yarn", yarn_fit, None
    skew = TiresiasSkewPlacement()
    yield "tiresias-skew", *_skew_rule(skew)
    bandwidth = BandwidthAwarePlacement()
    yield "bandwidth-aware", bandwidth.fit, bandwidth.single_node


def _expected_allocation(jobs: Mapping[str, JobState], ranking: Ranking, launch: Mapping[str, tuple[int, ...]],
                         suspend: Sequence[str]) -> dict[str, tuple[int, ...]]:
    kept = {j: s.gpus for j, s in jobs.items() if s.is_running and j not in suspend and j not in ranking.terminate}
    return {j: tuple(sorted(g)) for j, g in {**kept, **launch}.items()}


@pytest.mark.parametrize("backfill", [False, True], ids=["strict", "backfill"])
@pytest.mark.parametrize("seed", range(60))
def test_walk_equals_the_reference_walk(seed: int, backfill: bool) -> None:
    jobs, cluster = _scenario(seed)
    for label, ranking in _rankings(seed, jobs, cluster):
        for name, fit, single_node in _rules():
            launch, suspend = reference_place(ranking, jobs, cluster, fit, backfill=backfill)
            placement = place_in_order(ranking, jobs, cluster, fit, backfill=backfill, single_node=single_node)
            assert placement.plan is not None
            where = f"{label}/{name}"
            assert dict(placement.plan.launch) == launch, where
            assert tuple(placement.plan.suspend) == suspend, where
            got = {j: tuple(sorted(g)) for j, g in placement.allocation.items()}
            assert got == _expected_allocation(jobs, ranking, launch, suspend), where


@pytest.mark.parametrize("seed", range(10))
def test_policies_place_like_the_reference(seed: int) -> None:
    """The registered policies (their own closures and hooks) against the reference walk."""
    jobs, cluster = _scenario(seed + 100)
    ranking = Las().rank(jobs, cluster, NOW)
    skew = TiresiasSkewPlacement()
    skew_fit, _ = _skew_rule(skew)
    bandwidth = BandwidthAwarePlacement()
    for policy, fit in ((skew, skew_fit), (bandwidth, bandwidth.fit)):
        launch, suspend = reference_place(ranking, jobs, cluster, fit, backfill=policy.backfill)
        placement = policy.place(ranking, jobs, cluster, NOW)
        assert placement.plan is not None
        assert dict(placement.plan.launch) == launch
        assert tuple(placement.plan.suspend) == suspend


def _random_free(rng: random.Random, cluster: ClusterState) -> None:
    for g in range(cluster.total_gpus):
        if rng.random() < 0.55:
            cluster.assign(f"x{g}", (g,))


@pytest.mark.parametrize("seed", range(40))
def test_single_node_promises_hold(seed: int) -> None:
    """``single_node`` True: fit succeeds iff a node has ``need`` free and uses one such node;
    False: fit succeeds iff ``need`` GPUs are free. Checked on plain maps and on the index."""
    rng = random.Random(seed)
    cluster = _cluster(rng)
    _random_free(rng, cluster)
    plain = cluster.free_by_node()
    index = FreeIndex(cluster)
    for name, fit, single_node in _rules():
        if single_node is None:
            continue
        for need in range(1, cluster.total_gpus + 1):
            for model in MODELS:
                state = job("probe", gpus=need, model=model)
                got = fit(state, need, plain, cluster)
                assert fit(state, need, index, cluster) == got, name
                if single_node(state, need, cluster):
                    assert (got is not None) == any(len(g) >= need for g in plain.values()), name
                    if got is not None:
                        nodes = {cluster.node_position_of_gpu(g) for g in got}
                        assert len(nodes) == 1, name
                        assert len(plain[nodes.pop()]) >= need, name
                else:
                    assert (got is not None) == (need <= cluster.free_gpu_count), name


@pytest.mark.parametrize("seed", range(20))
def test_free_index_answers_like_a_scan(seed: int) -> None:
    rng = random.Random(seed)
    cluster = _cluster(rng)
    _random_free(rng, cluster)
    index = FreeIndex(cluster)
    shadow = cluster.free_by_node()
    held: list[tuple[int, ...]] = []
    for _ in range(200):
        if held and rng.random() < 0.5:
            gpus = held.pop(rng.randrange(len(held)))
            index.give(gpus)
            for g in gpus:
                shadow.setdefault(cluster.node_position_of_gpu(g), set()).add(g)
        else:
            pool = sorted(g for free in shadow.values() for g in free)
            if not pool:
                continue
            gpus = tuple(rng.sample(pool, rng.randint(1, min(4, len(pool)))))
            assert index.all_free(gpus)
            index.take(gpus)
            held.append(gpus)
            for g in gpus:
                node = cluster.node_position_of_gpu(g)
                shadow[node].discard(g)
                if not shadow[node]:
                    del shadow[node]
        assert dict(index) == shadow
        assert index.total == sum(len(f) for f in shadow.values())
        assert list(index.in_order()) == sorted(shadow)
        assert list(index.fewest_first()) == sorted(shadow, key=lambda n: (len(shadow[n]), n))
        assert list(index.most_first()) == sorted(shadow, key=lambda n: (-len(shadow[n]), n))
        assert index.most_free() == max((len(f) for f in shadow.values()), default=0)
        for need in range(1, cluster.largest_node_gpus + 2):
            fits = [(len(f), n) for n, f in shadow.items() if len(f) >= need]
            assert index.best_fit(need) == (min(fits)[1] if fits else None)


def test_a_broken_single_node_promise_is_reported() -> None:
    cluster = ClusterState.uniform(2, 2)
    cluster.assign("low", (0,))
    cluster.assign("other", (2,))
    low = job("low", gpus=1, on=(0,), service=500.0, seq=1)
    other = job("other", gpus=1, on=(2,), service=400.0, seq=2)
    new = job("new", gpus=2, seq=3)
    jobs = {"low": low, "other": other, "new": new}

    def never(state: JobState, need: int, free: FreeMap, c: ClusterState) -> tuple[int, ...] | None:
        return None

    def always_one_node(state: JobState, need: int, c: ClusterState) -> bool:
        return True

    ranking = Las().rank(jobs, cluster, NOW)
    with pytest.raises(PlacementError, match="single_node promise"):
        place_in_order(ranking, jobs, cluster, never, single_node=always_one_node)
    # Without the promise the same rule simply finds nothing: every victim keeps running.
    placement = place_in_order(ranking, jobs, cluster, never)
    assert placement.plan is not None
    assert placement.plan.suspend == ()
    assert dict(placement.plan.launch) == {}



@pytest.mark.parametrize("rule", list(_rules())[:3], ids=lambda r: r[0])
def test_a_victim_the_job_fits_without_keeps_running(rule: tuple[str, Fit, SingleNode | None]) -> None:
    # One 12-GPU node, full: "high" (8 GPUs, 4-11) ranks above "low" (4 GPUs, 0-3). "new" (8 GPUs)
    # ranks above both and does not fit until both are suspended (4 free, then 12). Fits take the
    # lowest free GPUs, 0-7, which would leave 8-11 free for "last", ranked below "low": two jobs
    # suspended where one was needed. "low" is spared: "new" fits in 4-11 alone.
    _, fit, single_node = rule
    cluster = ClusterState([Node("n0", tuple(range(12)))], [Gpu(g, "n0", g) for g in range(12)])
    high = job("high", gpus=8, on=range(4, 12), seq=1)
    low = job("low", gpus=4, on=range(4), seq=2)
    cluster.assign("high", high.gpus)
    cluster.assign("low", low.gpus)
    jobs = {j.job_id: j for j in (job("new", gpus=8, seq=0), high, low, job("last", gpus=4, seq=3))}
    ranking = Ranking(order=("new", "high", "low", "last"), preempt=True)

    placement = place_in_order(ranking, jobs, cluster, fit, single_node=single_node)

    assert placement.plan is not None
    assert placement.plan.suspend == ("high",)
    assert {j: tuple(sorted(g)) for j, g in placement.plan.launch.items()} == {"new": tuple(range(4, 12))}
    assert reference_place(ranking, jobs, cluster, fit) == (dict(placement.plan.launch), ("high",))
