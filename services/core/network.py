"""Communication cost of data-parallel training on a given set of GPUs: the simulator's network model.

Each iteration a data-parallel job all-reduces its gradient (``model_sizes.ModelProfile.gradient_bits``).
The cost of that all-reduce on the GPUs a job holds, modelled hierarchically as NCCL and Horovod's
hierarchical all-reduce do (Sergeev & Del Balso, *Horovod*, 2018; Cho et al., *BlueConnect*, SysML
'19): a ring inside each node, then a ring across the ``k`` nodes between their uplinks. A ring
all-reduce of ``S`` bits over ``p`` members moves ``2 (p-1)/p * S`` over its slowest link
(Patarasuk & Yuan, JPDC 2009; Thakur et al., IJHPCA 2005), so

    T_sync = 2 (m-1)/m * S / B_intra  +  2 (k-1)/k * S / B_inter

with ``m`` the most GPUs the job has on one node, ``B_intra`` the slowest GPU pair it holds inside
a node (exact for 2-3 GPUs, conservative for larger rings, which NCCL can route around a slow
pair) and ``B_inter`` the slowest uplink of its nodes (or the switch fabric, ``switch_gbps``, when
it spans switches). Communication overlaps the backward pass; Pollux (Qiao et al., OSDI '21, §3.2, its
throughput model) models the iteration time as

    T_iter = (T_grad^gamma + T_sync^gamma)^(1/gamma),   gamma >= 1

(gamma = 1: no overlap; larger: more), which this module uses with ``T_grad`` the model's step time.

A trace's duration is the job's run time placed as compactly as the cluster allows
(``services.core.simulation.workload.TraceJob``), so the simulator's progress rate is
``T_iter(compact) / T_iter(actual)`` (at most 1): :meth:`NetworkModel.speed`. The compact reference
for ``n`` GPUs is the best one the cluster offers: on one node (``n`` <= its GPUs), the subset whose
slowest pair is fastest; else whole nodes and the fastest uplink.

Not modelled: contention between jobs sharing an uplink or a switch (each job sees its links as its
own), latency terms (large gradients are bandwidth-bound), parameter servers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from services.core.link_profiles import PCIE3_X16_GBPS
from services.core.model_sizes import MODEL_PROFILES, ModelProfile, model_profile
from services.core.state import ClusterState, Node

__all__ = ["NetworkModel", "Spread", "ring_allreduce_s"]

_GIGA = 1e9
_EXHAUSTIVE = 5000
"""Most subsets searched for a node's best compact set; beyond, greedy."""


def ring_allreduce_s(bits: float, members: int, gbps: float) -> float:
    """Seconds for a ring all-reduce of ``bits`` among ``members`` over links of ``gbps`` Gb/s."""
    if members <= 1 or bits <= 0:
        return 0.0
    return 2.0 * (members - 1) / members * bits / (gbps * _GIGA)


@dataclass(frozen=True, slots=True)
class Spread:
    """How a set of GPUs is laid out for the all-reduce."""

    per_node: int
    """The most GPUs on one node (``m``)."""
    intra_gbps: float
    """Slowest GPU pair inside a node (inf when no node holds two of them)."""
    nodes: int
    """Nodes spanned (``k``)."""
    inter_gbps: float
    """Slowest uplink among them (inf on one node)."""

    @property
    def observed_gbps(self) -> float:
        """The slowest link the job's traffic crosses (Blox Table 4's "bandwidth observed")."""
        return min(self.intra_gbps, self.inter_gbps)


class _Reference:
    """Compact spreads per GPU count, for the cluster they were computed on (held, so its id stays valid)."""

    __slots__ = ("cluster", "spreads")

    def __init__(self) -> None:
        self.cluster: ClusterState | None = None
        self.spreads: dict[int, Spread] = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkModel:
    """Iteration times from model sizes and link bandwidths (module docstring); all Gb/s."""

    overlap_gamma: float = 2.0
    """Pollux's overlap exponent (1: communication after compute; larger: more overlap)."""
    default_pair_gbps: float = PCIE3_X16_GBPS
    """A GPU pair a node does not report (or reports as 0): the PCIe path."""
    switch_gbps: float | None = None
    """Per-node bandwidth across switches (None: a non-blocking fabric)."""
    profiles: Mapping[str, ModelProfile] | None = None
    """Per-model sizes and step times (None: ``model_sizes.MODEL_PROFILES``)."""
    _reference: _Reference = field(default_factory=_Reference, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.overlap_gamma) and self.overlap_gamma >= 1.0):
            raise ValueError(f"overlap_gamma must be finite and >= 1, got {self.overlap_gamma}")
        for name in ("default_pair_gbps", "switch_gbps"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0 Gb/s, got {value}")

    # --- bandwidths ---------------------------------------------------------------------------
    def pair_gbps(self, node: Node, i: int, j: int) -> float:
        """Gb/s between local GPUs ``i`` and ``j`` of ``node`` (either order; missing: the default)."""
        links = node.link_bandwidth_gbps
        value = links.get((i, j))
        if value is None:
            value = links.get((j, i))
        return value if value is not None and value > 0 and math.isfinite(value) else self.default_pair_gbps

    def spread(self, gpus: Sequence[int], cluster: ClusterState) -> Spread:
        """The layout of ``gpus`` (global ids) on ``cluster``."""
        by_node: dict[str, list[int]] = {}
        for g in gpus:
            gpu = cluster.gpus[g]
            by_node.setdefault(gpu.node_id, []).append(gpu.local_index)
        intra = math.inf
        inter = math.inf
        switches: set[str] = set()
        for node_id, local in by_node.items():
            node = cluster.nodes[node_id]
            for i, j in itertools.combinations(local, 2):
                intra = min(intra, self.pair_gbps(node, i, j))
            switches.add(node.switch)
            if len(by_node) > 1:
                inter = min(inter, _positive(node.network_gbps))
        if len(switches) > 1 and self.switch_gbps is not None:
            inter = min(inter, self.switch_gbps)
        return Spread(max(len(v) for v in by_node.values()), intra, len(by_node), inter)

    def compact(self, n: int, cluster: ClusterState) -> Spread:
        """The best layout ``cluster`` offers ``n`` GPUs (module docstring), cached per cluster."""
        ref = self._reference
        if ref.cluster is not cluster:
            ref.cluster, ref.spreads = cluster, {}
        cached = ref.spreads.get(n)
        if cached is None:
            cached = ref.spreads[n] = self._compact(n, cluster)
        return cached

    def _compact(self, n: int, cluster: ClusterState) -> Spread:
        largest = max(1, cluster.largest_node_gpus)
        per_node = min(n, largest)
        best_intra = 0.0
        seen: set[tuple[int, int]] = set()  # (id of a links map, GPU count): nodes built alike
        for node in cluster.nodes.values():
            if len(node.gpu_ids) < per_node:
                continue
            key = (id(node.link_bandwidth_gbps), len(node.gpu_ids))
            if key in seen:
                continue
            seen.add(key)
            local = [cluster.gpus[g].local_index for g in node.gpu_ids]
            best_intra = max(best_intra, self._best_subset_gbps(node, local, per_node))
        intra = best_intra if per_node > 1 else math.inf
        nodes = -(-n // largest)
        inter = math.inf
        if nodes > 1:
            inter = max(_positive(node.network_gbps) for node in cluster.nodes.values())
        return Spread(per_node, intra, nodes, inter)

    def _best_subset_gbps(self, node: Node, local: list[int], size: int) -> float:
        """The largest slowest-pair bandwidth of ``size`` GPUs among ``local``."""
        if size <= 1:
            return math.inf
        if math.comb(len(local), size) <= _EXHAUSTIVE:
            return max(
                min(self.pair_gbps(node, i, j) for i, j in itertools.combinations(subset, 2))
                for subset in itertools.combinations(local, size)
            )
        # greedy: the fastest pair, then the GPU whose slowest link to those chosen is fastest
        pair = max(itertools.combinations(local, 2), key=lambda p: self.pair_gbps(node, *p))
        chosen = list(pair)
        while len(chosen) < size:
            rest = [g for g in local if g not in chosen]
            chosen.append(max(rest, key=lambda g: min(self.pair_gbps(node, g, c) for c in chosen)))
        return min(self.pair_gbps(node, i, j) for i, j in itertools.combinations(chosen, 2))

    # --- times --------------------------------------------------------------------------------
    def profile(self, model: str | None) -> ModelProfile:
        return model_profile(model, self.profiles if self.profiles is not None else MODEL_PROFILES)

    def sync_s(self, profile: ModelProfile, spread: Spread) -> float:
        """Seconds of one gradient all-reduce laid out as ``spread``."""
        bits = profile.gradient_bits
        return ring_allreduce_s(bits, spread.per_node, spread.intra_gbps) + ring_allreduce_s(
            bits, spread.nodes, spread.inter_gbps
        )

    def iteration_s(self, profile: ModelProfile, spread: Spread) -> float:
        """Seconds of one iteration: compute and all-reduce, overlapped (Pollux §3.2)."""
        gamma = self.overlap_gamma
        sync = self.sync_s(profile, spread)
        return float((profile.step_s**gamma + sync**gamma) ** (1.0 / gamma))

    def speed(self, model: str | None, gpus: Sequence[int], cluster: ClusterState) -> float:
        """Progress rate of a job of ``model`` on ``gpus`` relative to its compact placement (<= 1)."""
        if len(gpus) <= 1:
            return 1.0
        profile = self.profile(model)
        actual = self.iteration_s(profile, self.spread(gpus, cluster))
        reference = self.iteration_s(profile, self.compact(len(gpus), cluster))
        return min(1.0, reference / actual)


def _positive(gbps: float) -> float:
    """An uplink as the model uses it: a non-positive (or NaN) one counts as the slowest possible."""
    return gbps if gbps > 0 else 1e-3
