"""Serve chunks of a lease's rank logs to the scheduler (``logs.read.<node>``, issue 14 item 1).

Only the scheduler may ask (the broker's rule); it asks only about the leases it granted the job. The
agent still trusts nothing in the request beyond ids: the file is always
``<leases dir>/<lease id>/rank-<local rank>.log``, built here from the agent's own configuration and
an id the schema has validated as a subject token (no ``/``, ``.`` or ``..`` can be in it), then
resolved and confined to that lease directory (:func:`~services.worker.checkpoints.confine`: a
symbolic link planted there cannot lead out). The lease directory must also carry the job marker the
launcher wrote (:data:`~services.worker.records.JOB_MARKER`) naming the same job, so a request pairing
one job with another job's lease reads nothing.

A restarted agent serves its predecessors' runs the same way: the files and their markers are all it
needs, no lease record (which is removed when a lease ends).

Chunks are at most ``max_bytes`` long (:data:`~schemas.logs.MAX_LOG_CHUNK`) and end on a character
boundary (:func:`complete_utf8`), so byte offsets stay exact while the text travels as a JSON string.
"""

from __future__ import annotations

import os
from pathlib import Path

from schemas.ids import is_token
from schemas.logs import LogData, LogRead
from services.worker.checkpoints import confine
from services.worker.launcher import LeasePaths
from services.worker.records import read_job_marker

__all__ = ["complete_utf8", "read_chunk", "serve_log_read"]


def complete_utf8(data: bytes) -> int:
    """How many leading bytes of ``data`` end on a UTF-8 character boundary: a trailing character
    cut short (its lead byte wants more bytes than follow it) is left for the next chunk. Bytes that
    are not UTF-8 at all count as complete (they decode to U+FFFD), so a reader always moves on."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:  # a continuation byte: its lead is further back
            continue
        if byte >> 5 == 0b110:
            wanted = 2
        elif byte >> 4 == 0b1110:
            wanted = 3
        elif byte >> 3 == 0b11110:
            wanted = 4
        else:
            return n  # ASCII or an invalid lead byte
        return n - back if wanted > back else n
    return n


def read_chunk(path: Path, offset: int, max_bytes: int) -> tuple[str, int, int]:
    """``(text, next_offset, size)``: up to ``max_bytes`` of ``path`` from byte ``offset``, decoded.

    ``size`` is the file's size when read; an offset past it (a log that was replaced) reads nothing.
    A chunk that would end inside a character stops before it, unless that leaves nothing (a
    ``max_bytes`` below the character's length), so every read of a non-empty rest makes progress.
    Raises OSError if the file cannot be read."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if offset >= size:
            return "", offset, size
        f.seek(offset)
        data = f.read(max_bytes)
    keep = complete_utf8(data)
    if keep == 0:
        keep = len(data)
    data = data[:keep]
    return data.decode("utf-8", errors="replace").replace("\x00", ""), offset + len(data), size


def serve_log_read(request: LogRead, leases_dir: Path) -> LogData:
    """The chunk ``request`` asks for, from ``leases_dir`` only; ``missing`` says why there is none."""
    nothing = {"offset": request.offset, "next_offset": request.offset}
    if not is_token(request.lease_id):  # the schema checked it; a path is built from it, so again here
        return LogData(**nothing, missing=f"lease id {request.lease_id[:64]!r} is not an id")
    lease_dir = leases_dir / request.lease_id
    if read_job_marker(lease_dir) != request.job_id:
        return LogData(**nothing, missing=f"no output of job {request.job_id} in lease {request.lease_id} here")
    path = confine(LeasePaths(lease_dir=lease_dir, checkpoint_dir=lease_dir).log(request.local_rank), lease_dir)
    if path is None:
        return LogData(**nothing, missing=f"the log of rank {request.local_rank} is not a file in its lease directory")
    try:
        text, next_offset, size = read_chunk(path, request.offset, request.max_bytes)
    except FileNotFoundError:
        return LogData(**nothing, missing=f"no output of local rank {request.local_rank} in lease {request.lease_id}")
    except OSError as exc:
        return LogData(**nothing, missing=f"cannot read the log of rank {request.local_rank}: {exc.strerror or exc}")
    return LogData(offset=request.offset, data=text, next_offset=next_offset, size=size)
