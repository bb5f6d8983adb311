"""The worker's lease table: which leases it holds, on which GPUs, and epoch fencing.

Optimistic leases (Blox §7): a grant holds until revoked; nothing here expires on a timer. The
table only answers "may I accept this command?" and remembers recent leases so a retried grant or
revoke (the scheduler retries with the same ``lease_id`` until acked) is a no-op, acked again with
``duplicate=True``. It does no I/O; the service drives it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from schemas.jobs import SuspendReason
from schemas.leases import LeaseAckError, LeaseGrant
from schemas.nodes import HeldLease, LeaseState
from services.core.packing import MAX_JOBS_PER_GPU

if TYPE_CHECKING:
    from services.worker.emulator import EmulatedRun
    from services.worker.launcher import RankProcess
    from services.worker.records import LeaseRecord
    from services.worker.watchdog import Watchdog

__all__ = ["EpochFence", "Lease", "LeaseTable"]

RECENT_LEASES = 4096
"""Ended lease ids remembered for duplicate detection (far more than a node ends in a retry window)."""


class EpochFence:
    """The highest fencing epoch accepted; commands from an older epoch (a deposed leader) are refused.

    Checking a command and remembering its epoch are two steps on purpose: the fence moves only once
    the command is accepted (a grant taken, a revoke of a lease held). Were it moved on arrival, one
    refused command with a huge epoch (an unknown lease, a busy GPU) would fence out the real leader
    for good, since nothing ever lowers the fence (issue 13, attack 9).
    """

    def __init__(self, seen: int = 0) -> None:
        self.seen = seen

    def allows(self, epoch: int) -> bool:
        """Whether a command of ``epoch`` may proceed (it is not older than one already accepted)."""
        return epoch >= self.seen

    def advance(self, epoch: int) -> bool:
        """Remember the epoch of an accepted command; True when the fence moved."""
        if epoch <= self.seen:
            return False
        self.seen = epoch
        return True


@dataclass(eq=False)
class Lease:
    """One lease this node holds, from grant to the end of its processes."""

    grant: LeaseGrant
    received_at: float = field(default_factory=time.monotonic)
    state: LeaseState = LeaseState.STARTING
    ranks: list[RankProcess] = field(default_factory=list)
    stop_reason: SuspendReason | None = None
    stop_requested_at: float | None = None
    deadline: float | None = None
    """Monotonic time at which the grace period ends (set by a revoke or a stop)."""
    stop_at: int | None = None
    killed: bool = False
    """The agent signalled the processes (grace expired, or a peer failed)."""
    silent: bool = False
    """Report nothing more (another node already reported the job's end)."""
    reported: bool = False
    """The job-wide fact (suspended/completed/failed) was queued for publishing."""
    ending: bool = False
    """Revoked for good (cancel, terminate): the job will not run again, so a process still starting
    has nothing for a boundary to save."""
    revoke_epoch: int | None = None
    """Epoch of the revoke being executed (carried on to the other nodes' ``LeaseStopAt``)."""
    propagate: bool = False
    """This node coordinates a multi-node stop (sends ``stop_at`` to the other nodes)."""
    failure: tuple[RankProcess, int] | None = None
    """The first process that exited non-zero on its own, and its return code."""
    checkpoint_dir: Path | None = None
    kill_after_s: float | None = None
    """SIGTERM-to-SIGKILL gap for this lease (None: the worker's ``kill_after_s``)."""
    emulated: EmulatedRun | None = None
    watchdog: Watchdog | None = None
    """Stops the processes should this agent die or go silent (released once they have all exited)."""
    record: LeaseRecord | None = None
    """What is on disk about the lease for a next agent (``<lease dir>/lease.json``)."""
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every process of the lease has exited."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the lease is out of the table and its GPUs are free."""

    @property
    def lease_id(self) -> str:
        return self.grant.lease_id

    @property
    def job_id(self) -> str:
        return self.grant.job_id

    @property
    def is_coordinator(self) -> bool:
        return self.grant.is_coordinator

    @property
    def multi_node(self) -> bool:
        return self.grant.world is not None and self.grant.world.num_nodes > 1

    @property
    def stopping(self) -> bool:
        return self.state is LeaseState.STOPPING

    def iteration(self) -> int | None:
        """The furthest iteration any local rank reported (None before the processes exist)."""
        if self.emulated is not None:
            return self.emulated.iteration()
        values = [r.channel.iteration for r in self.ranks if not r.channel.closed]
        return max(values) if values else None

    def held(self) -> HeldLease:
        return HeldLease(
            lease_id=self.lease_id, job_id=self.job_id, epoch=self.grant.epoch,
            gpus=list(self.grant.gpus), state=self.state, iteration=self.iteration(),
        )  # fmt: skip


class LeaseTable:
    """Leases held now, GPUs they hold, recently ended leases, and the epoch fence."""

    def __init__(self, gpu_indices: list[int], epoch_seen: int = 0) -> None:
        self.gpus = frozenset(gpu_indices)
        self.fence = EpochFence(epoch_seen)
        self._leases: dict[str, Lease] = {}
        self._gpu_owners: dict[int, list[str]] = {}
        """Leases on each GPU: one, or several when every one of them is shared (packing)."""
        self._ended: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._leases)

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._leases.values()))

    def get(self, lease_id: str) -> Lease | None:
        return self._leases.get(lease_id)

    def ended_recently(self, lease_id: str) -> bool:
        return lease_id in self._ended

    def check_grant(self, grant: LeaseGrant) -> tuple[LeaseAckError | None, list[Lease]]:
        """Why ``grant`` must be refused (None: it may be accepted), and the stopping leases it must wait for.

        A GPU held by a lease that is already stopping does not refuse the grant: the new lease waits
        for the old processes to exit (the scheduler moved on once the old lease reported). A GPU held
        by running leases refuses it (``gpu_busy``) unless the grant and every one of them are marked
        ``shared`` (packing: the scheduler said so explicitly for each; an ordinary or forged grant
        of a busy GPU is still refused), none of them runs the grant's own job (a job packed beside
        itself is a double run), and the GPU would then hold at most ``MAX_JOBS_PER_GPU`` running
        leases (a scheduler bug must not pile leases onto one GPU).
        """
        missing = [g for g in grant.gpus if g not in self.gpus]
        if missing:
            return LeaseAckError.NO_SUCH_GPU, []
        waits: list[Lease] = []
        for gpu in grant.gpus:
            beside = 0
            for owner_id in self._gpu_owners.get(gpu, ()):
                owner = self._leases[owner_id]
                if not owner.stopping:
                    if grant.shared and owner.grant.shared and owner.job_id != grant.job_id:
                        beside += 1  # packed beside it: nothing to wait for
                        continue
                    return LeaseAckError.GPU_BUSY, []
                if owner not in waits:
                    waits.append(owner)
            if beside >= MAX_JOBS_PER_GPU:
                return LeaseAckError.GPU_BUSY, []
        return None, waits

    def twins(self, grant: LeaseGrant) -> list[Lease]:
        """Other leases of ``grant``'s job held here. A running one refuses the grant (a second copy
        of a live run); a stopping one is waited for on whatever GPUs, so two copies never run at
        once (the old one may still be writing the checkpoint the new one is about to load)."""
        job_id, lease_id = grant.job_id, grant.lease_id
        return [lease for lease in self._leases.values() if lease.job_id == job_id and lease.lease_id != lease_id]

    def holders(self, gpus: Iterable[int]) -> str:
        """Who holds ``gpus`` now, for a refusal's message: ``GPU 1: lease L (job J, shared)``."""
        parts = []
        for gpu in gpus:
            for owner_id in self._gpu_owners.get(gpu, ()):
                owner = self._leases[owner_id]
                how = "stopping" if owner.stopping else ("shared" if owner.grant.shared else "exclusive")
                parts.append(f"GPU {gpu}: lease {owner_id} (job {owner.job_id}, {how})")
        return "; ".join(parts) or "none"

    def add(self, grant: LeaseGrant) -> Lease:
        lease = Lease(grant)
        self._leases[grant.lease_id] = lease
        for gpu in grant.gpus:
            self._gpu_owners.setdefault(gpu, []).append(grant.lease_id)
        return lease

    def remove(self, lease: Lease) -> None:
        """Forget a lease whose processes are gone: free its GPUs, remember its id."""
        if self._leases.get(lease.lease_id) is lease:
            del self._leases[lease.lease_id]
        for gpu in lease.grant.gpus:
            owners = self._gpu_owners.get(gpu)
            if owners is not None and lease.lease_id in owners:
                owners.remove(lease.lease_id)
                if not owners:
                    del self._gpu_owners[gpu]
        self._ended[lease.lease_id] = None
        while len(self._ended) > RECENT_LEASES:
            self._ended.popitem(last=False)
        lease.ended.set()

    def held(self) -> list[HeldLease]:
        return [lease.held() for lease in self._leases.values()]
