"""Encode and decode wire messages: pure functions, no I/O, testable without NATS.

``encode`` writes a model as compact JSON bytes; ``decode`` turns the bytes received on a subject
into that subject's model (see :mod:`schemas.subjects`). Anything wrong with a message — not JSON,
a field that breaks a rule, an unknown field, a payload id that does not match the subject's token,
a ``schema_version`` newer than this code — raises :class:`MalformedMessageError`, whose message
names the subject, the field and the rule. The bus logs it and drops (terminates) the message:
retrying a malformed message can never succeed.

Decoding uses ``Model.model_validate_json``, which parses and validates in one pass inside
pydantic-core (no intermediate ``dict``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from schemas.base import ENVELOPE_FIELDS, SCHEMA_VERSION, Event, WireModel
from schemas.subjects import SUBJECTS, SubjectSpec, spec_for, token_value

__all__ = [
    "MAX_MESSAGE_BYTES",
    "Decoder",
    "FieldError",
    "MalformedMessageError",
    "UnsupportedSchemaVersionError",
    "decode",
    "decode_as",
    "decode_reply",
    "decoder_for",
    "encode",
]

MAX_MESSAGE_BYTES: Final = 8 * 1024 * 1024
"""Largest payload decoded. NATS's own ``max_payload`` (1 MiB by default) usually binds first."""
_MAX_LISTED_ERRORS: Final = 8
_ENVELOPE: Final = frozenset(ENVELOPE_FIELDS)

M = TypeVar("M", bound=WireModel)

_TOKEN_INDEX: Final[dict[str, int]] = {
    s.pattern: s.pattern.split(".").index("*") for s in SUBJECTS if s.token_field is not None
}


@dataclass(frozen=True, slots=True)
class FieldError:
    """One broken rule: the field's dotted path (``spec.command.0``), the rule and pydantic's text."""

    field: str
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule} ({self.message})"


class MalformedMessageError(ValueError):
    """A message that cannot be decoded into its subject's model. Never worth a retry."""

    def __init__(self, subject: str, model: str, errors: Sequence[FieldError]) -> None:
        self.subject = subject
        self.model = model
        self.errors: tuple[FieldError, ...] = tuple(errors)
        listed = "; ".join(map(str, self.errors[:_MAX_LISTED_ERRORS]))
        more = len(self.errors) - _MAX_LISTED_ERRORS
        if more > 0:
            listed += f"; and {more} more"
        super().__init__(f"malformed {model} on subject {subject!r}: {listed}")


class UnsupportedSchemaVersionError(MalformedMessageError):
    """A message written by a newer Roundhouse (``schema_version`` above :data:`SCHEMA_VERSION`)."""

    def __init__(self, subject: str, model: str, version: int) -> None:
        self.version = version
        rule = FieldError(
            "schema_version",
            "unsupported_schema_version",
            f"version {version} is newer than the {SCHEMA_VERSION} this process supports; "
            "upgrade roundhouse here, or make the publisher write the older version",
        )
        super().__init__(subject, model, [rule])


def encode(event: WireModel) -> bytes:
    """The compact JSON bytes of ``event`` (what ``model_dump_json()`` writes, without a str copy)."""
    return event.__pydantic_serializer__.to_json(event)


def _field(loc: tuple[int | str, ...]) -> str:
    return ".".join(map(str, loc)) if loc else "(message)"


def _field_errors(details: list[ErrorDetails]) -> list[FieldError]:
    return [FieldError(_field(d["loc"]), d["type"], d["msg"]) for d in details]


def _newer_version(details: list[ErrorDetails]) -> int | None:
    for d in details:
        if d["loc"] == ("schema_version",):
            given = d.get("input")
            if isinstance(given, int) and not isinstance(given, bool) and given > SCHEMA_VERSION:
                return given
    return None


def decode_as(model: type[M], data: bytes, *, subject: str = "") -> M:
    """Validate ``data`` as ``model``; ``subject`` only labels the error. See :func:`decode`."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise MalformedMessageError(
            subject,
            model.__name__,
            [FieldError("(message)", "message_too_large", f"{len(data)} bytes; at most {MAX_MESSAGE_BYTES}")],
        )
    try:
        # The validator directly: model_validate_json adds a Python-level call on the hot path.
        decoded: M = model.__pydantic_validator__.validate_json(data)
    except ValidationError as exc:
        details = exc.errors(include_url=False)
        version = _newer_version(details)
        if version is not None:
            raise UnsupportedSchemaVersionError(subject, model.__name__, version) from None
        raise MalformedMessageError(subject, model.__name__, _field_errors(details)) from None
    if isinstance(decoded, Event) and not decoded.__pydantic_fields_set__ >= _ENVELOPE:
        missing = [name for name in ENVELOPE_FIELDS if name not in decoded.model_fields_set]
        if missing:
            raise MalformedMessageError(
                subject,
                model.__name__,
                [
                    FieldError(name, "missing", "Field required in a message (the publisher sets it)")
                    for name in missing
                ],
            )
    return decoded


class Decoder:
    """Decodes the messages of one subject pattern; everything about the pattern is worked out once.

    ``skip_tokens`` is the number of leading subject tokens to ignore (a namespace prefix), so a
    subscriber can pass the subject exactly as it arrived. This is the receive path of every bus
    message: one validator call, one set comparison and, for ``<prefix>.*`` subjects, one split.
    """

    __slots__ = ("_token_field", "_token_index", "_validate", "model", "spec")

    def __init__(self, spec: SubjectSpec, *, skip_tokens: int = 0) -> None:
        self.spec = spec
        self.model = spec.model
        self._validate = spec.model.__pydantic_validator__.validate_json
        self._token_field = spec.token_field
        self._token_index = _TOKEN_INDEX[spec.pattern] + skip_tokens if spec.token_field is not None else -1

    def __call__(self, subject: str, data: bytes) -> Event:
        if len(data) > MAX_MESSAGE_BYTES:
            return decode_as(self.model, data, subject=subject)  # raises, with the size rule
        try:
            event: Event = self._validate(data)
        except ValidationError:
            return decode_as(self.model, data, subject=subject)  # raises, naming field and rule
        if not event.__pydantic_fields_set__ >= _ENVELOPE:
            return decode_as(self.model, data, subject=subject)  # raises, naming the missing field
        if self._token_index >= 0:
            token = subject.split(".", self._token_index + 1)[self._token_index]
            value = token_value(event, self._token_field)  # type: ignore[arg-type]  # set with the index
            if value != token:
                raise MalformedMessageError(
                    subject,
                    self.model.__name__,
                    [FieldError(str(self._token_field), "subject_token_mismatch",
                                f"payload has {value!r} but the subject names {token!r}")],
                )  # fmt: skip
        return event


@functools.lru_cache(maxsize=256)
def decoder_for(spec: SubjectSpec, *, skip_tokens: int = 0) -> Decoder:
    """The (shared) decoder of ``spec``'s subjects."""
    return Decoder(spec, skip_tokens=skip_tokens)


@functools.lru_cache(maxsize=16_384)
def _route(subject: str) -> Decoder:
    # Cached: a process sees few distinct subjects, and this is on every decoded message's path.
    return decoder_for(spec_for(subject))


def decode(subject: str, data: bytes) -> Event:
    """Decode a message received on ``subject`` into the model :func:`~schemas.subjects.spec_for` names.

    Raises :class:`~schemas.subjects.UnknownSubjectError` for a subject with no schema and
    :class:`MalformedMessageError` (or its subclass :class:`UnsupportedSchemaVersionError`) for a
    payload that is not a valid instance of the subject's model.
    """
    return _route(subject)(subject, data)


def decode_reply(subject: str, data: bytes) -> WireModel:
    """Decode the reply to a request sent on ``subject`` (e.g. a :class:`~schemas.leases.LeaseAck`)."""
    spec = spec_for(subject)
    if spec.reply_model is None:
        raise MalformedMessageError(
            subject,
            spec.model.__name__,
            [FieldError("(message)", "no_reply_expected", f"{spec.pattern} is not a request-reply subject")],
        )
    return decode_as(spec.reply_model, data, subject=subject)
