"""`roundhouse logs JOB [-f] [--rank N] [--run K]`: a job's output, across its runs and nodes.

The scheduler answers (``query.logs.<you>``, only for the job's owner or an operator) and fetches
each chunk from the node that ran it (``services/scheduler/logs_query.py``). Runs come in order
(run 1 is the first lease, a resumed job's next run is run 2, ...), ranks in order within a run
(rank 0 first). With more than one run or rank shown, each line is prefixed with ``[run K rank N]``
(as ``kubectl logs --prefix``). ``--run -1`` is the latest run.

``-f`` prints what there is, then keeps polling the selected ranks of the current run, and of the
runs that follow if the job is preempted and resumed (unless ``--run`` pins one), until the job ends
(exit 0) or Ctrl-C. A run whose node is gone is reported as unavailable, naming the node, on stderr
(without ``-f`` the exit code is then 1: the rest was printed, but the output is incomplete).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from roundhouse.commands.common import cluster_command
from roundhouse.commands.statuses import FINAL

if TYPE_CHECKING:
    from roundhouse.client import Client
    from schemas.logs import LogRun, LogsQuery, LogsReply

POLL_S = 0.5
"""How often ``-f`` asks for more output once it has caught up."""
REQUEST_TIMEOUT_S = 5.0
"""How long one request waits for the scheduler (which waits at most 2 s for a node)."""


class LogsError(Exception):
    """Ends the command with this message (exit 1)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    description = ("Print a job's output, fetched from the nodes that ran it: every run in order, rank 0 first. "
                   "Only the job's owner or an operator may read it.")  # fmt: skip
    with cluster_command(subparsers, "logs", run, description) as parser:
        parser.add_argument("job_id", metavar="JOB")
        parser.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
        parser.add_argument("--rank", type=int, metavar="N", help="only this global rank (default: all ranks)")
        parser.add_argument("--run", type=int, metavar="K", help="only run K (1-based; -1: the latest; default: all)")


# --- what to show ---------------------------------------------------------------------------------
def select_runs(runs: list[LogRun], run: int | None) -> list[LogRun]:
    """The runs ``--run`` names: all of them (None), the K-th (1-based) or, counting back, -1 the latest."""
    if run is None:
        return list(runs)
    if not runs:
        return []
    index = run - 1 if run > 0 else len(runs) + run
    if run == 0 or not 0 <= index < len(runs):
        raise LogsError(f"--run {run}: the job has {len(runs)} run{'s' if len(runs) != 1 else ''} (1..{len(runs)}, "
                        "or -1 for the latest)")  # fmt: skip
    return [runs[index]]


def streams(runs: Iterable[LogRun], rank: int | None) -> list[tuple[int, int]]:
    """``(run, rank)`` pairs to print, runs in order, ranks ascending (rank 0 first)."""
    return [(r.run, k) for r in runs for k in sorted(r.ranks) if rank is None or k == rank]


@dataclass(slots=True)
class Printer:
    """Writes chunks of several streams, each line prefixed with its stream when ``prefix``; a line
    split across chunks is held until it is complete (or the stream is flushed)."""

    out: TextIO
    prefix: bool
    partial: dict[tuple[int, int], str] = field(default_factory=dict)

    def write(self, stream: tuple[int, int], text: str) -> None:
        if not self.prefix:
            self.out.write(text)
            self.out.flush()
            return
        text = self.partial.pop(stream, "") + text
        lines = text.split("\n")
        self.partial[stream] = lines.pop()
        tag = f"[run {stream[0]} rank {stream[1]}] "
        if lines:
            self.out.write("".join(f"{tag}{line}\n" for line in lines))
            self.out.flush()

    def flush(self, stream: tuple[int, int]) -> None:
        rest = self.partial.pop(stream, "")
        if rest:
            self.out.write(f"[run {stream[0]} rank {stream[1]}] {rest}\n")
            self.out.flush()


# --- talking to the scheduler ---------------------------------------------------------------------
async def ask(client: Client, query: LogsQuery) -> LogsReply:
    """One request, asked again while no scheduler leads (an election) for up to the request timeout."""
    import asyncio

    from schemas.logs import LogsReply
    from schemas.subjects import QUERY_LOGS
    from services.runtime.bus import NoResponderError

    loop = asyncio.get_running_loop()
    deadline = loop.time() + REQUEST_TIMEOUT_S
    while True:
        try:
            return await client.bus.request(QUERY_LOGS, query, LogsReply, timeout_s=max(deadline - loop.time(), 0.5))
        except NoResponderError:
            if loop.time() + 0.2 >= deadline:
                raise
        await asyncio.sleep(0.2)


@dataclass(slots=True)
class Reader:
    """Reads the selected streams of one job from where each left off."""

    client: Client
    job_id: str
    printer: Printer
    err: TextIO
    offsets: dict[tuple[int, int], int] = field(default_factory=dict)
    unavailable: set[tuple[int, int]] = field(default_factory=set)

    def query(self, **fields: object) -> LogsQuery:
        from schemas.logs import LogsQuery

        return LogsQuery.model_validate({"requester": self.client.identity, "job_id": self.job_id, **fields})

    async def runs(self) -> LogsReply:
        reply = await ask(self.client, self.query())
        if reply.refused is not None:
            raise LogsError(reply.refused)
        return reply

    async def drain(self, stream: tuple[int, int]) -> bool:
        """Print what the stream has beyond its offset; whether anything new came."""
        got = False
        while True:
            offset = self.offsets.get(stream, 0)
            reply = await ask(self.client, self.query(run=stream[0], rank=stream[1], offset=offset))
            if reply.refused is not None:
                raise LogsError(reply.refused)
            chunk = reply.chunk
            if chunk is None:
                return got
            if chunk.unavailable is not None:
                if stream not in self.unavailable:
                    self.unavailable.add(stream)
                    self.err.write(f"roundhouse logs: run {stream[0]} rank {stream[1]}: {chunk.unavailable}\n")
                return got
            self.unavailable.discard(stream)
            if chunk.next_offset <= offset:
                return got
            self.offsets[stream] = chunk.next_offset
            if chunk.data:
                self.printer.write(stream, chunk.data)
                got = True


async def show(client: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Print the job's output as ``args`` asks; the exit code."""
    reader = Reader(client, args.job_id, Printer(out, prefix=False), err)
    reply = await reader.runs()
    chosen = streams(select_runs(reply.runs, args.run), args.rank)
    if args.rank is not None and reply.runs and not chosen:
        raise LogsError(f"no run shown has rank {args.rank}")
    reader.printer.prefix = len(chosen) > 1
    if args.follow:
        return await follow(reader, args, chosen, reply)
    if not reply.runs:
        raise LogsError(f"{args.job_id} has no output yet ({reply.status}: it has not run)")
    for stream in chosen:
        await reader.drain(stream)
        reader.printer.flush(stream)
    return 1 if reader.unavailable else 0  # what could be read was printed; the output is incomplete


async def follow(reader: Reader, args: argparse.Namespace, chosen: list[tuple[int, int]], reply: LogsReply) -> int:
    """``-f``: the streams chosen so far, then poll the current run (and the runs after it, unless
    ``--run`` pins one) until the job ends."""
    import asyncio

    known = set(chosen)
    done: set[tuple[int, int]] = set()
    while True:
        current = {r.run for r in reply.runs if r.current}
        for stream in chosen:
            if stream not in done:
                await reader.drain(stream)
                if stream[0] not in current:  # its processes are gone: nothing more will come
                    done.add(stream)
                    reader.printer.flush(stream)
        reply = await reader.runs()
        if args.run is None:
            for stream in streams(reply.runs, args.rank):
                if stream not in known:
                    known.add(stream)
                    chosen.append(stream)
        if reply.status in FINAL:
            for stream in chosen:  # one last pass: what the last run wrote before it ended
                if stream not in done:
                    await reader.drain(stream)
                reader.printer.flush(stream)
            return 0
        await asyncio.sleep(POLL_S)


def run(args: argparse.Namespace) -> int:
    from roundhouse.commands.common import ask_cluster

    async def work(client: Client) -> int:
        return await show(client, args, sys.stdout, sys.stderr)

    try:
        return ask_cluster(args, work, nobody_answers="no scheduler answered (is one running and leading?)")
    except LogsError as exc:
        print(f"roundhouse logs: {exc}", file=sys.stderr)
        return 1
