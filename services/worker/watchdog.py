"""The lease watchdog: one small process per lease that stops the lease's job when its agent is gone.

Why a process of its own: the job's processes run in their own sessions (so a signal reaches a
whole rank, DataLoader workers included), and nothing else ends them when the agent dies (SIGKILL,
OOM, a crash). ``PR_SET_PDEATHSIG`` would reach only the direct child, with one signal and no grace
period for a checkpoint. The watchdog holds the read end of a pipe whose write end only the agent
holds (the descriptor is close-on-exec: no job process inherits it), so the kernel tells it the
moment the agent dies: ``read`` returns end-of-file. It also counts the agent gone when the agent's
keepalives (one line every ``min(heartbeat_s, lease_ttl_s / 8)``) stop for half the lease TTL: a
stopped or hung agent no longer heartbeats either, and the scheduler runs the job elsewhere after
the TTL just the same. It then stops the lease (:func:`services.worker.orphans.stop_orphaned`):
``orphaned`` on every channel (:mod:`roundhouse.train` stops at its next iteration boundary, rank 0
after a checkpoint), the grace period, SIGTERM, SIGKILL, all within the budget that ends before the
scheduler may reassign, and writes what happened to ``<lease dir>/orphaned.json``.

The pipe carries lines from the agent: ``l <ranks> <grace_s> <lease dir>`` (its lease: the agent
keeps one spare watchdog started, :class:`WatchdogPool`, so that a launch does not wait for a Python
process to start), ``g <pgid>`` (a rank's process group), ``k`` (keepalive), ``q`` (the lease ended
normally, or the spare is not needed: exit). Run as ``python -m services.worker.watchdog``; the
agent side is :class:`Watchdog`. Standard library and the channel only: it starts in tens of ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import select
import sys
import time
from pathlib import Path
from typing import Final

from services.worker.orphans import SILENT_FRACTION, budget, stop_orphaned

__all__ = ["PID_NAME", "RECORD_NAME", "Watchdog", "WatchdogPool", "keepalive_period", "main", "write_record"]

log = logging.getLogger("roundhouse.watchdog")

RECORD_NAME: Final = "orphaned.json"
"""Written to the lease directory once the watchdog stopped an orphaned lease."""
PID_NAME: Final = "watchdog.pid"
"""The lease's watchdog's pid, in the lease directory once it has its lease."""

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def keepalive_period(lease_ttl_s: float, heartbeat_s: float) -> float:
    """How often the agent writes a keepalive line (several per silence threshold)."""
    return min(heartbeat_s, lease_ttl_s / 8)


def write_record(lease_dir: Path, record: dict[str, object]) -> None:
    """Atomically (temp file, rename) write ``record`` as ``<lease_dir>/orphaned.json``."""
    _write_atomically(lease_dir / RECORD_NAME, json.dumps(record, sort_keys=True))


# --- the watchdog process ------------------------------------------------------------------------------
class _Lines:
    """Lines from the agent's pipe, with a timeout."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pending = b""
        self._lines: list[bytes] = []

    def next(self, timeout: float | None) -> bytes | bool | None:
        """The next line; None at end-of-file (the agent is gone); False when ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._lines:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return False
            readable, _, _ = select.select([self.fd], [], [], wait)
            if not readable:
                continue
            try:
                data = os.read(self.fd, 4096)
            except InterruptedError:
                continue
            if not data:
                return None
            *lines, self._pending = (self._pending + data).split(b"\n")
            self._lines.extend(lines)
        return self._lines.pop(0)


def _watch(lines: _Lines, silent_s: float, groups: set[int]) -> str | None:
    """Follow the agent's lines until it is gone; the reason (``agent_died``/``agent_silent``), or None on ``q``."""
    while True:
        line = lines.next(silent_s)
        if line is None:
            return "agent_died"
        if line is False:
            return "agent_silent"
        if line == b"q":
            return None
        if isinstance(line, bytes) and line.startswith(b"g "):
            with contextlib.suppress(ValueError):
                groups.add(int(line[2:]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.worker.watchdog",
                                     description="Stop a lease's job when its worker agent is gone.")  # fmt: skip
    parser.add_argument("--lease-ttl-s", type=float, required=True)
    parser.add_argument("--heartbeat-s", type=float, required=True)
    parser.add_argument("--kill-after-s", type=float, required=True)
    args = parser.parse_args(argv)
    lines = _Lines(sys.stdin.fileno())
    # A spare until the agent gives it a lease: "l <local ranks> <grace_s> <lease dir>".
    first = lines.next(None)
    if not isinstance(first, bytes) or not first.startswith(b"l "):
        return 0  # the agent exited (or is gone) before it needed this one
    raw_ranks, raw_grace, raw_dir = first[2:].decode().split(" ", 2)
    ranks, grace_s, lease_dir = int(raw_ranks), float(raw_grace), Path(raw_dir)
    logging.basicConfig(level=logging.INFO, filename=str(lease_dir / "watchdog.log"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")  # fmt: skip
    with contextlib.suppress(OSError):
        _write_atomically(lease_dir / PID_NAME, str(os.getpid()))
    channels = [lease_dir / f"rank-{i}.chan" for i in range(ranks)]
    groups: set[int] = set()
    reason = _watch(lines, SILENT_FRACTION * args.lease_ttl_s, groups)
    if reason is None:
        return 0
    detected = time.time()
    orphan_budget = budget(lease_ttl_s=args.lease_ttl_s, heartbeat_s=args.heartbeat_s,
                           kill_after_s=args.kill_after_s, grace_period_s=grace_s,
                           silent=reason == "agent_silent")  # fmt: skip
    log.warning("%s: the worker agent is gone (%s); stopping the lease's job within %.2f s (grace %.2f s)",
                lease_dir.name, reason, orphan_budget.total_s, orphan_budget.grace_s)  # fmt: skip
    outcome = stop_orphaned(channels, groups, orphan_budget)
    log.warning("%s: the job %s after %.2f s%s", lease_dir.name, outcome.how, outcome.seconds,
                f"; still there: {list(outcome.left)}" if outcome.left else "")  # fmt: skip
    with contextlib.suppress(OSError):
        write_record(lease_dir, {"by": "watchdog", "reason": reason, "detected_at": detected, "how": outcome.how,
                                 "seconds": round(outcome.seconds, 4), "left": list(outcome.left),
                                 "budget_s": orphan_budget.total_s})  # fmt: skip
    return 0


# --- the agent's side ----------------------------------------------------------------------------------
class Watchdog:
    """The agent's handle on one watchdog process (see the module doc)."""

    def __init__(self, process: asyncio.subprocess.Process, fd: int) -> None:
        self.process = process
        self._fd: int | None = fd

    @classmethod
    async def spawn(cls, log_path: Path, *, lease_ttl_s: float, heartbeat_s: float, kill_after_s: float) -> Watchdog:
        """Start a spare watchdog (no lease yet: :meth:`assign`); ``log_path`` takes what it says before."""
        read_end, write_end = os.pipe()  # both close-on-exec: only the watchdog gets the read end, as stdin
        env = {k: v for k, v in os.environ.items() if k != "ROUNDHOUSE_CHANNEL"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
        try:
            with log_path.open("ab") as out:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "services.worker.watchdog", "--lease-ttl-s", repr(lease_ttl_s),
                    "--heartbeat-s", repr(heartbeat_s), "--kill-after-s", repr(kill_after_s),
                    stdin=read_end, stdout=out, stderr=out, env=env, start_new_session=True,
                )  # fmt: skip
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)
        return cls(process, write_end)

    @property
    def alive(self) -> bool:
        return self._fd is not None and self.process.returncode is None

    def _send(self, line: bytes, *, warn: bool = True) -> bool:
        if self._fd is None:
            return False
        try:
            os.write(self._fd, line)
        except BlockingIOError:
            return False  # a full pipe: the watchdog has 64 KiB of our lines unread; the next one will do
        except OSError:  # BrokenPipeError: the watchdog is gone
            if warn:
                log.warning("watchdog %d is gone (see watchdog.log in its lease's directory); its job, if it "
                            "uses roundhouse.train, still stops on its own should this agent die",
                            self.process.pid)  # fmt: skip
            self._close()
            return False
        return True

    def assign(self, lease_dir: Path, ranks: int, grace_s: float) -> bool:
        """Give the watchdog its lease (files in ``lease_dir``, ``ranks`` local ranks); False if it is gone."""
        return self._send(f"l {ranks} {grace_s!r} {lease_dir}\n".encode(), warn=False)

    def watch(self, group: int) -> None:
        """Tell the watchdog a rank's process group (a process that clears its environment is still found)."""
        self._send(f"g {group}\n".encode())

    def keepalive(self) -> None:
        self._send(b"k\n")

    def release(self) -> None:
        """The lease ended normally (every process exited), or the spare is not needed: it exits."""
        self._send(b"q\n", warn=False)  # one that stopped its job (this agent was silent) has exited
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    async def wait(self) -> int:
        return await self.process.wait()


class WatchdogPool:
    """Keeps one spare watchdog started, so a launch only hands it the lease (a line on its pipe)
    instead of waiting for a Python process to start (~10 ms on the grant-to-running path)."""

    def __init__(self, work_dir: Path, *, lease_ttl_s: float, heartbeat_s: float, kill_after_s: float) -> None:
        self._log = work_dir / "watchdog.log"
        self._timing = {"lease_ttl_s": lease_ttl_s, "heartbeat_s": heartbeat_s, "kill_after_s": kill_after_s}
        self._spare: Watchdog | None = None
        self._lock = asyncio.Lock()

    async def fill(self) -> None:
        """Start a spare unless one is ready."""
        async with self._lock:
            if self._spare is None or not self._spare.alive:
                self._spare = await Watchdog.spawn(self._log, **self._timing)

    async def take(self, lease_dir: Path, ranks: int, grace_s: float) -> Watchdog:
        """A watchdog for the lease in ``lease_dir`` (which exists): the spare, or a new one."""
        spare, self._spare = self._spare, None
        if spare is not None and spare.assign(lease_dir, ranks, grace_s):
            return spare
        fresh = await Watchdog.spawn(self._log, **self._timing)
        if not fresh.assign(lease_dir, ranks, grace_s):
            raise OSError(f"the watchdog for {lease_dir.name} exited at once; see {self._log}")
        return fresh

    def close(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.release()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
