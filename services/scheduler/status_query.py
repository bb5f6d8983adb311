"""``query.status``: the control plane at a glance, for ``roundhouse status`` (issue 15, item 3).

The leader answers: itself and its epoch; every service instance that answered the services API's
``$SRV.STATS`` (``services/runtime/discovery.py``), grouped by kind, each with the policy and
options it says it runs (the leader's own from its configuration: what it ranks with, whatever a
standby was started with); the last round's number and phase timings; the queue's depth; nodes and
GPUs. :func:`answer_status` is pure; the service gathers the instances and hands them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import JsonValue, TypeAdapter, ValidationError

from schemas.fields import ShortText
from schemas.operations import InstanceView, QueueDepth, RoundView, ServiceView, StatusReply
from services.core.state import JobStatus
from services.runtime.discovery import Instance
from services.scheduler.book import JobBook
from services.scheduler.inventory import Inventory
from services.scheduler.timings import RoundTimings

__all__ = ["KIND_ORDER", "LeaderSelf", "answer_status", "instance_view"]

KIND_ORDER = ("scheduler", "admission", "placement", "metrics", "worker")
"""The order ``status`` lists kinds in (others after, by name)."""
_COUNTS = ("launched", "suspended", "dropped", "round")
_OPTIONS: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[ShortText, JsonValue])
"""What ``InstanceView.policy_options`` accepts."""


class LeaderSelf:
    """What the answering leader says of itself."""

    def __init__(self, instance: str, epoch: int, policy: str, policy_options: Mapping[str, Any]) -> None:
        self.instance = instance
        self.epoch = epoch
        self.policy = policy
        self.policy_options = dict(policy_options)


def _options(value: object) -> dict[str, Any]:
    """Policy options as a reply may carry them (JSON values, short keys); {} when they cannot be."""
    if not isinstance(value, Mapping):
        return {}
    try:
        options: dict[str, Any] = _OPTIONS.validate_python(dict(value))
    except ValidationError:
        return {}
    return options


def _text(value: object, limit: int = 128) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    return "".join(c for c in value if c.isprintable())[:limit] or None


def instance_view(instance: Instance, leader: LeaderSelf) -> InstanceView:
    """One instance's answer as ``status`` shows it; the leader's policy from its own configuration."""
    stats = instance.service_stats
    # What the instance says it runs: ``{"name", "options"}`` beside its stats where it reports that
    # (``RoundhouseService.policy_info``), else the policy name its own stats name.
    said = instance.data.get("policy")
    said = said if isinstance(said, Mapping) else {}
    is_leader = instance.kind == "scheduler" and instance.instance == leader.instance
    policy = leader.policy if is_leader else _text(said.get("name")) or _text(stats.get("policy"))
    options = leader.policy_options if is_leader else _options(said.get("options", stats.get("policy_options")))
    return InstanceView(
        instance=_text(instance.instance) or "?",
        service_id=_text(instance.service_id) or "?",
        version=_text(instance.version) or "0.0.0",
        uptime_s=min(instance.uptime_s, 1e9) if instance.uptime_s is not None else None,
        policy=policy,
        policy_options=_options(options),
        leader=is_leader,
        metrics_url=_text(instance.metadata.get("metrics_url"), 2048),
    )


def _services(instances: Iterable[Instance], leader: LeaderSelf) -> list[ServiceView]:
    by_kind: dict[str, list[InstanceView]] = {}
    for instance in instances:
        kind = _text(instance.kind) or "?"
        by_kind.setdefault(kind, []).append(instance_view(instance, leader))
    if not any(v.leader for v in by_kind.get("scheduler", [])):
        # Its own answer was not heard in time (a busy loop): the leader is running all the same.
        by_kind.setdefault("scheduler", []).insert(0, InstanceView(
            instance=leader.instance, service_id=leader.instance, policy=leader.policy,
            policy_options=_options(leader.policy_options), leader=True,
        ))  # fmt: skip

    def order(kind: str) -> tuple[int, str]:
        return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind)

    return [ServiceView(kind=kind, instances=by_kind[kind]) for kind in sorted(by_kind, key=order)]


def _queue(book: JobBook) -> QueueDepth:
    queued = held = running = queued_gpus = 0
    for entry in book.jobs.values():
        status = entry.state.status
        if status is JobStatus.QUEUED:
            queued += 1
            queued_gpus += entry.state.spec.gpus
        elif status is JobStatus.HELD:
            held += 1
        elif status is JobStatus.RUNNING:
            running += 1
    return QueueDepth(queued=queued, held=held, running=running, queued_gpus=queued_gpus)


def _round(timings: RoundTimings, rounds_run: int, policy: str) -> RoundView:
    phases = {k: max(0.0, v) for k, v in timings.as_dict().items() if k not in _COUNTS}
    return RoundView(
        number=timings.round, rounds_run=rounds_run, policy=policy, phases_s=phases,
        launched=timings.launched, suspended=timings.suspended, dropped=timings.dropped,
    )  # fmt: skip


def answer_status(
    leader: LeaderSelf,
    instances: Iterable[Instance],
    *,
    book: JobBook,
    inventory: Inventory,
    timings: RoundTimings,
    rounds_run: int,
    now: float,
) -> StatusReply:
    """The status as of monotonic ``now`` (the inventory's clock)."""
    live = list(inventory.live())
    gpus_used = sum(len(book.gpus_held_on(n.node_id) & set(n.gpus)) for n in live)
    return StatusReply(
        leader=leader.instance,
        epoch=leader.epoch,
        services=_services(instances, leader),
        round=_round(timings, rounds_run, leader.policy),
        queue=_queue(book),
        nodes=len(inventory),
        nodes_taking_work=sum(1 for n in live if inventory.takes_work(n, now)),
        gpus_total=sum(len(n.gpus) for n in live),
        gpus_used=gpus_used,
    )
