"""What a starting agent does about its predecessor's leases, before it registers.

The leases of an agent that died without draining ended with its incarnation, but their processes
may still run (their watchdogs are stopping them) and their newest checkpoints may be known only on
disk. Before the new agent registers (after which the scheduler releases the old leases and may
grant the GPUs and the jobs again), :func:`recover`:

1. finds every live process started under ``<work_dir>/leases`` (by the channel in its environment:
   a pid reused by another program is left alone) and stops each lease's processes as its watchdog
   would (:func:`services.worker.orphans.stop_orphaned`: ``orphaned`` on the channels, the job's grace
   period, SIGTERM, SIGKILL), waiting until none is left;
2. reads each lease's record (:mod:`services.worker.records`) and finds its newest complete
   checkpoint, to be reported as ``job.checkpointed`` with that lease's id.

Blocking (it waits for processes): the service runs it in a thread.
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from schemas.ids import TOKEN_PATTERN
from services.worker.orphans import StopOutcome, budget, leftovers, stop_orphaned
from services.worker.records import RECORD_NAME, LeaseRecord, RecordError, newest_checkpoint

__all__ = ["Recovered", "recover"]

log = logging.getLogger("roundhouse.worker")

_MAX_PARALLEL = 16
_ID = re.compile(TOKEN_PATTERN)


@dataclass(frozen=True, slots=True)
class Recovered:
    """One lease of a previous agent: what was left running of it, and what to report."""

    lease_dir: Path
    record: LeaseRecord | None
    """None: no (usable) record, nothing to report."""
    left_running: tuple[int, ...] = ()
    """Pids of its processes found running (stopped since)."""
    stopped: StopOutcome | None = None
    checkpoint: tuple[Path, int] | None = None
    """The newest complete checkpoint newer than the one the lease resumed from (path, iteration)."""


def recover(
    leases_dir: Path, *, checkpoint_root: Path, lease_ttl_s: float, heartbeat_s: float, kill_after_s: float
) -> list[Recovered]:
    """Stop what is left of the leases under ``leases_dir`` and read back their checkpoints (see the module doc)."""
    if not leases_dir.is_dir():
        return []
    running = {lease_id: found for lease_id, found in leftovers(leases_dir).items() if _ID.fullmatch(lease_id)}
    lease_dirs = sorted({p.parent for p in leases_dir.glob(f"*/{RECORD_NAME}")}
                        | {leases_dir / lease_id for lease_id in running})  # fmt: skip
    records: dict[Path, LeaseRecord | None] = {}
    for lease_dir in lease_dirs:
        try:
            records[lease_dir] = LeaseRecord.read(lease_dir)
        except RecordError as exc:
            if (lease_dir / RECORD_NAME).exists():
                log.warning("ignoring a lease record: %s", exc)
            records[lease_dir] = None

    def stop(lease_dir: Path) -> StopOutcome:
        record = records[lease_dir]
        found = running[lease_dir.name]
        log.warning("process group(s) %s of lease %s were left running by a previous agent on this node; "
                    "stopping them", sorted(set(found.values())), lease_dir.name)  # fmt: skip
        orphan_budget = budget(lease_ttl_s=lease_ttl_s, heartbeat_s=heartbeat_s, kill_after_s=kill_after_s,
                               grace_period_s=record.grace_period_s if record is not None else 0.0)  # fmt: skip
        # The ranks' channels (also those whose files are gone: a process found by its environment
        # is found again by it) and process groups.
        channels = sorted(set(lease_dir.glob("rank-*.chan")) | {lease_dir / f"rank-{i}.chan" for i in range(
            record.ranks if record is not None else 1)})
        return stop_orphaned(channels, set(found.values()), orphan_budget)

    with_processes = [d for d in lease_dirs if running.get(d.name)]
    outcomes: dict[Path, StopOutcome] = {}
    if with_processes:
        with ThreadPoolExecutor(min(len(with_processes), _MAX_PARALLEL), thread_name_prefix="orphans") as pool:
            outcomes = dict(zip(with_processes, pool.map(stop, with_processes), strict=True))
    results = []
    for lease_dir in lease_dirs:
        record = records[lease_dir]
        checkpoint = newest_checkpoint(record, lease_dir, checkpoint_root) if record is not None else None
        results.append(Recovered(lease_dir, record, tuple(sorted(running.get(lease_dir.name, {}))),
                                 outcomes.get(lease_dir), checkpoint))  # fmt: skip
    return results
