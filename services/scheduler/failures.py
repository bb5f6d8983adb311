"""What a failed job tells its owner: the worker's ``job.failed`` as the stored reason (issue 14).

``roundhouse jobs`` shows it and ``--json`` carries it (``reason``, ``exit_code``, ``signal``): the
exit code or the signal, the node, and the last lines of the rank's output (the worker's stderr
tail), or the launch error. Pure functions: the scheduler writes the result with the final status.
"""

from __future__ import annotations

import signal as signals

from schemas.fields import MAX_REASON_CHARS
from schemas.jobs import FailureReason, JobFailed
from services.runtime.store import JobChanges

__all__ = ["failure_changes", "failure_reason"]

_ELLIPSIS = "…"


def _signal(number: int) -> str:
    """``signal 9 (SIGKILL)``; a number this platform does not name, as a number."""
    try:
        return f"signal {number} ({signals.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _headline(event: JobFailed) -> str:
    reason = event.reason
    if reason is FailureReason.EXIT_CODE:
        head = f"exit code {event.exit_code}"
    elif reason is FailureReason.SIGNAL and event.signal is not None:
        head = f"killed by {_signal(event.signal)}"
    elif reason is FailureReason.LAUNCH_ERROR:
        head = "launch error"
    else:
        head = reason.value.replace("_", " ")
    return f"{head} on {event.node_id}"


def failure_reason(event: JobFailed, limit: int = MAX_REASON_CHARS) -> str:
    """``exit code 3 on gpu-1: rank 0 exited with 3: <last lines of its output>``, at most
    ``limit`` characters: the headline whole, then as much of the message's *end* as fits (the
    last lines of a traceback say the most)."""
    head = _headline(event)
    message = event.message.strip()
    if not message:
        return head[:limit]
    room = limit - len(head) - 2
    if room <= len(_ELLIPSIS):
        return head[:limit]
    if len(message) > room:
        message = _ELLIPSIS + message[-(room - len(_ELLIPSIS)) :]
    return f"{head}: {message}"


def failure_changes(event: JobFailed) -> JobChanges:
    """The columns a failure writes with its final status."""
    return {"reason": failure_reason(event), "exit_code": event.exit_code, "signal": event.signal}
