"""One job in the scheduler's book (``book.py``): its state, the version the book last wrote, its
checkpoint and the lease it holds, and what the book keeps about its runs in memory only."""

from __future__ import annotations

from dataclasses import dataclass

from services.core.state import JobState
from services.scheduler.leases import Lease


@dataclass(slots=True)
class JobEntry:
    """One unfinished job (or a finished one whose lease is still being revoked)."""

    state: JobState
    version: int
    checkpoint_path: str | None = None
    checkpoint_iteration: int | None = None
    """The iteration the checkpoint at ``checkpoint_path`` holds; None without a checkpoint, or when
    nobody reported it (see ``JobBook.resume_iteration``)."""
    lease: Lease | None = None
    service0: float = 0.0
    """Attained service when the current lease started."""
    executed0: float = 0.0
    reason: str | None = None
    """Why it was held, rejected, cancelled or failed (for ``roundhouse jobs``): a held job's in
    memory only, a final status's stored with it (``jobs.reason``)."""
    exit_code: int | None = None
    """A failed job's exit code (stored)."""
    signal: int | None = None
    """The signal that killed a failed job (stored)."""
    requeued_since: float | None = None
    """``queued_since`` before the current lease, to restore if its grant fails."""
    released_lease_id: str | None = None
    """The job's lease released last (memory only): a ``job.checkpointed`` of that run that lands
    after the release still counts (see ``JobBook.checkpointed``)."""
    released_lost: bool = False
    """Whether the run released last was released with no checkpoint reported (lost with its node or
    agent): only such a run may still report a newer checkpoint once another run was granted."""
