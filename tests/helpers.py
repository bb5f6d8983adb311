"""Helpers shared by the integration tests: polling for a condition and fake node inventories.

One implementation each, instead of a copy per test module (found by the ``duplicates`` tool).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from schemas.nodes import GpuInventory, NodeRegister


async def eventually(
    predicate: Callable[[], object], timeout_s: float = 10.0, what: str = "condition", poll_s: float = 0.02
) -> None:
    """Wait until ``predicate()`` is truthy, polling every ``poll_s`` on the running loop's clock.

    Raises AssertionError naming ``what`` when ``timeout_s`` passes first, so a failing test says
    which condition it was waiting for.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(poll_s)


def fake_node(
    node_id: str,
    gpus: int,
    *,
    incarnation: uuid.UUID | None = None,
    gpu_name: str = "Fake GPU",
    memory_mib: int = 16_384,
) -> NodeRegister:
    """A ``node.register`` fact for a fake node with ``gpus`` identical GPUs (32 CPUs, 256 GB).

    GPU uuids are ``GPU-<node_id>-<index>``; ``incarnation`` is fresh unless given (pass the same
    one to announce the same node again).
    """
    return NodeRegister(
        node_id=node_id,
        incarnation=incarnation or uuid.uuid4(),
        hostname=node_id,
        cpus=32,
        memory_gb=256,
        gpus=[
            GpuInventory(index=i, uuid=f"GPU-{node_id}-{i}", name=gpu_name, memory_mib=memory_mib)
            for i in range(gpus)
        ],
    )
