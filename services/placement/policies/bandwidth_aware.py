"""Bandwidth-aware intra-node placement (Blox §5.3 "Intra-Node Placement Policies", after Blink).

Blox §5.3: GPUs inside one server are not equally connected (on a p3.8xlarge, GPU 0-3 has twice
the bandwidth of GPU 0-1), so its intra-node policy "maximizes the aggregate bandwidth for
multi-GPU jobs, i.e. place multi-GPU jobs on GPUs on high bandwidth pair"; Blox evaluates it under
consolidated global placement (Table 4). This policy is that composition:

* **Which node**: the project's consolidated rule: the node with the fewest free GPUs that still
  has room (best fit; first node in cluster order on ties). A job that fits on one node but finds
  no node with room gets no place this round (the shared walk may preempt lower-ranked jobs for
  it), as in Blox's consolidated placement.
* **Which GPUs on it** (multi-GPU jobs): the free subset with the largest *aggregate* bandwidth,
  the sum over every pair of chosen GPUs of ``Node.link_bandwidth_gbps[(i, j)]`` (local indices,
  either order). Pairs missing from the map "share the PCIe/host path" and count
  ``default_bandwidth_gbps``. The search is exhaustive while the number of candidate subsets is at
  most ``max_subsets``, else greedy (best pair, then repeatedly the GPU adding most bandwidth).
  Ties go to the lexicographically smallest GPU ids.
* **Single-GPU jobs** (Blox is silent): the free GPU with the *least* bandwidth to the other free
  GPUs of the best-fit node, so well-connected sets stay free for multi-GPU jobs.
* **Jobs wider than a node**: whole nodes, most free GPUs first, and the remainder as the best
  subset of the best-fitting node.

Where the bandwidths come from (Gb/s, one direction): live, from each worker's ``node.register``
(NVML's NVLink topology or the agent's ``--link-bandwidth-gbps``, ``services.worker.links``), kept by
the scheduler's inventory and carried by the round snapshot (``SnapshotNode.links``); in the
simulator, from a cluster built with ``services.core.link_profiles.with_links``. A node that reports
none has every pair at ``default_bandwidth_gbps``, and the policy then takes the lowest GPU ids, as
``consolidated`` does.

The walk is the project's shared one (:func:`services.core.placing.place_in_order`): ranking order,
running jobs keep their GPUs, preemption from the bottom of the ranking; ``backfill`` is off by
default, as in Blox, where the first job that cannot be placed ends the round.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from services.core.decisions import Placement, Ranking
from services.core.placing import FreeIndex, FreeMap, place_in_order
from services.core.registry import PLACEMENT
from services.core.state import ClusterState, JobState, Node
from services.placement.policies.tiresias_skew import best_fit_node


class _Links:
    """Pairwise bandwidth between the GPUs of one node, by global GPU id."""

    __slots__ = ("_cluster", "_default", "_links")

    def __init__(self, node: Node, cluster: ClusterState, default: float) -> None:
        self._links = node.link_bandwidth_gbps
        self._cluster = cluster
        self._default = default

    def between(self, a: int, b: int) -> float:
        gpus = self._cluster.gpus
        i, j = gpus[a].local_index, gpus[b].local_index
        links = self._links
        value = links.get((i, j))
        if value is None:
            value = links.get((j, i))
        return self._default if value is None else value

    def aggregate(self, chosen: Sequence[int]) -> float:
        return sum(self.between(a, b) for a, b in itertools.combinations(chosen, 2))


_INTRA_NODE = ("bandwidth", "random")


@PLACEMENT.register("bandwidth-aware")
@dataclass(frozen=True, kw_only=True, slots=True)
class BandwidthAwarePlacement:
    """Best-fit node, then the free GPU subset with the largest aggregate link bandwidth."""

    name: ClassVar[str] = "bandwidth-aware"
    keeps_running: ClassVar[bool] = True

    default_bandwidth_gbps: float = 0.0
    """Bandwidth assumed for GPU pairs missing from ``Node.link_bandwidth_gbps``."""
    max_subsets: int = 5000
    """Largest number of candidate subsets searched exhaustively; beyond it the search is greedy."""
    backfill: bool = False
    """Let lower-ranked jobs take GPUs that a blocked higher-ranked job cannot use."""
    intra_node: str = "bandwidth"
    """``bandwidth`` (the policy) or ``random``: GPUs drawn at random on the same node, Blox Table 4's
    baseline (the node choice stays best fit)."""
    seed: int = 0
    """Seed of the ``random`` choice (each job draws from ``"{seed}:{job id}:{preemptions}"``)."""

    def __post_init__(self) -> None:
        if self.intra_node not in _INTRA_NODE:
            raise ValueError(f"intra_node must be one of {', '.join(_INTRA_NODE)}, got {self.intra_node!r}")
        if self.default_bandwidth_gbps < 0:
            raise ValueError(f"default_bandwidth_gbps must be >= 0, got {self.default_bandwidth_gbps}")
        if self.max_subsets < 1:
            raise ValueError(f"max_subsets must be >= 1, got {self.max_subsets}")

    def links(self, cluster: ClusterState, node: int) -> _Links:
        return _Links(cluster.nodes[cluster.node_ids[node]], cluster, self.default_bandwidth_gbps)

    def subset(self, job: JobState, links: _Links, free: Sequence[int], need: int) -> tuple[int, ...]:
        """``need`` GPUs of ``free`` (one node's) for ``job``: the best-connected, or random ones."""
        if self.intra_node == "random":
            rng = random.Random(f"{self.seed}:{job.job_id}:{job.preemptions}")
            return tuple(sorted(rng.sample(sorted(free), need)))
        return self.best_subset(links, free, need)

    def best_subset(self, links: _Links, free: Sequence[int], need: int) -> tuple[int, ...]:
        """The ``need`` GPUs of ``free`` with the largest aggregate bandwidth (see module doc)."""
        candidates = sorted(free)
        if need >= len(candidates):
            return tuple(candidates)
        pairs = {(a, b): links.between(a, b) for a, b in itertools.combinations(candidates, 2)}
        if len(set(pairs.values())) <= 1:
            # Every pair has the same bandwidth, so every subset ties and each rule below picks
            # the lowest ids: the first subset, the pair (c0, c1) then the lowest ids, the lowest id.
            return tuple(candidates[:need])
        if need == 1:
            return (self.loneliest(links, candidates),)
        if math.comb(len(candidates), need) <= self.max_subsets:
            best: tuple[int, ...] = ()
            best_bw = -1.0
            for subset in itertools.combinations(candidates, need):
                bw = sum(pairs[pair] for pair in itertools.combinations(subset, 2))
                if bw > best_bw:
                    best, best_bw = subset, bw
            return best
        pair = max(itertools.combinations(candidates, 2), key=lambda p: (links.between(*p), -p[0], -p[1]))
        chosen = list(pair)
        while len(chosen) < need:
            rest = [g for g in candidates if g not in chosen]
            chosen.append(max(rest, key=lambda g: (sum(links.between(g, c) for c in chosen), -g)))
        return tuple(sorted(chosen))

    @staticmethod
    def loneliest(links: _Links, free: Sequence[int]) -> int:
        """The free GPU with the least bandwidth to the other free GPUs (lowest id on ties)."""
        return min(free, key=lambda g: (sum(links.between(g, o) for o in free if o != g), g))

    def fit(self, job: JobState, need: int, free: FreeMap, cluster: ClusterState) -> tuple[int, ...] | None:
        """GPUs for a job of ``need`` GPUs from the free pool, or None if it should wait."""
        node = best_fit_node(free, need)
        if node is not None:
            return tuple(sorted(self.subset(job, self.links(cluster, node), list(free[node]), need)))
        if need <= cluster.largest_node_gpus:
            return None
        if isinstance(free, FreeIndex):
            return self._wide_indexed(job, free, need, cluster)
        chosen: list[int] = []
        unused = dict(free)
        remaining = need
        while remaining > 0 and unused:
            node = best_fit_node(unused, remaining)
            if node is not None:
                chosen.extend(self.subset(job, self.links(cluster, node), list(unused[node]), remaining))
                return tuple(sorted(chosen))
            node = min(unused, key=lambda n: (-len(unused[n]), n))
            gpus = unused.pop(node)
            chosen.extend(gpus)
            remaining -= len(gpus)
        return tuple(sorted(chosen)) if remaining == 0 else None

    def _wide_indexed(self, job: JobState, free: FreeIndex, need: int, cluster: ClusterState) -> tuple[int, ...] | None:
        """The wide-job branch of ``fit`` answered from the walk's index (same result)."""
        if need > free.total:
            return None
        chosen: list[int] = []
        used: set[int] = set()
        remaining = need
        while remaining > 0:
            node = free.best_fit(remaining, used)
            if node is not None:
                chosen.extend(self.subset(job, self.links(cluster, node), list(free[node]), remaining))
                return tuple(sorted(chosen))
            node = next((n for n in free.most_first() if n not in used), None)
            if node is None:
                break
            used.add(node)
            chosen.extend(free[node])
            remaining -= len(free[node])
        return tuple(sorted(chosen)) if remaining == 0 else None

    @staticmethod
    def single_node(job: JobState, need: int, cluster: ClusterState) -> bool:
        """``fit``'s ``services.core.placing.SingleNode`` promise: a job that fits on one node goes
        on the best-fitting node (the subset is chosen there); a wider one needs ``need`` in all."""
        return need <= cluster.largest_node_gpus

    def place(self, ranking: Ranking, jobs: Mapping[str, JobState], cluster: ClusterState, now: float) -> Placement:
        return place_in_order(ranking, jobs, cluster, self.fit, backfill=self.backfill, single_node=self.single_node)
