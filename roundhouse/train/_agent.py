"""Whether the worker agent that started this process still runs: the client's own check.

The lease's watchdog normally tells the client first (the channel's ``state`` becomes ``orphaned``
the moment the agent dies); this check covers a watchdog that is gone too. It follows the agent
process itself: a pidfd on ``ROUNDHOUSE_AGENT_PID`` (Linux 5.3+; it refers to that process, never to
a later one with the same pid), else, when the agent is this process's parent, a change of parent.
Called a few times a second from the iteration loop, never per iteration.
"""

from __future__ import annotations

import contextlib
import os
import select

__all__ = ["AgentWatch"]


class AgentWatch:
    """Polls for the end of the agent process (see the module doc); ``gone()`` costs one syscall."""

    def __init__(self, agent_pid: int | None) -> None:
        self._pid = agent_pid if agent_pid is not None else os.getppid()
        self._parent = os.getppid() == self._pid
        self._poll: select.poll | None = None
        self._fd: int | None = None
        self._gone = False
        if agent_pid is not None and hasattr(os, "pidfd_open"):
            try:
                self._fd = os.pidfd_open(agent_pid)
            except ProcessLookupError:
                self._gone = True  # it died before we looked
            except OSError:
                self._fd = None  # no pidfd on this kernel: the parent check, if it applies
            else:
                self._poll = select.poll()
                self._poll.register(self._fd, select.POLLIN)

    @property
    def watching(self) -> bool:
        """Whether this check can tell at all (a pidfd, or the agent is the parent)."""
        return self._gone or self._poll is not None or self._parent

    def gone(self) -> bool:
        """True once the agent process has ended (and from then on)."""
        if self._gone:
            return True
        if self._poll is not None:
            self._gone = bool(self._poll.poll(0))
        elif self._parent:
            self._gone = os.getppid() != self._pid
        return self._gone

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
            self._poll = None
