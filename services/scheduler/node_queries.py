"""``query.nodes``: the leader's nodes for ``roundhouse nodes`` (issue 15, item 3).

Pure: built from the inventory (liveness, drains), the book (which leases hold which GPUs) and
``now`` on the monotonic clock the inventory's ``last_seen`` is on. The same
``Inventory.takes_work`` that withholds a node from a round's snapshot (``cycle.py``) says whether
it takes work here, so what ``nodes`` shows and what placement is offered cannot disagree.

Anyone may ask (as Slurm's ``sinfo``): a user sees the ids of their own jobs on a node and a count of
the others (``other_jobs``); an operator sees every job id. No spec travels here.
"""

from __future__ import annotations

from collections.abc import Collection

from schemas.operations import NodesQuery, NodesReply, NodeState, NodeView
from services.scheduler.book import JobBook
from services.scheduler.inventory import Inventory, NodeInfo
from services.scheduler.trust import may_operate

__all__ = ["answer_nodes", "node_state", "node_view"]


def node_state(*, live: bool, silent: bool, draining: bool, used: int, total: int) -> NodeState:
    """One word for a node, the first of down, silent, draining/drained, allocated, mixed, idle."""
    if not live:
        return NodeState.DOWN
    if silent:
        return NodeState.SILENT
    if draining:
        return NodeState.DRAINING if used else NodeState.DRAINED
    if used and used >= total:
        return NodeState.ALLOCATED
    return NodeState.MIXED if used else NodeState.IDLE


def node_view(
    info: NodeInfo, inventory: Inventory, book: JobBook, now: float, *, requester: str, operators: Collection[str]
) -> NodeView:
    """``info`` as ``requester`` may see it at monotonic ``now``."""
    node_id = info.node_id
    used = len(book.gpus_held_on(node_id) & set(info.gpus))
    mine: list[str] = []
    others = 0
    for job_id in sorted({lease.job_id for lease in book.leases_on(node_id)}):
        entry = book.entry(job_id)
        owner = entry.state.spec.user if entry is not None else ""
        if may_operate(requester, owner, operators):
            mine.append(job_id)
        else:
            others += 1
    live = inventory.is_live(node_id)
    age = max(0.0, now - info.last_seen)
    silent = live and age >= inventory.silent_s
    drain = info.drain
    return NodeView(
        node_id=node_id,
        hostname=info.hostname,
        gpu_type=info.gpu_type,
        state=node_state(live=live, silent=silent, draining=info.draining, used=used, total=len(info.gpus)),
        gpus_total=len(info.gpus),
        gpus_used=used,
        gpus_free=len(info.gpus) - used,
        jobs=mine,
        other_jobs=others,
        live=live,
        silent=silent,
        heartbeat_age_s=age,
        takes_work=inventory.takes_work(info, now),
        draining=info.draining,
        drained_by=drain.by if drain is not None else None,
        drained_at=drain.at if drain is not None else None,
        drain_reason=drain.reason if drain is not None else None,
        agent_draining=info.agent_draining,
    )


def answer_nodes(
    query: NodesQuery, inventory: Inventory, book: JobBook, now: float, epoch: int, *, operators: Collection[str]
) -> NodesReply:
    """Every registered node (or the ones ``query`` names) in node-id order, at monotonic ``now``."""
    wanted = set(query.node_ids)
    infos = [info for info in inventory.nodes() if not wanted or info.node_id in wanted]
    views = [node_view(i, inventory, book, now, requester=query.requester, operators=operators) for i in infos]
    unknown = sorted(n for n in wanted if n not in inventory)
    return NodesReply(
        nodes=views, epoch=epoch, silent_after_s=inventory.silent_s, down_after_s=inventory.lease_ttl_s, unknown=unknown
    )
