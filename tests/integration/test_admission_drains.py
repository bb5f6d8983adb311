"""Admission keeps the operators' node drains apart from the agents' own, and current (issue 15,
item 3), against a real broker, scheduler and admission service with fake worker agents.

Heartbeats (every 0.1 s here) carry only the agent's ``draining``; before, the first one overwrote
the operator's drain admission started from, and a drain or undrain after its start never reached
it. Now admission asks the leader's ``query.nodes`` every ``drain_refresh_s``.
"""

from __future__ import annotations

from pathlib import Path

from services.admission.inventory import NodeRecord
from services.admission.service import AdmissionConfig, AdmissionService
from services.runtime.broker import Broker
from tests.integration.test_node_drain import beating, drain, leader
from tests.integration.test_scheduler import cluster, wait_for


def record(admission: AdmissionService, node_id: str) -> NodeRecord:
    return admission.inventory.nodes[node_id]


async def a_few_refreshes_and_heartbeats(admission: AdmissionService) -> None:
    """Two more answers of the leader applied, and a heartbeat of every node heard since."""
    assert admission.drains is not None
    drains = admission.drains
    refreshes = drains.refreshes
    heard = {n: r.last_heard for n, r in admission.inventory.nodes.items()}
    await wait_for(lambda: drains.refreshes >= refreshes + 2, what="two more drain refreshes")
    await wait_for(lambda: all(admission.inventory.nodes[n].last_heard > t for n, t in heard.items()),
                   what="a heartbeat of every node")  # fmt: skip


async def test_admission_follows_operator_drains_and_heartbeats_do_not_undo_them(
    broker: Broker, namespace: str, tmp_path: Path
) -> None:
    async with cluster(broker, namespace, tmp_path) as c:
        workers = await c.start_workers({"n0": 2, "n1": 2})
        async with beating(workers):
            await leader(c)
            # Drained before admission starts: it learns it from query.admission.
            await drain(c.client, "n1", reason="replace a fan")
            admission = AdmissionService(AdmissionConfig(
                nats=broker.url, namespace=namespace, reoffer_interval_s=60, drain_refresh_s=0.2,
            ))  # fmt: skip
            await admission.start(await c.connect("admission"))
            try:
                await wait_for(admission.ready.is_set, what="admission started from the store")
                await a_few_refreshes_and_heartbeats(admission)
                n1 = record(admission, "n1")
                assert n1.operator_drained
                assert not n1.agent_draining
                assert n1.draining
                assert admission.cluster().free_gpu_count == 2  # n1's GPUs held by the marker
                assert admission.cluster().total_gpus == 4

                # An undrain after the start reaches admission, and stays.
                await drain(c.client, "n1", undo=True)
                await wait_for(lambda: not record(admission, "n1").draining, what="n1 undrained in admission")
                await a_few_refreshes_and_heartbeats(admission)
                assert not record(admission, "n1").draining
                assert admission.cluster().free_gpu_count == 4

                # So does a drain after the start, through heartbeats saying the agent stays.
                await drain(c.client, "n0")
                await wait_for(lambda: record(admission, "n0").draining, what="n0 drained in admission")
                await a_few_refreshes_and_heartbeats(admission)
                n0 = record(admission, "n0")
                assert n0.operator_drained
                assert not n0.agent_draining
                assert admission.cluster().free_gpu_count == 2
                assert admission.drains is not None
                assert admission.drains.failures == 0
            finally:
                await admission.stop()
