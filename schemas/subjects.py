"""THE registry of NATS subjects: which model each subject carries, and whether it is durable.

The typed bus (``services/runtime/bus.py``) publishes and decodes only through this table, so a
subject cannot carry the wrong model. Durable subjects are lifecycle facts and user intents stored
on JetStream (replayable, deduplicated by ``Nats-Msg-Id = event_id``); the rest are core NATS:
heartbeats and metrics (frequent and superseded by the next one), rounds and plans (only meaningful
against the current state version, see :mod:`schemas.rounds`) and leases (request-reply, retried by
the scheduler until acked).

Patterns use NATS wildcards: ``*`` is exactly one token, ``>`` one or more trailing tokens. Where a
pattern has a ``*``, the token is an id that must equal a field of the payload (``token_field``):
``lease.grant.<node_id>`` carries a grant whose ``node_id`` is that node, and the codec checks it.

Identity tokens: everything a worker says is on a subject ending in its node id (``job.started.<node>``,
``node.heartbeat.<node>``), everything a user says on one ending in the user's name
(``job.arrived.<user>``, ``job.cancel.<user>``, ``query.jobs.<user>``, ``query.logs.<user>``). The broker lets each
authenticated identity publish only on its own token (:mod:`schemas.roles`), and the codec checks that
the payload names the same node or user, so a fact's ``node_id`` and a request's user are vouched for
by the broker, not chosen by the sender.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from schemas.base import Event, WireModel
from schemas.control import AdmissionQuery, AdmissionReply, JobsQuery, JobsReply, LeaseStopAt
from schemas.ids import MAX_ID_CHARS, TOKEN_PATTERN, is_token
from schemas.jobs import (
    JobAccepted,
    JobArrived,
    JobCancel,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobRejected,
    JobStarted,
    JobSuspended,
)
from schemas.leases import LeaseAck, LeaseGrant, LeaseRevoke
from schemas.logs import LogData, LogRead, LogsQuery, LogsReply
from schemas.metrics import JobMetrics, NodeMetrics
from schemas.nodes import NodeHeartbeat, NodeRegister, NodeReregister
from schemas.operations import DrainReply, DrainRequest, NodesQuery, NodesReply, StatusQuery, StatusReply
from schemas.rounds import PlacementPlan, ScheduleRound

__all__ = [
    "ANY_PLACEMENT",
    "JOB_ACCEPTED",
    "JOB_ARRIVED",
    "JOB_CANCEL",
    "JOB_CHECKPOINTED",
    "JOB_COMPLETED",
    "JOB_FAILED",
    "JOB_HELD",
    "JOB_REJECTED",
    "JOB_STARTED",
    "JOB_SUSPENDED",
    "NODE_HEARTBEAT",
    "NODE_REGISTER",
    "OPERATOR_DRAIN",
    "PLACEMENT_PLAN",
    "QUERY_ADMISSION",
    "QUERY_JOBS",
    "QUERY_LOGS",
    "QUERY_NODES",
    "QUERY_STATUS",
    "SCHEDULE_ROUND",
    "SUBJECTS",
    "InvalidSubjectTokenError",
    "SubjectSpec",
    "UnknownSubjectError",
    "durable_patterns",
    "job_metrics",
    "lease_grant",
    "lease_revoke",
    "lease_stop",
    "logs_read",
    "model_for",
    "node_metrics",
    "node_reregister",
    "schedule_round",
    "spec_for",
    "spec_for_model",
    "subject_for",
    "token_value",
]


@dataclass(frozen=True, slots=True)
class SubjectSpec:
    """One subject (pattern) and the model it carries."""

    pattern: str
    """NATS subject, with ``*`` for a token placeholder, e.g. ``lease.grant.*``."""
    model: type[Event]
    """The payload model."""
    durable: bool
    """True for lifecycle subjects stored on JetStream."""
    reply_model: type[WireModel] | None = None
    """For request-reply subjects: the model of the reply."""
    description: str = ""
    token_field: str | None = None
    """For a pattern with one ``*``: the payload field that must equal that token."""
    direction: str = ""
    """Who publishes -> who consumes, for the docs (``scheduler -> worker``)."""


class UnknownSubjectError(LookupError):
    """A subject that no entry of :data:`SUBJECTS` matches."""


class InvalidSubjectTokenError(ValueError):
    """An id that cannot be a NATS subject token (empty, too long, or with ``.``, ``*``, ``>``, spaces)."""


JOB_ARRIVED: Final = "job.arrived.*"
JOB_ACCEPTED: Final = "job.accepted"
JOB_HELD: Final = "job.held"
JOB_REJECTED: Final = "job.rejected"
JOB_CANCEL: Final = "job.cancel.*"
JOB_STARTED: Final = "job.started.*"
JOB_CHECKPOINTED: Final = "job.checkpointed.*"
JOB_SUSPENDED: Final = "job.suspended.*"
JOB_COMPLETED: Final = "job.completed.*"
JOB_FAILED: Final = "job.failed.*"
SCHEDULE_ROUND: Final = "schedule.round.*"
"""Every round, whichever placement instance it is for (subscribe here to watch rounds)."""
ANY_PLACEMENT: Final = "any"
"""The ``to`` of a round for any placement instance (queue group ``placement``): a full snapshot."""
PLACEMENT_PLAN: Final = "placement.plan"
NODE_REGISTER: Final = "node.register.*"
NODE_HEARTBEAT: Final = "node.heartbeat.*"
_LEASE_GRANT: Final = "lease.grant"
_LEASE_REVOKE: Final = "lease.revoke"
_NODE_REREGISTER: Final = "node.reregister"
_METRICS_JOB: Final = "metrics.job"
_METRICS_NODE: Final = "metrics.node"
_LEASE_STOP: Final = "lease.stop"
QUERY_JOBS: Final = "query.jobs.*"
QUERY_ADMISSION: Final = "query.admission"
QUERY_NODES: Final = "query.nodes.*"
QUERY_STATUS: Final = "query.status.*"
OPERATOR_DRAIN: Final = "operator.drain.*"
QUERY_LOGS: Final = "query.logs.*"
_LOGS_READ: Final = "logs.read"

SUBJECTS: Final[tuple[SubjectSpec, ...]] = (
    SubjectSpec(
        JOB_ARRIVED,
        JobArrived,
        durable=True,
        description="A job spec was submitted.",
        token_field="spec.user",
        direction="client -> admission",
    ),
    SubjectSpec(
        JOB_ACCEPTED,
        JobAccepted,
        durable=True,
        description="Admission accepted the job.",
        direction="admission -> scheduler, client",
    ),
    SubjectSpec(
        JOB_HELD,
        JobHeld,
        durable=True,
        description="Admission postponed the job, with a reason.",
        direction="admission -> scheduler, client",
    ),
    SubjectSpec(
        JOB_REJECTED,
        JobRejected,
        durable=True,
        description="Admission refused the job, with a reason.",
        direction="admission -> scheduler, client",
    ),
    SubjectSpec(
        JOB_CANCEL,
        JobCancel,
        durable=True,
        description="A user asked to stop a job.",
        token_field="user",
        direction="client -> scheduler",
    ),
    SubjectSpec(
        JOB_STARTED,
        JobStarted,
        durable=True,
        description="A worker launched a job for a lease.",
        token_field="node_id",
        direction="worker -> all",
    ),
    SubjectSpec(
        JOB_CHECKPOINTED,
        JobCheckpointed,
        durable=True,
        description="A running job completed a periodic checkpoint.",
        token_field="node_id",
        direction="worker -> scheduler",
    ),
    SubjectSpec(
        JOB_SUSPENDED,
        JobSuspended,
        durable=True,
        description="A job stopped and can resume from a checkpoint.",
        token_field="node_id",
        direction="worker -> all",
    ),
    SubjectSpec(
        JOB_COMPLETED,
        JobCompleted,
        durable=True,
        description="A job finished successfully.",
        token_field="node_id",
        direction="worker -> all",
    ),
    SubjectSpec(
        JOB_FAILED,
        JobFailed,
        durable=True,
        description="A job failed and will not be resumed.",
        token_field="node_id",
        direction="worker -> all",
    ),
    SubjectSpec(
        NODE_REGISTER,
        NodeRegister,
        durable=True,
        description="A worker's node and GPU inventory.",
        token_field="node_id",
        direction="worker -> scheduler, placement",
    ),
    SubjectSpec(
        SCHEDULE_ROUND,
        ScheduleRound,
        durable=False,
        description="Round N with its snapshot, for one placement instance (a delta against the snapshot it "
        "acknowledged) or for any (`schedule.round.any`, queue group: a full snapshot).",
        token_field="to",
        direction="scheduler -> placement",
    ),
    SubjectSpec(
        PLACEMENT_PLAN,
        PlacementPlan,
        durable=False,
        description="Round N: launches and suspensions.",
        direction="placement -> scheduler",
    ),
    SubjectSpec(
        f"{_LEASE_GRANT}.*",
        LeaseGrant,
        durable=False,
        reply_model=LeaseAck,
        description="Start work on a node; request-reply.",
        token_field="node_id",
        direction="scheduler -> worker",
    ),
    SubjectSpec(
        f"{_LEASE_REVOKE}.*",
        LeaseRevoke,
        durable=False,
        reply_model=LeaseAck,
        description="Stop work on a node; request-reply.",
        token_field="node_id",
        direction="scheduler -> worker",
    ),
    SubjectSpec(
        f"{_NODE_REREGISTER}.*",
        NodeReregister,
        durable=False,
        description="Register again: the leader's store does not know this node or incarnation.",
        token_field="node_id",
        direction="scheduler -> worker",
    ),
    SubjectSpec(
        NODE_HEARTBEAT,
        NodeHeartbeat,
        durable=False,
        description="Liveness and the leases a node holds.",
        token_field="node_id",
        direction="worker -> scheduler, placement",
    ),
    SubjectSpec(
        f"{_METRICS_JOB}.*",
        JobMetrics,
        durable=False,
        description="A job's iteration, loss and speed.",
        token_field="job_id",
        direction="job -> metrics, scheduler",
    ),
    SubjectSpec(
        f"{_METRICS_NODE}.*",
        NodeMetrics,
        durable=False,
        description="Per-GPU utilization and memory.",
        token_field="node_id",
        direction="worker -> metrics",
    ),
    SubjectSpec(
        f"{_LEASE_STOP}.*",
        LeaseStopAt,
        durable=False,
        reply_model=LeaseAck,
        description="Two-phase stop: finish iteration stop_at, then stop; request-reply.",
        token_field="node_id",
        direction="worker (coordinator) -> worker",
    ),
    SubjectSpec(
        QUERY_JOBS,
        JobsQuery,
        durable=False,
        reply_model=JobsReply,
        description="The scheduler's view of jobs; request-reply.",
        token_field="requester",
        direction="client -> scheduler",
    ),
    SubjectSpec(
        QUERY_ADMISSION,
        AdmissionQuery,
        durable=False,
        reply_model=AdmissionReply,
        description="What admission starts from: unfinished jobs with their specs, in submission order, and "
        "the live nodes; request-reply, for service roles only.",
        direction="admission -> scheduler",
    ),
    SubjectSpec(
        QUERY_LOGS,
        LogsQuery,
        durable=False,
        reply_model=LogsReply,
        description="A job's runs and a chunk of one rank's output, for its owner or an operator; request-reply.",
        token_field="requester",
        direction="client -> scheduler",
    ),
    SubjectSpec(
        f"{_LOGS_READ}.*",
        LogRead,
        durable=False,
        reply_model=LogData,
        description="A chunk of one rank's log of one lease, from that node's lease directory; request-reply.",
        token_field="node_id",
        direction="scheduler -> worker",
    ),
    SubjectSpec(
        QUERY_NODES,
        NodesQuery,
        durable=False,
        reply_model=NodesReply,
        description="The scheduler's nodes: GPUs, jobs, liveness, drains; request-reply (issue 15).",
        token_field="requester",
        direction="client -> scheduler",
    ),
    SubjectSpec(
        QUERY_STATUS,
        StatusQuery,
        durable=False,
        reply_model=StatusReply,
        description="The leader, its epoch, each service's instances and policy, the last round, the queue; "
        "request-reply (issue 15).",
        token_field="requester",
        direction="client -> scheduler",
    ),
    SubjectSpec(
        OPERATOR_DRAIN,
        DrainRequest,
        durable=False,
        reply_model=DrainReply,
        description="Drain a node (no new work; `now`: preempt its jobs with checkpoints) or undrain it; "
        "request-reply, operators only (issue 15).",
        token_field="requester",
        direction="operator -> scheduler",
    ),
)


def _is_wildcard(token: str) -> bool:
    return token in ("*", ">")


def _split(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("."))


_BY_PATTERN: Final[dict[str, SubjectSpec]] = {s.pattern: s for s in SUBJECTS}
"""Exact lookups: every concrete subject without a token, and every pattern itself."""
_WILD: Final[tuple[tuple[tuple[str, ...], SubjectSpec], ...]] = tuple(
    (_split(s.pattern), s) for s in SUBJECTS if any(map(_is_wildcard, _split(s.pattern)))
)
_BY_PREFIX: Final[dict[str, SubjectSpec]] = {
    s.pattern[:-2]: s for s in SUBJECTS if s.pattern.endswith(".*") and s.pattern.count("*") == 1
}
"""Fast path for the common ``<prefix>.*`` shape (``metrics.job.*``): one dict lookup per message."""
_BY_MODEL: Final[dict[type[Event], SubjectSpec]] = {s.model: s for s in SUBJECTS}


def _matches(pattern: tuple[str, ...], tokens: list[str]) -> bool:
    for i, want in enumerate(pattern):
        if want == ">":
            return len(tokens) > i
        if i >= len(tokens):
            return False
        if want != "*" and want != tokens[i]:
            return False
    return len(tokens) == len(pattern)


def spec_for(subject: str) -> SubjectSpec:
    """The entry whose pattern matches the concrete ``subject`` (token-wise).

    A registered pattern itself (``metrics.job.*``) also resolves to its entry, so a subscriber can
    look up the model of what it subscribes to. Raises :class:`UnknownSubjectError` when nothing
    matches, or for any other wildcard or an empty token.
    """
    found = _BY_PATTERN.get(subject)
    if found is not None:
        return found
    prefix, _, last = subject.rpartition(".")
    if last and not _is_wildcard(last):
        found = _BY_PREFIX.get(prefix)
        if found is not None:
            return found
    tokens = subject.split(".")
    if all(tokens) and not any(map(_is_wildcard, tokens)):
        for pattern, spec in _WILD:
            if _matches(pattern, tokens):
                return spec
    known = ", ".join(s.pattern for s in SUBJECTS)
    raise UnknownSubjectError(
        f"no schema for subject {subject[:200]!r}: it must be a concrete subject matching one of {known}"
    )


def model_for(subject: str) -> type[Event]:
    """The payload model of ``subject`` (see :func:`spec_for`)."""
    return spec_for(subject).model


def spec_for_model(model: type[Event]) -> SubjectSpec:
    """The entry that carries ``model`` (each model travels on exactly one subject pattern)."""
    try:
        return _BY_MODEL[model]
    except KeyError:
        raise UnknownSubjectError(f"{model.__name__} is not carried by any subject") from None


def durable_patterns() -> tuple[str, ...]:
    """The subjects of the JetStream stream: every durable entry's pattern, in table order."""
    return tuple(s.pattern for s in SUBJECTS if s.durable)


def _token(kind: str, value: str) -> str:
    if not is_token(value):
        raise InvalidSubjectTokenError(
            f"{kind} {value[:100]!r} cannot be a subject token: use 1-{MAX_ID_CHARS} characters "
            f"matching {TOKEN_PATTERN} (no '.', '*', '>' or spaces)"
        )
    return value


def schedule_round(to: str = ANY_PLACEMENT) -> str:
    """``schedule.round.<to>``: a round for one placement instance, or for any (:data:`ANY_PLACEMENT`)."""
    return SCHEDULE_ROUND.replace("*", _token("placement instance", to))


def lease_grant(node_id: str) -> str:
    """``lease.grant.<node_id>``: where the scheduler sends a node its grants."""
    return f"{_LEASE_GRANT}.{_token('node id', node_id)}"


def lease_revoke(node_id: str) -> str:
    """``lease.revoke.<node_id>``: where the scheduler sends a node its revokes."""
    return f"{_LEASE_REVOKE}.{_token('node id', node_id)}"


def node_reregister(node_id: str) -> str:
    """``node.reregister.<node_id>``: where the scheduler asks a node it does not know to register again."""
    return f"{_NODE_REREGISTER}.{_token('node id', node_id)}"


def lease_stop(node_id: str) -> str:
    """``lease.stop.<node_id>``: where a coordinator agent sends another node its ``stop_at``."""
    return f"{_LEASE_STOP}.{_token('node id', node_id)}"


def logs_read(node_id: str) -> str:
    """``logs.read.<node_id>``: where the scheduler asks a node's agent for a chunk of a job's output."""
    return f"{_LOGS_READ}.{_token('node id', node_id)}"


def job_metrics(job_id: str) -> str:
    """``metrics.job.<job_id>``: where a job's training client publishes its metrics."""
    return f"{_METRICS_JOB}.{_token('job id', job_id)}"


def node_metrics(node_id: str) -> str:
    """``metrics.node.<node_id>``: where a worker publishes its node's NVML readings."""
    return f"{_METRICS_NODE}.{_token('node id', node_id)}"


def subject_for(event: Event) -> str:
    """The concrete subject ``event`` is published on (its model's pattern, ``*`` filled from the
    payload's ``token_field``). Raises :class:`UnknownSubjectError` for a model no subject carries."""
    spec = spec_for_model(type(event))
    if spec.token_field is None:
        return spec.pattern
    token = _token(spec.token_field, str(token_value(event, spec.token_field)))
    return spec.pattern.replace("*", token, 1)


def token_value(event: WireModel, token_field: str) -> object:
    """The payload value a subject's token must equal: ``token_field`` may be dotted (``spec.user``)."""
    value: object = event
    for name in token_field.split("."):
        value = getattr(value, name)
    return value
