"""The job spec a user submits, with limits on everything a user controls."""

from __future__ import annotations

import enum
import re
from typing import Annotated

from pydantic import Field, StringConstraints, field_validator, model_validator

from schemas.base import WireModel

MAX_GPUS_PER_JOB = 1024
MAX_ARGV = 256
MAX_ARG_CHARS = 4096
MAX_ENV = 128
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
JobName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_NAME)]
_USER = r"^[A-Za-z0-9][A-Za-z0-9._@-]*$"
UserName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_USER)]
JobId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_NAME)]


class JobClass(enum.StrEnum):
    """FitGpp's job classes (seed 000, §2): latency-sensitive trial-and-error or best-effort."""

    TE = "TE"
    BE = "BE"


class JobSpec(WireModel):
    """What a user asks for. The scheduler assigns nothing here; state lives elsewhere."""

    name: JobName
    user: UserName = "default"
    command: list[str] = Field(
        min_length=1,
        max_length=MAX_ARGV,
        description="argv of the training process, executed without a shell.",
    )
    gpus: int = Field(default=1, ge=1, le=MAX_GPUS_PER_JOB, description="GPUs the job needs to run.")
    max_gpus: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS_PER_JOB,
        description="Elastic jobs may grow up to this many GPUs (Optimus, Gandiva grow-shrink).",
    )
    cpus: float = Field(default=1.0, gt=0, le=1024, description="CPU cores (FitGpp demand vector).")
    memory_gb: float = Field(default=4.0, gt=0, le=16384, description="Host RAM in GiB.")
    job_class: JobClass = Field(default=JobClass.BE, description="TE (trial-and-error) or BE (best-effort).")
    priority: int = Field(default=0, ge=-1000, le=1000)
    grace_period_s: float = Field(
        default=30.0, ge=0, le=86_400, description="Time allowed to checkpoint after a revoke."
    )
    max_preemptions: int | None = Field(
        default=None, ge=0, le=1_000_000, description="FitGpp's P; None means unbounded."
    )
    model: str | None = Field(
        default=None, max_length=128, description="Model/profile hint (e.g. resnet50) for cost models."
    )
    expected_iterations: int | None = Field(default=None, ge=1, le=10**12)
    expected_duration_s: float | None = Field(default=None, gt=0, le=10**9)
    loss_target: float | None = Field(default=None, description="Stop when loss reaches this (Blox §5.3).")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV)

    @field_validator("command")
    @classmethod
    def _argv_is_sane(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise ValueError("command[0] (the program) must not be empty")
        for i, arg in enumerate(argv):
            if len(arg) > MAX_ARG_CHARS:
                raise ValueError(f"command[{i}] is longer than {MAX_ARG_CHARS} characters")
            if "\x00" in arg:
                raise ValueError(f"command[{i}] contains a NUL byte")
        return argv

    @field_validator("env")
    @classmethod
    def _env_is_sane(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not _ENV_KEY.match(key):
                raise ValueError(f"env key {key!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
            if key.startswith("ROUNDHOUSE_"):
                raise ValueError(f"env key {key!r} is reserved: ROUNDHOUSE_* is set by the worker")
            if len(value) > MAX_ARG_CHARS or "\x00" in value:
                raise ValueError(f"env[{key}] is too long or contains a NUL byte")
        return env

    @model_validator(mode="after")
    def _elastic_range(self) -> JobSpec:
        if self.max_gpus is not None and self.max_gpus < self.gpus:
            raise ValueError(f"max_gpus ({self.max_gpus}) must be >= gpus ({self.gpus})")
        return self
