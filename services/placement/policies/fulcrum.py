"""``fulcrum``: load-weighted random placement with decaying load (Fulcrum, UIUC; seed 002, Algorithm 1).

Fulcrum's global scheduler keeps a load counter per worker and picks workers at random, weighted so
that less-loaded workers are more likely (§4, Algorithm 1):

* ``UPDATELOAD(i)``: ``load[i] += 1`` for every task received from (or sent to) worker ``i``;
* ``REFRESH(decayrate)``: ``load[i] *= decayrate`` for every worker, "periodically ... to eliminate
  stale information" (the paper uses 0.5 and says it needs tuning);
* ``GETWEIGHTEDRANDOM``: ``weight[i] = maxLoad - load[i]``; draw ``rand`` uniformly in
  ``[0, totalwt)`` and return the first ``i`` whose cumulative weight reaches ``rand``. The weight
  "can be replaced with any decreasing function g(load)" (§4): option ``weight``.

:class:`FulcrumBalancer` is Algorithm 1 in O(log n) per decision instead of the paper's three O(n)
passes (the paper's goal is "tens of microseconds" per decision, §3): a Fenwick tree over the
loads gives every prefix sum, ``maxLoad`` is tracked incrementally (``UPDATELOAD`` only raises one
load; ``REFRESH`` scales all of them, and the maximum, by the same factor), and the cumulative
weight of the first ``k`` workers is ``k * maxLoad - prefix_load(k)``, which is non-decreasing in
``k`` (every weight is >= 0), so the draw is one descent of the tree. For a pluggable weight ``g``
the tree holds ``g(load[i])`` instead. ``REFRESH`` is O(n) (periodic, not per decision).

Choices where the paper is silent (each documented at its option):

* When every weight is 0 (all loads equal, e.g. at the start) Algorithm 1 would return worker 0
  every time; we draw uniformly instead, since equally loaded workers deserve equal chances.
* What a worker is here: a node. The paper's UPDATELOAD counts tasks *spilled* by a worker's local
  scheduler; our scheduler has no local queues, so the analogue is a task placed on the worker (as
  in the paper's balls-and-bins Figure 5). Owners that do see spills may call ``update_load``.
* A job must fit the chosen node's free GPUs (GPU jobs cannot queue on a worker as Ray tasks do),
  so the draw is restricted to nodes with room: up to ``max_draws`` draws from the full
  distribution, rejecting nodes without room, then one exact draw over the nodes with room (the
  same distribution conditioned on having room). A job wider than every node takes whole nodes as
  in ``consolidated`` and each node it uses gets ``UPDATELOAD``.
* ``REFRESH`` runs once per ``refresh_s`` of the caller's clock: on each ``place`` call, the loads
  decay by ``decay_rate ** k`` for the ``k`` refresh periods elapsed since the last one.
* The walk: waiting jobs in ranking order; a job that cannot be placed ends the round (FIFO) unless
  ``backfill``; running jobs keep their GPUs; Fulcrum never preempts (``Ranking.preempt`` is
  ignored): Algorithm 1 only places.

State (the one policy that keeps some): the loads, the last refresh time and the random generator
live in the policy object and change on every ``place`` call; inputs are never mutated, and the
same seed and the same sequence of calls give the same decisions. The state is soft: a new object
(e.g. a restarted placement service) starts from zero loads, which the decay would reach anyway.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from services.core.decisions import Placement, Plan, Ranking
from services.core.placing import FreeMap
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState
from services.placement.policies.consolidated import consolidated_fit

Weight = Callable[[float], float]
"""A decreasing function of a worker's load (Fulcrum §4); must return a finite value >= 0."""

MAX_MINUS_LOAD = "max-minus-load"
WEIGHTS: dict[str, Weight] = {
    "inverse": lambda load: 1.0 / (1.0 + load),
    "exp": lambda load: math.exp(-load),
}
"""Named alternatives to Algorithm 1's ``maxLoad - load`` (which depends on the maximum)."""


class FulcrumBalancer:
    """Algorithm 1's three procedures over ``n`` workers, O(log n) per draw and per update."""

    __slots__ = ("_g", "_load", "_max", "_n", "_rng", "_sum", "_top", "_tree")

    def __init__(self, workers: int, *, seed: int = 0, weight: str | Weight = MAX_MINUS_LOAD) -> None:
        if workers <= 0:
            raise ValueError(f"workers must be > 0, got {workers}")
        if isinstance(weight, str):
            if weight != MAX_MINUS_LOAD and weight not in WEIGHTS:
                valid = ", ".join([MAX_MINUS_LOAD, *sorted(WEIGHTS)])
                raise ValueError(f"unknown weight {weight!r}; valid: {valid}")
            self._g: Weight | None = WEIGHTS.get(weight)
        else:
            self._g = weight
        self._n = workers
        self._rng = random.Random(seed)
        self._load = [0.0] * workers
        self._max = 0.0
        self._tree = [0.0] * (workers + 1)
        self._sum = 0.0
        self._top = 1 << (workers.bit_length() - 1)
        self._rebuild()

    @property
    def loads(self) -> tuple[float, ...]:
        return tuple(self._load)

    def set_loads(self, loads: Sequence[float]) -> None:
        """Replace every load (e.g. carried over when the worker list changes)."""
        if len(loads) != self._n or any(not (x >= 0 and math.isfinite(x)) for x in loads):
            raise ValueError(f"need {self._n} finite loads >= 0, got {list(loads)[:5]}...")
        self._load = [float(x) for x in loads]
        self._max = max(self._load)
        self._rebuild()

    def draw_among(self, workers: Sequence[int]) -> int:
        """GETWEIGHTEDRANDOM restricted to ``workers`` (in the given order); uniform if every weight
        among them is 0. O(len(workers))."""
        if not workers:
            raise ValueError("draw_among needs at least one worker")
        weights = [self.weight_of(i) for i in workers]
        total = sum(weights)
        if not total > 0:
            return workers[self._rng.randrange(len(workers))]
        target = self._rng.random() * total
        acc = 0.0
        for worker, w in zip(workers, weights, strict=True):
            acc += w
            if w > 0 and acc >= target:
                return worker
        return next(wk for wk, w in zip(reversed(workers), reversed(weights), strict=True) if w > 0)

    def _value(self, i: int) -> float:
        g = self._g
        return self._load[i] if g is None else g(self._load[i])

    def _rebuild(self) -> None:
        tree = self._tree
        n = self._n
        for i in range(1, n + 1):
            tree[i] = self._value(i - 1)
        self._sum = math.fsum(tree[1:])
        for i in range(1, n + 1):
            parent = i + (i & -i)
            if parent <= n:
                tree[parent] += tree[i]

    def _add(self, i: int, delta: float) -> None:
        tree = self._tree
        n = self._n
        k = i + 1
        while k <= n:
            tree[k] += delta
            k += k & -k

    def refresh(self, decay_rate: float, times: int = 1) -> None:
        """REFRESH: multiply every load by ``decay_rate`` (``times`` times)."""
        factor = decay_rate**times
        self._load = [x * factor for x in self._load]
        self._max *= factor
        self._rebuild()

    def update_load(self, i: int) -> None:
        """UPDATELOAD: one more task on worker ``i``."""
        old = self._load[i]
        new = old + 1.0
        self._load[i] = new
        self._max = max(self._max, new)
        g = self._g
        delta = 1.0 if g is None else g(new) - g(old)
        self._sum += delta
        self._add(i, delta)

    def _cumulative(self, count: int, tree_sum: float) -> float:
        return count * self._max - tree_sum if self._g is None else tree_sum

    def draw(self) -> int:
        """GETWEIGHTEDRANDOM: a worker, drawn with probability proportional to its weight."""
        n = self._n
        tree = self._tree
        total = self._cumulative(n, self._sum)
        if not total > 1e-12 * max(1.0, self._max) * n:
            return self._rng.randrange(n)  # every weight 0: all loads equal
        target = self._rng.random() * total
        # Largest prefix whose cumulative weight is < target; the answer is the next worker.
        pos = 0
        acc = 0.0
        step = self._top
        mx = self._max
        linear = self._g is None
        while step:
            nxt = pos + step
            if nxt <= n:
                s = acc + tree[nxt]
                cum = nxt * mx - s if linear else s
                if cum < target:
                    pos = nxt
                    acc = s
            step >>= 1
        return min(pos, n - 1)

    def weight_of(self, i: int) -> float:
        """Worker ``i``'s current weight (``maxLoad - load[i]`` or ``g(load[i])``)."""
        return self._max - self._load[i] if self._g is None else self._value(i)


@PLACEMENT.register("fulcrum")
class Fulcrum:
    """Load-weighted random node choice (Algorithm 1) for each waiting job, in ranking order."""

    name: ClassVar[str] = "fulcrum"
    keeps_running: ClassVar[bool] = True

    def __init__(
        self,
        *,
        seed: int = 0,
        decay_rate: float = 0.5,
        refresh_s: float = 60.0,
        weight: str = MAX_MINUS_LOAD,
        max_draws: int = 8,
        backfill: bool = False,
    ) -> None:
        if not 0 < decay_rate <= 1:
            raise ValueError(f"decay_rate must be in (0, 1], got {decay_rate}")
        if not refresh_s > 0:
            raise ValueError(f"refresh_s must be > 0, got {refresh_s}")
        if max_draws < 0:
            raise ValueError(f"max_draws must be >= 0, got {max_draws}")
        FulcrumBalancer(1, weight=weight)  # validates the weight name
        self.seed = seed
        self.decay_rate = decay_rate
        self.refresh_s = refresh_s
        self.weight = weight
        self.max_draws = max_draws
        self.backfill = backfill
        self._nodes: tuple[str, ...] = ()
        self._balancer: FulcrumBalancer | None = None
        self._refreshed_at: float | None = None

    def balancer(self, cluster: ClusterState) -> FulcrumBalancer:
        """The load state for ``cluster``'s nodes; rebuilt (loads carried over by node id) if the
        node list changed."""
        nodes = tuple(cluster.node_ids)
        if self._balancer is None or nodes != self._nodes:
            fresh = FulcrumBalancer(len(nodes), seed=self.seed, weight=self.weight)
            if self._balancer is not None:
                old = dict(zip(self._nodes, self._balancer.loads, strict=True))
                fresh.set_loads([old.get(node, 0.0) for node in nodes])
            self._balancer, self._nodes = fresh, nodes
        return self._balancer

    def _decay(self, balancer: FulcrumBalancer, now: float) -> None:
        if self._refreshed_at is None:
            self._refreshed_at = now
            return
        periods = math.floor((now - self._refreshed_at) / self.refresh_s)
        if periods > 0:
            balancer.refresh(self.decay_rate, periods)
            self._refreshed_at += periods * self.refresh_s

    def choose_node(self, balancer: FulcrumBalancer, need: int, free: FreeMap) -> int | None:
        """A node position with at least ``need`` free GPUs, drawn by weight; None if none has room."""
        for _ in range(self.max_draws):
            node = balancer.draw()
            bucket = free.get(node)
            if bucket is not None and len(bucket) >= need:
                return node
        fits = [n for n, gpus in sorted(free.items()) if len(gpus) >= need]
        return balancer.draw_among(fits) if fits else None

    def place(
        self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float
    ) -> Placement:
        balancer = self.balancer(cluster)
        self._decay(balancer, now)
        free: FreeMap = cluster.free_by_node()
        terminate = ranking.terminate
        for job_id in terminate:
            job = jobs.get(job_id)
            if job is not None and job.is_running:
                for g in job.gpus:
                    free.setdefault(cluster.node_position_of_gpu(g), set()).add(g)
        waiting: Sequence[str] = ranking.waiting if ranking.waiting is not None else [
            j for j in ranking.order if not jobs[j].is_running
        ]
        launch: dict[str, tuple[int, ...]] = {}
        for job_id in waiting:
            if not free:
                break
            if job_id in terminate:
                continue
            job = jobs[job_id]
            gpus = self._fit(balancer, job, free, cluster)
            if gpus is None:
                if self.backfill:
                    continue
                break
            for g in gpus:
                node = cluster.node_position_of_gpu(g)
                bucket = free[node]
                bucket.remove(g)
                if not bucket:
                    del free[node]
            launch[job_id] = gpus
        allocation = {j.job_id: j.gpus for j in jobs.values() if j.is_running and j.job_id not in terminate}
        allocation.update(launch)
        return Placement(allocation=allocation, plan=Plan(launch=launch, terminate=dict(terminate)))

    def _fit(
        self, balancer: FulcrumBalancer, job: JobState, free: FreeMap, cluster: ClusterState
    ) -> tuple[int, ...] | None:
        need = job.spec.gpus
        if need > cluster.largest_node_gpus:
            gpus = consolidated_fit(job, need, free, cluster)
            if gpus is not None:
                for used in sorted({cluster.node_position_of_gpu(g) for g in gpus}):
                    balancer.update_load(used)
            return gpus
        chosen = self.choose_node(balancer, need, free)
        if chosen is None:
            return None
        balancer.update_load(chosen)
        return tuple(sorted(free[chosen])[:need])
