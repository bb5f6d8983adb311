"""What the worker agent tells a training process through its environment (docs/control-plane.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JobEnv"]

DEFAULT_CHECKPOINT_DIR = "checkpoints"


class EnvError(ValueError):
    """A ``ROUNDHOUSE_*`` variable holds something the client cannot use."""


def _int(environ: Mapping[str, str], *names: str, default: int) -> int:
    for name in names:
        raw = environ.get(name)
        if raw is None or raw == "":
            continue
        try:
            return int(raw)
        except ValueError:
            raise EnvError(f"{name}={raw!r} must be an integer") from None
    return default


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEnv:
    """The job's identity and place in the world, read once at start-up.

    Outside a worker (a plain ``python train.py``) every field has a usable default: rank 0 of 1,
    no channel (the lease never ends), checkpoints in ``./checkpoints``.
    """

    job_id: str = "local"
    lease_id: str | None = None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    checkpoint_dir: Path = Path(DEFAULT_CHECKPOINT_DIR)
    channel: Path | None = None
    resume_from: Path | None = None
    resume_iteration: int | None = None
    agent_pid: int | None = None
    """The worker agent's pid (``ROUNDHOUSE_AGENT_PID``), watched so the job stops when it is gone."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> JobEnv:
        env = os.environ if environ is None else environ
        channel = env.get("ROUNDHOUSE_CHANNEL") or None
        resume = env.get("ROUNDHOUSE_RESUME_FROM") or None
        resume_iteration = env.get("ROUNDHOUSE_RESUME_ITERATION") or None
        world_size = _int(env, "ROUNDHOUSE_WORLD_SIZE", "WORLD_SIZE", default=1)
        rank = _int(env, "ROUNDHOUSE_RANK", "RANK", default=0)
        if world_size < 1 or not 0 <= rank < world_size:
            raise EnvError(f"rank {rank} is not within world size {world_size}")
        return cls(
            job_id=env.get("ROUNDHOUSE_JOB_ID") or "local",
            lease_id=env.get("ROUNDHOUSE_LEASE_ID") or None,
            rank=rank,
            local_rank=_int(env, "ROUNDHOUSE_LOCAL_RANK", "LOCAL_RANK", default=0),
            world_size=world_size,
            checkpoint_dir=Path(env.get("ROUNDHOUSE_CHECKPOINT_DIR") or DEFAULT_CHECKPOINT_DIR),
            channel=Path(channel) if channel else None,
            resume_from=Path(resume) if resume else None,
            resume_iteration=int(resume_iteration) if resume_iteration else None,
            agent_pid=_int(env, "ROUNDHOUSE_AGENT_PID", default=0) or None,
        )
