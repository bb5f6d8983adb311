"""Cluster shapes for the simulator: ``NODESxGPUS`` strings, typed ``TYPE:NODESxGPUS,...`` strings
(a heterogeneous cluster, e.g. Gavel's ``k80:3x4,p100:3x4,v100:3x4``) and Tiresias cluster spec files."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from services.core.heterogeneity import normalize_gpu_type
from services.core.state import ClusterState, Gpu, Node


class ClusterSpecError(ValueError):
    """A cluster description that cannot be used; the message says what form is expected."""


_SHAPE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shape(text: str) -> tuple[int, int]:
    """``"32x4"`` -> (32 nodes, 4 GPUs per node)."""
    match = _SHAPE.match(text)
    if not match:
        raise ClusterSpecError(f"cluster must look like NODESxGPUS (e.g. 32x4), got {text!r}")
    nodes, gpus = int(match.group(1)), int(match.group(2))
    if nodes < 1 or gpus < 1:
        raise ClusterSpecError(f"cluster needs at least one node and one GPU per node, got {text!r}")
    return nodes, gpus


def uniform_cluster(text: str) -> ClusterState:
    nodes, gpus = parse_shape(text)
    return ClusterState.uniform(nodes, gpus)


def parse_typed(text: str) -> list[tuple[str, int, int]]:
    """``"k80:8x4,v100:2x8"`` -> ``[("k80", 8, 4), ("v100", 2, 8)]`` (types normalised, as a node's
    inventory reports them: ``services.core.heterogeneity.normalize_gpu_type``). A part without
    ``TYPE:`` is ``generic``; a bare ``NODESxGPUS`` is one such part."""
    parts = [p.strip() for p in text.split(",")]
    if not all(parts):
        raise ClusterSpecError(f"cluster must look like TYPE:NODESxGPUS[,TYPE:NODESxGPUS...], got {text!r}")
    groups: list[tuple[str, int, int]] = []
    for part in parts:
        name, sep, shape = part.rpartition(":")
        if sep and not name.strip():
            raise ClusterSpecError(f"empty GPU type in {part!r} of {text!r} (TYPE:NODESxGPUS)")
        gpu_type = normalize_gpu_type(name) if sep else "generic"
        nodes, gpus = parse_shape(shape)
        groups.append((gpu_type, nodes, gpus))
    return groups


def typed_cluster(text: str) -> ClusterState:
    """A cluster of typed node groups (``parse_typed``), nodes numbered in the order given."""
    node_list: list[Node] = []
    gpu_list: list[Gpu] = []
    for gpu_type, nodes, gpus in parse_typed(text):
        for _ in range(nodes):
            node_id = f"node-{len(node_list)}"
            first = len(gpu_list)
            ids = tuple(range(first, first + gpus))
            node_list.append(Node(node_id, ids, gpu_type=gpu_type))
            gpu_list.extend(Gpu(g, node_id, i, gpu_type) for i, g in enumerate(ids))
    return ClusterState(node_list, gpu_list)


def cluster_from_text(text: str) -> ClusterState:
    """``NODESxGPUS`` (a ``generic`` cluster, as ``uniform_cluster``) or the typed form."""
    if ":" in text or "," in text:
        return typed_cluster(text)
    return uniform_cluster(text)


def read_tiresias_spec(path: Path) -> ClusterState:
    """A Tiresias cluster spec (``num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,
    mem_p_node``, one data row): switches x nodes per switch, each node with the given GPUs."""
    if not path.is_file():
        raise ClusterSpecError(f"cluster spec {path} does not exist")
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if len(rows) != 1:
        raise ClusterSpecError(f"{path}: expected a header and exactly one row, got {len(rows)} rows")
    row = {k.strip(): (v or "").strip() for k, v in rows[0].items() if k is not None}
    try:
        switches = int(row["num_switch"])
        per_switch = int(row["num_node_p_switch"])
        gpus = int(row["num_gpu_p_node"])
        cpus = float(row.get("num_cpu_p_node") or 32)
        memory = float(row.get("mem_p_node") or 256)
    except (KeyError, ValueError) as exc:
        raise ClusterSpecError(
            f"{path}: needs integer columns num_switch,num_node_p_switch,num_gpu_p_node ({exc})"
        ) from None
    if min(switches, per_switch, gpus) < 1:
        raise ClusterSpecError(f"{path}: switch, node and GPU counts must be >= 1")
    nodes: list[Node] = []
    gpu_list: list[Gpu] = []
    for s in range(switches):
        for n in range(per_switch):
            node_id = f"node-{s * per_switch + n}"
            first = len(gpu_list)
            ids = tuple(range(first, first + gpus))
            nodes.append(Node(node_id, ids, cpus=cpus, memory_gb=memory, switch=f"switch-{s}"))
            gpu_list.extend(Gpu(g, node_id, i) for i, g in enumerate(ids))
    return ClusterState(nodes, gpu_list)
