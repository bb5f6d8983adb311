"""GPU utilization and memory read through NVML (``pynvml`` from the nvidia-ml-py package).

NVML is optional: a host without an NVIDIA driver (a laptop, CI, a CPU-only node running fake
GPUs) has no ``libnvidia-ml``, and ``nvmlInit`` raises ``NVMLError``. :meth:`NvmlSampler.open`
then returns ``None`` and says why (:func:`unavailable_reason`), and callers fall back to the worker's
fake inventory. A reading a device does not support (power on some boards, temperature on MIG
instances) is left out of that GPU's sample instead of failing the whole sample.
"""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from schemas.metrics import GpuSample

log = logging.getLogger("roundhouse.nvml")

_MIB = 1024 * 1024


def _load() -> tuple[ModuleType | None, str]:
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py not installed
        return None, f"pynvml is not installed ({exc}); install nvidia-ml-py"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML could not start: {exc} (no NVIDIA driver on this host?)"
    return pynvml, ""


def unavailable_reason() -> str | None:
    """Why NVML cannot be used here, or None if it can (initialises and shuts it down again)."""
    sampler = NvmlSampler.open()
    if sampler is None:
        return NvmlSampler.last_error
    sampler.close()
    return None


class NvmlSampler:
    """Samples every GPU NVML sees on this host. Open with :meth:`open`; close when done."""

    last_error: str = ""
    """Why the last :meth:`open` returned None."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(int(nvml.nvmlDeviceGetCount()))]
        self._closed = False

    @classmethod
    def open(cls) -> NvmlSampler | None:
        """A sampler, or None when NVML is unavailable (the reason is in ``last_error`` and logged)."""
        nvml, reason = _load()
        if nvml is None:
            cls.last_error = reason
            log.info("NVML unavailable: %s", reason)
            return None
        try:
            return cls(nvml)
        except nvml.NVMLError as exc:
            cls.last_error = f"NVML could not list devices: {exc}"
            log.info("NVML unavailable: %s", cls.last_error)
            nvml.nvmlShutdown()
            return None

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    def sample(self) -> list[GpuSample]:
        """One reading per GPU, by NVML index. GPUs whose utilization cannot be read are skipped."""
        nvml = self._nvml
        out: list[GpuSample] = []
        for index, handle in enumerate(self._handles):
            try:
                utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as exc:
                log.debug("GPU %d: no utilization reading: %s", index, exc)
                continue
            out.append(
                GpuSample(
                    index=index,
                    utilization_pct=min(100.0, max(0.0, utilization)),
                    memory_used_mib=int(memory.used) // _MIB,
                    memory_total_mib=max(1, int(memory.total) // _MIB),
                    temperature_c=self._optional(
                        lambda h=handle: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
                    ),
                    power_w=self._optional(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
                )
            )
        return out

    def _optional(self, read: Any) -> float | None:
        try:
            return float(read())
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)
