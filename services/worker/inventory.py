"""The node's GPUs: from NVML (``pynvml``, shipped as nvidia-ml-py) or a fake inventory of N GPUs.

Fake GPUs let a laptop or CI run a whole cluster (``roundhouse up`` defaults to 2 x 4 of them);
they report plausible, fixed properties and a utilization derived from whether a lease holds them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from schemas.metrics import GpuSample
from schemas.nodes import GpuInventory
from services.worker.links import nvml_link_matrix

__all__ = ["Inventory", "NvmlUnavailableError", "fake_inventory", "host_resources", "nvml_inventory"]

log = logging.getLogger("roundhouse.worker")

FAKE_GPU_NAME = "Roundhouse Fake GPU"
FAKE_GPU_MEMORY_MIB = 81_920


class NvmlUnavailableError(RuntimeError):
    """NVML could not be loaded or initialised (no NVIDIA driver on this host)."""


@dataclass(frozen=True, slots=True)
class Inventory:
    """What the agent registers: GPUs plus driver/CUDA versions when known."""

    gpus: list[GpuInventory]
    fake: bool
    driver_version: str | None = None
    cuda_version: str | None = None
    link_bandwidth_gbps: list[list[float]] | None = None
    """NVLink bandwidths between the GPUs (``services.worker.links``), in the order of ``gpus``; None: none found."""

    @property
    def indices(self) -> list[int]:
        return [g.index for g in self.gpus]

    def sample(self, busy: set[int]) -> list[GpuSample]:
        """Current per-GPU readings: NVML's for real GPUs, 100 %/0 % by lease for fake ones."""
        if self.fake:
            return [
                GpuSample(index=g.index, utilization_pct=100.0 if g.index in busy else 0.0,
                          memory_used_mib=0, memory_total_mib=g.memory_mib)
                for g in self.gpus
            ]  # fmt: skip
        return _nvml_samples(self.gpus)


def fake_inventory(count: int, node_id: str, name: str = FAKE_GPU_NAME) -> Inventory:
    gpus = [
        GpuInventory(index=i, uuid=f"GPU-fake-{node_id}-{i}", name=name,
                     memory_mib=FAKE_GPU_MEMORY_MIB, compute_capability="9.0")
        for i in range(count)
    ]  # fmt: skip
    return Inventory(gpus=gpus, fake=True)


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailableError("pynvml (nvidia-ml-py) is not installed") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailableError(f"NVML is unavailable ({exc}); use --fake-gpus N on a host without GPUs") from exc
    return pynvml


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_inventory() -> Inventory:
    """The GPUs NVML sees, indexed as CUDA_VISIBLE_DEVICES numbers them."""
    nv = _nvml()
    gpus = []
    handles = []
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        handles.append(handle)
        try:
            major, minor = nv.nvmlDeviceGetCudaComputeCapability(handle)
            capability: str | None = f"{major}.{minor}"
        except nv.NVMLError:
            capability = None
        pci = _text(nv.nvmlDeviceGetPciInfo(handle).busId)
        memory_mib = max(1, int(nv.nvmlDeviceGetMemoryInfo(handle).total) // 2**20)
        gpus.append(GpuInventory(
            index=index, uuid=_text(nv.nvmlDeviceGetUUID(handle)), name=_text(nv.nvmlDeviceGetName(handle))[:128],
            memory_mib=memory_mib, compute_capability=capability,
            pci_bus_id=pci if _looks_like_pci(pci) else None,
        ))  # fmt: skip
    driver = _text(nv.nvmlSystemGetDriverVersion())
    cuda_raw = int(nv.nvmlSystemGetCudaDriverVersion())
    links = nvml_link_matrix(nv, handles, [g.pci_bus_id for g in gpus])
    return Inventory(gpus=gpus, fake=False, driver_version=driver,
                     cuda_version=f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}", link_bandwidth_gbps=links)


def _looks_like_pci(value: str) -> bool:
    parts = value.split(":")
    return len(parts) == 3 and 4 <= len(parts[0]) <= 8 and "." in parts[2]


def _nvml_samples(gpus: list[GpuInventory]) -> list[GpuSample]:
    nv = _nvml()
    samples = []
    for g in gpus:
        handle = nv.nvmlDeviceGetHandleByIndex(g.index)
        util = nv.nvmlDeviceGetUtilizationRates(handle)
        memory = nv.nvmlDeviceGetMemoryInfo(handle)
        try:
            temperature: float | None = float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
        except nv.NVMLError:
            temperature = None
        try:
            power: float | None = nv.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except nv.NVMLError:
            power = None
        samples.append(GpuSample(
            index=g.index, utilization_pct=float(util.gpu), memory_used_mib=int(memory.used) // 2**20,
            memory_total_mib=g.memory_mib, temperature_c=temperature, power_w=power,
        ))  # fmt: skip
    return samples


def discover(fake_gpus: int, node_id: str, fake_name: str = FAKE_GPU_NAME) -> Inventory:
    """Fake GPUs (named ``fake_name``) when asked for; else NVML's; else (no driver) none, with a warning."""
    if fake_gpus > 0:
        return fake_inventory(fake_gpus, node_id, fake_name)
    try:
        return nvml_inventory()
    except NvmlUnavailableError as exc:
        log.warning("%s; this node offers no GPUs", exc)
        return Inventory(gpus=[], fake=True)


def host_resources() -> tuple[float, float]:
    """(CPU cores, RAM in GiB) of this host."""
    cpus = float(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else float(os.cpu_count() or 1)
    try:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        memory_gb = 1.0
    return cpus, memory_gb
