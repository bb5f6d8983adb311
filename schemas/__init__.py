"""Roundhouse's wire contract: a pydantic v2 model for every event, and the subject each one uses.

Import models from here (``from schemas import JobArrived, LeaseGrant``); the submodules are named
after their concept (:mod:`schemas.jobs`, :mod:`schemas.leases`, ...). :mod:`schemas.subjects` maps
subjects to models and :mod:`schemas.codec` encodes and decodes messages.
"""

from __future__ import annotations

from schemas.base import SCHEMA_VERSION, Command, Event, WireModel
from schemas.codec import (
    FieldError,
    MalformedMessageError,
    UnsupportedSchemaVersionError,
    decode,
    decode_as,
    decode_reply,
    encode,
)
from schemas.control import (
    AdmissionJob,
    AdmissionNode,
    AdmissionQuery,
    AdmissionReply,
    JobsQuery,
    JobsReply,
    JobView,
    LeaseStopAt,
)
from schemas.ids import JobId, LeaseId, NodeId
from schemas.job import JobClass, JobName, JobSpec, UserName
from schemas.jobs import (
    CompletionReason,
    FailureReason,
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
    SuspendReason,
)
from schemas.leases import LeaseAck, LeaseAckError, LeaseGrant, LeaseRevoke, RevokeReason, WorldInfo
from schemas.logs import LogChunk, LogData, LogRead, LogRun, LogsQuery, LogsReply
from schemas.metrics import GpuSample, JobMetrics, NodeMetrics
from schemas.nodes import GpuInventory, GpuLink, HeldLease, LeaseState, NodeHeartbeat, NodeRegister
from schemas.rounds import NodeGpus, PlacementPlan, RoundTrigger, ScheduleRound
from schemas.subjects import (
    SUBJECTS,
    InvalidSubjectTokenError,
    SubjectSpec,
    UnknownSubjectError,
    durable_patterns,
    model_for,
    spec_for,
    subject_for,
)

__all__ = [
    "SCHEMA_VERSION",
    "SUBJECTS",
    "AdmissionJob",
    "AdmissionNode",
    "AdmissionQuery",
    "AdmissionReply",
    "Command",
    "CompletionReason",
    "Event",
    "FailureReason",
    "FieldError",
    "GpuInventory",
    "GpuLink",
    "GpuSample",
    "HeldLease",
    "InvalidSubjectTokenError",
    "JobAccepted",
    "JobArrived",
    "JobCancel",
    "JobCheckpointed",
    "JobClass",
    "JobCompleted",
    "JobFailed",
    "JobHeld",
    "JobId",
    "JobMetrics",
    "JobName",
    "JobRejected",
    "JobSpec",
    "JobStarted",
    "JobSuspended",
    "JobView",
    "JobsQuery",
    "JobsReply",
    "LeaseAck",
    "LeaseAckError",
    "LeaseGrant",
    "LeaseId",
    "LeaseRevoke",
    "LeaseState",
    "LeaseStopAt",
    "LogChunk",
    "LogData",
    "LogRead",
    "LogRun",
    "LogsQuery",
    "LogsReply",
    "MalformedMessageError",
    "NodeGpus",
    "NodeHeartbeat",
    "NodeId",
    "NodeMetrics",
    "NodeRegister",
    "PlacementPlan",
    "RevokeReason",
    "RoundTrigger",
    "ScheduleRound",
    "SubjectSpec",
    "SuspendReason",
    "UnknownSubjectError",
    "UnsupportedSchemaVersionError",
    "UserName",
    "WireModel",
    "WorldInfo",
    "decode",
    "decode_as",
    "decode_reply",
    "durable_patterns",
    "encode",
    "model_for",
    "spec_for",
    "subject_for",
]
