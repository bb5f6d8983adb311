"""The worker's GPU inventory from NVML, on a host with an NVIDIA driver (skipped elsewhere)."""

from __future__ import annotations

import re

import pytest

from services.metrics.nvml import unavailable_reason
from services.worker.inventory import discover

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason="no NVML on this host (no NVIDIA driver)")


def test_the_inventory_lists_every_gpu_nvml_sees_as_cuda_numbers_them() -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    inventory = discover(0, "this-host")
    assert not inventory.fake
    assert [g.index for g in inventory.gpus] == list(range(count))
    assert count >= 1
    for gpu in inventory.gpus:
        assert gpu.uuid.startswith(("GPU-", "MIG-")), gpu.uuid
        assert gpu.memory_mib > 1024, gpu
        assert gpu.name, gpu
        assert gpu.compute_capability is None or re.fullmatch(r"\d+\.\d+", gpu.compute_capability), gpu
    assert len({g.uuid for g in inventory.gpus}) == count
    assert inventory.driver_version
    assert re.fullmatch(r"\d+\.\d+", inventory.cuda_version or ""), inventory.cuda_version
