"""``query.logs``: a job's output, across its runs and nodes, for its owner or an operator (issue 14, item 1).

Design (zero trust, enforced by the broker; docs/security.md):

* The user asks the scheduler leader on ``query.logs.<user>``: the broker lets an identity publish
  only on its own token and the codec checks ``requester`` equals it, so the requester is vouched
  for. The scheduler answers only the job's owner or an operator (:func:`may_operate`, as for
  ``query.jobs`` and ``job.cancel``); anyone else gets the owner's name in ``refused`` and nothing of
  the job, not even its runs.
* The scheduler knows every run of the job: each lease it granted is kept in the store after its
  release (one row per node, ``<lease>-n<rank>``, in rank order), so run *K* is the *K*-th lease
  by grant time, with its nodes and GPUs, and from the spec which global rank runs on which node
  as which local rank (:meth:`JobRun.ranks`, as the executor numbers them).
* The scheduler then asks the one node holding that rank's log, on ``logs.read.<node>``, which only
  the scheduler may publish and only that node's agent may hear: users never talk to agents, so no
  grant or token has to be minted, checked or expired; the scheduler relays the chunk. The request
  names the job, the lease and the local rank, never a path; the agent builds the path itself
  (``services/worker/log_reader.py``).
* Every read is one bounded chunk (:data:`~schemas.logs.MAX_LOG_CHUNK`) from a byte offset, so a
  follower polls from where it stopped and a long log pages; each request to an agent has a bounded
  timeout (:data:`READ_TIMEOUT_S`), and a node that is gone or silent makes that run's output
  ``unavailable`` with the node's name instead of a hang.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Final

from schemas.job import JobSpec
from schemas.logs import LogChunk, LogData, LogRead, LogRun, LogsQuery, LogsReply
from schemas.subjects import logs_read
from services.runtime.bus import Bus, BusError, NoResponderError
from services.runtime.store import LeaseRecord, Store
from services.scheduler.book import JobBook
from services.scheduler.leases import Lease, split_row_id
from services.scheduler.trust import may_operate, permission_denied

__all__ = ["READ_TIMEOUT_S", "JobRun", "LogsAnswerer", "runs_from_rows"]

READ_TIMEOUT_S: Final = 2.0
"""How long the scheduler waits for a node's agent to answer one read (clients wait longer)."""


@dataclass(frozen=True, slots=True)
class JobRun:
    """One run of a job: one lease, its ``(node, GPUs)`` parts in rank order."""

    run: int
    lease_id: str
    parts: tuple[tuple[str, tuple[int, ...]], ...]
    current: bool = False

    def ranks(self, *, distributed: bool) -> list[tuple[int, str, int]]:
        """``(global rank, node, local rank)`` of each process of the run (launcher.plan_ranks): one
        process on one node unless ``distributed``; one per GPU on several nodes, ranks offset by the
        GPUs of the nodes before."""
        if len(self.parts) == 1:
            node, gpus = self.parts[0]
            count = len(gpus) if distributed else 1
            return [(i, node, i) for i in range(count)]
        out: list[tuple[int, str, int]] = []
        offset = 0
        for node, gpus in self.parts:
            out += [(offset + i, node, i) for i in range(len(gpus))]
            offset += len(gpus)
        return out

    def to_wire(self, *, distributed: bool) -> LogRun:
        return LogRun(
            run=self.run, lease_id=self.lease_id, nodes=[node for node, _ in self.parts],
            ranks=[rank for rank, _, _ in self.ranks(distributed=distributed)], current=self.current,
        )  # fmt: skip


def runs_from_rows(rows: Iterable[LeaseRecord], *, current_lease: str | None = None) -> list[JobRun]:
    """The job's runs from its lease rows: one per lease id, numbered from 1 in grant order (ties by
    lease id), each lease's nodes in rank order; ``current_lease`` marks the run in progress."""
    leases: dict[str, list[tuple[int, LeaseRecord]]] = {}
    for row in rows:
        try:
            lease_id, rank = split_row_id(row.lease_id)
        except ValueError:
            continue  # not a row this scheduler wrote
        leases.setdefault(lease_id, []).append((rank, row))
    ordered = sorted(leases.items(), key=lambda item: (min(r.granted_at for _, r in item[1]), item[0]))
    runs: list[JobRun] = []
    for number, (lease_id, ranked) in enumerate(ordered, start=1):
        ranked.sort(key=lambda pair: pair[0])
        parts = tuple((row.node_id, tuple(row.gpu_indices)) for _, row in ranked)
        runs.append(JobRun(number, lease_id, parts, current=lease_id == current_lease))
    return runs


class LogsAnswerer:
    """Answers ``query.logs`` for the leader of one term: ``book()`` is the leader's book now, ``store``
    its store."""

    def __init__(
        self, bus: Bus, book: Callable[[], JobBook], store: Store, *, epoch: int, operators: Collection[str]
    ) -> None:
        self.bus = bus
        self.book = book
        self.store = store
        self.epoch = epoch
        self.operators = operators

    async def answer(self, query: LogsQuery) -> LogsReply:
        job_id = query.job_id
        found = await self._job(job_id)
        if found is None:
            return LogsReply(job_id=job_id, refused=f"no such job: {job_id}", epoch=self.epoch)
        spec, status, current = found
        if not may_operate(query.requester, spec.user, self.operators):
            return LogsReply(job_id=job_id, refused=permission_denied(query.requester, "read", spec.user),
                             epoch=self.epoch)  # fmt: skip
        rows = {row.lease_id: row for row in await self.store.leases_for_job(job_id, include_released=True)}
        for row in current.records() if current is not None else ():
            rows.setdefault(row.lease_id, row)  # a grant the store has not written yet
        runs = runs_from_rows(rows.values(), current_lease=current.lease_id if current is not None else None)
        wire = [run.to_wire(distributed=spec.distributed) for run in runs]
        reply = LogsReply(job_id=job_id, status=status, runs=wire, epoch=self.epoch)
        if query.run is None:
            return reply
        if query.run > len(runs):
            return reply.model_copy(update={"refused": f"{job_id} has no run {query.run} (it has {len(runs)})"})
        run = runs[query.run - 1]
        where = {rank: (node, local) for rank, node, local in run.ranks(distributed=spec.distributed)}
        if query.rank not in where:
            return reply.model_copy(
                update={"refused": f"run {run.run} of {job_id} has no rank {query.rank} (ranks: {sorted(where)})"}
            )
        node, local = where[query.rank]
        chunk = await self._read(run, node, LogRead(
            node_id=node, job_id=job_id, lease_id=run.lease_id, local_rank=local, offset=query.offset,
            max_bytes=query.max_bytes,
        ), query.rank)  # fmt: skip
        return reply.model_copy(update={"chunk": chunk})

    async def _job(self, job_id: str) -> tuple[JobSpec, str, Lease | None] | None:
        """``(spec, status, current lease)`` of ``job_id`` from the book, else the store."""
        entry = self.book().jobs.get(job_id)
        if entry is not None:
            return entry.state.spec, entry.state.status.value, entry.lease
        record = await self.store.get_job(job_id)
        if record is None:
            return None
        return record.spec, record.status.value, None

    async def _read(self, run: JobRun, node: str, request: LogRead, rank: int) -> LogChunk:
        base = {"run": run.run, "rank": rank, "node_id": node, "offset": request.offset}
        try:
            data = await self.bus.request(logs_read(node), request, LogData, timeout_s=READ_TIMEOUT_S)
        except (NoResponderError, TimeoutError):
            return LogChunk(**base, next_offset=request.offset,
                            unavailable=f"node {node} did not answer (gone, or its agent is not running)")  # fmt: skip
        except BusError as exc:
            return LogChunk(**base, next_offset=request.offset, unavailable=f"node {node}: {exc}"[:1000])
        if data.missing is not None:
            return LogChunk(**base, next_offset=request.offset, unavailable=f"node {node}: {data.missing}"[:1000])
        return LogChunk(**base, data=data.data, next_offset=data.next_offset, size=data.size)
