"""When to ask a node the leader does not know to register again (issue 18).

A leader whose store lacks a live node's registration (restored from an older backup, a lost
``node.register``) drops that node's heartbeats, so the node's GPUs are never offered. It asks the
node to register again (``node.reregister.<node>``), but at most once per node per ``interval_s``:
heartbeats come every few seconds, and a late heartbeat of an old incarnation must not start a storm
of asks and registrations. Pure: the caller passes the clock.
"""

from __future__ import annotations

from typing import Final

MIN_INTERVAL_S: Final = 1.0
"""Floor of the interval: ``reconcile_grace_s`` may be 0, which must not mean an ask per heartbeat."""
MAX_REMEMBERED: Final = 4096
"""Nodes remembered at once; past that, entries older than the interval are forgotten (they allow an ask anyway)."""


class ReregisterLimiter:
    """At most one re-register ask per node per ``interval_s``."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = max(interval_s, MIN_INTERVAL_S)
        self._asked: dict[str, float] = {}
        """node id -> monotonic time of the last ask."""

    def allow(self, node_id: str, now: float) -> bool:
        """Whether to ask ``node_id`` now; an allowed ask is remembered."""
        last = self._asked.get(node_id)
        if last is not None and now - last < self.interval_s:
            return False
        if len(self._asked) >= MAX_REMEMBERED:
            self._forget_before(now - self.interval_s)
        self._asked[node_id] = now
        return True

    def _forget_before(self, cutoff: float) -> None:
        self._asked = {node: at for node, at in self._asked.items() if at > cutoff}

    def __len__(self) -> int:
        return len(self._asked)
