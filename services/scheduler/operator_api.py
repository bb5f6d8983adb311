"""The operator's requests the leader serves: ``query.nodes``, ``query.status``, ``operator.drain``.

Served only while this replica leads, as ``query.jobs`` is: :class:`OperatorLeadership` adds these
subscriptions to each term it starts, and the term's end removes them with the others (``term.py``).
The answers are built by ``node_queries.py``, ``status_query.py`` and ``drain.py``.
"""

from __future__ import annotations

from typing import Any

from schemas.operations import DrainRequest, NodesQuery, NodesReply, StatusQuery, StatusReply
from schemas.subjects import OPERATOR_DRAIN, QUERY_NODES, QUERY_STATUS
from services.core.protocols import SchedulingPolicy
from services.runtime.discovery import gather_instances
from services.scheduler.cycle import RoundCycle
from services.scheduler.drain import NotLeaderError, OperatorDrains
from services.scheduler.execution import Execution
from services.scheduler.node_queries import answer_nodes
from services.scheduler.replica import Replica
from services.scheduler.status_query import LeaderSelf, answer_status
from services.scheduler.term import Leadership, Term

__all__ = ["OperatorApi", "OperatorLeadership"]


class OperatorApi:
    """Answers ``query.nodes`` and ``query.status`` and applies ``operator.drain`` (module doc)."""

    def __init__(
        self, replica: Replica, execution: Execution, cycle: RoundCycle, *, instance: str, policy: SchedulingPolicy
    ) -> None:
        self.replica = replica
        self.cycle = cycle
        self.instance = instance
        self.policy = policy
        self.drains = OperatorDrains(replica, execution)

    def _term(self) -> Term:
        term = self.replica.term
        if term is None:
            raise NotLeaderError("not the leader; ask again (the leader answers)")
        return term

    async def on_nodes(self, query: NodesQuery) -> NodesReply:
        term = self._term()
        r = self.replica
        return answer_nodes(
            query, r.inventory, r.book, r.clock.monotonic(), term.epoch, operators=r.cfg.operators
        )

    async def on_status(self, query: StatusQuery) -> StatusReply:
        term = self._term()
        r = self.replica
        assert r.bus is not None
        instances = await gather_instances(r.bus)
        if r.term is not term:
            raise NotLeaderError("the term ended while answering; ask the next leader")
        leader = LeaderSelf(self.instance, term.epoch, self.policy.name, r.cfg.policy_options)
        return answer_status(
            leader, instances, book=r.book, inventory=r.inventory, timings=self.cycle.timings,
            rounds_run=self.cycle.rounds_run, now=r.clock.monotonic(),
        )  # fmt: skip

    async def serve(self, term: Term) -> None:
        """Serve the three subjects for ``term`` (its end unsubscribes them)."""
        bus = self.replica.bus
        assert bus is not None
        term.subscriptions.append(await bus.serve(QUERY_NODES, NodesQuery, self.on_nodes))
        term.subscriptions.append(await bus.serve(QUERY_STATUS, StatusQuery, self.on_status))
        term.subscriptions.append(await bus.serve(OPERATOR_DRAIN, DrainRequest, self.drains.on_request))


class OperatorLeadership(Leadership):
    """:class:`Leadership` whose terms also serve the operator's requests."""

    def __init__(self, replica: Replica, *, operator_api: OperatorApi, **kwargs: Any) -> None:
        super().__init__(replica, **kwargs)
        self.operator_api = operator_api

    async def _take_over(self, revision: int) -> None:
        await super()._take_over(revision)
        term = self.replica.term
        if term is not None:
            await self.operator_api.serve(term)
