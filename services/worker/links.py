"""The bandwidths between this node's GPUs that the agent registers (``NodeRegister.link_bandwidth_gbps``).

From NVML on real GPUs: the active NVLinks of each GPU, counted per peer GPU, times the per-link
bandwidth of their NVLink generation; links that end at an NVSwitch connect the GPU to every other
GPU on the switch fabric, at the smaller of the two GPUs' switch link counts. Pairs with no NVLink
stay 0 ("unknown": they talk over PCIe, which consumers assume). From a setting for fake GPUs (or to
override NVML): ``--link-bandwidth-gbps`` / ``ROUNDHOUSE_LINK_BANDWIDTH_GBPS``, either the name of a
server profile (``services.core.link_profiles``: ``p3.8xlarge``, ``dgx-a100``, ...) or explicit pairs
``"0-1=400,2-3=400"``. All values are Gb/s, one direction.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from services.core.link_profiles import LINK_PROFILES

__all__ = ["NVLINK_GBPS_PER_LINK", "LinkSpecError", "check_link_spec", "links_from_spec", "nvml_link_matrix"]

log = logging.getLogger("roundhouse.worker")

NVLINK_GBPS_PER_LINK: dict[int, float] = {1: 160.0, 2: 200.0, 3: 200.0, 4: 200.0, 5: 400.0}
"""One link, one direction, by NVLink version: 1 (P100) 20 GB/s; 2-4 (V100, A100, H100) 25 GB/s;
5 (B200) 50 GB/s (NVIDIA's architecture whitepapers)."""
MAX_BANDWIDTH_GBPS = 100_000.0
"""The schema's bound (``schemas.nodes``): a value above it would make the register invalid."""

_PAIR = re.compile(r"^\s*(\d{1,2})\s*-\s*(\d{1,2})\s*=\s*(\d+(?:\.\d+)?)\s*$")


class LinkSpecError(ValueError):
    """A link bandwidth setting that cannot be used; the message says the expected form."""


def _pairs(spec: str) -> list[tuple[int, int, float]]:
    out: list[tuple[int, int, float]] = []
    for part in spec.split(","):
        match = _PAIR.match(part)
        if match is None:
            raise LinkSpecError(
                f"link bandwidth {part.strip()!r}: expected a profile ({', '.join(LINK_PROFILES)}) or pairs "
                "like '0-1=400,2-3=400' (GPU indices, Gb/s)"
            )
        a, b, gbps = int(match.group(1)), int(match.group(2)), float(match.group(3))
        if a == b:
            raise LinkSpecError(f"link bandwidth {part.strip()!r}: a link joins two different GPUs")
        if not 0 < gbps <= MAX_BANDWIDTH_GBPS:
            raise LinkSpecError(f"link bandwidth {part.strip()!r}: Gb/s must be in (0, {MAX_BANDWIDTH_GBPS:g}]")
        out.append((a, b, gbps))
    return out


def check_link_spec(spec: str) -> str:
    """``spec`` if it is a known profile or well-formed pairs (the config's validator)."""
    if spec.strip() not in LINK_PROFILES:
        _pairs(spec)
    return spec.strip()


def links_from_spec(spec: str, indices: Sequence[int]) -> list[list[float]]:
    """The matrix (rows and columns in the order of ``indices``, the NVML indices registered) for
    ``spec``; LinkSpecError if a pair names a GPU this node does not have."""
    profile = LINK_PROFILES.get(spec.strip())
    if profile is not None:
        pairs = [(a, b, gbps) for (a, b), gbps in profile.pair_map().items() if a < b]
    else:
        pairs = _pairs(spec)
    where = {index: row for row, index in enumerate(indices)}
    matrix = [[0.0] * len(indices) for _ in indices]
    for a, b, gbps in pairs:
        if a not in where or b not in where:
            if profile is not None:
                continue  # a profile of a bigger server: the pairs this node has
            raise LinkSpecError(f"link bandwidth {a}-{b}: this node has GPUs {list(indices)}")
        i, j = where[a], where[b]
        matrix[i][j] = matrix[j][i] = gbps
    return matrix


def nvml_link_matrix(nv: Any, handles: Sequence[Any], bus_ids: Sequence[str | None]) -> list[list[float]] | None:
    """NVLink bandwidths between the GPUs of ``handles`` (NVML module ``nv``; ``bus_ids`` their PCI
    bus ids), or None when no GPU has an active NVLink (PCIe-only hosts)."""
    n = len(handles)
    row_of = {bus.lower(): i for i, bus in enumerate(bus_ids) if bus}
    direct = [[0.0] * n for _ in range(n)]
    to_switch = [0.0] * n
    found = False
    for i, handle in enumerate(handles):
        for link in range(int(nv.NVML_NVLINK_MAX_LINKS)):
            try:
                if nv.nvmlDeviceGetNvLinkState(handle, link) != nv.NVML_FEATURE_ENABLED:
                    continue
                gbps = NVLINK_GBPS_PER_LINK.get(int(nv.nvmlDeviceGetNvLinkVersion(handle, link)), 200.0)
                remote = _remote_type(nv, handle, link)
                bus = _bus(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
            except nv.NVMLError:
                continue  # no such link on this GPU, or not supported: nothing to count
            found = True
            if remote == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                to_switch[i] += gbps
            elif bus in row_of and row_of[bus] != i:
                direct[i][row_of[bus]] += gbps
    if not found:
        return None
    matrix = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            # both ends count the same links; the smaller count is the one both agree on
            value = min(direct[i][j], direct[j][i]) + min(to_switch[i], to_switch[j])
            matrix[i][j] = matrix[j][i] = min(value, MAX_BANDWIDTH_GBPS)
    return matrix


def _remote_type(nv: Any, handle: Any, link: int) -> int:
    """The device at the far end of ``link`` (older drivers do not say: assume a GPU)."""
    try:
        return int(nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))
    except (nv.NVMLError, AttributeError):
        return int(nv.NVML_NVLINK_DEVICE_TYPE_GPU)


def _bus(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
