"""The admission service: a verdict for every submitted job, and releases of held jobs.

* Consumes ``job.arrived`` on the durable consumer ``admission`` and offers each new job, behind the
  jobs already held (FIFO), to the admission policy (``--policy``, a name in
  ``services.core.registry.ADMISSION``, default ``accept-all``; options from ``policy_options``,
  e.g. ``{"factor": 1.5}`` for ``load-threshold``). It publishes ``job.accepted``, ``job.held``
  or ``job.rejected`` (with the policy's reason).
* Held jobs are offered again, in the order they were held, whenever capacity may have freed: an
  admitted job completed, failed or was cancelled, a node registered, or every
  ``reoffer_interval_s``. Only a change is published (``job.accepted`` / ``job.rejected`` for a
  released job); a job stays held silently.
* A malformed ``job.arrived`` whose raw JSON names a valid ``job_id`` gets ``job.rejected`` with
  the validation message (field and rule), so the submitter learns why; it is dead-lettered either
  way, and nothing else is disturbed (docs/control-plane.md, Durable consumers).
* The policy sees the admitted, unfinished jobs (``ledger.py``) and a ``ClusterState`` of the live
  nodes (``services.admission.inventory``); heartbeats (core NATS) keep nodes live. Operators'
  drains are asked of the scheduler leader every ``drain_refresh_s`` (``drains.py``: heartbeats
  carry only the agent's own ``draining``).

Start: from the store, not by replaying the stream (DESIGN, Trust and failure). Admission reads
the stream's last sequence ``P`` and asks the leading scheduler (``query.admission``, retried with
back-off until one leads) for what it stores: the unfinished jobs with their specs in submission
order, and the live nodes. The leader answers once it has applied every fact stored up to ``P``.
Admitted jobs become the ledger's demand; ``held`` jobs — held by a verdict, or arrived without one
(a crash between the two: the store cannot tell them apart) — are offered to the policy again, in
submission order, which is the order they were held in, and each gets its verdict again. Then
admission follows only what comes after ``P``: completions, failures, cancels and registrations
from ``P + 1`` (``StreamFollower``), and arrivals on its durable consumer (created, if it does not
exist, to start at ``P + 1`` too; arrivals it delivers that the reply already held are recognised as
duplicates). With all NATS data lost and the store kept, the same steps resume the held queue.

Every arrival gets exactly one verdict: an arrival is acked once its verdict is on the wire, and the
JetStream acks are confirmed behind (``outbox.py``); an arrival whose verdict was lost in a crash is
``held`` in the store without one, so the next start judges it. Verdict event ids derive from the
judged arrival's job id (``uuid5(job id, verdict)``; one arrival per job id is judged — a later one
is a duplicate), not from its event id, which the store does not keep: a verdict given again after
a restart is the same event (stored once within JetStream's duplicate window, applied once by
consumers that key on event ids), and a redelivered arrival whose job is in the ledger is not judged
again. A held job therefore sees its ``job.held`` again after a restart, with the same event id.

One admission instance should be active per namespace: replicas would share the durable consumer
and so see only part of the arrivals each.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import nats.errors
import nats.js.errors
from nats.aio.subscription import Subscription
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import Field, model_validator

from schemas.base import Event
from schemas.codec import MalformedMessageError
from schemas.control import AdmissionJob, AdmissionNode, AdmissionQuery, AdmissionReply
from schemas.fields import MAX_REASON_CHARS
from schemas.ids import is_token
from schemas.jobs import JobAccepted, JobArrived, JobCancel, JobCompleted, JobFailed, JobHeld, JobRejected
from schemas.nodes import GpuInventory, NodeHeartbeat, NodeRegister
from schemas.subjects import (
    JOB_ACCEPTED,
    JOB_ARRIVED,
    JOB_CANCEL,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_HELD,
    JOB_REJECTED,
    NODE_HEARTBEAT,
    NODE_REGISTER,
    QUERY_ADMISSION,
)
from services.admission.drains import DrainRefresher
from services.admission.inventory import Inventory
from services.admission.ledger import Ledger
from services.admission.outbox import VerdictOutbox
from services.core.decisions import Admission
from services.core.protocols import AdmissionPolicy, accepts_all
from services.core.registry import ADMISSION
from services.core.state import ClusterState, JobState
from services.runtime.bus import Bus, BusError
from services.runtime.config import ServiceConfig
from services.runtime.consumer import ConsumerOptions, DurableConsumer
from services.runtime.replay import StreamFollower
from services.runtime.service import RoundhouseService

log = logging.getLogger("roundhouse.admission")

DURABLE = "admission"
FOLLOW_SUBJECTS: tuple[str, ...] = (JOB_COMPLETED, JOB_FAILED, JOB_CANCEL, NODE_REGISTER)
"""What changes the ledger and inventory after the start, besides this service's own verdicts and
the durable arrivals (followed from the stream's end at the start, never from sequence 1)."""

_VERDICT_IDS = uuid.UUID("6f1d4c2e-3b7a-4e55-9a0c-1d2e3f405a6b")
"""uuid5 namespace of verdict event ids."""
_VERDICT_PREFIX = _VERDICT_IDS.bytes


def verdict_event_id(job_id: str, verdict: str) -> uuid.UUID:
    """The event id of ``verdict`` (accepted/held/rejected) for the judged arrival of ``job_id``.

    ``uuid.uuid5(_VERDICT_IDS, f"{job_id}:{verdict}")``, computed without ``uuid5``'s keyword
    handling and version checks (once per verdict, on admission's hot path); a test pins equality.
    """
    digest = hashlib.sha1(_VERDICT_PREFIX + f"{job_id}:{verdict}".encode(), usedforsecurity=False).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


def node_register(node: AdmissionNode) -> NodeRegister:
    """A registration standing in for ``node`` as the scheduler stores it (inventory: GPU indices
    and type; NVML uuids and memory are not stored, and no admission policy reads them)."""
    gpus = [
        GpuInventory(index=i, uuid=f"{node.node_id}-gpu-{i}", name=node.gpu_type, memory_mib=1) for i in node.gpus
    ]
    return NodeRegister(
        node_id=node.node_id, incarnation=node.incarnation, hostname=node.hostname, cpus=node.cpus,
        memory_gb=node.memory_gb, gpus=gpus,
    )  # fmt: skip


def malformed_reason(error: MalformedMessageError) -> str:
    """A rejection reason naming every broken field and rule (what ``roundhouse submit`` shows)."""
    rules = "; ".join(str(e) for e in error.errors)
    reason = f"job spec refused: {rules}"
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 3] + "..."


def job_id_of(raw: bytes) -> str | None:
    """The ``job_id`` a raw payload names, if it is JSON and the id is a valid token."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    job_id = data.get("job_id") if isinstance(data, dict) else None
    return job_id if isinstance(job_id, str) and is_token(job_id) else None


class AdmissionConfig(ServiceConfig):
    """Settings of the admission service (``roundhouse service admission --policy load-threshold``)."""

    policy: str = Field(default="accept-all", description="Admission policy (a name in ADMISSION).")
    lease_ttl_s: float = Field(
        default=30.0, gt=0, le=86_400, description="A node silent this long no longer counts (as the scheduler's)."
    )
    sweep_interval_s: float = Field(default=1.0, gt=0, le=3600, description="How often node liveness is checked.")
    reoffer_interval_s: float = Field(
        default=5.0, gt=0, le=86_400, description="Held jobs are offered again at least this often."
    )
    batch: int = Field(default=512, ge=1, le=65_536, description="Arrivals fetched per pull.")
    start_timeout_s: float = Field(
        default=5.0, gt=0, le=600, description="Time-out of each query.admission request at the start."
    )
    start_retry_max_s: float = Field(
        default=5.0, gt=0, le=600, description="Longest pause between start queries while no scheduler leads."
    )
    start_page: int = Field(default=1000, ge=1, le=10_000, description="Jobs asked for per query.admission page.")
    drain_refresh_s: float = Field(
        default=10.0, gt=0, le=86_400,
        description="How often the operators' node drains are asked of the scheduler leader (query.nodes).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _policy_builds(self) -> AdmissionConfig:
        # Fail at configuration time, with the valid names, rather than in the service's start.
        ADMISSION.check(self.policy, self.policy_options, label="policy_options")
        return self


class AdmissionService(RoundhouseService):
    """Runs the admission policy on arrivals and held jobs; publishes the verdicts."""

    kind: ClassVar[str] = "admission"
    description: ClassVar[str] = "Roundhouse admission: accepts, holds or rejects submitted jobs"
    config_model: ClassVar[type[ServiceConfig]] = AdmissionConfig

    def __init__(self, config: ServiceConfig) -> None:
        super().__init__(config)
        if not isinstance(config, AdmissionConfig):
            raise TypeError(f"AdmissionService needs an AdmissionConfig, not {type(config).__name__}")
        self.settings = config
        self.policy: AdmissionPolicy = ADMISSION.create(config.policy, **config.policy_options)
        self._accepts_all = accepts_all(self.policy)
        self.ledger = Ledger()
        self.inventory = Inventory(lease_ttl_s=config.lease_ttl_s)
        self.start_stats: dict[str, float] = {}
        """How the last start went: attempts, pages, jobs, held, admitted, nodes, through_seq, seconds."""
        self.counts: dict[str, int] = {
            "accepted": 0, "held": 0, "rejected": 0, "released": 0, "malformed_rejected": 0, "duplicates": 0,
        }  # fmt: skip
        self.ready = asyncio.Event()
        """Set once the ledger is loaded from the store, its held jobs judged, and arrivals are consumed."""
        self._bus: Bus | None = None
        self._lock = asyncio.Lock()
        self._cluster: ClusterState | None = None
        self._cluster_version = -1
        self._reoffer = asyncio.Event()
        self._outbox: VerdictOutbox | None = None
        self._consumer: DurableConsumer[JobArrived] | None = None
        self._follower: StreamFollower | None = None
        self._subs: list[Subscription] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False
        self.drains: DrainRefresher | None = None
        """Keeps the operators' drains current once started (``drains.py``)."""

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, bus: Bus) -> None:
        """Start the outbox and the heartbeat subscription, and the start-up from the store in the
        background (it waits for a leading scheduler); ``ready`` is set once arrivals are consumed."""
        self._bus = bus
        self._outbox = VerdictOutbox(bus)
        await self._outbox.start()
        self._subs.append(await bus.subscribe(NODE_HEARTBEAT, NodeHeartbeat, self._on_heartbeat))
        self._tasks.append(asyncio.create_task(self._start_from_store(bus), name="admission-start"))

    async def _start_from_store(self, bus: Bus) -> None:
        """Start (``_start_once``) until it succeeds: a step that fails on the bus after the reply
        (the broker went away) undoes the start and begins again with a fresh query."""
        delay = 0.5
        while True:
            try:
                await self._start_once(bus)
                return
            except Exception:
                log.exception("admission's start failed; starting again from the store in %.1f s", delay)
            await self._undo_start()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.start_retry_max_s)

    async def _undo_start(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None
        if self._outbox is not None:
            # Verdicts given so far must be stored before the next query asks what the store holds.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._outbox.flush(), self.settings.start_timeout_s)

    async def _start_once(self, bus: Bus) -> None:
        began = time.perf_counter()
        through = await self._recover(bus)
        self._follower = StreamFollower(bus, FOLLOW_SUBJECTS, self._followed, start_seq=through + 1,
                                        name="admission-view")  # fmt: skip
        await self._follower.start()
        # Held in the store: held by a verdict, or arrived without one (a crash between the two).
        # Both are offered again, in submission order; the durable consumer may deliver some of them
        # again, which the ledger recognises as duplicates.
        if self.ledger.pending:
            await self._decide(list(self.ledger.pending.values()))
        options = ConsumerOptions(batch=self.settings.batch, fetch_timeout_s=0.5)
        await self._provision_durable(bus, options, start_seq=through + 1)
        self._consumer = await bus.consume(
            JOB_ARRIVED, JobArrived, self._on_arrived, durable=DURABLE, options=options,
            on_malformed=self._on_malformed,
        )  # fmt: skip
        self._tasks.append(asyncio.create_task(self._sweep(), name="admission-sweep"))
        self._tasks.append(asyncio.create_task(self._reoffer_loop(), name="admission-reoffer"))
        if self.drains is None:  # once: a start again (after a failed one) keeps the running loop
            self.drains = DrainRefresher(
                bus, lambda: self.inventory, interval_s=self.settings.drain_refresh_s,
                timeout_s=self.settings.start_timeout_s, on_change=self._on_drains_changed,
            )  # fmt: skip
            self._tasks.append(asyncio.create_task(self.drains.run(), name="admission-drains"))
        self.start_stats["seconds"] = time.perf_counter() - began
        log.info(
            "admission started from the store in %.0f ms (stream sequence %d): %d admitted, %d held, %d GPUs",
            self.start_stats["seconds"] * 1000, through, len(self.ledger.admitted), len(self.ledger.held),
            self.inventory.total_gpus,
        )  # fmt: skip
        self.ready.set()

    async def _recover(self, bus: Bus) -> int:
        """Load the ledger and the inventory from the leading scheduler (asked until one answers);
        returns the stream sequence the answer reflects every fact up to."""
        delay = 0.1
        attempts = 0
        while True:
            attempts += 1
            try:
                info = await bus.js.stream_info(bus.stream_name)
                through = int(info.state.last_seq or 0)
                jobs, nodes, pages = await self._ask(bus, through)
                break
            except (BusError, MalformedMessageError, nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
                level = logging.WARNING if attempts in (1, 10) or attempts % 100 == 0 else logging.DEBUG
                log.log(level, "admission waits for a leading scheduler to start from (attempt %d): %s",
                        attempts, exc)  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.start_retry_max_s)
        self.ledger.recover(jobs)
        self.inventory = Inventory(lease_ttl_s=self.settings.lease_ttl_s)
        self._cluster = None
        now = time.monotonic()
        for node in nodes:
            self.inventory.on_register(node_register(node), now, draining=node.draining)
        self.start_stats = {
            "attempts": attempts, "pages": pages, "jobs": len(jobs), "held": len(self.ledger.pending),
            "admitted": len(self.ledger.admitted), "nodes": len(nodes), "through_seq": through,
        }  # fmt: skip
        return through

    async def _ask(self, bus: Bus, through: int) -> tuple[list[AdmissionJob], list[AdmissionNode], int]:
        """Every page of ``query.admission`` for ``through``: (jobs in submission order, nodes, pages)."""
        jobs: list[AdmissionJob] = []
        nodes: list[AdmissionNode] = []
        after: int | None = None
        pages = 0
        while True:
            query = AdmissionQuery(through_seq=through, after_seq=after, limit=self.settings.start_page)
            reply = await bus.request(QUERY_ADMISSION, query, AdmissionReply, timeout_s=self.settings.start_timeout_s)
            pages += 1
            if after is None:
                nodes = list(reply.nodes)
            jobs.extend(reply.jobs)
            if not reply.truncated or not reply.jobs:
                return jobs, nodes, pages
            after = reply.jobs[-1].seq

    async def _provision_durable(self, bus: Bus, options: ConsumerOptions, *, start_seq: int) -> None:
        """Create the durable arrivals consumer, if it does not exist, to start at ``start_seq``: an
        arrival stored before it is in the store already (held, judged at the start). An existing one
        resumes where it acked."""
        name = bus.name(DURABLE)
        try:
            await bus.js.consumer_info(bus.stream_name, name)
            return
        except nats.js.errors.NotFoundError:
            pass
        config = ConsumerConfig(
            durable_name=name, name=name, ack_policy=AckPolicy.EXPLICIT, ack_wait=options.ack_wait_s,
            max_deliver=options.max_deliver, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=max(1, start_seq), filter_subject=bus.wire(JOB_ARRIVED),
        )  # fmt: skip
        try:
            await bus.js.add_consumer(bus.stream_name, config)
        except nats.js.errors.BadRequestError as exc:
            log.info("admission's durable consumer exists already (%s)", exc)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._tasks:  # the start first: it may still be waiting for a scheduler
            starting = self._tasks[0]
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
        if self._consumer is not None:
            await self._consumer.stop()
        if self._outbox is not None:
            await self._outbox.stop(self.settings.drain_timeout_s / 2)
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sub in self._subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        if self._follower is not None:
            await self._follower.stop()

    # --- facts ------------------------------------------------------------------------------
    async def _followed(self, event: Event) -> None:
        if isinstance(event, (JobCompleted, JobFailed, JobCancel)):
            if self.ledger.on_finished(event.job_id) and self.ledger.held:
                self._reoffer.set()
        elif isinstance(event, NodeRegister):
            self.inventory.on_register(event, time.monotonic())
            if self.ledger.held:
                self._reoffer.set()

    async def _on_heartbeat(self, event: NodeHeartbeat) -> None:
        if self.inventory.on_heartbeat(event, time.monotonic()) and self.ledger.held:
            self._reoffer.set()

    def _on_drains_changed(self, nodes: list[str]) -> None:
        if self.ledger.held:
            self._reoffer.set()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            died = self.inventory.sweep(time.monotonic())
            if died:
                log.warning("nodes silent for over %.0f s no longer count: %s", self.settings.lease_ttl_s,
                            ", ".join(died))  # fmt: skip

    async def _reoffer_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reoffer.wait(), self.settings.reoffer_interval_s)
            self._reoffer.clear()
            if self.ledger.held:
                try:
                    await self._decide([])
                except Exception:
                    log.exception("re-offering held jobs failed; trying again later")

    # --- verdicts ---------------------------------------------------------------------------
    async def _on_arrived(self, event: JobArrived) -> None:
        job = self.ledger.on_arrived(event)
        if job is None:
            self.counts["duplicates"] += 1
            log.info("job %s arrived again; it already has a verdict", event.job_id)
            return
        if self._accepts_all and not self.ledger.held:
            # Fast path (protocols: accepts_all): no policy call, no offered list, no lock needed.
            await self._accept(job.job_id, was_held=False)
            return
        await self._decide([job])

    async def _on_malformed(self, raw: bytes, error: MalformedMessageError) -> None:
        job_id = job_id_of(raw)
        if job_id is None or self.ledger.knows(job_id):
            return  # nobody to tell, or a broken copy of a job that already arrived intact
        assert self._outbox is not None
        await self._outbox.send(JOB_REJECTED, JobRejected(job_id=job_id, reason=malformed_reason(error)))
        self.counts["malformed_rejected"] += 1

    def cluster(self) -> ClusterState:
        """The live nodes as a ``ClusterState`` (rebuilt only when the inventory changed)."""
        if self._cluster is None or self._cluster_version != self.inventory.version:
            self._cluster, _ = self.inventory.build_cluster()
            self._cluster_version = self.inventory.version
        return self._cluster

    async def _decide(self, new: Sequence[JobState]) -> None:
        """Offer the held jobs, then ``new`` (pending in the ledger), and publish the verdicts."""
        async with self._lock:
            ledger = self.ledger
            new = [job for job in new if job.job_id in ledger.pending]
            offered = [*ledger.held.values(), *new]
            if not offered:
                return
            if self._accepts_all:
                verdict = Admission(accepted=tuple(job.job_id for job in offered))
            else:
                verdict = self.policy.admit(offered, ledger.admitted, self.cluster(), time.time())
            answered = {*verdict.accepted, *verdict.held, *verdict.rejected}
            unanswered = [job.job_id for job in offered if job.job_id not in answered]
            if unanswered:
                log.error("admission policy %r gave no verdict for %s; holding them", self.policy.name,
                          unanswered[:5])  # fmt: skip
            await self._publish(verdict, [*verdict.held, *unanswered])

    async def _publish(self, verdict: Admission, held: list[str]) -> None:
        outbox, ledger, name = self._outbox, self.ledger, self.policy.name
        assert outbox is not None
        for job_id in verdict.accepted:
            if job_id in ledger.pending or job_id in ledger.held:
                await self._accept(job_id, was_held=job_id in ledger.held)
        for job_id, reason in verdict.rejected.items():
            if job_id not in ledger.pending and job_id not in ledger.held:
                continue
            await outbox.send(JOB_REJECTED, JobRejected(
                event_id=verdict_event_id(job_id, "rejected"), job_id=job_id, reason=reason, policy=name,
            ))  # fmt: skip
            ledger.on_rejected(job_id)
            self.counts["rejected"] += 1
        held_reason: str | None = None  # one per call: admitted demand does not change while jobs are held
        for job_id in held:
            if job_id not in ledger.pending:
                continue  # held before: stays held without a new event
            held_reason = held_reason or self._held_reason()
            await outbox.send(JOB_HELD, JobHeld(
                event_id=verdict_event_id(job_id, "held"), job_id=job_id, policy=name, reason=held_reason,
            ))  # fmt: skip
            ledger.on_held(job_id)
            self.counts["held"] += 1

    async def _accept(self, job_id: str, *, was_held: bool) -> None:
        assert self._outbox is not None
        # Built without re-validation: every field comes from a validated arrival or from here.
        accepted = JobAccepted.model_construct(
            event_id=verdict_event_id(job_id, "accepted"), ts=time.time(), schema_version=1, job_id=job_id,
            reason="released: capacity freed" if was_held else None, policy=self.policy.name,
        )  # fmt: skip
        await self._outbox.send(JOB_ACCEPTED, accepted)
        self.ledger.on_accepted(job_id, accepted.ts)
        self.counts["accepted"] += 1
        self.counts["released"] += was_held

    def _held_reason(self) -> str:
        return (
            f"held by admission policy {self.policy.name!r} while {len(self.ledger.admitted)} admitted jobs "
            f"request {self.ledger.admitted_gpus} GPUs of the cluster's {self.inventory.total_gpus}; "
            "held jobs are offered again, in submission order, as jobs finish or nodes join"
        )

    def stats(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name,
            **self.counts,
            "admitted_now": len(self.ledger.admitted),
            "held_now": len(self.ledger.held),
            "gpus": self.inventory.total_gpus,
            "started_from_store": dict(self.start_stats),
        }
