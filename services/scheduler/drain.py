"""``operator.drain``: an operator drains a node, or lifts the drain (issue 15, item 3).

A drained node takes no new work. It is the same path as a node whose agent says it is leaving:
``Inventory.takes_work`` is false for it, so the round's snapshot holds its free GPUs with the
``UNAVAILABLE`` marker (``cycle.py``), placement is offered nothing there, a plan naming it is
dropped (``rounds.py``), and a queued job's reason counts its GPUs as not free. Its running jobs
keep their leases, unless the operator asked for ``now``: then each lease on it is revoked through
the normal two-phase revoke (reason ``drain``), so its job checkpoints at an iteration boundary,
is released with its ``job.suspended`` and queues again, to resume elsewhere.

The drain is written to the store with the node inventory (``scheduler.nodes``) in the same commit
as the revokes, before the reply: a scheduler that restarts or takes over loads it, and an agent
that registers again is still drained. Only ``roundhouse undrain`` lifts it.

Who may: the broker lets only operators publish on ``operator.drain.<requester>`` and vouches for
the requester (the subject's last token); the scheduler checks that name against its operators
besides (an unsecured broker vouches for nobody), and refuses anyone else, changing nothing.
"""

from __future__ import annotations

import logging

from schemas.leases import RevokeReason
from schemas.operations import DrainReply, DrainRequest
from schemas.rounds import RoundTrigger
from schemas.subjects import OPERATOR_DRAIN
from services.runtime.store import LeaseState, SetMeta
from services.scheduler.book import Change
from services.scheduler.execution import Execution
from services.scheduler.inventory import META_KEY, OperatorDrain
from services.scheduler.replica import Replica
from services.scheduler.trust import Refusal

__all__ = ["NotAnOperatorError", "NotLeaderError", "OperatorDrains", "UnknownNodeError"]

log = logging.getLogger("roundhouse.scheduler")


class NotAnOperatorError(PermissionError):
    """Someone who is not an operator asked to drain or undrain a node."""


class UnknownNodeError(LookupError):
    """No node by that id ever registered."""


class NotLeaderError(RuntimeError):
    """This replica does not lead (any more): ask again, the leader answers."""


class OperatorDrains:
    """Drains and undrains asked for on ``operator.drain`` (module doc)."""

    def __init__(self, replica: Replica, execution: Execution) -> None:
        self.replica = replica
        self.execution = execution

    async def on_request(self, request: DrainRequest) -> DrainReply:
        r = self.replica
        term = r.term
        if term is None or r.store is None:
            raise NotLeaderError("not the leader; ask again (the leader answers operator.drain)")
        verb = "drain" if request.drain else "undrain"
        if request.requester not in r.cfg.operators:
            message = f"permission denied: {request.requester} is not an operator; only operators may {verb} nodes"
            r.refusals.refuse(OPERATOR_DRAIN, Refusal.PERMISSION_DENIED, message)
            raise NotAnOperatorError(message)
        node_id = request.node_id
        preempted: list[str] = []
        async with r.lock:
            node = r.inventory.get(node_id)
            if node is None:
                known = ", ".join(n.node_id for n in r.inventory.nodes()[:20]) or "none"
                raise UnknownNodeError(f"no such node: {node_id} (known nodes: {known})")
            before = node.drain
            after: OperatorDrain | None = None
            if request.drain:  # a drain again keeps the first one's record (who, when, why)
                after = before or OperatorDrain(request.requester, r.clock.time(), request.reason)
            changes: list[Change | None] = []
            if request.drain and request.now:
                now = r.clock.time()
                for lease in r.book.leases_on(node_id):
                    if lease.state is not LeaseState.GRANTED:
                        continue  # being revoked already: it stops anyway
                    deadline = now + self.execution.grace(lease.job_id) + r.cfg.revoke_margin_s
                    change = r.book.revoke(lease.job_id, RevokeReason.DRAIN, deadline)
                    if change is not None:
                        changes.append(change)
                        preempted.append(lease.job_id)
            changed = r.inventory.set_drain(node_id, after)
            if not changed and not changes:
                return DrainReply(node_id=node_id, draining=after is not None, changed=False, epoch=term.epoch)
            change = r.book.merge(changes)
            change.ops.append(SetMeta(META_KEY, r.inventory.dumps()))
            try:
                await r.commit(change)
            except BaseException:
                r.inventory.set_drain(node_id, before)  # nothing was written: nothing changed
                raise
        log.info(
            "%s %sed by %s%s", node_id, verb, request.requester,
            f"; preempting {', '.join(preempted)}" if preempted else "",
            extra={"node_id": node_id, "epoch": term.epoch},
        )  # fmt: skip
        self.execution.send_revokes(change)
        r.churn(RoundTrigger.NODE_CHANGE)
        return DrainReply(
            node_id=node_id, draining=after is not None, changed=changed, preempted=preempted, epoch=term.epoch
        )
