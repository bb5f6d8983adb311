"""The local channel between a worker agent and one training process: a small mmap'd file.

Why a file and not a socket: the training client checks its lease after *every* iteration (DESIGN,
Leases and preemption; Blox §7 "optimistic lease renewals"), so that check must cost a memory read,
not a syscall or a network round-trip. Agent and client map the same file ``MAP_SHARED`` and read
and write aligned 8-byte slots, which x86-64 and AArch64 store and load atomically. Each slot has
exactly one writer (the agent or the client), so no locks are needed.

This module must stay importable without NATS or torch: ``roundhouse.train`` imports it inside the
training process.

Layout (little-endian, 128 bytes, one slot = 8 bytes):

======  ==========  ======  ==========================================================================
slot    name        writer  meaning
======  ==========  ======  ==========================================================================
0       header      agent   magic ``RHCH`` (u32) then version (u32)
1       state       agent   0 run, 1 stop requested (pause at the next boundary), 2 ``stop_at`` fixed,
                            3 orphaned (the agent is gone: stop at the next boundary)
2       stop_at     agent   stop after finishing this iteration (valid when state is 2)
3       iteration   client  iterations finished so far (the job's global step)
4       paused_at   client  -1, or the iteration after which the client waits for ``stop_at``
5       ckpt_iter   client  iteration held by the last complete checkpoint, -1 if none
6       status      client  0 running, 1 stopped for the lease, 2 finished its work
7       loss        client  last reported loss (f64; NaN when none)
8       iter_time   client  EWMA of seconds per iteration (f64; 0 when unknown)
9       seq         client  bumped whenever loss/iter_time change (the agent publishes on change)
10      pid         client  the training process's pid
11      samples     client  samples per iteration when known (batch size), else 0
12      group       agent   pid of the launched process, leader of the job's process group
13      noise       client  last gradient noise scale (f64, examples; 0 when unknown), for Pollux
======  ==========  ======  ==========================================================================

"agent" is the agent that launched the process or, once that agent is gone, the lease's watchdog
(:mod:`services.worker.watchdog`) or the next agent on the node (:mod:`services.worker.orphans`):
they write only ``state = orphaned``, and only after the agent's death.
"""

from __future__ import annotations

import enum
import math
import mmap
import os
import struct
from pathlib import Path
from typing import Final

__all__ = [
    "CHANNEL_SIZE",
    "MAGIC",
    "VERSION",
    "Channel",
    "ChannelError",
    "ClientStatus",
    "LeaseSignal",
]

MAGIC: Final = 0x48434852  # b"RHCH" read little-endian
VERSION: Final = 1
CHANNEL_SIZE: Final = 128
_SLOTS: Final = CHANNEL_SIZE // 8

HEADER, STATE, STOP_AT, ITERATION, PAUSED_AT, CKPT_ITER, STATUS, LOSS, ITER_TIME, SEQ, PID, SAMPLES, GROUP = range(13)
NOISE: Final = 13
"""Added after version 1 without a version bump: a client that predates it leaves the slot 0 (unknown)."""


class ChannelError(RuntimeError):
    """The channel file is missing, too small, or was written by another layout version."""


class LeaseSignal(enum.IntEnum):
    """What the agent asks of the client (slot ``state``)."""

    RUN = 0
    STOP_REQUESTED = 1
    """Two-phase stop, phase one: pause at the next iteration boundary and publish it (``paused_at``)."""
    STOP_AT = 2
    """Phase two: finish iteration ``stop_at``, then stop."""
    ORPHANED = 3
    """The agent is gone (died, or silent for half the lease TTL): stop at the next iteration
    boundary, rank 0 after its checkpoint, and exit, before the scheduler may run the job elsewhere.
    A client that predates this value keeps running and is stopped by signals (SIGTERM, SIGKILL)."""


class ClientStatus(enum.IntEnum):
    """What the client reports about itself (slot ``status``)."""

    RUNNING = 0
    STOPPED = 1
    """Stopped for the lease; rank 0's checkpoint (if any) is complete."""
    FINISHED = 2
    """Ran all its work; exits next."""


class Channel:
    """One mapped channel file. ``create`` is the agent's side, ``open`` the client's."""

    __slots__ = ("_d", "_f", "_mm", "_q", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._f = fd
        self._mm = mmap.mmap(fd, CHANNEL_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._q = memoryview(self._mm).cast("q")
        self._d = memoryview(self._mm).cast("d")

    # --- construction ----------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path) -> Channel:
        """Create (or reset) the channel file at ``path`` for a fresh process: state run, nothing done."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, CHANNEL_SIZE)
            channel = cls(path, fd)
        except OSError:
            os.close(fd)
            raise
        q = channel._q
        for slot in range(1, _SLOTS):
            q[slot] = 0
        q[PAUSED_AT] = -1
        q[CKPT_ITER] = -1
        channel._d[LOSS] = math.nan
        struct.pack_into("<II", channel._mm, 0, MAGIC, VERSION)  # header last: the file is now valid
        return channel

    @classmethod
    def open(cls, path: Path | str) -> Channel:
        """Map an existing channel file, checking its magic and version."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise ChannelError(f"cannot open the lease channel {path}: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            if size < CHANNEL_SIZE:
                raise ChannelError(f"lease channel {path} has {size} bytes; expected {CHANNEL_SIZE}")
            channel = cls(path, fd)
        except BaseException:
            os.close(fd)
            raise
        magic, version = struct.unpack_from("<II", channel._mm, 0)
        if magic != MAGIC or version != VERSION:
            channel.close()
            raise ChannelError(
                f"lease channel {path} has magic {magic:#x} version {version}; this client reads "
                f"{MAGIC:#x} version {VERSION} (worker and training client versions differ)"
            )
        return channel

    def close(self) -> None:
        """Unmap and close (idempotent)."""
        if self._mm.closed:
            return
        self._q.release()
        self._d.release()
        self._mm.close()
        os.close(self._f)

    @property
    def closed(self) -> bool:
        return self._mm.closed

    # --- the agent's side ------------------------------------------------------------------------
    @property
    def signal(self) -> LeaseSignal:
        return LeaseSignal(self._q[STATE])

    def request_stop(self) -> None:
        """Phase one: ask the client to pause at its next iteration boundary."""
        if self._q[STATE] == LeaseSignal.RUN:
            self._q[STATE] = LeaseSignal.STOP_REQUESTED

    def orphan(self) -> None:
        """The agent is gone: stop at the next boundary (a ``stop_at`` already fixed stands)."""
        if self._q[STATE] != LeaseSignal.STOP_AT:
            self._q[STATE] = LeaseSignal.ORPHANED

    def set_group(self, pid: int) -> None:
        """Record the launched process (its process group's leader), so a later agent can find it."""
        self._q[GROUP] = pid

    @property
    def group(self) -> int | None:
        return self._q[GROUP] or None

    def set_stop_at(self, stop_at: int) -> None:
        """Phase two: finish iteration ``stop_at``, then stop (``stop_at`` first, then the state)."""
        self._q[STOP_AT] = stop_at
        self._q[STATE] = LeaseSignal.STOP_AT

    # --- shared reads ------------------------------------------------------------------------------
    @property
    def stop_at(self) -> int | None:
        return self._q[STOP_AT] if self._q[STATE] == LeaseSignal.STOP_AT else None

    @property
    def iteration(self) -> int:
        return self._q[ITERATION]

    @property
    def paused_at(self) -> int | None:
        value = self._q[PAUSED_AT]
        return None if value < 0 else value

    @property
    def checkpoint_iteration(self) -> int | None:
        value = self._q[CKPT_ITER]
        return None if value < 0 else value

    @property
    def status(self) -> ClientStatus:
        return ClientStatus(self._q[STATUS])

    @property
    def loss(self) -> float | None:
        value = self._d[LOSS]
        return None if math.isnan(value) else value

    @property
    def iteration_time_s(self) -> float | None:
        value = self._d[ITER_TIME]
        return value if value > 0 else None

    @property
    def grad_noise_scale(self) -> float | None:
        value = self._d[NOISE]
        return value if math.isfinite(value) and value > 0 else None

    @property
    def samples_per_iteration(self) -> int | None:
        value = self._q[SAMPLES]
        return value if value > 0 else None

    @property
    def seq(self) -> int:
        return self._q[SEQ]

    @property
    def pid(self) -> int | None:
        value = self._q[PID]
        return value or None

    # --- the client's side -------------------------------------------------------------------------
    def raw_state(self) -> int:
        """The ``state`` slot as an int: the per-iteration lease check (one memory read)."""
        return self._q[STATE]

    def slots(self) -> memoryview:
        """The int64 view of the slots, for the client's hot loop (avoids a method call per read)."""
        return self._q

    def set_iteration(self, iteration: int) -> None:
        self._q[ITERATION] = iteration

    def pause(self, iteration: int) -> None:
        """Report that the client waits after finishing ``iteration`` (phase one answered)."""
        self._q[ITERATION] = iteration
        self._q[PAUSED_AT] = iteration

    def set_checkpoint_iteration(self, iteration: int) -> None:
        self._q[CKPT_ITER] = iteration

    def set_status(self, status: ClientStatus) -> None:
        self._q[STATUS] = status

    def set_pid(self, pid: int) -> None:
        self._q[PID] = pid

    def set_samples(self, samples: int) -> None:
        self._q[SAMPLES] = samples

    def report(
        self, *, loss: float | None = None, iteration_time_s: float | None = None, grad_noise_scale: float | None = None
    ) -> None:
        """Record the latest loss, iteration time and/or gradient noise scale; the agent publishes them
        about once a second."""
        if loss is not None:
            self._d[LOSS] = loss
        if iteration_time_s is not None:
            self._d[ITER_TIME] = iteration_time_s
        if grad_noise_scale is not None:
            self._d[NOISE] = grad_noise_scale
        self._q[SEQ] += 1
