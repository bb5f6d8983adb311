"""Reading a job's output: ``roundhouse logs`` asks the scheduler, the scheduler asks the workers.

``query.logs.<requester>`` (:class:`LogsQuery`, request-reply, :class:`LogsReply`): a user (or an
operator) asks the scheduler leader for a job's runs and, optionally, one chunk of one rank's output
in one run. The broker vouches for the requester (the subject's last token); the scheduler answers
only the job's owner or an operator, and knows which nodes ran which lease of the job.

``logs.read.<node>`` (:class:`LogRead`, request-reply, :class:`LogData`): the scheduler, and only
the scheduler (the broker enforces it), asks one node's agent for a chunk of one rank's log of one
lease. The agent builds the path from its own lease directory and the validated lease id, never from
the bus, and checks the lease directory belongs to the named job.

Output travels in chunks of at most :data:`MAX_LOG_CHUNK` bytes, addressed by byte offsets into the
rank's log file, so a follower polls from where it left off and a long log pages. The text is the
file's bytes decoded as UTF-8 (bytes that are not become U+FFFD); a chunk never ends inside a
character, so offsets stay exact.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, StringConstraints

from schemas.base import Event, WireModel
from schemas.fields import Counter, Reason
from schemas.ids import JobId, LeaseId, NodeId
from schemas.job import UserName

__all__ = ["MAX_LOG_CHUNK", "MAX_LOG_RUNS", "LogChunk", "LogData", "LogRead", "LogRun", "LogsQuery", "LogsReply"]

MAX_LOG_CHUNK: Final = 64 * 1024
"""Most bytes of output in one reply (NATS's default ``max_payload`` is 1 MiB; JSON escaping of
control characters can make the text up to six times longer)."""
MAX_LOG_RUNS: Final = 10_000
"""Most runs listed in one reply."""
_MAX_RANKS: Final = 4096

_Rank = Annotated[int, Field(ge=0, le=_MAX_RANKS)]
_Offset = Annotated[int, Field(ge=0, le=2**53)]
_Text = Annotated[str, StringConstraints(max_length=MAX_LOG_CHUNK)]
_Status = Annotated[str, StringConstraints(min_length=1, max_length=32, pattern=r"^[a-z_]+$")]


class LogsQuery(Event):
    """Ask the scheduler for a job's runs, and, with ``run``, a chunk of one rank's output."""

    requester: UserName = Field(description="The asking identity: the subject's last token.")
    job_id: JobId
    run: int | None = Field(
        default=None, ge=1, le=MAX_LOG_RUNS, description="1-based run to read from; None: only list the runs."
    )
    rank: _Rank = Field(default=0, description="Global rank whose output to read.")
    offset: _Offset = Field(default=0, description="Byte offset in that rank's log to read from.")
    max_bytes: int = Field(default=MAX_LOG_CHUNK, ge=1, le=MAX_LOG_CHUNK)


class LogRun(WireModel):
    """One run of a job: one lease, on its nodes in rank order."""

    run: int = Field(ge=1, le=MAX_LOG_RUNS, description="1-based, in the order the leases were granted.")
    lease_id: LeaseId
    nodes: list[NodeId] = Field(min_length=1, max_length=1024, description="Its nodes, coordinator first.")
    ranks: list[_Rank] = Field(default_factory=list, max_length=_MAX_RANKS, description="Its global ranks.")
    current: bool = Field(default=False, description="The job's run now (it may still write output).")


class LogChunk(WireModel):
    """Output of one rank of one run from ``offset``; or why there is none (``unavailable``)."""

    run: int = Field(ge=1, le=MAX_LOG_RUNS)
    rank: _Rank
    node_id: NodeId
    offset: _Offset
    data: _Text = ""
    next_offset: _Offset = Field(description="Where the next read starts (``offset`` + bytes read).")
    size: _Offset = Field(default=0, description="The log's size when it was read.")
    unavailable: Reason | None = Field(
        default=None, description="Why nothing could be read: the node is gone or silent, no such output."
    )


class LogsReply(WireModel):
    """A job's runs, and the chunk asked for; or why the requester may not read them (``refused``)."""

    job_id: JobId
    status: _Status | None = Field(default=None, description="The job's status (None when refused).")
    runs: list[LogRun] = Field(default_factory=list, max_length=MAX_LOG_RUNS)
    chunk: LogChunk | None = None
    refused: Reason | None = Field(
        default=None,
        description="No such job, or `permission denied: bob cannot read alice's job`: the owner's name only.",
    )
    epoch: Counter = Field(description="The answering leader's epoch.")


class LogRead(Event):
    """The scheduler asks a node's agent for a chunk of one rank's log of one lease (``logs.read.<node>``)."""

    node_id: NodeId = Field(description="The node whose agent reads (the subject's last token).")
    job_id: JobId
    lease_id: LeaseId
    local_rank: _Rank = Field(description="The rank's index among this node's processes of the lease.")
    offset: _Offset = 0
    max_bytes: int = Field(default=MAX_LOG_CHUNK, ge=1, le=MAX_LOG_CHUNK)


class LogData(WireModel):
    """A chunk of one log file: ``data`` from ``offset`` to ``next_offset``; or why none (``missing``)."""

    offset: _Offset
    data: _Text = ""
    next_offset: _Offset
    size: _Offset = 0
    missing: Reason | None = Field(default=None, description="Why there is no such log on this node.")
