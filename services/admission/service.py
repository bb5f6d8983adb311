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
  nodes (``services.admission.inventory``). Both are rebuilt on start by replaying the stream
  (``services.runtime.replay``) and then followed; heartbeats (core NATS) keep nodes live.

Verdicts are published pipelined (``outbox.py``): an arrival is acked once its verdict is on the
wire, and the JetStream acks are confirmed behind. After a crash, replay finds every arrival without
a stored verdict and judges it again. Verdict event ids derive from the arrival's ``event_id``
(uuid5), so a verdict republished within JetStream's duplicate window is stored once, and a
redelivered arrival whose verdict is already in the ledger is not judged again.

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
from nats.aio.subscription import Subscription
from pydantic import Field, model_validator

from schemas.base import Event
from schemas.codec import MalformedMessageError
from schemas.fields import MAX_REASON_CHARS
from schemas.ids import is_token
from schemas.jobs import JobAccepted, JobArrived, JobCancel, JobCompleted, JobFailed, JobHeld, JobRejected
from schemas.nodes import NodeHeartbeat, NodeRegister
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
)
from services.admission.inventory import Inventory
from services.admission.ledger import Ledger
from services.admission.outbox import VerdictOutbox
from services.core.decisions import Admission
from services.core.protocols import AdmissionPolicy, accepts_all
from services.core.registry import ADMISSION
from services.core.state import ClusterState, JobState
from services.runtime.bus import Bus
from services.runtime.config import ServiceConfig
from services.runtime.consumer import ConsumerOptions, DurableConsumer
from services.runtime.replay import ReaderStats, StreamFollower, replay
from services.runtime.service import RoundhouseService

log = logging.getLogger("roundhouse.admission")

DURABLE = "admission"
REPLAY_SUBJECTS: tuple[str, ...] = (
    JOB_ARRIVED,
    JOB_ACCEPTED,
    JOB_HELD,
    JOB_REJECTED,
    JOB_COMPLETED,
    JOB_FAILED,
    JOB_CANCEL,
    NODE_REGISTER,
)
"""What the ledger and inventory are rebuilt from on start."""
FOLLOW_SUBJECTS: tuple[str, ...] = (JOB_COMPLETED, JOB_FAILED, JOB_CANCEL, NODE_REGISTER)
"""What changes them afterwards, besides this service's own verdicts and the durable arrivals."""

_VERDICT_IDS = uuid.UUID("6f1d4c2e-3b7a-4e55-9a0c-1d2e3f405a6b")
"""uuid5 namespace of verdict event ids."""
_VERDICT_PREFIX = _VERDICT_IDS.bytes


def verdict_event_id(arrival: uuid.UUID, verdict: str) -> uuid.UUID:
    """The event id of ``verdict`` (accepted/held/rejected) for the arrival ``arrival``.

    ``uuid.uuid5(_VERDICT_IDS, f"{arrival}:{verdict}")``, computed without ``uuid5``'s keyword
    handling and version checks (once per verdict, on admission's hot path); a test pins equality.
    """
    digest = hashlib.sha1(_VERDICT_PREFIX + f"{arrival}:{verdict}".encode(), usedforsecurity=False).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


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
        self.replay_stats = ReaderStats()
        self.counts: dict[str, int] = {
            "accepted": 0, "held": 0, "rejected": 0, "released": 0, "malformed_rejected": 0, "duplicates": 0,
        }  # fmt: skip
        self.ready = asyncio.Event()
        """Set once the ledger is rebuilt and arrivals are being consumed."""
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

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, bus: Bus) -> None:
        self._bus = bus
        self._outbox = VerdictOutbox(bus)
        await self._outbox.start()
        began = time.perf_counter()
        last = await replay(bus, REPLAY_SUBJECTS, self._replayed, stats=self.replay_stats)
        log.info(
            "admission ledger rebuilt from %d facts in %.0f ms: %d admitted, %d held, %d GPUs",
            self.replay_stats.handled, (time.perf_counter() - began) * 1000,
            len(self.ledger.admitted), len(self.ledger.held), self.inventory.total_gpus,
        )  # fmt: skip
        self._follower = StreamFollower(bus, FOLLOW_SUBJECTS, self._followed, start_seq=last + 1,
                                        name="admission-view")  # fmt: skip
        await self._follower.start()
        self._subs.append(await bus.subscribe(NODE_HEARTBEAT, NodeHeartbeat, self._on_heartbeat))
        # Arrivals stored without a verdict (a crash between the two) are judged now; the durable
        # consumer may deliver them again, which the ledger recognises as duplicates.
        if self.ledger.pending:
            await self._decide(list(self.ledger.pending.values()))
        self._consumer = await bus.consume(
            JOB_ARRIVED, JobArrived, self._on_arrived, durable=DURABLE,
            options=ConsumerOptions(batch=self.settings.batch, fetch_timeout_s=0.5),
            on_malformed=self._on_malformed,
        )  # fmt: skip
        self._tasks.append(asyncio.create_task(self._sweep(), name="admission-sweep"))
        self._tasks.append(asyncio.create_task(self._reoffer_loop(), name="admission-reoffer"))
        self.ready.set()

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
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
    async def _replayed(self, event: Event) -> None:
        ledger = self.ledger
        if isinstance(event, JobArrived):
            ledger.on_arrived(event)
        elif isinstance(event, JobAccepted):
            ledger.on_accepted(event.job_id, event.ts)
        elif isinstance(event, JobHeld):
            ledger.on_held(event.job_id)
        elif isinstance(event, JobRejected):
            ledger.on_rejected(event.job_id)
        else:
            await self._followed(event)

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
            await self._accept(job.job_id, event.event_id, was_held=False)
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
            arrival = ledger.arrival_ids.get(job_id)
            if arrival is not None:
                await self._accept(job_id, arrival, was_held=job_id in ledger.held)
        for job_id, reason in verdict.rejected.items():
            arrival = ledger.arrival_ids.get(job_id)
            if arrival is None:
                continue
            await outbox.send(JOB_REJECTED, JobRejected(
                event_id=verdict_event_id(arrival, "rejected"), job_id=job_id, reason=reason, policy=name,
            ))  # fmt: skip
            ledger.on_rejected(job_id)
            self.counts["rejected"] += 1
        for job_id in held:
            arrival = ledger.arrival_ids.get(job_id)
            if arrival is None or job_id not in ledger.pending:
                continue  # held before: stays held without a new event
            await outbox.send(JOB_HELD, JobHeld(
                event_id=verdict_event_id(arrival, "held"), job_id=job_id, policy=name, reason=self._held_reason(),
            ))  # fmt: skip
            ledger.on_held(job_id)
            self.counts["held"] += 1

    async def _accept(self, job_id: str, arrival: uuid.UUID, *, was_held: bool) -> None:
        assert self._outbox is not None
        # Built without re-validation: every field comes from a validated arrival or from here.
        accepted = JobAccepted.model_construct(
            event_id=verdict_event_id(arrival, "accepted"), ts=time.time(), schema_version=1, job_id=job_id,
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
            "replayed": self.replay_stats.handled,
        }
