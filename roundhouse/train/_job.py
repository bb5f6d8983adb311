"""The training process's view of its lease: check it every iteration, stop in step, checkpoint, resume.

The per-iteration check is one read of an mmap'd slot (:mod:`services.worker.channel`); everything
else happens only when that slot is non-zero. The two-phase stop (DESIGN, Leases and preemption;
Blox §7) looks like this from here:

1. The agent sets ``state = stop requested`` on rank 0's channel.
2. At its next iteration boundary (after finishing iteration ``i``) rank 0 writes ``paused_at = i``
   and waits; the agent fixes ``stop_at = i + 1``, tells every other rank (other nodes through their
   agents), then sets ``stop_at`` here, which releases rank 0.
3. Every rank finishes iteration ``stop_at`` and stops: one consistent checkpoint from rank 0.

No agent, no job (DESIGN, Trust and failure): when the agent is gone (it died, or went silent for half
the lease TTL) the lease's watchdog sets ``state = orphaned`` and each rank stops at its next
boundary, rank 0 after a checkpoint, well before the scheduler may run the job elsewhere. Should the
watchdog be gone too, the client notices the agent's end itself (:mod:`roundhouse.train._agent`,
checked every ``_AGENT_CHECK_S`` from the iteration loop) and stops the same way.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from roundhouse.train._agent import AgentWatch
from roundhouse.train._checkpoint import CHECKPOINT_NAME, Position, confine, load_checkpoint, save_checkpoint
from roundhouse.train._env import JobEnv
from services.worker.channel import (
    CKPT_ITER,
    ITERATION,
    STATE,
    STOP_AT,
    Channel,
    ClientStatus,
    LeaseSignal,
)

__all__ = ["Job", "Restored", "StateDictLike"]

log = logging.getLogger("roundhouse.train")

T = TypeVar("T")

_EWMA_ALPHA = 0.1
_REPORT_EVERY_S = 0.2
_PAUSE_POLL_S = 0.0001
_PAUSE_POLL_MAX_S = 0.002
_AGENT_CHECK_S = 0.25
"""How often the iteration loop checks that the agent process still runs (one syscall)."""


class StateDictLike(Protocol):
    """Anything with ``state_dict`` / ``load_state_dict`` (a torch module, optimizer, scheduler)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


@dataclass(frozen=True, slots=True)
class Restored:
    """What :meth:`Job.restore` loaded: the position to continue from and the user's extra state."""

    path: Path
    position: Position
    extra: Any

    @property
    def iteration(self) -> int:
        return self.position.iteration


class Job:
    """A training process under a Roundhouse lease (or a plain run when no worker started it).

    Single-process and ``torch.distributed`` jobs use it the same way; only rank 0 writes checkpoints,
    every rank restores them.
    """

    def __init__(self, env: JobEnv | None = None, channel: Channel | None = None) -> None:
        self.env = env if env is not None else JobEnv.from_environ()
        if channel is None and self.env.channel is not None:
            channel = Channel.open(self.env.channel)
        self._channel = channel
        self._q: memoryview | None = channel.slots() if channel is not None else None
        self.iteration = 0
        """Iterations finished (the global step); restored from a checkpoint on resume."""
        self._place = (0, 0, 0)
        """(iteration, epoch, batch index) as of the last batch :meth:`iterate` handed out."""
        self.stopping = False
        """True once the lease asked this process to stop and it has reached ``stop_at`` (or its agent is gone)."""
        self.orphaned = False
        """True once this process learnt that its worker agent is gone (it stops as for a revoke)."""
        self.last_checkpoint: Path | None = None
        self._stop_reported = False
        self._last_boundary = time.perf_counter()
        self._iter_time = 0.0
        self._last_report = self._last_boundary
        self._loss: float | None = None
        self._agent: AgentWatch | None = None
        self._agent_checked = self._last_boundary
        if channel is not None:
            channel.set_pid(os.getpid())
            self._agent = AgentWatch(self.env.agent_pid)

    @property
    def position(self) -> Position:
        """Where training stands: the loader position when :meth:`iterate` drives it, else just the step."""
        iteration, epoch, index = self._place
        return Position(iteration, epoch, index) if iteration == self.iteration else Position(self.iteration)

    # --- identity ---------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_leader(self) -> bool:
        """Rank 0: the process that writes checkpoints."""
        return self.env.rank == 0

    @property
    def checkpoint_path(self) -> Path:
        return self.env.checkpoint_dir / CHECKPOINT_NAME

    @property
    def under_lease(self) -> bool:
        """Whether a worker agent started this process (a channel exists)."""
        return self._channel is not None

    # --- the lease check ------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """Whether to stop now, at an iteration boundary (call it before starting each iteration).

        Costs one memory read while the lease holds. On a stop request it runs this rank's part of
        the two-phase stop, which may wait for the agent (milliseconds). Once it returns True, a
        rank-0 process should :meth:`checkpoint` and every rank should leave its loop.
        """
        q = self._q
        if q is None or not q[STATE]:  # 0: run
            return self.stopping
        return self._lease_signalled(q)

    def _lease_signalled(self, q: memoryview) -> bool:
        if self.stopping:
            return True
        if q[STATE] == LeaseSignal.STOP_REQUESTED:
            assert self._channel is not None
            self._channel.pause(self.iteration)
            delay = _PAUSE_POLL_S
            while q[STATE] == LeaseSignal.STOP_REQUESTED:
                if self._agent is not None and self._agent.gone():
                    # The agent died while we waited for stop_at (and no watchdog said so): stop
                    # here, at a boundary, rather than wait forever; rank 0 still checkpoints.
                    self._orphan()
                    return True
                time.sleep(delay)
                delay = min(delay * 1.5, _PAUSE_POLL_MAX_S)
        if q[STATE] == LeaseSignal.ORPHANED:
            self._orphan()
            return True
        if q[STATE] == LeaseSignal.STOP_AT and self.iteration >= q[STOP_AT]:
            if self.iteration > q[STOP_AT]:
                log.warning("stopping at iteration %d, past stop_at %d", self.iteration, q[STOP_AT])
            self.stopping = True
            if not self.is_leader:
                self._set_status(ClientStatus.STOPPED)
            return True
        return False

    def _orphan(self) -> None:
        """The agent is gone: stop at this boundary as for a revoke (rank 0 checkpoints, then all exit)."""
        if not self.stopping:
            log.warning("the worker agent is gone; stopping after iteration %d", self.iteration)
        self.stopping = self.orphaned = True
        if not self.is_leader:
            self._set_status(ClientStatus.STOPPED)

    def iteration_done(self, *, loss: float | None = None) -> None:
        """Count one finished iteration (and its loss, if given) and publish it to the agent."""
        self.iteration += 1
        q = self._q
        if q is not None:
            q[ITERATION] = self.iteration
        now = time.perf_counter()
        if now - self._agent_checked >= _AGENT_CHECK_S and self._agent is not None:
            self._agent_checked = now
            if self._agent.gone():
                self._orphan()
        dt = now - self._last_boundary
        self._last_boundary = now
        self._iter_time = dt if self._iter_time == 0.0 else self._iter_time + _EWMA_ALPHA * (dt - self._iter_time)
        if loss is not None:
            self._loss = loss
        if now - self._last_report >= _REPORT_EVERY_S:
            self._last_report = now
            self.report()

    def report(
        self, *, loss: float | None = None, batch_size: int | None = None, grad_noise_scale: float | None = None
    ) -> None:
        """Hand the latest loss and iteration time to the agent, which publishes ``JobMetrics``
        (with ``batch_size``, once given, also the throughput in samples per second). A job that
        estimates its gradient noise scale (``GradientNoiseScale``) passes it as ``grad_noise_scale``:
        Pollux's statistical efficiency reads it."""
        if loss is not None:
            self._loss = loss
        if batch_size is not None and self._channel is not None:
            self._channel.set_samples(batch_size)
        if self._channel is not None:
            noise = grad_noise_scale if grad_noise_scale is not None and math.isfinite(grad_noise_scale) else None
            self._channel.report(loss=self._loss, iteration_time_s=self._iter_time or None, grad_noise_scale=noise)

    def _set_status(self, status: ClientStatus) -> None:
        if self._channel is not None:
            self.report()
            self._channel.set_status(status)

    # --- checkpoints ------------------------------------------------------------------------------
    def checkpoint(
        self,
        model: StateDictLike | None = None,
        optimizer: StateDictLike | None = None,
        *,
        extra: Any = None,
        position: Position | None = None,
    ) -> Path | None:
        """Write model, optimizer, position and ``extra`` atomically (rank 0 only; others return None).

        After a lease stop this is the consistent checkpoint; writing it also tells the agent the
        process is done (so it can report ``job.suspended`` without waiting for interpreter exit).
        """
        if not self.is_leader:
            return None
        pos = position or self.position
        state: dict[str, Any] = {
            "job_id": self.env.job_id,
            "iteration": pos.iteration,
            "epoch": pos.epoch,
            "batch_index": pos.batch_index,
            "model": model.state_dict() if model is not None else None,
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "extra": extra,
        }
        path = save_checkpoint(self.checkpoint_path, state)
        self.last_checkpoint = path
        q = self._q
        if q is not None:
            q[CKPT_ITER] = pos.iteration
            if self.stopping:
                self._set_status(ClientStatus.STOPPED)
        return path

    def restore(
        self, model: StateDictLike | None = None, optimizer: StateDictLike | None = None, *, path: Path | None = None
    ) -> Restored | None:
        """Load the checkpoint this lease resumes from into ``model`` and ``optimizer`` (in place).

        Which checkpoint: ``path`` if given; else the one the scheduler named (``ROUNDHOUSE_RESUME_FROM``),
        which must be a file inside this job's checkpoint directory (it came over the bus: anything
        else raises :class:`CheckpointError` rather than being loaded); else, outside a worker only,
        ``<checkpoint dir>/checkpoint.pt`` when it exists. Returns None when there is nothing to
        resume (a fresh start). Sets :attr:`iteration` and :attr:`position`, which :meth:`iterate`
        continues from, so no finished iteration repeats and none is skipped. Whichever the file, it
        is loaded without running code from it (:func:`~roundhouse.train.load_checkpoint`).
        """
        if path is None and self.env.resume_from is not None:
            path = confine(self.env.resume_from, self.env.checkpoint_dir)
        if path is None and not self.under_lease and self.checkpoint_path.is_file():
            path = self.checkpoint_path
        if path is None:
            return None
        data = load_checkpoint(path)
        if model is not None and data.get("model") is not None:
            model.load_state_dict(data["model"])
        if optimizer is not None and data.get("optimizer") is not None:
            optimizer.load_state_dict(data["optimizer"])
        position = Position(int(data["iteration"]), int(data["epoch"]), int(data["batch_index"]))
        expected = self.env.resume_iteration
        if expected is not None and expected != position.iteration:
            log.warning("checkpoint %s holds iteration %d; the scheduler expected %d",
                        path, position.iteration, expected)
        self.iteration = position.iteration
        self._place = (position.iteration, position.epoch, position.batch_index)
        if self._channel is not None:
            self._channel.set_iteration(self.iteration)
            if self.is_leader:
                self._channel.set_checkpoint_iteration(self.iteration)
        return Restored(path=path, position=position, extra=data.get("extra"))

    # --- the loader wrapper -------------------------------------------------------------------------
    def iterate(
        self,
        data: Iterable[T],
        *,
        model: StateDictLike | None = None,
        optimizer: StateDictLike | None = None,
        max_iterations: int | None = None,
        epochs: int | None = None,
        checkpoint_every: int | None = None,
        extra: Any = None,
    ) -> Iterator[T]:
        """Yield batches from ``data`` (re-iterated epoch after epoch) until the work is done or the
        lease stops it; the lease is checked before every batch.

        ``data`` must yield the same batches in the same order for the same epoch (a DataLoader with
        a seeded sampler; ``set_epoch(epoch)`` is called on its sampler when it has one), so resuming
        at ``(epoch, batch_index)`` repeats and skips nothing. Stops after ``max_iterations`` global
        iterations or ``epochs`` epochs, whichever comes first. With ``model`` (and ``optimizer``),
        rank 0 checkpoints when the lease stops the job, at the end, and every ``checkpoint_every``
        iterations. Call :meth:`iteration_done` yourself only when not using this wrapper.
        """
        epoch, skip = self.position.epoch, self.position.batch_index
        q = self._q
        while epochs is None or epoch < epochs:
            _set_epoch(data, epoch)
            batches = iter(data)
            index = 0
            for _ in range(skip):
                if next(batches, _END) is _END:
                    break
                index += 1
            resumed_mid_epoch, skip = index > 0, 0
            produced = False
            while True:
                if max_iterations is not None and self.iteration >= max_iterations:
                    self._finished(model, optimizer, extra)
                    return
                if (q is not None and q[STATE] and self._lease_signalled(q)) or self.stopping:
                    if model is not None or optimizer is not None:
                        self.checkpoint(model, optimizer, extra=extra)
                    return
                batch = next(batches, _END)
                if batch is _END:
                    break
                produced = True
                yield batch
                index += 1
                self._place = (self.iteration + 1, epoch, index)
                self.iteration_done()
                if checkpoint_every and model is not None and self.iteration % checkpoint_every == 0:
                    self.checkpoint(model, optimizer, extra=extra)
            if not produced and not resumed_mid_epoch:
                raise ValueError("the data yielded no batch in a whole epoch; iterate() would loop forever")
            epoch += 1
            self._place = (self.iteration, epoch, 0)
        self._finished(model, optimizer, extra)

    def _finished(self, model: StateDictLike | None, optimizer: StateDictLike | None, extra: Any) -> None:
        if (model is not None or optimizer is not None) and self.is_leader:
            self.checkpoint(model, optimizer, extra=extra)
        self._set_status(ClientStatus.FINISHED)

    def close(self) -> None:
        """Flush the last metrics to the agent and unmap the channel."""
        if self._channel is not None:
            self.report()
            self._channel.close()
            self._channel = None
            self._q = None
        if self._agent is not None:
            self._agent.close()
            self._agent = None


_END: Any = object()


def _set_epoch(data: object, epoch: int) -> None:
    for holder in (data, getattr(data, "sampler", None), getattr(data, "batch_sampler", None)):
        set_epoch = getattr(holder, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
            return
