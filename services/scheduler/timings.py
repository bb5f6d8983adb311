"""How long each phase of a round took (``stats()``, ``benchmarks/round.py``).

Measured with ``time.perf_counter`` and ``time.process_time``, not the service's clock: these
report what the process really spent, whatever clock its decisions run on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RoundTimings:
    """Seconds spent in each phase of the last round (the benchmark prints these)."""

    round: int = 0
    snapshot: float = 0.0
    rank: float = 0.0
    encode: float = 0.0
    """Building the round's snapshot message (a delta against what placement holds)."""
    publish: float = 0.0
    placement: float = 0.0
    apply: float = 0.0
    revoke: float = 0.0
    """Part of ``apply``: marking leases revoking and sending the revokes."""
    wait: float = 0.0
    """Part of ``apply``: waiting for ``job.suspended`` (or the deadlines)."""
    grant: float = 0.0
    """Part of ``apply``: recording the new leases (their grants are sent after the round)."""
    cpu: float = 0.0
    """CPU seconds this process spent during the round (steadier than wall time on a busy host)."""
    grants_acked: float = 0.0
    """After the round: from the start of sending its grants until every one was answered."""
    launched: int = 0
    suspended: int = 0
    dropped: int = 0

    def as_dict(self) -> dict[str, float]:
        names = ("round", "snapshot", "rank", "encode", "publish", "placement", "apply", "revoke", "wait", "grant",
                 "cpu", "grants_acked", "launched", "suspended", "dropped")  # fmt: skip
        return {k: getattr(self, k) for k in names}
