"""``query.jobs``: the leader's view of jobs, for ``roundhouse jobs``; ``query.admission``: what the
admission service starts from.

A user (``query.jobs.<requester>``, vouched for by the broker) sees only their own jobs; an operator
sees everyone's; a job of another user named by id is refused with its owner's name, nothing more.
Unfinished jobs come from the leader's book (current to the last applied event, running jobs'
attained service and runtime to ``now``); finished ones, when asked for, from the store. Results
are sorted by job id and paged with ``after`` / ``limit``; each queued job carries its place in the
last round's ranking (``queue_position``), by which ``roundhouse jobs`` shows the queue in order.

A queued job that nothing held says why it waits (``waiting_reason``): the GPUs it needs against
those free now (and on one node, which is what a consolidating placement needs), and its place
among the waiting jobs in the last round's ranking, the policy's order.

A queued job carries its expected start (``eta_s`` from ``now``, ``eta_time``, ``eta_quality``) from
the last ETA run (``eta.py``: a forward simulation under the policy in force, run off the event loop
and cached, never per query), or ``eta_reason`` saying why it has none; other jobs carry no ETA.

``query.admission`` (:func:`answer_admission`) lists the unfinished jobs of the book (held ones and
admitted ones, each with its spec) in submission order (``seq``: the stream order of their
``job.arrived``, so held jobs come in the order admission held them), paged by ``after_seq``, with
the live nodes on the first page. It is answered only once the leader has applied every fact
stored up to the query's ``through_seq`` (:func:`applied_through`): admission reads the stream's
last sequence, asks, and then follows the stream from the next one, so no fact falls between the
reply and what it follows.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import nats.errors
import nats.js.errors

from schemas.control import (
    AdmissionJob,
    AdmissionNode,
    AdmissionQuery,
    AdmissionReply,
    JobsQuery,
    JobsReply,
    JobView,
)
from schemas.subjects import (
    JOB_ACCEPTED,
    JOB_ARRIVED,
    JOB_CANCEL,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_REJECTED,
    NODE_REGISTER,
)
from services.core.state import ClusterState, JobState, JobStatus
from services.runtime.bus import Bus
from services.runtime.store import JobRecord
from services.scheduler.book import JobBook, JobEntry
from services.scheduler.eta import EtaTable
from services.scheduler.inventory import Inventory
from services.scheduler.replica import CONSUMERS
from services.scheduler.trust import may_operate, permission_denied


@dataclass(frozen=True, slots=True)
class WaitingContext:
    """What explains a queued job's wait: the cluster now and the last round's ranking."""

    cluster: ClusterState
    """Live GPUs with every held lease assigned."""
    positions: Mapping[str, int] = field(default_factory=dict)
    """Each waiting job of the last round's ranking -> its place among them (1 = first in line)."""
    round: int | None = None
    """That round's number (None: no round has run in this term yet)."""

    @classmethod
    def after_round(
        cls, cluster: ClusterState, ranked: Iterable[str], is_waiting: Callable[[str], bool], round_no: int | None
    ) -> WaitingContext:
        """From a round's ranked job ids (running ones included; ``is_waiting`` picks the others)."""
        waiting = (j for j in ranked if is_waiting(j))
        return cls(cluster, {job_id: i for i, job_id in enumerate(waiting, start=1)}, round_no)


def waiting_reason(gpus: int, job_id: str, context: WaitingContext) -> str:
    """Why a queued job of ``gpus`` GPUs is not running, in words for ``roundhouse jobs``."""
    cluster = context.cluster
    total = cluster.total_gpus
    plural = "s" if gpus != 1 else ""
    if gpus > total:
        return f"needs {gpus} GPU{plural}; the live nodes have {total}"
    free = cluster.free_gpu_count
    reason = f"needs {gpus} GPU{plural}, {free} of {total} free"
    if free >= gpus > 1:
        on_one_node = max((len(g) for g in cluster.free_by_node().values()), default=0)
        if on_one_node < gpus:  # enough in all, not together: what a consolidating placement waits for
            reason += f" (at most {on_one_node} on one node)"
    if context.round is None:
        return reason + "; no round yet"
    position = context.positions.get(job_id)
    if position is not None:
        return reason + f"; #{position} of {len(context.positions)} waiting in round {context.round}"
    return reason + f"; arrived after round {context.round}"


NO_ETA_YET: Final = "no ETA yet: the scheduler has not simulated the queue since this job arrived"
ETA_OFF: Final = "ETA is off (scheduler setting eta)"


def eta_fields(job_id: str, now: float, table: EtaTable | None, *, enabled: bool = True) -> dict[str, object]:
    """A queued job's ETA fields of :class:`JobView` from the last ETA run's ``table``."""
    if not enabled:
        return {"eta_reason": ETA_OFF}
    if table is None:
        return {"eta_reason": NO_ETA_YET}
    eta = table.etas.get(job_id)
    if eta is None:
        return {"eta_reason": table.left_out_reason() if job_id in table.left_out else NO_ETA_YET}
    if eta.start is None:
        return {"eta_reason": eta.reason}
    return {"eta_s": max(0.0, eta.start - now), "eta_time": eta.start, "eta_quality": eta.quality}


def _view_from_entry(
    entry: JobEntry, now: float, context: WaitingContext | None, etas: EtaTable | None, eta_on: bool
) -> JobView:
    state = entry.state
    lease = entry.lease
    service = state.attained_service
    runtime = state.executed_time
    placement: dict[str, list[int]] = {}
    if lease is not None:
        placement = {node: list(gpus) for node, gpus in lease.parts}
        start = state.last_start_time if state.last_start_time is not None else now
        service = entry.service0 + lease.gpu_count * max(0.0, now - start)
        runtime = entry.executed0 + max(0.0, now - start)
    reason = entry.reason
    position = None
    if context is not None and state.status is JobStatus.QUEUED:
        position = context.positions.get(state.job_id)
        if reason is None:
            reason = waiting_reason(state.spec.gpus, state.job_id, context)
    eta = eta_fields(state.job_id, now, etas, enabled=eta_on) if state.status is JobStatus.QUEUED else {}
    view = _view(
        state, service, placement, reason, runtime=runtime, position=position, exit_code=entry.exit_code,
        signal=entry.signal,
    )  # fmt: skip
    return view.model_copy(update=eta) if eta else view


def _view(
    state: JobState,
    service: float,
    placement: dict[str, list[int]],
    reason: str | None,
    *,
    runtime: float,
    position: int | None = None,
    exit_code: int | None = None,
    signal: int | None = None,
) -> JobView:
    spec = state.spec
    return JobView(
        job_id=state.job_id,
        name=spec.name,
        user=spec.user,
        job_class=spec.job_class,
        status=state.status.value,
        gpus=spec.gpus,
        model=spec.model,
        placement=placement,
        submit_time=state.submit_time,
        first_start_time=state.first_start_time,
        finish_time=state.finish_time,
        attained_service_s=service,
        runtime_s=runtime,
        queue_position=position,
        iterations_done=state.iterations_done,
        preemptions=state.preemptions,
        reason=reason,
        exit_code=exit_code,
        signal=signal,
    )


def answer(
    query: JobsQuery,
    book: JobBook,
    finished: Iterable[JobRecord],
    now: float,
    epoch: int,
    *,
    context: WaitingContext | None = None,
    operators: Collection[str] = (),
    etas: EtaTable | None = None,
    eta_on: bool = True,
) -> JobsReply:
    """Build the reply to ``query`` from the book and the finished jobs read from the store;
    ``context`` explains queued jobs' waits (none without it); ``etas``, the last ETA run, gives
    queued jobs their expected start (``eta_on`` False: ETA is off, and queued jobs say so).

    ``query.requester`` sees only their own jobs unless it is one of ``operators``; a job of
    another user that the query names by id is listed in ``refused`` with its owner's name only."""
    wanted_ids = set(query.job_ids)
    statuses = set(query.statuses)
    views: dict[str, JobView] = {}
    refused: dict[str, str] = {}
    requester = query.requester

    def keep(job_id: str, status: str, user: str) -> bool:
        if wanted_ids and job_id not in wanted_ids:
            return False
        if not may_operate(requester, user, operators):
            if job_id in wanted_ids:
                refused[job_id] = permission_denied(requester, "read", user)
            return False
        if statuses and status not in statuses:
            return False
        if query.user is not None and user != query.user:
            return False
        return query.after is None or job_id > query.after

    for job_id, entry in book.jobs.items():
        state = entry.state
        if keep(job_id, state.status.value, state.spec.user):
            views[job_id] = _view_from_entry(entry, now, context, etas, eta_on)
    for record in finished:
        if record.job_id in views or not keep(record.job_id, record.status.value, record.spec.user):
            continue
        state = record.to_state()
        views[record.job_id] = _view(
            state, record.attained_service, {}, record.reason, runtime=record.executed_time,
            exit_code=record.exit_code, signal=record.signal,
        )  # fmt: skip
    ordered = [views[j] for j in sorted(views)]
    truncated = len(ordered) > query.limit
    return JobsReply(jobs=ordered[: query.limit], truncated=truncated, epoch=epoch, refused=refused)


# --- query.admission ----------------------------------------------------------------------------
ADMISSION_FACTS: Final = (JOB_ARRIVED, JOB_ACCEPTED, JOB_REJECTED, JOB_CANCEL, JOB_COMPLETED, JOB_FAILED, NODE_REGISTER)
"""The subjects whose facts change what ``query.admission`` answers (``job.held`` only sets a reason)."""
ADMISSION_REPLY_BYTES: Final = 512 * 1024
"""Specs per page stop at about this many bytes (NATS's default ``max_payload`` is 1 MiB); a page
holds at least one job, whose spec fitted in its own ``job.arrived``."""


async def applied_through(bus: Bus, seq: int, *, subjects: Iterable[str] = ADMISSION_FACTS) -> bool:
    """Whether this leader's durable consumers of ``subjects`` have applied (acked, so committed
    and in the book) every message stored up to stream sequence ``seq``.

    Per consumer, from the server's view: its ack floor reached ``seq``; or nothing it was delivered
    is unacked and it has nothing left to deliver, or what is left comes after ``seq``. Conservative:
    the server does not say where unacked messages lie, so any unacked one holds the answer back
    while the ack floor is below ``seq`` (a message nak'ed for a retry too, until it is applied or
    dead-lettered); under steady load the floor passes ``seq`` as later messages are acked.
    """
    if seq <= 0:
        return True
    for subject in subjects:
        try:
            info = await bus.js.consumer_info(bus.stream_name, bus.name(CONSUMERS[subject]))
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
            return False  # not created yet (a term starting), or the broker is away: not known
        if info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= seq:
            continue
        if info.num_ack_pending:
            return False
        if info.num_pending and (info.delivered is None or (info.delivered.stream_seq or 0) < seq):
            return False
    return True


async def wait_applied_through(bus: Bus, seq: int, *, timeout_s: float, poll_s: float = 0.05) -> bool:
    """:func:`applied_through`, asked again every ``poll_s`` for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await applied_through(bus, seq):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)
    return True


def admission_nodes(inventory: Inventory) -> list[AdmissionNode]:
    """The live nodes, as admission rebuilds its inventory from them."""
    nodes: list[AdmissionNode] = []
    for n in inventory.live():
        nodes.append(AdmissionNode(
            node_id=n.node_id, incarnation=uuid.UUID(n.incarnation), hostname=n.hostname, gpus=list(n.gpus),
            gpu_type=n.gpu_type, cpus=n.cpus, memory_gb=n.memory_gb, draining=n.draining,
        ))  # fmt: skip
    return nodes


def answer_admission(query: AdmissionQuery, book: JobBook, inventory: Inventory, epoch: int) -> AdmissionReply:
    """The unfinished jobs of ``book`` with ``seq`` above ``query.after_seq``, in ``seq`` order, up to
    ``query.limit`` jobs and about :data:`ADMISSION_REPLY_BYTES` of specs; the live nodes on the
    first page (``after_seq`` None)."""
    after = query.after_seq if query.after_seq is not None else -1
    states = sorted(
        (e.state for e in book.jobs.values() if not e.state.status.is_final and e.state.seq > after),
        key=lambda state: state.seq,
    )
    jobs: list[AdmissionJob] = []
    size = 0
    for state in states:
        if len(jobs) >= query.limit or (jobs and size >= ADMISSION_REPLY_BYTES):
            break
        size += len(state.spec.model_dump_json())
        jobs.append(AdmissionJob(
            job_id=state.job_id, spec=state.spec, status=state.status.value, submit_time=state.submit_time,
            admit_time=state.admit_time, seq=state.seq,
        ))  # fmt: skip
    nodes = admission_nodes(inventory) if query.after_seq is None else []
    return AdmissionReply(jobs=jobs, nodes=nodes, truncated=len(jobs) < len(states), epoch=epoch)
