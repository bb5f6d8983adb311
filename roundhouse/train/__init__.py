"""``roundhouse.train``: the client a training script imports to run under a Roundhouse lease.

>>> from roundhouse import train
>>> job = train.attach()
>>> job.restore(model, optimizer)                      # no-op on a fresh start
>>> for x, y in job.iterate(loader, model=model, optimizer=optimizer, max_iterations=1000):
...     loss = step(x, y)
...     job.report(loss=loss.item())

The lease is checked before every batch at the cost of one memory read (a channel the worker agent
updates; no network round-trip). When the scheduler revokes the lease every rank stops after the
same iteration and rank 0 writes one consistent checkpoint (atomically), from which a resumed job
continues with no iteration repeated or skipped. Loss and iteration time go to the agent through
the same channel; the agent publishes them on ``metrics.job.<id>``, so the training process needs no
NATS connection. See docs/training-client.md.
"""

from __future__ import annotations

from roundhouse.train._checkpoint import CHECKPOINT_NAME, CheckpointError, Position, load_checkpoint, save_checkpoint
from roundhouse.train._env import EnvError, JobEnv
from roundhouse.train._job import Job, Restored, StateDictLike
from roundhouse.train._noise import GradientNoiseScale, squared_norm

__all__ = [
    "CHECKPOINT_NAME",
    "CheckpointError",
    "EnvError",
    "GradientNoiseScale",
    "Job",
    "JobEnv",
    "Position",
    "Restored",
    "StateDictLike",
    "attach",
    "load_checkpoint",
    "save_checkpoint",
    "squared_norm",
]

_current: Job | None = None


def attach() -> Job:
    """The process's :class:`Job`, created from the environment on first use (one per process)."""
    global _current  # noqa: PLW0603  # one Job per process, created lazily
    if _current is None:
        _current = Job()
    return _current
