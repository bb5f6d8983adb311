"""The operator's view without a bus (issue 15, item 3): a node's state word, an operator's drain in
the inventory (it withholds the node, outlives a re-registration and a reload, old stored rows
still load), the services API's answers as ``status`` reads them, and the CLI's words."""

from __future__ import annotations

import json
import uuid

import pytest

from roundhouse.commands.drain import describe
from roundhouse.commands.nodes import format_table
from roundhouse.commands.status import format_status
from schemas.examples import example
from schemas.operations import DrainReply, NodesReply, NodeState, StatusReply
from services.runtime.discovery import Instance, parse_stats
from services.scheduler.book import JobBook
from services.scheduler.inventory import Inventory, OperatorDrain
from services.scheduler.node_queries import node_state
from services.scheduler.status_query import LeaderSelf, answer_status, instance_view
from services.scheduler.timings import RoundTimings
from tests.helpers import fake_node

DRAIN = OperatorDrain("operator", 1_700_000_000.0, "swap a fan")


@pytest.mark.parametrize(
    ("live", "silent", "draining", "used", "state"),
    [
        pytest.param(False, True, True, 2, NodeState.DOWN, id="down-first"),
        pytest.param(True, True, True, 2, NodeState.SILENT, id="silent-before-drain"),
        pytest.param(True, False, True, 1, NodeState.DRAINING, id="drained-with-jobs"),
        pytest.param(True, False, True, 0, NodeState.DRAINED, id="drained-and-idle"),
        pytest.param(True, False, False, 2, NodeState.ALLOCATED, id="all-gpus-held"),
        pytest.param(True, False, False, 1, NodeState.MIXED, id="some-held"),
        pytest.param(True, False, False, 0, NodeState.IDLE, id="none-held"),
    ],
)
def test_a_node_state_is_the_first_word_that_applies(
    live: bool, silent: bool, draining: bool, used: int, state: NodeState
) -> None:
    assert node_state(live=live, silent=silent, draining=draining, used=used, total=2) is state


def test_an_operator_drain_withholds_the_node_and_outlives_a_new_agent_and_a_reload() -> None:
    inventory = Inventory(lease_ttl_s=30.0, silent_s=6.0)
    inventory.register(fake_node("n0", 2), 0.0)
    node = inventory.get("n0")
    assert node is not None
    version = inventory.version
    assert inventory.set_drain("n0", DRAIN)
    assert not inventory.set_drain("n0", DRAIN)  # nothing changed
    assert inventory.version == version + 1
    assert node.draining
    assert not node.agent_draining
    assert not inventory.takes_work(node, 1.0)

    inventory.register(fake_node("n0", 2), 2.0)  # a new incarnation of the agent registers
    again = inventory.get("n0")
    assert again is not None
    assert again.drain == DRAIN

    loaded = Inventory(lease_ttl_s=30.0)
    loaded.loads(inventory.dumps(), 5.0)
    reloaded = loaded.get("n0")
    assert reloaded is not None
    assert reloaded.drain == DRAIN
    assert not loaded.takes_work(reloaded, 5.0)

    assert loaded.set_drain("n0", None)
    assert loaded.takes_work(reloaded, 5.0)
    with pytest.raises(KeyError):
        loaded.set_drain("n9", DRAIN)


def test_an_agent_leaving_and_an_operator_drain_are_told_apart() -> None:
    inventory = Inventory(lease_ttl_s=30.0)
    register = fake_node("n0", 1)
    inventory.register(register, 0.0)
    assert inventory.heartbeat("n0", register.incarnation, True, 1.0)
    node = inventory.get("n0")
    assert node is not None
    assert node.agent_draining
    assert node.drain is None
    assert node.draining
    assert inventory.heartbeat("n0", register.incarnation, False, 2.0)
    assert not node.draining


def test_rows_stored_before_drains_existed_still_load() -> None:
    stored = json.dumps({"n0": ["h", [0, 1], str(uuid.uuid4()), 32.0, 256.0, "generic"]})
    inventory = Inventory(lease_ttl_s=30.0)
    inventory.loads(stored, 0.0)
    node = inventory.get("n0")
    assert node is not None
    assert node.drain is None
    assert node.gpus == (0, 1)


def _stats(name: str, namespace: str, **service: object) -> bytes:
    return json.dumps({
        "type": "io.nats.micro.v1.stats_response", "name": name, "id": "ID1", "version": "0.1.0",
        "metadata": {"instance": "inst-1", "namespace": namespace},
        "endpoints": [{"name": "stats", "data": {"service": service, "uptime_s": 12.5}}],
    }).encode()  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "kept"),
    [
        pytest.param(_stats("roundhouse-placement", "ns1", policy="consolidated"), True, id="ours"),
        pytest.param(_stats("roundhouse-placement", "ns2"), False, id="another-namespace"),
        pytest.param(_stats("other-app", "ns1"), False, id="another-program"),
        pytest.param(b"not json", False, id="garbage"),
        pytest.param(b"[1, 2]", False, id="not-an-object"),
    ],
)
def test_only_this_namespaces_roundhouse_instances_are_read(payload: bytes, kept: bool) -> None:
    instance = parse_stats(payload, "ns1")
    assert (instance is not None) is kept
    if instance is not None:
        assert instance.kind == "placement"
        assert instance.instance == "inst-1"
        assert instance.uptime_s == 12.5
        assert instance.service_stats["policy"] == "consolidated"


def test_status_names_the_leaders_own_policy_and_fills_it_in_when_its_answer_was_missed() -> None:
    leader = LeaderSelf("sched-0", 4, "las", {"starvation_s": 3600})
    standby = Instance("scheduler", "ID2", "sched-1", "0.1.0", data={"service": {"policy": "srtf"}})
    placement = Instance("placement", "ID3", "p-0", "0.1.0",
                         data={"service": {"policy": "packed", "policy_options": {"bad key\n": 1}}})  # fmt: skip
    view = instance_view(standby, leader)
    assert view.policy == "srtf"
    assert not view.leader
    assert instance_view(placement, leader).policy_options == {}  # not what a reply may carry: left out
    reply = answer_status(leader, [standby, placement], book=JobBook(), inventory=Inventory(lease_ttl_s=30.0),
                          timings=RoundTimings(round=7, rank=0.002), rounds_run=3, now=0.0)  # fmt: skip
    schedulers = next(s for s in reply.services if s.kind == "scheduler").instances
    assert [(i.instance, i.leader, i.policy) for i in schedulers] == [("sched-0", True, "las"), ("sched-1", False,
                                                                                                 "srtf")]
    assert schedulers[0].policy_options == {"starvation_s": 3600}
    assert [s.kind for s in reply.services] == ["scheduler", "placement"]
    assert reply.round.number == 7
    assert reply.round.phases_s["rank"] == 0.002


@pytest.mark.parametrize(
    ("reply", "line"),
    [
        pytest.param(DrainReply(node_id="n0", draining=True, changed=True, preempted=["a", "b"], epoch=1),
                     "n0 drained: it takes no new work; preempting a, b (each checkpoints and queues again)",
                     id="drain-now"),
        pytest.param(DrainReply(node_id="n0", draining=True, changed=False, epoch=1), "n0 already drained",
                     id="again"),
        pytest.param(DrainReply(node_id="n0", draining=False, changed=True, epoch=1),
                     "n0 undrained: it takes new work", id="undrain"),
        pytest.param(DrainReply(node_id="n0", draining=False, changed=False, epoch=1), "n0 was not drained",
                     id="undrain-again"),
    ],
)
def test_drain_says_what_happened(reply: DrainReply, line: str) -> None:
    assert describe(reply) == line


def test_the_nodes_table_and_the_status_summary() -> None:
    nodes = example(NodesReply)
    table = format_table(list(nodes.nodes), (nodes.nodes[0].drained_at or 0.0) + 60)
    header, row = table.splitlines()
    assert header.split() == ["NODE", "STATE", "GPUS", "USED", "FREE", "TYPE", "HEARTBEAT", "JOBS", "DRAIN"]
    assert row.split()[:5] == ["node-01", "draining", "8", "4", "4"]
    assert "job-0001 +1" in row
    assert "by operator 1m ago" in row
    assert row.endswith(": replace a fan")

    summary = format_status(example(StatusReply))
    assert summary.splitlines()[0] == "leader    scheduler-a1b2 (epoch 7)"
    assert "3 queued (12 GPUs), 1 held, 2 running" in summary
    assert "scheduler-a1b2 (leader)" in summary
    assert '{"thresholds":[3600.0],"starvation_factor":4}' in summary


def test_an_instance_that_reports_its_policy_and_options_beside_its_stats_shows_both() -> None:
    leader = LeaderSelf("sched-0", 1, "fifo", {})
    admission = Instance("admission", "ID4", "a-0", "0.1.0",
                         data={"policy": {"name": "user-quota", "options": {"max_jobs": 4}},
                               "service": {"policy": "user-quota"}})  # fmt: skip
    view = instance_view(admission, leader)
    assert view.policy == "user-quota"
    assert view.policy_options == {"max_jobs": 4}
