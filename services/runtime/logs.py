"""Structured logging: one JSON object per line (or plain text for people at a terminal).

A JSON line carries ``ts`` (ISO 8601, UTC, microseconds, ``Z``), ``level``, ``logger``, ``msg``, the
process's static fields (``service``, ``instance``; a worker's ``node_id``), anything passed with
``extra=``, and the ids of what the line is about: ``job_id``, ``lease_id`` and ``node_id``, so that
``journalctl -o json``, Loki or any shipper can select one job's lines (docs/operations.md, "Logs").

Those ids come from the message being handled: the bus binds them (:func:`bind_ids`) from each
decoded event's ``job_id``, ``lease_id`` and ``node_id`` around its handler, and tasks the handler
starts inherit them (``contextvars``). ``extra={"job_id": ...}`` on a call names them explicitly
and wins. A line about nothing in particular has none of these keys.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "ID_FIELDS",
    "JsonFormatter",
    "TextFormatter",
    "bind_ids",
    "bound_ids",
    "configure_logging",
    "iso_timestamp",
    "parse_timestamp",
    "reset_ids",
]

# Attributes every LogRecord has; anything else was passed with ``extra=`` and is emitted as a field.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

ID_FIELDS = ("job_id", "lease_id", "node_id")
"""The ids a line may be about, in the order they are written."""

_IDS: contextvars.ContextVar[tuple[str | None, str | None, str | None] | None] = contextvars.ContextVar(
    "roundhouse_log_ids", default=None
)


def bind_ids(event: object) -> contextvars.Token[tuple[str | None, str | None, str | None] | None] | None:
    """Bind ``event``'s ``job_id``, ``lease_id`` and ``node_id`` (those it has) to the lines logged
    until :func:`reset_ids` with the returned token; None (nothing to reset) if it has none.

    Called by the bus around every handler, so it is kept to a dict look-up of which id fields the
    event's class has (a missing attribute of a pydantic model costs an exception), their reads and
    one context-variable set: about a microsecond per message."""
    cls = type(event)
    fields = _ID_FIELDS_OF.get(cls)
    if fields is None:
        fields = _ID_FIELDS_OF[cls] = _id_fields(cls)
    if not fields:
        return None
    job = lease = node = None
    for name in fields:
        value = getattr(event, name, None)
        if value is None:
            continue
        if name == "job_id":
            job = str(value)
        elif name == "lease_id":
            lease = str(value)
        else:
            node = str(value)
    if job is None and lease is None and node is None:
        return None
    return _IDS.set((job, lease, node))


_ID_FIELDS_OF: dict[type, tuple[str, ...]] = {}


def _id_fields(cls: type) -> tuple[str, ...]:
    """The id fields to read from instances of ``cls``: a pydantic model's declared ones; for any
    other class all three (read with a default)."""
    declared = getattr(cls, "model_fields", None)
    if isinstance(declared, dict):
        return tuple(name for name in ID_FIELDS if name in declared)
    return ID_FIELDS


def reset_ids(token: contextvars.Token[tuple[str | None, str | None, str | None] | None] | None) -> None:
    if token is not None:
        _IDS.reset(token)


def bound_ids() -> dict[str, str]:
    """The ids bound now (:func:`bind_ids`), by field name."""
    ids = _IDS.get()
    if ids is None:
        return {}
    return {name: value for name, value in zip(ID_FIELDS, ids, strict=True) if value is not None}


def iso_timestamp(created: float) -> str:
    """``created`` (seconds since the epoch) as ISO 8601 in UTC: ``2025-06-01T12:00:00.123456Z``."""
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(value: object) -> float:
    """Seconds since the epoch from a log line's ``ts``: ISO 8601 (this format), or the number that
    lines written before issue 15 carried."""
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"not a log timestamp: {value!r}")
    try:
        return float(value)
    except ValueError:
        pass
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


class JsonFormatter(logging.Formatter):
    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = static or {}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": iso_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **self.static,
        }
        ids = _IDS.get()
        if ids is not None:
            for name, value in zip(ID_FIELDS, ids, strict=True):
                if value is not None:
                    entry[name] = value
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``2025-06-01T12:00:00.123Z INFO    logger: message [job_id=... lease_id=...]`` (UTC)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
        self.converter = time.gmtime

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return f"{super().formatTime(record, datefmt)}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = {**bound_ids(), **{k: str(v) for k in ID_FIELDS if (v := record.__dict__.get(k)) is not None}}
        if not ids:
            return line
        first, newline, rest = line.partition("\n")  # after the message, before any traceback
        return f"{first} [{' '.join(f'{k}={v}' for k, v in ids.items())}]{newline}{rest}"


def configure_logging(*, level: str = "INFO", fmt: str = "json", **static: Any) -> None:
    """Log to stderr; ``static`` fields (service, instance, a worker's node_id) are added to every
    JSON line; None values are left out."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter({k: v for k, v in static.items() if v is not None}))
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # nats-py logs every reconnect attempt at ERROR; ours already say what happened.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
