"""The placement walk shared by placement policies: follow the ranking, fill free GPUs, preempt.

Blox's placement (its ``placement/placement.py``) walks the ranked jobs in order: a running job
keeps its GPUs; a waiting job takes free GPUs if its placement rule finds some, and otherwise
suspends running jobs from the *bottom* of the ranking, one at a time, until it fits; the first job
that cannot be placed ends the round. ``place_in_order`` implements that walk once, so a placement
policy only supplies its ``fit`` rule (which free GPUs a job of ``need`` GPUs should take). Three
corrections over Blox: victims suspended for a job that still does not fit are given back (Blox
leaves them suspended); once it fits, every victim but the last that it also fits without keeps
running, highest-ranked first (else the fit may take a low victim's GPUs while a higher victim's
stay free for a job ranked below both: two suspended where one was needed); and victims whose
GPUs the job did not use keep running.

Cost: the walk reads ``Ranking.order`` lazily and stops as soon as nothing further can change (no
free GPU left and every running job seen, or the first blocked job in strict mode), so a round
costs time proportional to the jobs looked at, not to the queue. With ``Ranking.preempt`` False it
reads only ``Ranking.waiting``. Free GPUs live in a ``FreeIndex`` (nodes bucketed by free-GPU count),
so fits that know it never scan every node; and a fit that states its ``single_node`` promise is
called once per placed job: the victims a job needs are computed from per-node counts
(``_Victims``) instead of being suspended one by one with a ``fit`` call after each, which made a
heavy round (10^4 GPUs, 2x10^4 queued jobs) cost ~2x10^5 full scans. The result is the same;
``tests/unit/core/test_placing.py`` keeps the one-by-one walk as the reference.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from itertools import chain, repeat
from typing import Any

from services.core.decisions import Placement, Plan, Ranking
from services.core.state import ClusterState, JobState, JobStatus

FreeMap = dict[int, set[int]]
"""Free GPUs by node position (``ClusterState.node_ids`` index); nodes without free GPUs absent."""

Fit = Callable[[JobState, int, FreeMap, ClusterState], "tuple[int, ...] | None"]
"""``fit(job, need, free, cluster)``: the GPUs (from ``free``) a job needing ``need`` GPUs should
take, or None if this rule finds no acceptable placement. Must not mutate ``free``."""

SingleNode = Callable[[JobState, int, ClusterState], bool]
"""``single_node(job, need, cluster)``, the optional fast-path companion of a ``Fit`` (exact
promises about that fit, which tests check):

* True: ``fit`` finds GPUs iff some node has at least ``need`` free GPUs; it then takes them all
  from one such node, and which node and GPUs it picks depends only on the free GPUs of the nodes
  that have at least ``need`` free (a consolidating rule, for a job that fits on one node);
* False: ``fit`` finds GPUs iff at least ``need`` GPUs are free in all (a rule that may split).

With it, ``place_in_order`` calls ``fit`` only when it will succeed and finds the preemption
victims a job needs from per-node counts, instead of suspending victims one by one and calling
``fit`` after each (the result is the same; see ``_Victims``)."""


class PlacementError(RuntimeError):
    """A fit rule broke its ``single_node`` promise (a bug in the placement policy)."""


class FreeIndex(dict[int, set[int]]):
    """The ``FreeMap`` of a placement walk, with nodes also indexed by their number of free GPUs.

    It *is* the plain ``{node position: set of free GPU ids}`` map every ``Fit`` reads, so any fit
    works with it unchanged; fits that know it (``isinstance(free, FreeIndex)``) answer "the best-
    fitting node", "the nodes in cluster order" or "the nodes with the fewest free GPUs first" from
    the index, in time independent of the number of nodes with free GPUs, instead of scanning them.
    Only ``place_in_order`` mutates it (``take``/``give``); fits must treat it and every sequence it
    returns as read-only.
    """

    __slots__ = ("_buckets", "_gpu_node", "_nodes", "total", "watch")

    def __init__(self, cluster: ClusterState) -> None:
        # (map, not a list comprehension: in Python 3.11 that is a function call, and this runs every round)
        buckets: list[list[int]] = list(map(list, repeat((), cluster.largest_node_gpus + 1)))
        if cluster.free_gpu_count:
            super().__init__(cluster.free_by_node())
            nodes = list(self)  # ``free_by_node`` lists nodes in cluster order
            for node in nodes:
                buckets[len(self[node])].append(node)
        else:  # a full cluster (the usual state of a busy one): nothing to scan
            super().__init__()
            nodes = []
        self._gpu_node = cluster.gpu_node_positions
        self._nodes = nodes
        """Nodes with free GPUs, in cluster order."""
        self._buckets = buckets
        """``_buckets[c]``: nodes with exactly ``c`` free GPUs, in cluster order (``[0]`` unused)."""
        self.total: int = cluster.free_gpu_count
        """Free GPUs in all."""
        self.watch: set[int] | None = None
        """If set, every node whose free GPUs change is added to it (the victim search's cue)."""

    # --- queries (for fits) ---------------------------------------------------------------------
    def best_fit(self, need: int, skip: Container[int] = ()) -> int | None:
        """The node with the fewest free GPUs that still has ``need`` free (first in cluster order
        on ties), leaving out the nodes in ``skip``; None if there is none."""
        buckets = self._buckets
        for count in range(max(need, 1), len(buckets)):
            for node in buckets[count]:
                if node not in skip:
                    return node
        return None

    def most_free(self) -> int:
        """The largest number of free GPUs on one node (0 if none is free)."""
        buckets = self._buckets
        for count in range(len(buckets) - 1, 0, -1):
            if buckets[count]:
                return count
        return 0

    def in_order(self) -> Sequence[int]:
        """Nodes with free GPUs in cluster order (``sorted(free)``), without sorting."""
        return self._nodes

    def fewest_first(self) -> Iterator[int]:
        """Nodes with free GPUs by (free GPUs, position): ``sorted(free, key=lambda n: (len(free[n]), n))``."""
        for bucket in self._buckets[1:]:
            yield from bucket

    def most_first(self) -> Iterator[int]:
        """Nodes with free GPUs by (-free GPUs, position)."""
        for bucket in reversed(self._buckets[1:]):
            yield from bucket

    # --- mutation (the walk only) ---------------------------------------------------------------
    def take(self, gpus: Sequence[int]) -> None:
        gpu_node = self._gpu_node
        node = -1
        free: set[int] = set()
        count = 0
        for g in gpus:  # one index update per run of GPUs on the same node
            at = gpu_node[g]
            if at != node:
                if node >= 0:
                    self._moved(node, count, len(free))
                    if not free:
                        del self[node]
                node = at
                free = self[node]
                count = len(free)
            free.remove(g)
        if node >= 0:
            self._moved(node, count, len(free))
            if not free:
                del self[node]
        self.total -= len(gpus)

    def give(self, gpus: Sequence[int]) -> None:
        gpu_node = self._gpu_node
        node = -1
        free: set[int] = set()
        count = 0
        for g in gpus:
            at = gpu_node[g]
            if at != node:
                if node >= 0:
                    self._moved(node, count, len(free))
                node = at
                got = self.get(node)
                if got is None:
                    got = self[node] = set()
                free = got
                count = len(free)
            free.add(g)
        if node >= 0:
            self._moved(node, count, len(free))
        self.total += len(gpus)

    def all_free(self, gpus: Sequence[int]) -> bool:
        gpu_node = self._gpu_node
        for g in gpus:
            free = self.get(gpu_node[g])
            if free is None or g not in free:
                return False
        return True

    def _moved(self, node: int, old: int, new: int) -> None:
        if old == new:
            return
        if self.watch is not None:
            self.watch.add(node)
        buckets = self._buckets
        if old:
            bucket = buckets[old]
            del bucket[bisect_left(bucket, node)]
        else:
            insort(self._nodes, node)
        if new:
            insort(buckets[new], node)
        else:
            nodes = self._nodes
            del nodes[bisect_left(nodes, node)]


class _Fitter:
    """``fit`` guarded by the cheap conditions its ``single_node`` promise gives."""

    __slots__ = ("cluster", "fit", "free", "single_node")

    def __init__(self, fit: Fit, single_node: SingleNode | None, free: FreeIndex, cluster: ClusterState) -> None:
        self.fit = fit
        self.single_node = single_node
        self.free = free
        self.cluster = cluster

    def on_node(self, job: JobState, need: int) -> int:
        """GPUs the job needs free on one node (``need`` for a single-node rule), else 0."""
        single_node = self.single_node
        if single_node is not None and need > 1 and single_node(job, need, self.cluster):
            return need
        return 0

    def __call__(self, job: JobState, need: int, on_node: int) -> tuple[int, ...] | None:
        free = self.free
        if need > free.total or (on_node and free.most_free() < on_node):
            return None
        return self.fit(job, need, free, self.cluster)


_RUNNING = JobStatus.RUNNING
_NEVER = 1 << 62
"""A victim index larger than any: "no prefix of the victims is enough"."""


class _Victims:
    """The running jobs a walk may preempt, lowest-ranked first, and the search for the fewest of
    them that make room for a job.

    The walk's rule (Blox, with our two corrections) suspends victims from the bottom of the ranking
    one at a time until the job fits, then gives back the victims whose GPUs it did not use. The
    victims it suspends for a job are therefore the shortest prefix of the *alive* victims (not
    suspended so far this round), in that order, after which ``fit`` succeeds. Given the fit's
    ``single_node`` promise that prefix is computed, not searched:

    * a job that must go on one node needs a node with ``m = need`` free GPUs: for each node, the
      index of the alive victim at which the node's free GPUs reach ``m`` (``_reach``) is kept in a
      lazy min-heap per ``m``, refreshed only for nodes whose free GPUs changed (``FreeIndex.watch``);
      the prefix ends at the heap's minimum, and only the victims on the nodes that reach ``m`` there
      are handed back to ``fit`` (the promise says the other nodes cannot matter; their victims would
      be given back anyway);
    * a job that may be split needs ``need`` free GPUs in all: the prefix ends where the alive
      victims' GPUs add up, and all of it is handed to ``fit``.

    Victims are read from the ranking lazily, once per round; a victim that loses GPUs to a job is
    suspended for the rest of the round (skipped through ``_next``, a union-find over indices).
    Without a ``single_node`` promise the victims are suspended one at a time with a ``fit`` call
    after each, as the rule says.
    """

    __slots__ = (
        "_alive",
        "_dirty",
        "_heaps",
        "_ids",
        "_indexed",
        "_jobs",
        "_low",
        "_next",
        "_on_node",
        "_reach",
        "_source",
        "_tracked",
        "fitter",
        "free",
        "keyed",
        "keys",
        "suspended",
    )

    def __init__(
        self,
        source: Iterator[str] | Iterator[tuple[Any, str]],
        jobs: Mapping[str, JobState],
        fitter: _Fitter,
        suspended: dict[str, None],
        *,
        keyed: bool = False,
    ) -> None:
        self._source: Iterator[Any] | None = source
        self.keyed = keyed
        self.keys: list[Any] = []
        """With a ``keyed`` source (``(key, id)`` pairs): ``keys[i]`` is victim ``i``'s sort key."""
        self._low = 0
        """No victim below this index is alive (victims only die during a walk)."""
        self._jobs = jobs
        self.fitter = fitter
        self.free = fitter.free
        self.suspended = suspended
        self._ids: list[str] = []
        self._alive: list[bool] = []
        self._next: list[int] = []
        """Union-find: ``_next[i] == i`` while victim ``i`` is alive, else a larger index."""
        self._on_node: dict[int, list[tuple[int, int]]] = {}
        """Node -> (victim index, GPUs of that victim on the node), by index."""
        self._dirty: set[int] = set()
        self._reach: dict[int, dict[int, int]] = {}
        """m -> {node: index of the alive victim at which the node has m free GPUs (-1: already)}."""
        self._heaps: dict[int, list[tuple[int, int]]] = {}
        self._indexed = 0
        """Victims ``[0, _indexed)`` are in ``_on_node``."""
        self._tracked: list[int] = []
        """The m values asked about so far, ascending."""
        if fitter.single_node is not None:
            self.free.watch = self._dirty

    # --- the victims, in order ----------------------------------------------------------------
    def _pull(self) -> bool:
        """Read the next victim from the ranking; False when there is none."""
        source = self._source
        if source is None:
            return False
        item = next(source, None)
        if item is None:
            self._source = None
            return False
        if self.keyed:
            key, victim_id = item
            self.keys.append(key)
        else:
            victim_id = item
        index = len(self._ids)
        self._ids.append(victim_id)
        self._alive.append(True)
        self._next.append(index)
        return True

    def _index_nodes(self) -> None:
        """Enter the victims read since the last call in the per-node lists (only single-node
        searches need them, so victims that only ever serve split jobs skip this)."""
        ids = self._ids
        on_node = self._on_node
        gpu_node = self.fitter.cluster.gpu_node_positions
        jobs = self._jobs
        dirty = self._dirty
        for index in range(self._indexed, len(ids)):
            gpus = jobs[ids[index]].gpus
            first = gpu_node[gpus[0]] if gpus else -1
            if all(gpu_node[g] == first for g in gpus):  # the common case: one node
                counts = {first: len(gpus)} if gpus else {}
            else:
                counts = {}
                for g in gpus:
                    node = gpu_node[g]
                    counts[node] = counts.get(node, 0) + 1
            for node, count in counts.items():
                entries = on_node.get(node)
                if entries is None:
                    on_node[node] = [(index, count)]
                else:
                    entries.append((index, count))
                dirty.add(node)
        self._indexed = len(ids)

    def _find(self, index: int) -> int:
        """The first alive victim at or after ``index`` (``len(_ids)`` if none is known)."""
        nxt = self._next
        n = len(nxt)
        root = index
        while root < n and nxt[root] != root:
            root = nxt[root]
        while index < n and nxt[index] != index:
            nxt[index], index = root, nxt[index]
        return root

    def _at(self, index: int) -> int | None:
        """The first alive victim at or after ``index``, reading more from the ranking if needed."""
        nxt = self._next
        if index < len(nxt):
            if nxt[index] == index:
                return index
            index = self._find(index)
        while index >= len(nxt):  # past the victims read so far (index == len(nxt) here)
            if not self._pull():
                return None
        return index

    def lowest_index(self) -> int | None:
        """The index of the lowest-ranked alive victim (its id is ``ids[index]``)."""
        index = self._low
        nxt = self._next
        if index < len(nxt) and nxt[index] == index:
            return index
        found = self._at(index)
        if found is not None:
            self._low = found
        return found

    @property
    def ids(self) -> list[str]:
        """The victims read so far, lowest-ranked first (read-only)."""
        return self._ids

    def swap(self, index: int, gpu: int) -> None:
        """Suspend the lowest alive victim, ``index``, which holds the one GPU ``gpu``, for a job that
        needs one GPU and takes it while no other GPU is free: what ``make_room`` would do (give the
        GPU back, ``fit`` takes the only free GPU, the victim stays suspended) without the round
        trip through the index."""
        self._kill(index)
        self.suspended[self._ids[index]] = None
        watch = self.free.watch
        if watch is not None:
            watch.add(self.fitter.cluster.gpu_node_positions[gpu])

    def _kill(self, index: int) -> None:
        self._alive[index] = False
        self._next[index] = index + 1

    # --- per-node reach ------------------------------------------------------------------------
    def _refresh(self) -> None:
        """Recompute, for every node whose free GPUs changed, at which victim it reaches each tracked m."""
        dirty = self._dirty
        if not dirty or not self._reach:
            return
        on_node = self._on_node
        free = self.free
        alive = self._alive
        tracked = self._tracked
        reaches = self._reach
        heaps = self._heaps
        for node in dirty:
            entries = on_node.get(node)
            if entries is None:
                continue
            have = len(free.get(node, ()))
            position = 0
            at = -1
            for m in tracked:  # ascending: one pass over the node's victims serves every m
                while have < m and position < len(entries):
                    index, count = entries[position]
                    position += 1
                    if alive[index]:
                        have += count
                        at = index
                r = at if have >= m else _NEVER
                reach = reaches[m]
                if reach.get(node, _NEVER) != r:
                    reach[node] = r
                    if r != _NEVER:
                        heapq.heappush(heaps[m], (r, node))
        dirty.clear()

    def _min_reach(self, m: int) -> int:
        if self._indexed < len(self._ids):
            self._index_nodes()
        reach = self._reach.get(m)
        if reach is None:
            self._dirty.update(self._on_node)  # start tracking m on every node with victims
            self._reach[m] = reach = {}
            self._heaps[m] = []
            insort(self._tracked, m)
        self._refresh()
        heap = self._heaps[m]
        while heap:
            r, node = heap[0]
            if reach.get(node) == r:
                return r
            heapq.heappop(heap)
        return _NEVER

    # --- the search ----------------------------------------------------------------------------
    def make_room(
        self, job: JobState, need: int, on_node: int, eligible: Callable[[str], bool]
    ) -> tuple[tuple[int, ...] | None, int]:
        """Suspend the fewest victims ``eligible`` allows so that ``job`` fits, and place it.

        Returns the job's GPUs (already taken; None if it cannot fit: nothing changed) and how
        many victims stay suspended.
        """
        if self.fitter.single_node is None:
            return self._one_by_one(job, need, on_node, eligible)
        ids = self._ids
        if on_node:
            batch = 1
            while True:
                last = self._min_reach(on_node)
                if last != _NEVER:
                    break
                if ids and not eligible(ids[-1]):
                    return None, 0
                # Read more victims, twice as many each time (reading past the answer changes
                # nothing: a node's reach depends only on the victims before it).
                pulled = 0
                while pulled < batch and self._pull():
                    pulled += 1
                if not pulled:
                    return None, 0
                batch *= 2
            if last < 0 or not eligible(ids[last]):
                return None, 0
            gpu_node = self.fitter.cluster.gpu_node_positions
            reach = self._reach[on_node]
            alive = self._alive
            chosen: set[int] = set()
            for node in {gpu_node[g] for g in self._jobs[ids[last]].gpus}:
                if reach.get(node) == last:
                    chosen.update(i for i, _ in self._on_node[node] if i <= last and alive[i])
            return self._place(job, need, on_node, sorted(chosen))
        short = need - self.free.total
        taken: list[int] = []
        index = self._at(0)
        while index is not None and eligible(ids[index]):
            taken.append(index)
            short -= len(self._jobs[ids[index]].gpus)
            if short <= 0:
                return self._place(job, need, on_node, taken)
            index = self._at(index + 1)
        return None, 0

    def _place(self, job: JobState, need: int, on_node: int, chosen: list[int]) -> tuple[tuple[int, ...], int]:
        free = self.free
        ids = self._ids
        jobs = self._jobs
        suspended = self.suspended
        for index in chosen:
            free.give(jobs[ids[index]].gpus)
            suspended[ids[index]] = None
        self._spare(job, need, on_node, chosen)
        fitter = self.fitter
        gpus = fitter.fit(job, need, free, fitter.cluster)  # the promise says it fits now
        if gpus is None:
            raise PlacementError(
                f"the placement rule found no GPUs for job {job.job_id!r} ({need} GPUs) although its "
                f"single_node promise says it must; fix the policy's fit or single_node function"
            )
        free.take(gpus)
        return gpus, self._keep_unused(chosen)

    def _spare(self, job: JobState, need: int, on_node: int, chosen: list[int]) -> None:
        """Let the suspended victims the job fits without keep running, highest-ranked first.

        ``chosen`` (ascending indices, all suspended, the job fits with their GPUs) loses the victims
        spared. The last one is never spared: the job did not fit before it was suspended. Without
        this, the fit may take a low victim's GPUs and leave a higher one's free: the low victim
        stays suspended and its GPUs go to a job ranked below it (two suspended for one needed).
        """
        if len(chosen) < 2:
            return
        free = self.free
        jobs = self._jobs
        ids = self._ids
        suspended = self.suspended
        fitter = self.fitter
        for position in range(len(chosen) - 2, -1, -1):
            victim = jobs[ids[chosen[position]]]
            free.take(victim.gpus)
            if fitter(job, need, on_node) is None:
                free.give(victim.gpus)
            else:
                del suspended[victim.job_id]
                del chosen[position]

    def _keep_unused(self, chosen: list[int]) -> int:
        """Give back the victims (highest-ranked first) whose GPUs all stayed free."""
        free = self.free
        jobs = self._jobs
        ids = self._ids
        suspended = self.suspended
        died = 0
        for index in reversed(chosen):
            victim = jobs[ids[index]]
            if free.all_free(victim.gpus):
                free.take(victim.gpus)
                del suspended[victim.job_id]
            else:
                self._kill(index)
                died += 1
        return died

    def _one_by_one(
        self, job: JobState, need: int, on_node: int, eligible: Callable[[str], bool]
    ) -> tuple[tuple[int, ...] | None, int]:
        """The rule as stated, for fits without a ``single_node`` promise: one ``fit`` per victim."""
        free = self.free
        ids = self._ids
        jobs = self._jobs
        suspended = self.suspended
        taken: list[int] = []
        gpus: tuple[int, ...] | None = None
        index = self._at(0)
        while index is not None and eligible(ids[index]):
            free.give(jobs[ids[index]].gpus)
            suspended[ids[index]] = None
            taken.append(index)
            gpus = self.fitter(job, need, on_node)
            if gpus is not None:
                break
            index = self._at(index + 1)
        if gpus is None:
            for index in taken:  # nothing gained: every victim keeps running
                free.take(jobs[ids[index]].gpus)
                del suspended[ids[index]]
            return None, 0
        before = len(taken)
        self._spare(job, need, on_node, taken)
        if len(taken) < before:  # the pool shrank: fit again on what is left free
            gpus = self.fitter(job, need, on_node)
            assert gpus is not None  # it fitted with exactly these GPUs free
        free.take(gpus)
        return gpus, self._keep_unused(taken)


def place_in_order(
    ranking: Ranking,
    jobs: Mapping[str, JobState],
    cluster: ClusterState,
    fit: Fit,
    *,
    backfill: bool = False,
    single_node: SingleNode | None = None,
) -> Placement:
    """Walk ``ranking`` and place jobs with ``fit``; see the module docstring for the rules.

    ``backfill`` lets lower-ranked jobs use GPUs that a blocked higher-ranked job cannot use (the
    walk then continues past a blocked job; without it the first blocked job ends the round, as in
    Blox). Backfilling may read deep into the queue while a few GPUs stay free, so it costs more.
    ``single_node`` (see ``SingleNode``) states what ``fit`` needs, so the walk calls it only when
    it will succeed and finds victims without trying them one by one; the result is the same.
    """
    free = FreeIndex(cluster)
    fitter = _Fitter(fit, single_node, free, cluster)
    launch: dict[str, tuple[int, ...]] = {}
    suspended: dict[str, None] = {}  # insertion-ordered set
    terminate = ranking.terminate
    targets = ranking.gpu_targets
    for job_id in terminate:
        job = jobs.get(job_id)
        if job is not None and job.is_running:
            free.give(job.gpus)

    if not ranking.preempt and not targets:
        waiting = ranking.waiting
        if waiting is None:
            waiting = [j for j in ranking.order if not jobs[j].is_running]
        for job_id in waiting:
            if free.total <= 0:
                break
            if job_id in terminate:
                continue
            job = jobs[job_id]
            need = job.gpus_requested
            gpus = fitter(job, need, fitter.on_node(job, need))
            if gpus is None:
                if backfill:
                    continue
                break
            free.take(gpus)
            launch[job_id] = gpus
        return _result(ranking, jobs, launch, suspended)

    if ranking.key is not None and ranking.running is not None and ranking.waiting is not None and not targets:
        _two_pointer(ranking=ranking, jobs=jobs, fitter=fitter, launch=launch, suspended=suspended, backfill=backfill)
        return _result(ranking, jobs, launch, suspended)

    running: Sequence[str] = (
        ranking.running if ranking.running is not None else [j for j in ranking.order if jobs[j].status is _RUNNING]
    )
    # Unseen running jobs are running[seen:]; victims come from the end (lowest-ranked first).
    position = {job_id: i for i, job_id in enumerate(running)}
    seen = 0
    remaining = len(running) - sum(1 for j in terminate if j in position)

    def source() -> Iterator[str]:
        for victim_id in reversed(running):
            if victim_id not in suspended and victim_id not in terminate:
                yield victim_id

    def below(victim_id: str) -> bool:
        return position[victim_id] >= seen

    victims: _Victims | None = None
    for job_id in ranking.order:
        if free.total <= 0 and remaining <= 0:
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
            free.give(job.gpus)
            gpus = fitter(job, target, fitter.on_node(job, target))
            if gpus is None:
                suspended[job_id] = None
                continue
            free.take(gpus)
            if tuple(sorted(gpus)) != tuple(sorted(job.gpus)):
                suspended[job_id] = None
                launch[job_id] = gpus
            continue
        need = targets.get(job_id, job.gpus_requested)
        on_node = fitter.on_node(job, need) if need > 1 else 0
        gpus = fitter(job, need, on_node)
        if gpus is None and ranking.preempt:
            if victims is None:
                victims = _Victims(source(), jobs, fitter, suspended)
            gpus, died = victims.make_room(job, need, on_node, below)
            remaining -= died
            if gpus is not None:
                launch[job_id] = gpus
                continue
        if gpus is None:
            if backfill:
                continue
            break
        free.take(gpus)
        launch[job_id] = gpus
    if victims is not None:
        free.watch = None
    return _result(ranking, jobs, launch, suspended)


def _two_pointer(
    *,
    ranking: Ranking,
    jobs: Mapping[str, JobState],
    fitter: _Fitter,
    launch: dict[str, tuple[int, ...]],
    suspended: dict[str, None],
    backfill: bool,
) -> None:
    """The same walk, driven by waiting jobs (upwards) and victims (downwards) with ``ranking.key``.

    Running jobs that keep their GPUs are never visited: a waiting job may only displace running jobs
    ranked below it, which are exactly the victims whose key is larger than its own. Views that hand
    out their keys with the ids (``keyed_items()`` on ``ranking.waiting``, ``keyed_reversed()`` on
    ``ranking.running``: ``services.core.ordering.KeyedOrder``'s) spare a ``key()`` call per job.
    """
    key = ranking.key
    assert key is not None
    assert ranking.running is not None
    assert ranking.waiting is not None
    terminate = ranking.terminate
    preempt = ranking.preempt
    free = fitter.free
    running = ranking.running
    waiting = ranking.waiting
    keyed_items = getattr(waiting, "keyed_items", None)
    pairs: Iterator[tuple[Any, str]] = keyed_items() if keyed_items is not None else ((key(j), j) for j in waiting)
    keyed_reversed: Callable[[], Iterator[tuple[Any, str]]] | None = getattr(running, "keyed_reversed", None)
    victims: _Victims | None = None

    # A one-GPU job facing a full cluster whose lowest victim holds one GPU simply takes that GPU:
    # ``fit`` must pick the only free GPU (fits take free GPUs), and a ``single_node`` promise says it
    # will (the common LAS swap of one-GPU jobs; the same result as ``make_room``).
    swap = fitter.single_node is not None
    # Until a job needs more than such a swap, the victims are read straight from a keyed view
    # (``streak``, with ``head`` the one read but not yet taken), without ``_Victims``: every victim
    # read so far was swapped out, so the lowest alive victim is simply the next one. ``_Victims``
    # takes over from ``head`` when needed; victims it never saw are dead ones, which it would skip.
    streak: Iterator[tuple[Any, str]] | None = None
    head: tuple[Any, str] | None = None
    for rank, job_id in pairs:
        if terminate and job_id in terminate:
            continue
        job = jobs[job_id]
        need = job.gpus_requested
        if free.total <= 0:
            if not preempt:
                break
            if victims is None and keyed_reversed is not None:
                if head is None:
                    if streak is None:
                        streak = _victim_items(keyed_reversed, terminate)
                    head = next(streak, None)
                    if head is None:
                        break
                lowest_key, lowest = head
                if not lowest_key > rank:
                    break
                if swap and need == 1:
                    held = jobs[lowest].gpus
                    if len(held) == 1:
                        suspended[lowest] = None
                        launch[job_id] = held
                        head = None
                        continue
                assert streak is not None
                victims = _Victims(chain((head,), streak), jobs, fitter, suspended, keyed=True)
                head = None
            else:
                if victims is None:
                    victims = _make_victims(
                        running, keyed_reversed, terminate, jobs=jobs, fitter=fitter, suspended=suspended
                    )
                index = victims.lowest_index()
                if index is None:
                    break
                lowest = victims.ids[index]
                if not (victims.keys[index] if victims.keyed else key(lowest)) > rank:
                    break
                if swap and need == 1:
                    held = jobs[lowest].gpus
                    if len(held) == 1:
                        victims.swap(index, held[0])
                        launch[job_id] = held
                        continue
        on_node = fitter.on_node(job, need) if need > 1 else 0
        gpus = fitter(job, need, on_node) if need <= free.total else None
        if gpus is None and preempt:
            if victims is None:  # (a streak, which needs a full cluster, has handed over already)
                victims = _make_victims(
                    running, keyed_reversed, terminate, jobs=jobs, fitter=fitter, suspended=suspended
                )
            gpus, _ = victims.make_room(job, need, on_node, _Below(key, rank))
            if gpus is not None:
                launch[job_id] = gpus
                continue
        if gpus is None:
            if backfill:
                continue
            break
        free.take(gpus)
        launch[job_id] = gpus
    free.watch = None


def _victim_items(
    keyed_reversed: Callable[[], Iterator[tuple[Any, str]]], terminate: Mapping[str, str]
) -> Iterator[tuple[Any, str]]:
    items = keyed_reversed()
    if terminate:
        items = ((k, j) for k, j in items if j not in terminate)
    return items


def _make_victims(
    running: Sequence[str],
    keyed_reversed: Callable[[], Iterator[tuple[Any, str]]] | None,
    terminate: Mapping[str, str],
    *,
    jobs: Mapping[str, JobState],
    fitter: _Fitter,
    suspended: dict[str, None],
) -> _Victims:
    if keyed_reversed is not None:
        return _Victims(_victim_items(keyed_reversed, terminate), jobs, fitter, suspended, keyed=True)
    ids: Iterator[str] = reversed(running)
    if terminate:
        ids = (j for j in ids if j not in terminate)
    return _Victims(ids, jobs, fitter, suspended)


class _Below:
    """``eligible`` for ``make_room``: whether a victim ranks below the job being placed (a class, not
    a closure over the walk's loop variable, which would slow every step of the walk)."""

    __slots__ = ("key", "rank")

    def __init__(self, key: Callable[[str], Any], rank: Any) -> None:
        self.key = key
        self.rank = rank

    def __call__(self, victim_id: str) -> bool:
        return bool(self.key(victim_id) > self.rank)


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
        self._suspended = suspended
        self._gone_set: set[str] | None = None

    @property
    def _gone(self) -> set[str]:
        # Built on first use: the simulator and the services apply ``Placement.plan`` and never read
        # the allocation, so most rounds need not pay for it.
        if self._gone_set is None:
            self._gone_set = set(self._suspended) | set(self._ranking.terminate)
        return self._gone_set

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
