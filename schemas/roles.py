"""THE permission table: who may publish and subscribe to what, by role, enforced by the broker.

Every NATS connection of a secured Roundhouse authenticates as one identity, and each identity has
one role. The broker's configuration is generated from this table (``services/runtime/auth``) and
``docs/security.md`` prints it, so the code, the server and the docs cannot disagree.

Identities and what vouches for them:

* one per service kind (``scheduler``, ``admission``, ``placement``, ``metrics``): replicas of a
  kind share it;
* one per worker node, named by the node id: it may speak only on subjects ending in its own node id
  (``job.started.<node>``, ``node.heartbeat.<node>``) and hears only its own node's commands
  (``lease.grant.<node>``, ``logs.read.<node>``: only the scheduler asks a node for a job's output);
* one per submitting user, named by the user: it may publish only its own submissions, cancellations
  and queries (``job.arrived.<user>``, ``job.cancel.<user>``, ``query.jobs.<user>``,
  ``query.logs.<user>``; and reads ``query.nodes.<user>``, ``query.status.<user>``, as Slurm's
  ``sinfo``), never reads a
  spec (``job.arrived.*``) or a grant, and may not touch JetStream's API;
* operators: everything, including JetStream management (deleting a stream is theirs alone) and
  draining nodes (``operator.drain.<operator>``: no other role may publish there).

Templates in the patterns: ``{ns}`` is the namespace prefix of bus subjects (``""`` or ``"<ns>."``),
``{sn}`` the prefix of stream, consumer and bucket names (``""`` or ``"<ns>_"``), ``{id}`` the
identity's name. Every identity gets its own reply inbox, ``_INBOX.<role>.<id>`` (:func:`inbox_prefix`),
and may subscribe only there, so nobody reads replies meant for someone else.

Replies: a role with ``allow_responses`` may publish to the reply subject of a request it received
(NATS's ``allow_responses``), which is how services answer ``query.*``, workers ack leases and every
service answers the services API (``$SRV.PING``), without a publish permission on anyone's inbox.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from schemas.ids import MAX_ID_CHARS, is_token

__all__ = [
    "BUCKETS",
    "RESERVED_NAMES",
    "ROLE_PERMISSIONS",
    "STREAM",
    "Permissions",
    "Role",
    "expand",
    "inbox_prefix",
    "permissions_for",
    "validate_identity",
]


class Role(enum.StrEnum):
    SCHEDULER = "scheduler"
    ADMISSION = "admission"
    PLACEMENT = "placement"
    METRICS = "metrics"
    WORKER = "worker"
    USER = "user"
    OPERATOR = "operator"


STREAM: Final = "RH_EVENTS"
"""The lifecycle stream's base name (``Bus.stream_name`` adds the namespace)."""


@dataclass(frozen=True, slots=True)
class Bucket:
    name: str
    writers: frozenset[Role]
    readers: frozenset[Role]


BUCKETS: Final[tuple[Bucket, ...]] = (
    Bucket("scheduler-leader", frozenset({Role.SCHEDULER}), frozenset({Role.SCHEDULER})),
    Bucket("job-metrics", frozenset({Role.METRICS}), frozenset({Role.METRICS, Role.SCHEDULER})),
    Bucket("node-metrics", frozenset({Role.METRICS}), frozenset({Role.METRICS})),
)
"""The KV buckets (base names) and who may write and read each. Only the scheduler holds the leader key."""


@dataclass(frozen=True, slots=True)
class Permissions:
    """What one role may do; patterns are templates (see the module's docstring)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool
    """May answer requests it received (on their reply subject), and nothing else outside ``publish``."""
    why: str
    """One line for docs/security.md."""


_SERVICES_API: Final = "$SRV.>"
"""The NATS services API (ping, info, stats) every service and worker answers."""


def _stats_endpoint(role: Role) -> str:
    """The extra services-API endpoint each service kind adds (``rh.<kind>.stats``, services/runtime/service.py)."""
    return "{ns}rh." + role.value + ".stats"


def _self_ping(role: Role) -> tuple[str, ...]:
    """Ping its own kind over the services API (``$SRV.PING.roundhouse-<kind>[.<id>]``): a container's
    health check runs with the service's own credentials. The answers come back to its own inbox."""
    return ("$SRV.PING.roundhouse-" + role.value, "$SRV.PING.roundhouse-" + role.value + ".*")


# JetStream API a durable consumer of the lifecycle stream needs: look the stream up, create and
# inspect its own durable consumers, pull from them and ack. No delete, no purge, no other stream.
_CONSUME_STREAM: Final = (
    "$JS.API.INFO",
    "$JS.API.STREAM.INFO.{sn}" + STREAM,
    "$JS.API.CONSUMER.CREATE.{sn}" + STREAM + ".>",
    "$JS.API.CONSUMER.DURABLE.CREATE.{sn}" + STREAM + ".>",
    "$JS.API.CONSUMER.INFO.{sn}" + STREAM + ".>",
    "$JS.API.CONSUMER.MSG.NEXT.{sn}" + STREAM + ".>",
    "$JS.ACK.{sn}" + STREAM + ".>",
)
_PROVISION_STREAM: Final = (
    "$JS.API.STREAM.CREATE.{sn}" + STREAM,
    "$JS.API.STREAM.UPDATE.{sn}" + STREAM,
)
"""Create the stream or add subjects and replicas to it (never delete, purge or shrink it)."""
_DEAD_LETTERS: Final = ("{ns}deadletter.*",)
_SERVICES_STATS: Final = ("$SRV.STATS", "$SRV.STATS.>")
"""Ask every service instance for its stats (``roundhouse status``: the scheduler gathers who runs, and
with which policy; the answers come back to its own inbox)."""
_STREAM_INFO: Final = "$JS.API.STREAM.INFO.{sn}" + STREAM
"""A durable publish that finds no stream asks whether it exists (``Bus._publish_durable``), to fail
at once instead of retrying for seconds."""
_DELETE_OWN_EPHEMERALS: Final = ("$JS.API.CONSUMER.DELETE.{sn}" + STREAM + ".>",)
"""Admission replays the stream with ephemeral consumers (services/runtime/replay.py) and deletes them."""


def _kv_publish(role: Role) -> tuple[str, ...]:
    """KV access as JetStream API subjects: writers put; writers and readers create the bucket, get and watch."""
    out: list[str] = []
    for bucket in BUCKETS:
        stream = "KV_{sn}" + bucket.name
        if role in bucket.writers:
            out += [f"$KV.{{sn}}{bucket.name}.>"]
        if role in bucket.readers or role in bucket.writers:
            # Readers may create the (empty) bucket too: the scheduler opens job-metrics when it starts
            # leading, which may be before the metrics service first ran. Creating writes no key.
            out += [
                f"$JS.API.STREAM.CREATE.{stream}",
                f"$JS.API.STREAM.INFO.{stream}",
                f"$JS.API.STREAM.MSG.GET.{stream}",
                f"$JS.API.DIRECT.GET.{stream}.>",
                # A watch is an unnamed ordered consumer: created on the bare subject.
                f"$JS.API.CONSUMER.CREATE.{stream}",
                f"$JS.API.CONSUMER.CREATE.{stream}.>",
                f"$JS.API.CONSUMER.INFO.{stream}.>",
                f"$JS.API.CONSUMER.DELETE.{stream}.>",
                f"$JS.FC.{stream}.>",
            ]
    return tuple(out)


_WORKER_FACTS: Final = tuple(
    "{ns}job." + fact + ".{id}" for fact in ("started", "checkpointed", "suspended", "completed", "failed")
)

ROLE_PERMISSIONS: Final[dict[Role, Permissions]] = {
    Role.SCHEDULER: Permissions(
        publish=(
            "{ns}lease.grant.*",
            "{ns}lease.revoke.*",
            "{ns}node.reregister.*",
            "{ns}logs.read.*",
            "{ns}schedule.round.*",
            "{ns}rh.scheduler.leader.*",
            *_CONSUME_STREAM,
            *_PROVISION_STREAM,
            *_DEAD_LETTERS,
            *_kv_publish(Role.SCHEDULER),
            *_self_ping(Role.SCHEDULER),
            *_SERVICES_STATS,
        ),
        subscribe=(
            "{ns}node.heartbeat.*",
            "{ns}job.suspended.*",
            "{ns}placement.plan",
            "{ns}query.jobs.*",
            "{ns}query.logs.*",
            "{ns}query.nodes.*",
            "{ns}query.status.*",
            "{ns}operator.drain.*",
            "{ns}query.admission",
            "{ns}rh.scheduler.leader.*",
            _SERVICES_API,
            _stats_endpoint(Role.SCHEDULER),
        ),
        allow_responses=True,
        why="Owns job and lease state: the only role that commands workers, sends rounds and holds the leader key.",
    ),
    Role.ADMISSION: Permissions(
        publish=(
            "{ns}job.accepted",
            "{ns}job.held",
            "{ns}job.rejected",
            "{ns}query.admission",
            "{ns}query.nodes.{id}",  # the operators' drains, kept current (services/admission/drains.py)
            *_CONSUME_STREAM,
            *_PROVISION_STREAM,
            *_DEAD_LETTERS,
            *_DELETE_OWN_EPHEMERALS,
            *_self_ping(Role.ADMISSION),
        ),
        subscribe=("{ns}node.heartbeat.*", _SERVICES_API, _stats_endpoint(Role.ADMISSION)),
        allow_responses=True,
        why="Reads submissions from the stream and publishes verdicts; asks the scheduler what it starts from "
        "and which nodes operators drained.",
    ),
    Role.PLACEMENT: Permissions(
        publish=("{ns}placement.plan", *_self_ping(Role.PLACEMENT)),
        subscribe=("{ns}schedule.round.*", _SERVICES_API, _stats_endpoint(Role.PLACEMENT)),
        allow_responses=True,
        why="Turns the scheduler's rounds into plans; sees no job spec beyond what a round carries.",
    ),
    Role.METRICS: Permissions(
        publish=("{ns}metrics.node.*", *_kv_publish(Role.METRICS), *_self_ping(Role.METRICS)),
        subscribe=("{ns}metrics.>", _SERVICES_API, _stats_endpoint(Role.METRICS)),
        allow_responses=True,
        why="Aggregates job and node metrics into KV buckets and Prometheus; commands nothing.",
    ),
    Role.WORKER: Permissions(
        publish=(
            *_WORKER_FACTS,
            "{ns}node.register.{id}",
            "{ns}node.heartbeat.{id}",
            "{ns}metrics.node.{id}",
            "{ns}metrics.job.*",
            "{ns}lease.stop.*",
            _STREAM_INFO,
            *_self_ping(Role.WORKER),
        ),
        subscribe=(
            "{ns}lease.grant.{id}",
            "{ns}lease.revoke.{id}",
            "{ns}lease.stop.{id}",
            "{ns}logs.read.{id}",
            "{ns}node.reregister.{id}",
            "{ns}job.started.*",
            "{ns}job.failed.*",
            _SERVICES_API,
            _stats_endpoint(Role.WORKER),
        ),
        allow_responses=True,
        why="Speaks only for its own node (facts, heartbeats, registration) and hears only its own commands; "
        "sees peers' started/failed facts and sends stop_at to the peers of a multi-node job.",
    ),
    Role.USER: Permissions(
        publish=(
            "{ns}job.arrived.{id}",
            "{ns}job.cancel.{id}",
            "{ns}query.jobs.{id}",
            "{ns}query.logs.{id}",
            "{ns}query.nodes.{id}",
            "{ns}query.status.{id}",
            _STREAM_INFO,
        ),
        subscribe=("{ns}job.accepted", "{ns}job.held", "{ns}job.rejected"),
        allow_responses=False,
        why="Submits, cancels, lists and reads output only as itself; reads verdicts (job id and reason, "
        "never a spec), no grant, no stream history, no JetStream API but the event stream's existence.",
    ),
    Role.OPERATOR: Permissions(
        publish=(">",),
        subscribe=(">",),
        allow_responses=True,
        why="Runs the cluster: every subject and the JetStream management API (deleting or purging streams).",
    ),
}

RESERVED_NAMES: Final = frozenset(role.value for role in Role)
"""Names no worker or user may take: each service kind's identity is its role's name."""


def inbox_prefix(role: Role, identity: str) -> str:
    """The reply inbox of ``identity``: nobody else may subscribe there."""
    return f"_INBOX.{role.value}.{identity}"


def validate_identity(role: Role, identity: str) -> str:
    """``identity`` if it can be one of ``role``'s names; ValueError saying why not otherwise."""
    if not is_token(identity):
        raise ValueError(
            f"{role.value} name {identity[:100]!r} must be 1-{MAX_ID_CHARS} characters of letters, digits, "
            "'-' and '_', starting with a letter or digit (it becomes a NATS subject token)"
        )
    if role in (Role.WORKER, Role.USER) and identity in RESERVED_NAMES:
        raise ValueError(f"{role.value} name {identity!r} is reserved (it names a role)")
    return identity


def expand(pattern: str, *, identity: str, namespace: str = "") -> str:
    """``pattern`` with its templates filled for one identity in one namespace."""
    return pattern.format(
        ns=f"{namespace}." if namespace else "",
        sn=f"{namespace}_" if namespace else "",
        id=identity,
    )


def permissions_for(role: Role, identity: str, *, namespace: str = "") -> tuple[list[str], list[str], bool]:
    """(publish, subscribe, allow_responses) of one identity, templates filled, its own inbox added."""
    spec = ROLE_PERMISSIONS[role]
    publish = [expand(p, identity=identity, namespace=namespace) for p in spec.publish]
    subscribe = [expand(p, identity=identity, namespace=namespace) for p in spec.subscribe]
    subscribe.append(inbox_prefix(role, identity) + ".>")
    return publish, subscribe, spec.allow_responses
