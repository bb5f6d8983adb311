"""Jobs whose agent is gone: how long they may still run, and how they are stopped.

DESIGN, Trust and failure, "No agent, no job": the scheduler reassigns a node's GPUs (and runs its
jobs elsewhere) once it has heard no heartbeat from it for ``lease_ttl_s``
(``services/scheduler/inventory.py``, ``Inventory.sweep``: ``now - last_seen >= lease_ttl_s``). An
agent that dies stops heartbeating at once, but its training processes run in their own sessions
and would go on: the job would run twice. So whoever notices that the agent is gone (the lease's
watchdog, :mod:`services.worker.watchdog`, at once; the next agent on the node when it starts)
stops the lease's processes here, within a budget that ends before the scheduler may reassign:

* the agent **died**: its last heartbeat went out at most ``heartbeat_s`` before; the processes
  must be gone ``lease_ttl_s - heartbeat_s - margin`` after the death;
* the agent is **silent** (stopped, hung) for ``lease_ttl_s / 2``: what is left is
  ``lease_ttl_s / 2 - heartbeat_s - margin``;

where ``margin = ORPHAN_MARGIN * lease_ttl_s`` covers heartbeat jitter, signal delivery and process
teardown. Within a budget ``B`` the job gets ``grace = min(spec.grace_period_s, B - kill_after)`` to
checkpoint and exit on its own (the channel says ``orphaned``: :mod:`roundhouse.train` stops at its
next iteration boundary, rank 0 after a checkpoint), then SIGTERM, then SIGKILL ``kill_after =
min(kill_after_s, B / 4)`` later: the cut-off rule's split (``WorkerService._on_cut_off``).

This module is imported by the watchdog process: standard library and the channel only (no NATS,
no pydantic), so a watchdog starts in tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from services.worker.channel import Channel, ChannelError

__all__ = [
    "ORPHAN_MARGIN",
    "OrphanBudget",
    "StopOutcome",
    "TimingError",
    "budget",
    "check_timing",
    "lease_processes",
    "leftovers",
    "mark_orphaned",
    "stop_orphaned",
]

ORPHAN_MARGIN: Final = 0.1
"""Fraction of ``lease_ttl_s`` kept free at the end of an orphan's budget."""

SILENT_FRACTION: Final = 0.5
"""An agent silent (no keepalive to its watchdogs) this fraction of ``lease_ttl_s`` counts as gone."""

_POLL_FIRST_S = 0.01
_POLL_MAX_S = 0.1
_REAP_WAIT_S = 5.0
"""After SIGKILL: how long to wait for the kernel to take the processes down before giving up."""


class TimingError(ValueError):
    """The worker's timing leaves a job without an agent no time to stop before its lease TTL."""


@dataclass(frozen=True, slots=True)
class OrphanBudget:
    """How a job without an agent is stopped: ``grace_s`` on its own, then SIGTERM, then SIGKILL."""

    grace_s: float
    kill_after_s: float

    @property
    def total_s(self) -> float:
        return self.grace_s + self.kill_after_s


def _window(lease_ttl_s: float, heartbeat_s: float, *, silent: bool) -> float:
    start = SILENT_FRACTION * lease_ttl_s if silent else 0.0
    return lease_ttl_s - start - heartbeat_s - ORPHAN_MARGIN * lease_ttl_s


def budget(
    *, lease_ttl_s: float, heartbeat_s: float, kill_after_s: float, grace_period_s: float, silent: bool = False
) -> OrphanBudget:
    """The stop budget of one lease once its agent died (``silent``: was found silent), see the module doc."""
    window = max(0.0, _window(lease_ttl_s, heartbeat_s, silent=silent))
    kill_after = min(kill_after_s, window / 4)
    return OrphanBudget(grace_s=max(0.0, min(grace_period_s, window - kill_after)), kill_after_s=kill_after)


def check_timing(*, lease_ttl_s: float, heartbeat_s: float) -> None:
    """Raise :class:`TimingError` unless a job without an agent can stop before the TTL (both cases)."""
    window = _window(lease_ttl_s, heartbeat_s, silent=True)
    if window <= 0:
        limit = (1 - SILENT_FRACTION - ORPHAN_MARGIN) * lease_ttl_s
        raise TimingError(
            f"heartbeat_s={heartbeat_s:g} leaves no time under lease_ttl_s={lease_ttl_s:g}: a job whose agent "
            f"is silent for half the TTL must checkpoint and exit by lease_ttl_s - heartbeat_s - "
            f"{ORPHAN_MARGIN:g} x lease_ttl_s; use heartbeat_s < {limit:g} (or a longer lease_ttl_s)"
        )


# --- the lease's processes ---------------------------------------------------------------------------
def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) "
    try:
        return fields[0].decode(), int(fields[2])
    except (IndexError, ValueError):
        return None


def _environ_has(pid: int, needles: frozenset[bytes]) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return any(item in needles for item in environ.split(b"\x00"))


def _needles(channels: Iterable[Path]) -> frozenset[bytes]:
    return frozenset(f"ROUNDHOUSE_CHANNEL={path}".encode() for path in channels)


def lease_processes(channels: Iterable[Path], groups: set[int]) -> dict[int, int]:
    """The live processes of a lease: ``pid -> process group``.

    A process belongs to the lease when it runs with one of the lease's channels in its environment
    (every rank and whatever it started, a DataLoader worker or a process that left the group with
    ``setsid``) or is in one of ``groups`` (the ranks' process groups: also children that cleared
    their environment). A zombie is not live: its parent is gone and it holds nothing. ``groups``
    grows with the groups of processes found by their environment.
    """
    needles = _needles(channels)
    me = os.getpid()
    found: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid == me:
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X", "x"):
            continue
        if stat[1] in groups or _environ_has(pid, needles):
            found[pid] = stat[1]
    groups.update(found.values())
    return found


def leftovers(leases_dir: Path) -> dict[str, dict[int, int]]:
    """Live processes started by any lease under ``leases_dir``: lease id -> {pid: process group}.

    One pass over ``/proc``: a process belongs to lease ``L`` when its environment holds
    ``ROUNDHOUSE_CHANNEL=<leases_dir>/L/...`` (what a restarted agent finds of its predecessor's jobs).
    """
    prefix = f"ROUNDHOUSE_CHANNEL={leases_dir}/".encode()
    me = os.getpid()
    found: dict[str, dict[int, int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X", "x"):
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        for item in environ.split(b"\x00"):
            if item.startswith(prefix):
                lease_id = item[len(prefix) :].split(b"/", 1)[0].decode(errors="replace")
                found.setdefault(lease_id, {})[pid] = stat[1]
                break
    return found


def _signal(found: dict[int, int], groups: set[int], sig: signal.Signals) -> None:
    for group in sorted(set(found.values()) & groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
    for pid in found:  # also those that left the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@dataclass(frozen=True, slots=True)
class StopOutcome:
    """How a lease's processes ended: ``exited`` on their own, ``terminated`` by SIGTERM, ``killed``
    by SIGKILL; ``left`` pids still there after all that (a process in uninterruptible sleep)."""

    how: str
    seconds: float
    left: tuple[int, ...] = ()


def _wait_gone(
    channels: list[Path], groups: set[int], deadline: float, clock: Callable[[], float]
) -> dict[int, int]:
    delay = _POLL_FIRST_S
    while True:
        found = lease_processes(channels, groups)
        remaining = deadline - clock()
        if not found or remaining <= 0:
            return found
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, _POLL_MAX_S)


def mark_orphaned(channels: Iterable[Path]) -> None:
    """Tell each rank (``state = orphaned``) that its agent is gone; missing channels are skipped."""
    for path in channels:
        try:
            channel = Channel.open(path)
        except ChannelError:
            continue
        try:
            channel.orphan()
        finally:
            channel.close()


def stop_orphaned(
    channels: list[Path],
    groups: set[int],
    orphan_budget: OrphanBudget,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> StopOutcome:
    """Stop a lease whose agent is gone: ``orphaned`` on its channels, ``grace_s`` to exit on its
    own, SIGTERM, ``kill_after_s`` more, SIGKILL. Blocks until no process of the lease is left (or
    a few seconds after SIGKILL). ``groups``: the ranks' process groups, as far as known."""
    start = clock()
    mark_orphaned(channels)
    found = _wait_gone(channels, groups, start + orphan_budget.grace_s, clock)
    if not found:
        return StopOutcome("exited", clock() - start)
    _signal(found, groups, signal.SIGTERM)
    found = _wait_gone(channels, groups, clock() + orphan_budget.kill_after_s, clock)
    if not found:
        return StopOutcome("terminated", clock() - start)
    _signal(found, groups, signal.SIGKILL)
    found = _wait_gone(channels, groups, clock() + _REAP_WAIT_S, clock)
    return StopOutcome("killed", clock() - start, tuple(sorted(found)))
