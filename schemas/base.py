"""The common shape of every wire model: strict, frozen, versioned.

Every event carries ``event_id`` (a uuid, also used as the JetStream ``Nats-Msg-Id`` so a retried
publish is stored once), ``ts`` (seconds since the Unix epoch, as a float: cheap to produce and to
compare) and ``schema_version`` so a consumer can refuse a message from a newer, incompatible writer.
Commands additionally carry the fencing ``epoch`` of the scheduler leader that issued them.

Floats reject NaN and infinities everywhere (``allow_inf_nan=False``): no field of a wire model has a
meaning for them, and a NaN would poison every comparison a policy makes.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

SCHEMA_VERSION: Final = 1
"""Bumped on any incompatible change of a wire model."""

MAX_TS: Final = 4_102_444_800.0
"""2100-01-01 in seconds: a larger ``ts`` is almost surely milliseconds sent by mistake."""


def _now() -> float:
    return time.time()


class WireModel(BaseModel):
    """Base of every model that crosses a process boundary.

    Unknown fields are rejected (a typo in a job spec must not be silently ignored) and instances
    are immutable, so a model can be shared between tasks without defensive copies.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=False, allow_inf_nan=False)


ENVELOPE_FIELDS: Final = ("event_id", "ts", "schema_version")
"""Defaulted when a model is built in Python, but required in a message: a consumer must never
invent a dedup key or a timestamp for someone else's event (``schemas.codec`` enforces this)."""


def _require_envelope(schema: dict[str, Any]) -> None:
    required = schema.setdefault("required", [])
    if isinstance(required, list):
        required[:0] = [name for name in ENVELOPE_FIELDS if name not in required]


class Event(WireModel):
    """A fact or command published on the bus.

    ``event_id``, ``ts`` and ``schema_version`` are filled in when a model is built in Python, but a
    message must carry them: the JSON Schema lists them as required and the codec refuses a
    message without them.
    """

    model_config = ConfigDict(json_schema_extra=_require_envelope)

    event_id: uuid.UUID = Field(default_factory=uuid.uuid4, description="Unique id; the dedup key.")
    ts: float = Field(
        default_factory=_now,
        ge=0,
        le=MAX_TS,
        description="Seconds since the Unix epoch, when it was created.",
    )
    schema_version: Literal[1] = Field(default=1, description="Wire schema version (SCHEMA_VERSION).")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _version_is_an_int(cls, value: object) -> object:
        # Literal[1] would take ``true`` (bool is an int); a version must be a JSON integer.
        if isinstance(value, bool):
            raise PydanticCustomError("int_type", "schema_version must be an integer, not a boolean")
        return value


class Command(Event):
    """An event that tells someone to act; it carries the issuing leader's fencing epoch."""

    epoch: int = Field(
        ge=0, le=2**53, description="Scheduler leadership term; receivers refuse older epochs."
    )
