"""Blox's starvation promotion, shared by the policies that reproduce Blox's (``las``, ``srtf``,
``optimus``).

Blox's manager (``blox_manager.py``, ``priority_thresh``) gives a job that has waited for 3600 x
1000 s priority over every job that has not, for good; every Blox policy sorts by that priority
first (``job_priority``), then by its own key. Here the promotion is a policy option, never a
constant of the loop: ``starvation_s`` (None disables it). Blox counts the wait in whole rounds,
from the round after the suspension; we count it continuously from the suspension.
"""

from __future__ import annotations

import math

from services.core.state import JobState, JobStatus

BLOX_STARVATION_S = 3600.0 * 1000.0
"""Blox's ``priority_thresh``: a job waiting this long gets priority over all others."""

_QUEUED = JobStatus.QUEUED


def check_starvation_s(value: float | None) -> None:
    """Refuse a non-positive limit (None disables the promotion)."""
    if value is not None and not value > 0:
        raise ValueError(f"starvation_s must be positive or None, got {value}")


def starved(job: JobState, now: float, limit: float | None) -> bool:
    """Whether ``job`` has ever waited ``limit`` seconds in one stretch (sticky, as in Blox)."""
    if limit is None:
        return False
    if job.longest_wait_s >= limit:
        return True
    since = job.queued_since
    return since is not None and job.status is _QUEUED and now - since >= limit


def starvation_due(job: JobState, now: float, limit: float | None) -> float:
    """When a waiting job's promotion comes due (``math.inf`` if never, or if it is promoted
    already): the moment a sort key that starts with ``starved`` changes by itself."""
    since = job.queued_since
    if limit is None or since is None or job.longest_wait_s >= limit:
        return math.inf
    if job.status is _QUEUED and now - since >= limit:
        return math.inf
    return since + limit
