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

The pipe carries lines from the agent: ``g <pgid>`` (a rank's process group), ``k`` (keepalive),
``q`` (the lease ended normally: exit). Run as ``python -m services.worker.watchdog``; the agent
side is :class:`Watchdog`. Standard library and the channel only: it starts in tens of milliseconds.
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

__all__ = ["RECORD_NAME", "Watchdog", "keepalive_period", "main"]

log = logging.getLogger("roundhouse.watchdog")

RECORD_NAME: Final = "orphaned.json"
"""Written to the lease directory once the watchdog (or a restarted agent) stopped an orphaned lease."""

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def keepalive_period(lease_ttl_s: float, heartbeat_s: float) -> float:
    """How often the agent writes a keepalive line (several per silence threshold)."""
    return min(heartbeat_s, lease_ttl_s / 8)


def write_record(lease_dir: Path, record: dict[str, object]) -> None:
    """Atomically (temp file, rename) write ``record`` as ``<lease_dir>/orphaned.json``."""
    path = lease_dir / RECORD_NAME
    tmp = path.with_name(f".{RECORD_NAME}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(record, sort_keys=True))
    os.replace(tmp, path)


# --- the watchdog process ------------------------------------------------------------------------------
def _watch(fd: int, silent_s: float, groups: set[int]) -> str | None:
    """Read the agent's lines until it is gone; the reason (``agent_died``/``agent_silent``), or None on ``q``."""
    last = time.monotonic()
    pending = b""
    while True:
        timeout = last + silent_s - time.monotonic()
        if timeout <= 0:
            return "agent_silent"
        readable, _, _ = select.select([fd], [], [], timeout)
        if not readable:
            continue  # the loop re-checks the silence
        try:
            data = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not data:
            return "agent_died"
        last = time.monotonic()
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line == b"q":
                return None
            if line.startswith(b"g "):
                with contextlib.suppress(ValueError):
                    groups.add(int(line[2:]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.worker.watchdog",
                                     description="Stop a lease's job when its worker agent is gone.")  # fmt: skip
    parser.add_argument("--lease-dir", type=Path, required=True)
    parser.add_argument("--ranks", type=int, required=True, help="local ranks (rank-N.chan files)")
    parser.add_argument("--lease-ttl-s", type=float, required=True)
    parser.add_argument("--heartbeat-s", type=float, required=True)
    parser.add_argument("--kill-after-s", type=float, required=True)
    parser.add_argument("--grace-s", type=float, required=True, help="the job's grace period (spec)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    lease_dir: Path = args.lease_dir
    channels = [lease_dir / f"rank-{i}.chan" for i in range(args.ranks)]
    groups: set[int] = set()
    reason = _watch(sys.stdin.fileno(), SILENT_FRACTION * args.lease_ttl_s, groups)
    if reason is None:
        return 0
    detected = time.time()
    orphan_budget = budget(lease_ttl_s=args.lease_ttl_s, heartbeat_s=args.heartbeat_s,
                           kill_after_s=args.kill_after_s, grace_period_s=args.grace_s,
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
    """The agent's handle on one lease's watchdog process (see the module doc)."""

    def __init__(self, process: asyncio.subprocess.Process, fd: int) -> None:
        self.process = process
        self._fd: int | None = fd

    @classmethod
    async def start(
        cls, lease_dir: Path, ranks: int, *, lease_ttl_s: float, heartbeat_s: float, kill_after_s: float,
        grace_s: float,
    ) -> Watchdog:  # fmt: skip
        """Start the watchdog of the lease whose files are in ``lease_dir`` (exists; before its processes)."""
        read_end, write_end = os.pipe()  # both close-on-exec: only the watchdog gets the read end, as stdin
        env = {k: v for k, v in os.environ.items() if k != "ROUNDHOUSE_CHANNEL"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
        try:
            with (lease_dir / "watchdog.log").open("ab") as out:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "services.worker.watchdog", "--lease-dir", str(lease_dir),
                    "--ranks", str(ranks), "--lease-ttl-s", repr(lease_ttl_s), "--heartbeat-s", repr(heartbeat_s),
                    "--kill-after-s", repr(kill_after_s), "--grace-s", repr(grace_s),
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

    def _send(self, line: bytes) -> bool:
        if self._fd is None:
            return False
        try:
            os.write(self._fd, line)
        except BlockingIOError:
            return False  # a full pipe: the watchdog has 64 KiB of our lines unread; the next one will do
        except OSError:  # BrokenPipeError: the watchdog is gone
            log.warning("the watchdog (pid %d) is gone; jobs that use roundhouse.train still stop on their own",
                        self.process.pid)
            self._close()
            return False
        return True

    def watch(self, group: int) -> None:
        """Tell the watchdog a rank's process group (a process that clears its environment is still found)."""
        self._send(f"g {group}\n".encode())

    def keepalive(self) -> None:
        self._send(b"k\n")

    def release(self) -> None:
        """The lease ended normally (every process exited): the watchdog exits."""
        self._send(b"q\n")
        self._close()

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    async def wait(self) -> int:
        return await self.process.wait()


if __name__ == "__main__":
    sys.exit(main())
