"""Identifiers that travel inside NATS subjects, and therefore must be valid subject tokens.

A NATS subject is a dot-separated list of tokens; a token must not contain whitespace, ``.``,
``*`` or ``>``. Roundhouse is stricter than NATS and allows only ASCII letters, digits, ``_`` and
``-`` (starting with a letter or digit), so an id is also safe in a file name, a log line, a
Prometheus label and a shell variable. Every id a model carries is validated with these types, so
an id that reaches :func:`schemas.subjects.lease_grant` or ``metrics.job.<id>`` is always a token.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import StringConstraints

MAX_ID_CHARS: Final = 64
TOKEN_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
_TOKEN = re.compile(TOKEN_PATTERN)

JobId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=TOKEN_PATTERN)]
"""A job's id, assigned by the submitter (e.g. a uuid4 hex or ``<user>-<n>``); a subject token."""

NodeId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=TOKEN_PATTERN)]
"""A worker node's id (stable across agent restarts, usually the short hostname); a subject token."""

InstanceId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=TOKEN_PATTERN)]
"""A service instance as a subject token (a placement instance's ``schedule.round.<instance>``)."""

LeaseId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=TOKEN_PATTERN)]
"""A lease's id, assigned by the scheduler; unique per grant (a re-launch gets a new lease)."""


def is_token(value: str) -> bool:
    """Whether ``value`` is a valid id/subject token under Roundhouse's rule (see module doc)."""
    return len(value) <= MAX_ID_CHARS and _TOKEN.match(value) is not None
