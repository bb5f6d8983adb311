"""Who may ask a node to register again (issue 18): only the scheduler (and operators, who may do
everything) publishes ``node.reregister.<node>``, and only that node's identity hears it."""

from __future__ import annotations

from schemas.roles import Role
from tests.unit.test_roles import may_publish, may_subscribe


def test_only_the_scheduler_asks_a_node_to_register_again() -> None:
    allowed = {role for role in Role if may_publish(role, "n1", "node.reregister.n1")}
    assert allowed == {Role.SCHEDULER, Role.OPERATOR}


def test_only_that_node_hears_the_ask() -> None:
    assert may_subscribe(Role.WORKER, "n1", "node.reregister.n1")
    assert not may_subscribe(Role.WORKER, "n1", "node.reregister.n2")
    assert not may_subscribe(Role.WORKER, "n1", "node.reregister.*")
    for role in (Role.USER, Role.ADMISSION, Role.PLACEMENT, Role.METRICS):
        assert not may_subscribe(role, "n1", "node.reregister.n1"), role
