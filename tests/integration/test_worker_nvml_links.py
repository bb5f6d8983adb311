"""The agent's NVLink topology from a real NVML (skipped on hosts without an NVIDIA driver)."""

from __future__ import annotations

import uuid

import pytest

from schemas.nodes import NodeRegister
from services.metrics.nvml import unavailable_reason
from services.worker.inventory import discover

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason="no NVML on this host (no NVIDIA driver)")


def test_nvml_links_are_a_valid_symmetric_matrix_or_none() -> None:
    inventory = discover(0, "this-host")
    matrix = inventory.link_bandwidth_gbps
    n = len(inventory.gpus)
    if matrix is not None:  # None: no active NVLink (PCIe-only hosts, a single PCIe GPU)
        assert len(matrix) == n
        for i in range(n):
            assert len(matrix[i]) == n
            assert matrix[i][i] == 0.0
            for j in range(n):
                assert matrix[i][j] == matrix[j][i]
                assert 0.0 <= matrix[i][j] <= 100_000.0
    # and the schema accepts what the agent would register
    NodeRegister(node_id="this-host", incarnation=uuid.uuid4(), hostname="h", cpus=1, memory_gb=1,
                 gpus=inventory.gpus, link_bandwidth_gbps=matrix)  # fmt: skip
