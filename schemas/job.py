"""The job spec a user submits, with limits on everything a user controls.

The command is an argv list executed without a shell: a spec never carries a shell string, so a
job name or an argument can never be interpreted by ``sh``. Sizes are bounded per item and in
total so one ``job.arrived`` message stays well below NATS's default 1 MiB payload limit.
"""

from __future__ import annotations

import enum
from typing import Annotated, Final

from pydantic import AfterValidator, Field, StringConstraints, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from schemas.base import WireModel
from schemas.ids import JobId

__all__ = [
    "MAX_ARGV",
    "MAX_ARG_CHARS",
    "MAX_COMMAND_CHARS",
    "MAX_ENV",
    "MAX_ENV_CHARS",
    "MAX_GPUS_PER_JOB",
    "JobClass",
    "JobId",
    "JobName",
    "JobSpec",
    "UserName",
]

MAX_GPUS_PER_JOB: Final = 1024
MAX_ARGV: Final = 256
MAX_ARG_CHARS: Final = 4096
MAX_COMMAND_CHARS: Final = 65_536
"""Bound on the sum of the argv items' lengths."""
MAX_ENV: Final = 128
MAX_ENV_CHARS: Final = 65_536
"""Bound on the sum of the env keys' and values' lengths."""
RESERVED_ENV_PREFIX: Final = "ROUNDHOUSE_"

_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
JobName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_NAME)]
_USER = r"^[A-Za-z0-9][A-Za-z0-9._@-]*$"
UserName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=_USER)]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("nul_byte", "must not contain a NUL byte")
    return value


_Arg = Annotated[str, StringConstraints(max_length=MAX_ARG_CHARS), AfterValidator(_no_nul)]
_EnvKey = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
_EnvValue = Annotated[str, StringConstraints(max_length=MAX_ARG_CHARS), AfterValidator(_no_nul)]
ModelHint = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]*$")]
GpuTypeName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
"""A normalised GPU type (``services.core.heterogeneity.normalize_gpu_type``: "a100", "v100")."""
_AbsPath = Annotated[str, StringConstraints(min_length=1, max_length=4096, pattern=r"^/[^\x00]*$")]


class JobClass(enum.StrEnum):
    """FitGpp's job classes (seed 000, §2): latency-sensitive trial-and-error or best-effort."""

    TE = "TE"
    BE = "BE"


class JobSpec(WireModel):
    """What a user asks for. The scheduler assigns nothing here; state lives elsewhere."""

    name: JobName
    user: UserName = "default"
    command: list[_Arg] = Field(
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
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="Tier: higher ranks first, whatever the policy."
    )
    grace_period_s: float = Field(
        default=30.0, ge=0, le=86_400, description="Time allowed to checkpoint after a revoke."
    )
    max_preemptions: int | None = Field(
        default=None, ge=0, le=1_000_000, description="FitGpp's P; None means unbounded."
    )
    model: ModelHint | None = Field(
        default=None, description="Model/profile hint (e.g. resnet50) for cost models."
    )
    gpu_throughputs: dict[GpuTypeName, Annotated[float, Field(gt=0, le=1e6)]] | None = Field(
        default=None,
        max_length=32,
        description="Relative speed per GPU type (e.g. {k80: 0.2, v100: 1}) for heterogeneity-aware "
        "policies (Gavel); None: looked up from the model (services.core.heterogeneity).",
    )
    expected_iterations: int | None = Field(default=None, ge=1, le=10**12)
    expected_duration_s: float | None = Field(default=None, gt=0, le=10**9)
    loss_target: float | None = Field(
        default=None, ge=-1e12, le=1e12, description="Stop when loss reaches this (Blox §5.3)."
    )
    env: dict[_EnvKey, _EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description="Extra environment variables; ROUNDHOUSE_* is reserved for the worker.",
    )
    workdir: _AbsPath | None = Field(
        default=None,
        description="Absolute working directory on the node (`submit` sets the directory it ran in); "
        "None: the agent's own. A launch fails if it does not exist there.",
    )
    distributed: bool = Field(
        default=False,
        description="One process per granted GPU, each with torch.distributed's rank, world size and "
        "rendezvous environment; False: one process seeing all the node's granted GPUs.",
    )

    @field_validator("command")
    @classmethod
    def _argv_is_sane(cls, argv: list[str]) -> list[str]:
        if not argv[0]:
            raise PydanticCustomError("empty_program", "command[0] (the program) must not be empty")
        total = sum(map(len, argv))
        if total > MAX_COMMAND_CHARS:
            raise PydanticCustomError(
                "command_too_large",
                "the argv items add up to {total} characters; at most {limit} are allowed",
                {"total": total, "limit": MAX_COMMAND_CHARS},
            )
        return argv

    @field_validator("env")
    @classmethod
    def _env_is_sane(cls, env: dict[str, str]) -> dict[str, str]:
        total = 0
        for key, value in env.items():
            if key.startswith(RESERVED_ENV_PREFIX):
                raise PydanticCustomError(
                    "reserved_env_key",
                    "env key '{key}' is reserved: ROUNDHOUSE_* is set by the worker",
                    {"key": key},
                )
            total += len(key) + len(value)
        if total > MAX_ENV_CHARS:
            raise PydanticCustomError(
                "env_too_large",
                "env keys and values add up to {total} characters; at most {limit} are allowed",
                {"total": total, "limit": MAX_ENV_CHARS},
            )
        return env

    @field_validator("max_gpus")
    @classmethod
    def _elastic_range(cls, max_gpus: int | None, info: ValidationInfo) -> int | None:
        gpus = info.data.get("gpus")
        if max_gpus is not None and isinstance(gpus, int) and max_gpus < gpus:
            raise PydanticCustomError(
                "max_gpus_below_gpus",
                "max_gpus ({max_gpus}) must be >= gpus ({gpus})",
                {"max_gpus": max_gpus, "gpus": gpus},
            )
        return max_gpus
