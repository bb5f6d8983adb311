"""The worker agent: one per node. Registers, heartbeats, runs leases, reports what happened.

Commands (request-reply, acked once recorded, fenced by epoch): ``lease.grant.<node>`` starts a
lease's processes, ``lease.revoke.<node>`` starts the two-phase stop (coordinator of a multi-node
job), ``lease.stop.<node>`` carries ``stop_at`` from a coordinator to this node. Facts (durable,
through :class:`~services.worker.outbox.Outbox`): ``job.started``, ``job.checkpointed`` (a
periodic checkpoint of a running job, seen where the metrics are sampled), ``job.suspended``,
``job.completed``, ``job.failed``. Liveness: ``node.register`` on start, after a reconnect and
when the scheduler leader asks for it (``node.reregister.<node>``: its store does not know this node),
``node.heartbeat`` every ``heartbeat_s``. Metrics: ``metrics.job.<id>`` from the training
processes' channels and ``metrics.node.<id>``, every ``metrics_s``. See docs/worker.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import nats.errors

from schemas.base import Event
from schemas.control import LeaseStopAt
from schemas.jobs import (
    CompletionReason,
    FailureReason,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobStarted,
    JobSuspended,
    SuspendReason,
)
from schemas.leases import LeaseAck, LeaseAckError, LeaseGrant, LeaseRevoke, RevokeReason
from schemas.logs import LogData, LogRead
from schemas.metrics import JobMetrics, NodeMetrics
from schemas.nodes import LeaseState, NodeHeartbeat, NodeRegister, NodeReregister
from schemas.subjects import (
    JOB_FAILED,
    JOB_STARTED,
    NODE_HEARTBEAT,
    NODE_REGISTER,
    job_metrics,
    lease_grant,
    lease_revoke,
    lease_stop,
    logs_read,
    node_metrics,
    node_reregister,
)
from services.core.packing import MAX_JOBS_PER_GPU
from services.runtime.bus import Bus, BusError, RemoteError
from services.runtime.checkpoint import CHECKPOINT_NAME
from services.runtime.config import ServiceConfig
from services.runtime.prometheus import GpuCollector
from services.runtime.service import RoundhouseService
from services.runtime.version import __version__
from services.worker import two_phase
from services.worker.channel import ClientStatus, LeaseSignal
from services.worker.checkpoints import confine, confine_resume
from services.worker.config import WorkerConfig
from services.worker.emulator import Emulator
from services.worker.inventory import Inventory, discover, host_resources
from services.worker.launcher import LaunchError, LeasePaths, RankProcess, launch, plan_ranks, stderr_tail
from services.worker.leases import Lease, LeaseTable
from services.worker.links import links_from_spec
from services.worker.log_reader import serve_log_read
from services.worker.outbox import Outbox
from services.worker.peers import PeerBook, PeerClaim, judge_peer_fact
from services.worker.records import LeaseRecord
from services.worker.recovery import recover
from services.worker.watchdog import WatchdogPool, keepalive_period

__all__ = ["WorkerService"]

log = logging.getLogger("roundhouse.worker")

_REREGISTER_MIN_INTERVAL_S = 3.0
"""At most one ``node.register`` per this many seconds on the leader's asks (a replayed or forged ask
is harmless, re-registering being idempotent, but stays bounded)."""
_EXIT_MARGIN_S = 5.0
"""After a reported stop, processes get the rest of the grace period plus this to exit on their own."""


class WorkerService(RoundhouseService):
    """The node agent (see the module doc and docs/worker.md)."""

    kind = "worker"
    description = "Roundhouse worker agent: launches jobs under leases, two-phase preemption"
    config_model = WorkerConfig

    def __init__(self, config: ServiceConfig, *, inventory: Inventory | None = None) -> None:
        cfg = config if isinstance(config, WorkerConfig) else WorkerConfig.model_validate(config.model_dump())
        super().__init__(cfg)
        self.cfg = cfg
        self.node_id = cfg.node_id
        self.incarnation = uuid.uuid4()
        self.work_dir = Path(cfg.work_dir).resolve()
        root = cfg.checkpoint_root
        self.checkpoint_root = Path(root).resolve() if root else self.work_dir / "checkpoints"
        self.inventory = inventory if inventory is not None else discover(cfg.fake_gpus, cfg.node_id, cfg.fake_gpu_name)
        spec = cfg.link_bandwidth_gbps
        self.link_bandwidth_gbps = (
            links_from_spec(spec, self.inventory.indices) if spec else self.inventory.link_bandwidth_gbps
        )
        """What the register reports between the GPUs: the setting, else what NVML found."""
        self.table = LeaseTable(self.inventory.indices, epoch_seen=self._load_epoch())
        self.outbox = Outbox()
        self.emulator = Emulator(cfg) if cfg.emulate else None
        self.watchdogs = WatchdogPool(self.work_dir, lease_ttl_s=cfg.lease_ttl_s, heartbeat_s=cfg.heartbeat_s,
                                      kill_after_s=cfg.kill_after_s)  # fmt: skip
        self.peers = PeerBook()
        """The other nodes of each multi-node lease (the coordinator's fan-out list; whose
        ``job.failed`` counts)."""
        self.last_contact = time.monotonic()
        self._reregistered_at = -_REREGISTER_MIN_INTERVAL_S
        """Monotonic time of the last ``node.register`` sent on the leader's ask."""
        self.cut_off = False
        self.draining = False
        self._bus: Bus | None = None
        self._seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._subs: list[Any] = []
        self._metrics_seen: dict[str, tuple[int, int]] = {}
        self.last_sample: NodeMetrics | None = None
        """This node's latest GPU readings (NVML, or the fake inventory's), as published every
        ``metrics_s``; ``/metrics`` shows them by GPU."""
        self.metrics_registry.register(GpuCollector(lambda: [self.last_sample] if self.last_sample else []))
        self._checkpoints_seen: dict[str, int] = {}
        """lease id -> iteration of the last checkpoint reported with ``job.checkpointed``."""
        self.counters: dict[str, int] = dict.fromkeys(
            ("grants", "revokes", "stop_ats", "refused", "duplicates", "stale_epoch", "started", "checkpointed",
             "suspended", "completed", "failed", "cut_offs", "checkpoint_refused", "reregistered"), 0,
        )  # fmt: skip

    # --- lifecycle ---------------------------------------------------------------------------------
    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise RuntimeError("the worker is not started")
        return self._bus

    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.outbox.start(bus)
        # Before registering: once registered, the scheduler releases the previous incarnation's
        # leases and may grant their GPUs and jobs again.
        await self._recover()
        if self.emulator is None:
            await self.watchdogs.fill()
        self._subs = [
            await bus.serve(lease_grant(self.node_id), LeaseGrant, self._on_grant),
            await bus.serve(lease_revoke(self.node_id), LeaseRevoke, self._on_revoke),
            await bus.serve(lease_stop(self.node_id), LeaseStopAt, self._on_stop_at),
            await bus.serve(logs_read(self.node_id), LogRead, self._on_log_read),
            await bus.subscribe(node_reregister(self.node_id), NodeReregister, self._on_reregister),
            await bus.subscribe(JOB_STARTED, JobStarted, self._on_job_started),
            await bus.subscribe(JOB_FAILED, JobFailed, self._on_job_failed),
        ]
        bus.on_reconnect(self._on_reconnected)
        await bus.nc.flush()
        await bus.publish(NODE_REGISTER, self._register())
        await self._heartbeat()
        self._loops = [
            asyncio.create_task(self._liveness_loop(), name="worker-liveness"),
            asyncio.create_task(self._metrics_loop(), name="worker-metrics"),
            asyncio.create_task(self._keepalive_loop(), name="worker-keepalive"),
        ]
        log.info("worker %s up with %d GPU(s)%s", self.node_id, len(self.inventory.gpus),
                 " (fake)" if self.inventory.fake else "")

    async def stop(self) -> None:
        """Drain: suspend every job (checkpointing), report, then close."""
        if self.draining:
            return
        self.draining = True
        # Say so at once: the scheduler stops counting this node's free GPUs (issue 15, item 4)
        # instead of offering them until the node has been silent for a while.
        with contextlib.suppress(nats.errors.Error, BusError, TimeoutError):
            await asyncio.wait_for(self._heartbeat(), 1.0)
        budget = self.cfg.drain_timeout_s
        for lease in self.table:
            if not lease.stopping:
                grace = min(lease.grant.spec.grace_period_s, budget * 0.5)
                self._begin_stop(lease, SuspendReason.NODE_SHUTDOWN, grace, propagate=True)
        waits = [lease.ended.wait() for lease in self.table]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), budget * 0.7)
        await self.outbox.flush(budget * 0.2)
        leases = list(self.table)  # a cancelled lease task takes its lease out of the table
        for task in self._loops:
            task.cancel()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)
        await self.outbox.stop()
        for lease in leases:
            for rank in lease.ranks:
                rank.signal(signal.SIGKILL)
        self.watchdogs.close()
        # Watchdogs of leases whose processes outlived the drain were not released: they see the
        # agent exit and make sure those processes are gone.

    def stats(self) -> dict[str, Any]:
        return {
            **self.counters,
            "leases": len(self.table),
            "epoch_seen": self.table.fence.seen,
            "outbox_pending": self.outbox.pending,
            "cut_off": self.cut_off,
        }

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker task %s failed", task.get_name(), exc_info=task.exception())

    # --- a previous agent's leases ------------------------------------------------------------------
    async def _recover(self) -> None:
        """Stop what a previous agent left running and report its leases' newest checkpoints
        (:mod:`services.worker.recovery`), before this agent registers."""
        cfg = self.cfg
        recovered = await asyncio.to_thread(
            recover, self.work_dir / "leases", checkpoint_root=self.checkpoint_root, lease_ttl_s=cfg.lease_ttl_s,
            heartbeat_s=cfg.heartbeat_s, kill_after_s=cfg.kill_after_s,
        )  # fmt: skip
        done: list[Path] = []
        for item in recovered:
            if item.stopped is not None:
                log.warning("lease %s: its processes %s (%.2f s)%s", item.lease_dir.name, item.stopped.how,
                            item.stopped.seconds, f"; still there: {list(item.stopped.left)}" if item.stopped.left
                            else "")  # fmt: skip
            record = item.record
            if record is None:
                continue
            done.append(item.lease_dir)
            if item.checkpoint is None or not record.coordinator:
                continue
            if record.node_id != self.node_id:
                log.warning("lease %s was run by node %s, not this one (%s): its checkpoint is not reported",
                            record.lease_id, record.node_id, self.node_id)  # fmt: skip
                continue
            path, iteration = item.checkpoint
            try:
                fact = JobCheckpointed(job_id=record.job_id, lease_id=record.lease_id, node_id=self.node_id,
                                       epoch=record.epoch, checkpoint_path=str(path), iteration=iteration)  # fmt: skip
            except ValueError as exc:
                log.warning("lease %s: cannot report its checkpoint: %s", record.lease_id, exc)
                continue
            log.info("lease %s of a previous agent: job %s checkpointed at iteration %d (%s)", record.lease_id,
                     record.job_id, iteration, path)  # fmt: skip
            self.counters["checkpointed"] += 1
            self._emit(fact)
        if done:

            def forget() -> None:
                for lease_dir in done:
                    LeaseRecord.remove(lease_dir)

            self.outbox.then(forget)
            # Published before node.register goes out: the scheduler then most likely applies them
            # while it still holds (or has just released) those leases, which is what it accepts.
            if not await self.outbox.flush(min(10.0, self.cfg.lease_ttl_s / 2)):
                log.warning("the checkpoints of a previous agent's leases are not published yet; they will be")

    # --- epoch persistence ------------------------------------------------------------------------
    @property
    def _epoch_file(self) -> Path:
        return Path(self.cfg.work_dir).resolve() / "epoch"

    def _load_epoch(self) -> int:
        try:
            return int(self._epoch_file.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _accept_epoch(self, epoch: int) -> None:
        """Move the fence to the epoch of a command this agent has just accepted, and persist it.

        Called only after acceptance: a refused command (unknown lease, busy GPU, draining, another
        job's lease) must change nothing, or one forged command with a huge epoch would fence out the
        real leader on this node forever (issue 13, attack 9)."""
        if not self.table.fence.advance(epoch):
            return
        # A restarted agent must still refuse a deposed leader: remember the highest epoch on disk.
        with contextlib.suppress(OSError):
            self._epoch_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._epoch_file.with_suffix(".tmp")
            tmp.write_text(str(epoch))
            os.replace(tmp, self._epoch_file)

    # --- acks ---------------------------------------------------------------------------------------
    def _ack(self, lease_id: str, *, duplicate: bool = False, message: str = "") -> LeaseAck:
        if duplicate:
            self.counters["duplicates"] += 1
        return LeaseAck(lease_id=lease_id, node_id=self.node_id, accepted=True, duplicate=duplicate,
                        epoch_seen=self.table.fence.seen, message=message, leases_held=len(self.table))

    def _refuse(self, lease_id: str, error: LeaseAckError, message: str) -> LeaseAck:
        self.counters["refused"] += 1
        log.info("refused %s for lease %s: %s", error.value, lease_id, message)
        return LeaseAck(lease_id=lease_id, node_id=self.node_id, accepted=False, error=error,
                        epoch_seen=self.table.fence.seen, message=message, leases_held=len(self.table))

    def _fence(self, lease_id: str, node_id: str, epoch: int) -> LeaseAck | None:
        """The refusal for a command to another node or from an older epoch; None when it may proceed.

        Only a check: the fence moves once the command is accepted (:meth:`_accept_epoch`)."""
        if node_id != self.node_id:
            return self._refuse(lease_id, LeaseAckError.WRONG_NODE, f"this is node {self.node_id}, not {node_id}")
        if not self.table.fence.allows(epoch):
            self.counters["stale_epoch"] += 1
            return self._refuse(lease_id, LeaseAckError.STALE_EPOCH,
                                f"epoch {epoch} is older than {self.table.fence.seen}, already accepted")
        return None

    # --- output ---------------------------------------------------------------------------------------
    async def _on_log_read(self, request: LogRead) -> LogData:
        """A chunk of one of this node's lease logs, for the scheduler (``log_reader``); off the event
        loop, so a slow disk does not hold up grants and heartbeats."""
        return await asyncio.to_thread(serve_log_read, request, self.work_dir / "leases")

    # --- grants ---------------------------------------------------------------------------------------
    async def _on_grant(self, grant: LeaseGrant) -> LeaseAck:
        self.counters["grants"] += 1
        refusal = self._fence(grant.lease_id, grant.node_id, grant.epoch)
        if refusal is not None:
            return refusal
        if self.table.get(grant.lease_id) is not None or self.table.ended_recently(grant.lease_id):
            return self._ack(grant.lease_id, duplicate=True)
        if self.draining:
            return self._refuse(grant.lease_id, LeaseAckError.DRAINING, "the node is draining")
        twins = self.table.twins(grant)
        twin = next((t for t in twins if not t.stopping), None)
        if twin is not None:
            return self._refuse(grant.lease_id, LeaseAckError.JOB_RUNNING,
                                f"job {grant.job_id} already runs here under lease {twin.lease_id} "
                                f"(GPUs {list(twin.grant.gpus)}, epoch {twin.grant.epoch})")  # fmt: skip
        error, waits = self.table.check_grant(grant)
        if error is LeaseAckError.NO_SUCH_GPU:
            return self._refuse(grant.lease_id, error, f"GPUs {grant.gpus} not all in {sorted(self.table.gpus)}")
        if error is not None:
            # Packing needs the grant and every running lease on the GPU shared, and room beside them.
            rule = (
                f"a shared grant packs only beside shared leases of other jobs, at most {MAX_JOBS_PER_GPU} a GPU"
                if grant.shared
                else "a grant not marked shared needs its GPUs free"
            )
            held = self.table.holders(grant.gpus)
            return self._refuse(grant.lease_id, error, f"GPUs {grant.gpus} are held ({held}): {rule}")
        waits += [t for t in twins if t not in waits]  # all stopping: a running one refused above
        grant, dropped = self._confine_resume(grant)
        lease = self.table.add(grant)
        self._accept_epoch(grant.epoch)
        for why in self.peers.adopt(grant):
            log.info("lease %s: a job.started that came before the grant is ignored: %s", grant.lease_id, why)
        self._spawn(self._run_lease(lease, waits), f"lease-{grant.lease_id}")
        notes = [f"starting from scratch: {dropped}"[:1000] if dropped else "",
                 "waiting for a stopping lease" if waits else ""]  # fmt: skip
        return self._ack(grant.lease_id, message="; ".join(n for n in notes if n))

    def _confine_resume(self, grant: LeaseGrant) -> tuple[LeaseGrant, str | None]:
        """``grant`` with a ``resume_from`` the job may load (:func:`~services.worker.checkpoints.confine_resume`)."""
        if self.emulator is not None:
            return grant, None  # an emulated run loads nothing; its "checkpoints" are emulated:// names
        confined, dropped = confine_resume(grant, self.checkpoint_root / grant.job_id)
        if dropped is not None:
            log.warning("lease %s of job %s: %s; the job starts from scratch", grant.lease_id, grant.job_id, dropped)
        return confined, dropped

    def _own_checkpoint(self, lease: Lease) -> str | None:
        """``<checkpoint dir>/checkpoint.pt`` of the lease, the path the agent reports for rank 0's
        checkpoint: inside the job's directory by construction (a job id is one path token), checked
        all the same, since the scheduler hands it back to a job to load."""
        if lease.checkpoint_dir is None:
            return None
        path = confine(lease.checkpoint_dir / CHECKPOINT_NAME, self.checkpoint_root / lease.job_id)
        return str(path) if path is not None else None

    async def _run_lease(self, lease: Lease, waits: list[Lease]) -> None:
        grant = lease.grant
        for old in waits:
            remaining = (old.deadline or time.monotonic()) - time.monotonic() + self.cfg.kill_after_s + _EXIT_MARGIN_S
            try:
                await asyncio.wait_for(old.ended.wait(), max(remaining, _EXIT_MARGIN_S))
            except TimeoutError:
                log.warning("lease %s still waits for lease %s's processes; killing them", lease.lease_id, old.lease_id)
                await self._kill(old)
                await old.ended.wait()
        if lease.stopping:
            # Revoked before it ran: nothing to stop, the resume point is unchanged.
            self._report_suspended(lease, iteration=grant.resume_iteration or 0)
            self._drop(lease)
            return
        if self.emulator is not None:
            await self._run_emulated(lease)
            return
        paths = LeasePaths(lease_dir=self.work_dir / "leases" / grant.lease_id,
                           checkpoint_dir=self.checkpoint_root / grant.job_id)
        try:
            lease.ranks = await self._launch(lease, paths)
        except (LaunchError, OSError) as exc:
            self._retire(lease, paths.lease_dir)
            self._emit(JobFailed(job_id=grant.job_id, reason=FailureReason.LAUNCH_ERROR, lease_id=grant.lease_id,
                                 node_id=self.node_id, epoch=grant.epoch, iteration=grant.resume_iteration,
                                 checkpoint_path=grant.resume_from, message=str(exc), attempts=grant.attempt))
            self.counters["failed"] += 1
            self._drop(lease)
            return
        lease.checkpoint_dir = paths.checkpoint_dir
        if not lease.stopping:
            lease.state = LeaseState.RUNNING
        self.counters["started"] += 1
        self._emit(JobStarted(job_id=grant.job_id, lease_id=grant.lease_id, node_id=self.node_id,
                              epoch=grant.epoch, gpus=list(grant.gpus), iteration=grant.resume_iteration or 0,
                              resumed_from=grant.resume_from, startup_s=time.monotonic() - lease.received_at))
        self._record(lease, paths.lease_dir)
        if lease.stop_at is not None:  # a coordinator's stop_at arrived while we were launching
            two_phase.release_at(lease, lease.stop_at)
            self._spawn(self._finish_local_stop(lease), f"stop-{lease.lease_id}")
        elif lease.state is LeaseState.STOPPING:  # revoked while launching
            self._spawn(self._stop(lease), f"stop-{lease.lease_id}")
        await self._monitor(lease)

    async def _launch(self, lease: Lease, paths: LeasePaths) -> list[RankProcess]:
        """Give the lease a watchdog, then start its processes (no agent, no job)."""
        grant, cfg = lease.grant, self.cfg
        ranks = len(plan_ranks(grant))
        paths.lease_dir.mkdir(parents=True, exist_ok=True)
        lease.watchdog = await self.watchdogs.take(paths.lease_dir, ranks, grant.spec.grace_period_s)
        try:
            return await launch(grant, paths, nats=cfg.nats, namespace=cfg.namespace, watch=lease.watchdog.watch)
        finally:
            self._spawn(self.watchdogs.fill(), "watchdog-spare")  # the next launch's, off this one's path

    def _record(self, lease: Lease, lease_dir: Path) -> None:
        """Put the lease on disk for a next agent (after ``job.started``: a file costs milliseconds here)."""
        grant = lease.grant
        record = LeaseRecord(
            lease_id=grant.lease_id, job_id=grant.job_id, node_id=self.node_id, epoch=grant.epoch,
            coordinator=grant.is_coordinator, ranks=len(lease.ranks), grace_period_s=grant.spec.grace_period_s,
            resume_iteration=grant.resume_iteration,
        )  # fmt: skip
        try:
            record.write(lease_dir)
        except OSError as exc:
            log.warning("lease %s: cannot record it on disk (a next agent will not report its checkpoints): %s",
                        lease.lease_id, exc)  # fmt: skip
            return
        lease.record = record

    def _retire(self, lease: Lease, lease_dir: Path) -> None:
        """The lease's processes are all gone: release its watchdog; forget its record once the fact
        that ends it (queued before this) is published."""
        watchdog = lease.watchdog
        if watchdog is not None:
            lease.watchdog = None
            watchdog.release()
            self._spawn(watchdog.wait(), f"watchdog-{lease.lease_id}")
        if lease.record is not None:
            lease.record = None
            self.outbox.then(lambda: LeaseRecord.remove(lease_dir))

    @staticmethod
    def _orphaned(lease: Lease) -> bool:
        """Whether the lease's watchdog stopped it (it found this agent silent for half the TTL)."""
        return any(not r.channel.closed and r.channel.signal is LeaseSignal.ORPHANED for r in lease.ranks)

    # --- revokes and the two-phase stop ----------------------------------------------------------
    async def _on_revoke(self, revoke: LeaseRevoke) -> LeaseAck:
        self.counters["revokes"] += 1
        refusal = self._fence(revoke.lease_id, revoke.node_id, revoke.epoch)
        if refusal is not None:
            return refusal
        lease = self.table.get(revoke.lease_id)
        if lease is None:
            if self.table.ended_recently(revoke.lease_id):
                return self._ack(revoke.lease_id, duplicate=True, message="the lease has already ended")
            return self._refuse(revoke.lease_id, LeaseAckError.UNKNOWN_LEASE, "no such lease on this node")
        if revoke.job_id != lease.job_id:
            return self._refuse(revoke.lease_id, LeaseAckError.UNKNOWN_LEASE,
                                f"lease {lease.lease_id} runs job {lease.job_id}, not {revoke.job_id}")
        if lease.stopping:
            return self._ack(revoke.lease_id, duplicate=True)
        self._accept_epoch(revoke.epoch)
        lease.revoke_epoch = revoke.epoch
        lease.ending = revoke.reason in (RevokeReason.CANCEL, RevokeReason.TERMINATE)
        self._begin_stop(lease, SuspendReason.PREEMPTED, revoke.grace_s, propagate=True)
        return self._ack(revoke.lease_id)

    def _begin_stop(self, lease: Lease, reason: SuspendReason, grace_s: float, *, propagate: bool) -> None:
        lease.state = LeaseState.STOPPING
        lease.stop_reason = reason
        lease.stop_requested_at = time.monotonic()
        lease.deadline = lease.stop_requested_at + grace_s
        lease.propagate = propagate and lease.multi_node and lease.is_coordinator
        if lease.ranks or lease.emulated is not None:
            self._spawn(self._stop(lease), f"stop-{lease.lease_id}")
        # else: _run_lease sees the state once the processes exist (or skips launching them)

    async def _stop(self, lease: Lease) -> None:
        assert lease.deadline is not None
        if lease.emulated is not None and self.emulator is not None:
            await self.emulator.stop(lease.emulated)
            return
        if lease.ending and lease.ranks[0].channel.pid is None:
            # Cancelled or terminated, and its first process never opened the lease channel (a
            # plain script, or one still starting): no boundary will come, and the job runs no
            # more, so there is nothing to wait the grace period for. SIGTERM now (a script may
            # save on it, as under Slurm), SIGKILL kill_after_s later. A preemption still waits:
            # a training job still starting reaches its first boundary and keeps that progress
            # (killed at once, a job whose start outlasts the round would never progress).
            log.info("lease %s: ended before its job opened the lease channel; stopping it now", lease.lease_id)
            await self._kill(lease)
            return
        propagate = self._propagator(lease) if lease.propagate else None
        stop_at = await two_phase.coordinate_stop(lease, lease.deadline, propagate)
        if stop_at is None and not any(r.returncode is not None for r in lease.ranks):
            await self._kill(lease)  # the leader never reached a boundary within the grace period
            return
        await self._finish_local_stop(lease)

    async def _finish_local_stop(self, lease: Lease) -> None:
        """Wait for the local ranks to stop at ``stop_at``; report early; kill whatever outstays the grace."""
        assert lease.deadline is not None
        if not await two_phase.wait_stopped(lease, lease.deadline):
            await self._kill(lease)
            return
        leader = lease.ranks[0]
        if (lease.is_coordinator and leader.returncode is None
                and leader.channel.status is ClientStatus.STOPPED):  # fmt: skip
            # Rank 0's checkpoint is complete: report now rather than after interpreter shutdown.
            # The GPUs stay in the table (state stopping) until the processes exit; a grant for
            # them waits for that.
            self._report_suspended(lease)
        exit_by = max(lease.deadline, time.monotonic()) + _EXIT_MARGIN_S
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lease.exited.wait(), exit_by - time.monotonic())
        if not lease.exited.is_set():
            await self._kill(lease)

    def _propagator(self, lease: Lease) -> two_phase.Propagate:
        async def propagate(stop_at: int) -> None:
            await self._propagate(lease, stop_at)

        return propagate

    async def _propagate(self, lease: Lease, stop_at: int) -> None:
        """Phase two across nodes: every other node of the lease acks ``stop_at`` (retried until the deadline)."""
        world = lease.grant.world
        assert world is not None
        assert lease.deadline is not None
        deadline = lease.deadline
        expected = world.num_nodes - 1
        known = await two_phase.poll_until(lambda: len(self._gang(lease)) >= expected, deadline)
        if not known:
            log.warning("lease %s: only %d of %d other nodes known; stop_at goes to those", lease.lease_id,
                        len(self._gang(lease)), expected)
        epoch = lease.revoke_epoch if lease.revoke_epoch is not None else lease.grant.epoch
        await asyncio.gather(*(
            self._send_stop_at(lease, peer, stop_at, epoch, deadline) for peer in sorted(self._gang(lease))
        ))  # fmt: skip

    async def _send_stop_at(self, lease: Lease, peer: str, stop_at: int, epoch: int, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("lease %s: node %s did not ack stop_at %d in time", lease.lease_id, peer, stop_at)
                return
            command = LeaseStopAt(epoch=epoch, lease_id=lease.lease_id, job_id=lease.job_id, node_id=peer,
                                  stop_at=stop_at, grace_s=remaining)
            try:
                ack = await self.bus.request(lease_stop(peer), command, LeaseAck, timeout_s=min(0.5, remaining))
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, RemoteError, BusError,
                    nats.errors.Error) as exc:
                log.info("lease %s: stop_at to %s not acked yet (%r)", lease.lease_id, peer, exc)
                await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            if not ack.accepted:
                log.warning("lease %s: node %s refused stop_at: %s %s", lease.lease_id, peer, ack.error, ack.message)
            return

    async def _on_stop_at(self, command: LeaseStopAt) -> LeaseAck:
        self.counters["stop_ats"] += 1
        refusal = self._fence(command.lease_id, command.node_id, command.epoch)
        if refusal is not None:
            return refusal
        lease = self.table.get(command.lease_id)
        if lease is None:
            if self.table.ended_recently(command.lease_id):
                return self._ack(command.lease_id, duplicate=True, message="the lease has already ended")
            return self._refuse(command.lease_id, LeaseAckError.UNKNOWN_LEASE, "no such lease on this node")
        refusal = self._stop_at_refusal(lease, command)
        if refusal is not None:
            return refusal
        if lease.stop_at is not None:
            return self._ack(command.lease_id, duplicate=True)
        # The fence does not move: a stop_at is relayed by a peer agent, not sent by the scheduler,
        # and the revoke it carries the epoch of already moved the coordinator's fence.
        lease.state = LeaseState.STOPPING
        lease.stop_reason = SuspendReason.PREEMPTED
        lease.stop_requested_at = time.monotonic()
        lease.deadline = lease.stop_requested_at + command.grace_s
        lease.stop_at = command.stop_at
        if lease.ranks:
            two_phase.release_at(lease, command.stop_at)
            self._spawn(self._finish_local_stop(lease), f"stop-{lease.lease_id}")
        return self._ack(command.lease_id)

    def _stop_at_refusal(self, lease: Lease, command: LeaseStopAt) -> LeaseAck | None:
        """Why a ``stop_at`` for a lease this node holds must be refused (None: it may be applied).

        Only the coordinator of a multi-node lease sends ``stop_at``, to the lease's other nodes, for
        the same job (issue 13, attack 6). The message does not say who sent it, so "from the
        coordinator" is left to the broker's permissions; what the agent can check, it does."""
        if command.job_id != lease.job_id:
            return self._refuse(command.lease_id, LeaseAckError.UNKNOWN_LEASE,
                                f"lease {lease.lease_id} runs job {lease.job_id}, not {command.job_id}")
        if not lease.multi_node:
            return self._refuse(command.lease_id, LeaseAckError.WRONG_NODE,
                                f"lease {lease.lease_id} runs on this node alone: nobody sends it stop_at")
        if lease.is_coordinator:
            return self._refuse(command.lease_id, LeaseAckError.WRONG_NODE,
                                f"this node coordinates lease {lease.lease_id}: it sends stop_at, it takes none")
        return None

    async def _kill(self, lease: Lease) -> None:
        """Past the grace period: SIGTERM the processes, SIGKILL what is left ``kill_after_s`` later."""
        if lease.exited.is_set():
            return
        lease.killed = True
        log.warning("lease %s: stopping its processes (SIGTERM, then SIGKILL)", lease.lease_id)
        for rank in lease.ranks:
            rank.signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lease.exited.wait(), lease.kill_after_s or self.cfg.kill_after_s)
        for rank in lease.ranks:
            rank.signal(signal.SIGKILL)

    # --- process exits and the facts they make --------------------------------------------------------
    async def _monitor(self, lease: Lease) -> None:
        waits = {asyncio.create_task(rank.process.wait()): rank for rank in lease.ranks}
        pending = set(waits)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    code = task.result()
                    if code != 0 and not lease.killed and lease.failure is None and not self._orphaned(lease):
                        lease.failure = (waits[task], code)
                        if pending:
                            self._spawn(self._kill(lease), f"kill-{lease.lease_id}")
        finally:
            for task in pending:
                task.cancel()
            lease.exited.set()
            self._finalize(lease)

    def _finalize(self, lease: Lease) -> None:
        grant = lease.grant
        try:
            if lease.failure is not None and not lease.silent:
                rank, code = lease.failure
                by_signal = code < 0
                ckpt_path, _ = self._last_checkpoint(lease)
                self._emit(JobFailed(
                    job_id=grant.job_id, lease_id=grant.lease_id, node_id=self.node_id, epoch=grant.epoch,
                    reason=FailureReason.SIGNAL if by_signal else FailureReason.EXIT_CODE,
                    exit_code=None if by_signal else code & 0xFF or 1, signal=-code if by_signal else None,
                    iteration=lease.iteration(), checkpoint_path=ckpt_path, attempts=grant.attempt,
                    message=f"rank {rank.plan.rank} exited with {code}: {stderr_tail(rank.log_path)}"[-4000:],
                ))  # fmt: skip
                self.counters["failed"] += 1
            elif lease.silent or lease.reported or not lease.is_coordinator:
                pass
            elif lease.killed:
                self._report_suspended(lease, grace_expired=True)
            elif self._orphaned(lease) and lease.ranks[0].channel.status is not ClientStatus.FINISHED:
                # This agent was silent (stopped, hung) for half the TTL and the watchdog stopped the
                # job, as the agent itself does when cut off from the bus.
                log.warning("lease %s: the watchdog stopped the job while this agent was silent", lease.lease_id)
                lease.stop_reason = lease.stop_reason or SuspendReason.LEASE_EXPIRED
                self._report_suspended(lease, grace_expired=any((r.returncode or 0) < 0 for r in lease.ranks))
            elif lease.stopping and lease.ranks[0].channel.status is not ClientStatus.FINISHED:
                self._report_suspended(lease)
            else:
                ckpt_path, _ = self._last_checkpoint(lease)
                finished = lease.ranks[0].channel.status is ClientStatus.FINISHED
                self._emit(JobCompleted(
                    job_id=grant.job_id, lease_id=grant.lease_id, node_id=self.node_id, epoch=grant.epoch,
                    reason=CompletionReason.ITERATIONS if finished else CompletionReason.EXITED,
                    iteration=lease.iteration() or 0, exit_code=0, checkpoint_path=ckpt_path,
                    loss=lease.ranks[0].channel.loss, runtime_s=time.monotonic() - lease.received_at,
                ))  # fmt: skip
                self.counters["completed"] += 1
        finally:
            self._publish_metrics(lease)
            # The lease's last sample is out: its per-lease records go with it (a long-lived agent
            # runs many leases).
            self._metrics_seen.pop(lease.lease_id, None)
            self._checkpoints_seen.pop(lease.lease_id, None)
            if all(rank.returncode is not None for rank in lease.ranks):
                self._retire(lease, self.work_dir / "leases" / lease.lease_id)
            # else: cancelled (the agent exits) with processes left: the watchdog sees to them and
            # the record tells the next agent about the lease.
            for rank in lease.ranks:
                rank.channel.close()
            self._drop(lease)

    def _last_checkpoint(self, lease: Lease) -> tuple[str | None, int | None]:
        """The newest complete checkpoint: this lease's (rank 0 wrote one) or the one it resumed from."""
        grant = lease.grant
        ckpt = lease.ranks[0].channel.checkpoint_iteration if lease.ranks and lease.is_coordinator else None
        wrote = ckpt is not None and (grant.resume_iteration is None or ckpt > grant.resume_iteration)
        own = self._own_checkpoint(lease) if wrote else None
        if own is not None:
            return own, ckpt
        if grant.resume_from is not None:  # confined on receipt (_confine_resume)
            return grant.resume_from, grant.resume_iteration
        return None, None

    def _report_suspended(self, lease: Lease, *, iteration: int | None = None, grace_expired: bool = False,
                          checkpoint: tuple[str | None, int | None] | None = None) -> None:
        if lease.reported or lease.silent or not lease.is_coordinator:
            return  # the coordinator reports the job-wide fact
        lease.reported = True
        grant = lease.grant
        ckpt_path, ckpt_iter = checkpoint if checkpoint is not None else self._last_checkpoint(lease)
        if iteration is None:
            iteration = lease.stop_at if lease.stop_at is not None and not grace_expired else lease.iteration()
        iteration = max(iteration or 0, ckpt_iter or 0)
        stop_s = time.monotonic() - lease.stop_requested_at if lease.stop_requested_at is not None else None
        self._emit(JobSuspended(
            job_id=grant.job_id, lease_id=grant.lease_id, node_id=self.node_id, epoch=grant.epoch,
            reason=lease.stop_reason or SuspendReason.PREEMPTED, iteration=iteration,
            checkpoint_path=ckpt_path, checkpoint_iteration=ckpt_iter if ckpt_path is not None else None,
            grace_expired=grace_expired, stop_s=stop_s,
        ))  # fmt: skip
        self.counters["suspended"] += 1

    def _emit(self, event: Event) -> None:
        log.info("%s %s", type(event).__name__, getattr(event, "job_id", ""))
        self.outbox.put(event)

    # --- emulation -------------------------------------------------------------------------------------
    async def _run_emulated(self, lease: Lease) -> None:
        assert self.emulator is not None
        grant = lease.grant
        run = self.emulator.begin(grant)
        lease.emulated = run
        if not lease.stopping:
            lease.state = LeaseState.RUNNING
        self.counters["started"] += 1
        self._emit(JobStarted(job_id=grant.job_id, lease_id=grant.lease_id, node_id=self.node_id,
                              epoch=grant.epoch, gpus=list(grant.gpus), iteration=run.start_iteration,
                              resumed_from=grant.resume_from, startup_s=0.0))
        if lease.stopping:
            self._spawn(self._stop(lease), f"stop-{lease.lease_id}")
        outcome = await self.emulator.wait(run)
        lease.exited.set()
        try:
            if not lease.is_coordinator or lease.silent:
                return
            if outcome.completed:
                self._emit(JobCompleted(
                    job_id=grant.job_id, lease_id=grant.lease_id, node_id=self.node_id, epoch=grant.epoch,
                    reason=CompletionReason.ITERATIONS, iteration=outcome.iteration,
                    runtime_s=time.monotonic() - lease.received_at,
                ))  # fmt: skip
                self.counters["completed"] += 1
            else:
                lease.stop_at = outcome.iteration
                self._report_suspended(lease, iteration=outcome.iteration,
                                       checkpoint=(outcome.checkpoint_path, outcome.iteration))
        finally:
            self._drop(lease)

    # --- peers ---------------------------------------------------------------------------------------
    def _drop(self, lease: Lease) -> None:
        """The lease is over on this node: out of the table (its GPUs free), its gang forgotten."""
        self.peers.forget(lease.lease_id)
        self.table.remove(lease)

    def _gang(self, lease: Lease) -> frozenset[str]:
        return self.peers.members(lease.grant, self.node_id)

    async def _on_job_started(self, event: JobStarted) -> None:
        """Another node started its part of a lease: it joins that lease's gang if the fact matches."""
        if event.node_id == self.node_id:
            return
        lease = self.table.get(event.lease_id)
        claim = PeerClaim(node_id=event.node_id, lease_id=event.lease_id, job_id=event.job_id, epoch=event.epoch)
        why = self.peers.note(claim, lease.grant if lease is not None else None, self.node_id)
        if why is not None:
            log.info("job.started of lease %s from node %s ignored: %s", event.lease_id, event.node_id, why)

    async def _on_job_failed(self, event: JobFailed) -> None:
        """Another node's part of a lease we share failed: our ranks would hang in a collective, stop them.

        Only for a fact from a known member of the lease's gang, about this node's lease, job and
        epoch (:func:`~services.worker.peers.judge_peer_fact`): anything else is ignored, or a forged
        ``job.failed`` would kill a healthy job without a word (issue 13, attack 6)."""
        if event.lease_id is None or event.node_id == self.node_id:
            return  # the scheduler's own verdicts (no lease) and this node's facts
        lease = self.table.get(event.lease_id)
        if lease is None:
            return  # another gang's lease: none of this node's business
        why = judge_peer_fact(lease.grant, job_id=event.job_id, epoch=event.epoch, node_id=event.node_id,
                              self_node=self.node_id, members=self._gang(lease))  # fmt: skip
        if why is not None:
            log.info("job.failed of lease %s from node %s ignored: %s", event.lease_id, event.node_id, why)
            return
        if lease.exited.is_set():
            return
        lease.silent = True
        log.warning("lease %s failed on node %s; stopping the local ranks", lease.lease_id, event.node_id)
        if lease.emulated is not None and self.emulator is not None:
            self.emulator.cancel(lease.emulated)
        else:
            self._spawn(self._kill(lease), f"kill-{lease.lease_id}")

    # --- liveness ------------------------------------------------------------------------------------
    def _register(self) -> NodeRegister:
        cpus, memory_gb = host_resources()
        return NodeRegister(
            node_id=self.node_id, incarnation=self.incarnation, hostname=self.cfg.host,
            cpus=self.cfg.cpus or cpus, memory_gb=self.cfg.memory_gb or memory_gb,
            gpus=list(self.inventory.gpus), driver_version=self.inventory.driver_version,
            cuda_version=self.inventory.cuda_version, agent_version=__version__[:128],
            lease_ttl_s=self.cfg.lease_ttl_s,
            labels={"fake-gpus": "true"} if self.inventory.fake and self.inventory.gpus else {},
            link_bandwidth_gbps=self.link_bandwidth_gbps if self.inventory.gpus else None,
            network_gbps=self.cfg.network_gbps,
        )  # fmt: skip

    async def _heartbeat(self) -> None:
        self._seq += 1
        beat = NodeHeartbeat(node_id=self.node_id, incarnation=self.incarnation, seq=self._seq,
                             epoch_seen=self.table.fence.seen, leases=self.table.held(), draining=self.draining)
        await self.bus.publish(NODE_HEARTBEAT, beat)

    async def _liveness_loop(self) -> None:
        """Heartbeat, and check the bus: cut off longer than ``lease_ttl_s``, suspend every job."""
        nc = self.bus.nc
        period = min(self.cfg.heartbeat_s, self.cfg.lease_ttl_s / 4)
        next_beat = 0.0
        while True:
            now = time.monotonic()
            if nc.is_connected:
                try:
                    await nc.flush(timeout=max(1, round(period)))  # a PING/PONG round trip with the server
                    self.last_contact = time.monotonic()
                except (nats.errors.Error, TimeoutError):
                    pass
            if self.last_contact > now - period and self.cut_off:
                self.cut_off = False
                log.info("back in contact with the bus")
            if not self.cut_off and time.monotonic() - self.last_contact > self.cfg.lease_ttl_s / 2:
                self._on_cut_off()
            if nc.is_connected and now >= next_beat:
                next_beat = now + self.cfg.heartbeat_s
                with contextlib.suppress(nats.errors.Error, BusError, TimeoutError):
                    await self._heartbeat()
            await asyncio.sleep(period)

    def _on_cut_off(self) -> None:
        """Half the TTL without contact: stop every job, and be done (killing if need be) before the
        scheduler may reassign the GPUs, ``lease_ttl_s`` after the last heartbeat it received. That
        heartbeat may be one period older than our last contact, hence the margin."""
        self.cut_off = True
        self.counters["cut_offs"] += 1
        done_by = self.last_contact + self.cfg.lease_ttl_s - min(self.cfg.heartbeat_s, self.cfg.lease_ttl_s / 4)
        remaining = max(0.0, done_by - time.monotonic())
        kill_after = min(self.cfg.kill_after_s, remaining / 4)
        grace_left = remaining - kill_after
        log.warning("no contact with the bus for %.1f s: suspending %d job(s) within %.1f s",
                    time.monotonic() - self.last_contact, len(self.table), grace_left)
        for lease in self.table:
            if not lease.stopping:
                grace = min(lease.grant.spec.grace_period_s, grace_left)
                lease.kill_after_s = kill_after
                self._begin_stop(lease, SuspendReason.LEASE_EXPIRED, grace, propagate=False)

    async def _keepalive_loop(self) -> None:
        """A line to every lease's watchdog, several times per half TTL: silent that long (this agent
        stopped or hung), the watchdogs stop the jobs (:mod:`services.worker.watchdog`)."""
        period = keepalive_period(self.cfg.lease_ttl_s, self.cfg.heartbeat_s)
        while True:
            for lease in self.table:
                if lease.watchdog is not None:
                    lease.watchdog.keepalive()
            await asyncio.sleep(period)

    async def _on_reregister(self, ask: NodeReregister) -> None:
        """The leader's store does not know this node or incarnation (issue 18): register again.

        Fenced as commands are (an ask from a deposed leader's older epoch is ignored), but the fence
        does not move: an ask changes nothing here, and a forged huge epoch must not fence out the
        real leader. At most once per ``_REREGISTER_MIN_INTERVAL_S``."""
        if ask.node_id != self.node_id or self.draining:
            return
        if not self.table.fence.allows(ask.epoch):
            self.counters["stale_epoch"] += 1
            return
        now = time.monotonic()
        if now - self._reregistered_at < _REREGISTER_MIN_INTERVAL_S:
            return
        self._reregistered_at = now
        self.counters["reregistered"] += 1
        log.warning("the scheduler (epoch %d) does not know this node (%s): registering again", ask.epoch,
                    ask.reason.value)  # fmt: skip
        await self.bus.publish(NODE_REGISTER, self._register())

    async def _on_reconnected(self) -> None:
        self.last_contact = time.monotonic()
        await self.bus.publish(NODE_REGISTER, self._register())
        await self._heartbeat()

    # --- metrics ---------------------------------------------------------------------------------------
    async def _metrics_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.metrics_s)
            for lease in self.table:
                # Before the connection check: the fact waits in the outbox while we are cut off.
                self._report_checkpoint(lease)
            if not self.bus.nc.is_connected:
                continue
            for lease in self.table:
                self._publish_metrics(lease)
            busy = {gpu for lease in self.table for gpu in lease.grant.gpus}
            with contextlib.suppress(nats.errors.Error, BusError, ValueError):
                sample = NodeMetrics(node_id=self.node_id, gpus=self.inventory.sample(busy),
                                     interval_s=self.cfg.metrics_s)
                self.last_sample = sample
                await self.bus.publish(node_metrics(self.node_id), sample)

    def _report_checkpoint(self, lease: Lease) -> None:
        """``job.checkpointed`` once per new complete checkpoint of rank 0 while the job runs.

        Why: the scheduler learns a checkpoint otherwise only from the fact that ends the run; a run
        that is lost instead (its node goes silent, this agent dies) would resume from an older
        checkpoint, its progress since counted as lost. The checkpoint written at a stop is left to
        ``job.suspended`` (the lease is stopping, or rank 0 no longer running, by then); one written
        just before a stop may go both ways, which the scheduler's newer-only rule makes harmless.
        Sampled every ``metrics_s`` like the metrics: a checkpoint replaced within one period is
        reported only as the newer one, which is all a resume needs.
        """
        if (not lease.is_coordinator or lease.stopping or lease.reported or lease.silent or lease.killed
                or not lease.ranks or lease.checkpoint_dir is None):  # fmt: skip
            return
        channel = lease.ranks[0].channel
        if channel.closed:
            return
        iteration = channel.checkpoint_iteration  # read before the status: a stop sets it first
        if iteration is None or channel.status is not ClientStatus.RUNNING:
            return
        grant = lease.grant
        # The checkpoint the run resumed from is already the scheduler's (the client reports it as
        # restored); only a newer one is news. As in _last_checkpoint, rank 0 writes its own
        # checkpoints to <checkpoint dir>/checkpoint.pt.
        floor = self._checkpoints_seen.get(lease.lease_id, grant.resume_iteration)
        if floor is not None and iteration <= floor:
            return
        path = self._own_checkpoint(lease)
        if path is None:
            # The job's checkpoint.pt is not a file inside its own directory (a symlink out, say):
            # never reported, so never resumed from; say so, or nobody learns why it restarts at 0.
            self.counters["checkpoint_refused"] += 1
            log.warning("lease %s: checkpoint of iteration %d is not a file inside the job's checkpoint "
                        "directory; not reported", lease.lease_id, iteration,
                        extra={"job_id": lease.job_id})  # fmt: skip
            return
        self._checkpoints_seen[lease.lease_id] = iteration
        self.counters["checkpointed"] += 1
        if lease.record is not None:
            # On disk first: should this agent die before the fact is out, the next one reports it.
            lease.record = lease.record.with_checkpoint(path, iteration)
            try:
                lease.record.write(self.work_dir / "leases" / lease.lease_id)
            except OSError as exc:
                log.warning("lease %s: cannot record its checkpoint on disk: %s", lease.lease_id, exc)
        self._emit(JobCheckpointed(
            job_id=grant.job_id, lease_id=grant.lease_id, node_id=self.node_id, epoch=grant.epoch,
            checkpoint_path=path, iteration=iteration,
        ))  # fmt: skip

    def _publish_metrics(self, lease: Lease) -> None:
        """Publish rank 0's latest numbers (coordinator only) when they changed since the last time."""
        if not lease.is_coordinator or self._bus is None or not self._bus.nc.is_connected:
            return
        if lease.emulated is not None:
            run = lease.emulated
            emulated = JobMetrics(job_id=lease.job_id, lease_id=lease.lease_id, rank=0, iteration=run.iteration(),
                                  iteration_time_s=run.iteration_s)
            self._spawn(self._publish_quietly(job_metrics(lease.job_id), emulated), f"metrics-{lease.lease_id}")
            return
        if not lease.ranks:
            return
        channel = lease.ranks[0].channel
        if channel.closed:
            return
        key = (channel.seq, channel.iteration)
        if self._metrics_seen.get(lease.lease_id) == key:
            return
        self._metrics_seen[lease.lease_id] = key
        iteration_time = channel.iteration_time_s
        samples = channel.samples_per_iteration
        event = JobMetrics(
            job_id=lease.job_id, lease_id=lease.lease_id, rank=0, iteration=channel.iteration,
            loss=channel.loss if channel.loss is not None and abs(channel.loss) <= 1e30 else None,
            iteration_time_s=iteration_time if iteration_time is not None and iteration_time <= 1e6 else None,
            throughput=samples / iteration_time if samples and iteration_time else None,
            batch_size=samples,
            grad_noise_scale=_noise_scale(channel.grad_noise_scale),
        )  # fmt: skip
        self._spawn(self._publish_quietly(job_metrics(lease.job_id), event), f"metrics-{lease.lease_id}")

    async def _publish_quietly(self, subject: str, event: Event) -> None:
        with contextlib.suppress(nats.errors.Error, BusError):
            await self.bus.publish(subject, event)


def _noise_scale(value: float | None) -> float | None:
    """A client's gradient noise scale within ``JobMetrics``' bounds (a wild value is dropped, not
    published: the event would be refused)."""
    return value if value is not None and 0 <= value <= 1e12 else None
