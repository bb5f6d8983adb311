"""Constrained field types shared by the wire models: every user-reachable value has a bound.

Custom checks raise :class:`pydantic_core.PydanticCustomError` with a short snake_case *type* (the
rule, e.g. ``duplicate_items``) so a rejection names both the field (pydantic's ``loc``) and the
rule, the same way built-in constraints do (``string_too_long``, ``greater_than_equal``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Hashable, Sequence
from typing import Annotated, Final, TypeVar

from pydantic import AfterValidator, Field, StringConstraints
from pydantic_core import PydanticCustomError

MAX_GPUS_PER_NODE: Final = 64
"""Bound on GPUs in one node's inventory (NVML reports at most a few dozen)."""
MAX_REASON_CHARS: Final = 1024
MAX_MESSAGE_CHARS: Final = 4096
MAX_PATH_CHARS: Final = 4096
MAX_LABELS: Final = 64
MAX_LABEL_CHARS: Final = 256

_NO_NUL: Final = r"^[^\x00]*$"
_NO_CONTROL: Final = r"^[^\x00-\x1f\x7f]*$"

Reason = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REASON_CHARS, pattern=_NO_NUL)]
"""Why something happened, for a human (a log line, ``roundhouse status``)."""

Message = Annotated[str, StringConstraints(max_length=MAX_MESSAGE_CHARS, pattern=_NO_NUL)]
"""Free text such as the tail of a failed process's stderr; may be empty."""

Path = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH_CHARS, pattern=_NO_NUL)]
"""A file path or URI (``/ckpt/job-1/000120.pt``, ``s3://bucket/job-1/000120``)."""

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=_NO_CONTROL)]
"""A one-line name such as a GPU product name, a driver version or a policy name."""

LabelKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([A-Za-z0-9_./-]*[A-Za-z0-9])?$"),
]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_CHARS, pattern=_NO_CONTROL)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)]
"""Small key-value metadata (rack, zone, instance type), bounded in count and size."""

GpuIndex = Annotated[int, Field(ge=0, lt=MAX_GPUS_PER_NODE)]
"""A GPU's index inside its node, as NVML numbers it (``CUDA_VISIBLE_DEVICES`` order)."""

Epoch = Annotated[int, Field(ge=0, le=2**53)]
"""A scheduler leadership term (the fencing epoch); 2**53 keeps it exact in JavaScript too."""

Counter = Annotated[int, Field(ge=0, le=2**53)]
"""A non-negative count or sequence number, exact in every JSON implementation."""

Iteration = Annotated[int, Field(ge=0, le=10**12)]
"""A training iteration (step) number; 0 means none done yet."""

Seconds = Annotated[float, Field(ge=0, le=10**9)]
"""A non-negative duration in seconds (about 31 years at most)."""

_HOST_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^{_HOST_LABEL}(\.{_HOST_LABEL})*\.?$")


def _check_host(value: str) -> str:
    # The regex first: it accepts every host name and IPv4 address cheaply; only what it refuses
    # (IPv6, or garbage) pays for ipaddress's exception-driven parsing.
    if len(value) <= 253 and _HOSTNAME.match(value):
        return value
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise PydanticCustomError(
            "invalid_host",
            "'{value}' is neither an IP address nor an RFC 1123 host name",
            {"value": value[:80]},
        ) from None
    return value


Host = Annotated[str, StringConstraints(min_length=1, max_length=253), AfterValidator(_check_host)]
"""A host name (RFC 1123) or an IPv4/IPv6 address."""

S = TypeVar("S", bound=Sequence[Hashable])


def unique(items: S) -> S:
    """Reject a list that names the same item twice (a GPU granted twice, a job ranked twice)."""
    seen: set[Hashable] = set()
    for i, item in enumerate(items):
        if item in seen:
            raise PydanticCustomError(
                "duplicate_items", "item {index} ({item}) repeats an earlier item", {"index": i, "item": item}
            )
        seen.add(item)
    return items


GpuIndices = Annotated[
    list[GpuIndex], Field(min_length=1, max_length=MAX_GPUS_PER_NODE), AfterValidator(unique)
]
"""Distinct local GPU indices on one node (at least one)."""

PolicyName = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
"""A registered policy name (``fifo``, ``las``, ``fitgpp``), as services report who decided."""
