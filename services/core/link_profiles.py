"""Link bandwidths of real servers, for simulated clusters: GPU pairs inside a node and the node's uplink.

All bandwidths are **Gb/s (gigabits per second), one direction**, the unit of ``Node.network_gbps``
and ``Node.link_bandwidth_gbps`` (and of NIC speeds; 1 GB/s = 8 Gb/s). Sources:

* **NVLink 2.0** (V100): 25 GB/s per direction per link = 200 Gb/s (NVIDIA Tesla V100 architecture
  whitepaper, 2017: six links, 300 GB/s in total both directions).
* **p3.8xlarge** (Blox §4, §5.3): 4 V100 of a DGX-1V hybrid cube-mesh quad. GPUs 0-3 and 1-2 have
  two NVLinks, the other pairs one ("bandwidth between GPU 0 and GPU 3 is twice that of bandwidth
  between GPU 0 and GPU 1", Blox §5.3 after Blink, Wang et al. MLSys '20; NVIDIA DGX-1 with V100
  system architecture whitepaper, Fig. 3); a 10 Gb/s uplink (Blox §4.3: "only have a 10Gbps
  interconnect across servers"; AWS lists p3.8xlarge as "10 Gigabit").
* **p100-ib100**: the Tiresias private cluster Blox §4.3 contrasts it with: 4 P100 per server over
  PCIe, 100 Gb/s InfiniBand (EDR) across servers.
* **PCIe 3.0 x16**: 15.75 GB/s raw per direction, ~12 GB/s achieved = 96 Gb/s (what GPUs without
  NVLink get between them through a PCIe switch); **pcie-25gbe**: such a server on 25 Gb/s Ethernet.
* **dgx-a100**: 8 A100 on NVSwitch, 300 GB/s per direction to every peer = 2400 Gb/s (NVIDIA A100
  whitepaper: NVLink 3, 600 GB/s total), 8 x 200 Gb/s HDR InfiniBand = 1600 Gb/s per node.

A :class:`LinkProfile` also says how fast the fabric between switches is (``switch_gbps``: the
per-node share of a switch's uplink when a job spans switches; None: non-blocking).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from services.core.state import ClusterState, Node

__all__ = ["LINK_PROFILES", "LinkProfile", "link_profile", "with_links"]

NVLINK2_GBPS = 200.0
"""One NVLink 2.0 link, one direction."""
PCIE3_X16_GBPS = 96.0
"""PCIe 3.0 x16 as achieved (~12 GB/s)."""
NVSWITCH_A100_GBPS = 2400.0


@dataclass(frozen=True, slots=True)
class LinkProfile:
    """One server model's links: pairs of local GPU indices, the rest, the uplink, the switch fabric."""

    name: str
    gpus_per_node: int
    pairs: tuple[tuple[int, int, float], ...]
    """``(i, j, Gb/s)`` for the pairs that differ from ``other_pairs_gbps`` (i < j)."""
    other_pairs_gbps: float
    uplink_gbps: float
    switch_gbps: float | None = None
    source: str = ""

    def pair_map(self) -> dict[tuple[int, int], float]:
        """Every pair (both orders) of one node of this profile, as ``Node.link_bandwidth_gbps``."""
        out: dict[tuple[int, int], float] = {}
        explicit = {(i, j): bw for i, j, bw in self.pairs}
        for i, j in itertools.combinations(range(self.gpus_per_node), 2):
            bw = explicit.get((i, j), self.other_pairs_gbps)
            out[(i, j)] = out[(j, i)] = bw
        return out


LINK_PROFILES: Mapping[str, LinkProfile] = MappingProxyType(
    {
        "p3.8xlarge": LinkProfile(
            name="p3.8xlarge", gpus_per_node=4,
            pairs=((0, 3, 2 * NVLINK2_GBPS), (1, 2, 2 * NVLINK2_GBPS)),
            other_pairs_gbps=NVLINK2_GBPS, uplink_gbps=10.0,
            source="DGX-1V quad: NVLink 2.0 x1/x2; 10 Gb/s Ethernet (Blox §4.3, §5.3)",
        ),
        "p100-ib100": LinkProfile(
            name="p100-ib100", gpus_per_node=4, pairs=(), other_pairs_gbps=PCIE3_X16_GBPS, uplink_gbps=100.0,
            source="4 x P100 over PCIe 3.0, 100 Gb/s EDR InfiniBand (Tiresias' cluster, Blox §4.3)",
        ),
        "pcie-25gbe": LinkProfile(
            name="pcie-25gbe", gpus_per_node=4, pairs=(), other_pairs_gbps=PCIE3_X16_GBPS, uplink_gbps=25.0,
            source="PCIe 3.0 x16 between GPUs, 25 Gb/s Ethernet",
        ),
        "dgx-a100": LinkProfile(
            name="dgx-a100", gpus_per_node=8, pairs=(), other_pairs_gbps=NVSWITCH_A100_GBPS, uplink_gbps=1600.0,
            source="NVSwitch (NVLink 3, 300 GB/s per direction); 8 x 200 Gb/s HDR InfiniBand",
        ),
    }
)  # fmt: skip


def link_profile(name: str) -> LinkProfile:
    """The profile called ``name``; ValueError naming the known ones otherwise."""
    try:
        return LINK_PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown link profile {name!r}; known: {', '.join(LINK_PROFILES)}") from None


def with_links(cluster: ClusterState, profile: LinkProfile, *, uplink_gbps: float | None = None) -> ClusterState:
    """A copy of the (empty) ``cluster`` whose nodes carry ``profile``'s links (``uplink_gbps``
    overrides the profile's uplink: a bandwidth sweep). Nodes with another GPU count than the
    profile's keep the pairs that exist on them."""
    if any(cluster.gpu_jobs):
        raise ValueError("with_links takes an empty cluster (it builds a new one)")
    uplink = profile.uplink_gbps if uplink_gbps is None else uplink_gbps
    if not uplink > 0:
        raise ValueError(f"uplink bandwidth must be > 0 Gb/s, got {uplink}")
    pairs = profile.pair_map()
    by_size: dict[int, Mapping[tuple[int, int], float]] = {}  # one shared map per node size
    nodes: list[Node] = []
    for node_id in cluster.node_ids:
        node = cluster.nodes[node_id]
        size = len(node.gpu_ids)
        links = by_size.get(size)
        if links is None:
            links = by_size[size] = MappingProxyType(
                {(i, j): bw for (i, j), bw in pairs.items() if i < size and j < size}
            )
        nodes.append(dataclasses.replace(node, link_bandwidth_gbps=links, network_gbps=uplink))
    return ClusterState(nodes, cluster.gpus)
