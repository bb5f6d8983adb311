"""What the agent keeps on disk about each lease, so that its successor on the node can report it.

``<work_dir>/leases/<lease id>/lease.json``, written atomically (temp file, rename) when the lease's
processes are started and whenever the agent reports a periodic checkpoint of it, removed once the
fact that ends the lease is published. An agent that dies leaves it behind; the next agent on the
node (:meth:`services.worker.service.WorkerService.start`) stops what is left of the lease's
processes, then reports the newest checkpoint the lease completed, the one in this record or a newer
one its rank 0 recorded in its channel since (``ckpt_iter``, e.g. the checkpoint written when the job
found its agent gone), as ``job.checkpointed`` with the lease's id: the scheduler keeps it for the
job's current run or the run it released last (``JobBook.checkpointed``), so the next run resumes
from there instead of an older checkpoint or iteration 0.

The file is rewritten without ``fsync``: it must survive the agent's death, which the page cache
does; a power loss takes the job's processes with it, and the job then resumes from the last
checkpoint the scheduler was told of. Everything read back is checked: ids, and a checkpoint path
that must resolve (symbolic links followed) to a regular file inside ``<checkpoint root>/<job id>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

from schemas.ids import TOKEN_PATTERN
from services.runtime.checkpoint import CHECKPOINT_NAME
from services.worker.channel import Channel, ChannelError

__all__ = [
    "JOB_MARKER", "RECORD_NAME", "LeaseRecord", "RecordError", "confined_checkpoint", "newest_checkpoint",
    "read_job_marker", "write_job_marker",
]  # fmt: skip

RECORD_NAME: Final = "lease.json"
JOB_MARKER: Final = "job"
"""``<lease dir>/job``: the id of the job the lease ran, written at launch and kept after the lease
ends (unlike ``lease.json``), so that the lease's logs are served for that job only, by this agent
or a later one (``services/worker/log_reader.py``)."""
_MAX_BYTES = 64 * 1024
_ID = re.compile(TOKEN_PATTERN)


class RecordError(ValueError):
    """A lease record that cannot be used (missing, unreadable, or naming something it may not)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRecord:
    """One lease as its agent knew it: identity, what it resumed from, its newest reported checkpoint."""

    lease_id: str
    job_id: str
    node_id: str
    epoch: int
    coordinator: bool
    ranks: int
    grace_period_s: float
    resume_iteration: int | None = None
    checkpoint_path: str | None = None
    checkpoint_iteration: int | None = None

    def with_checkpoint(self, path: str, iteration: int) -> LeaseRecord:
        return replace(self, checkpoint_path=path, checkpoint_iteration=iteration)

    def write(self, lease_dir: Path) -> None:
        """Replace ``<lease_dir>/lease.json`` atomically (readers see the old or the new record)."""
        lease_dir.mkdir(parents=True, exist_ok=True)
        path = lease_dir / RECORD_NAME
        tmp = path.with_name(f".{RECORD_NAME}.tmp")
        tmp.write_text(json.dumps(asdict(self), sort_keys=True))
        os.replace(tmp, path)

    @staticmethod
    def remove(lease_dir: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            (lease_dir / RECORD_NAME).unlink()

    @classmethod
    def read(cls, lease_dir: Path) -> LeaseRecord:
        """The record in ``lease_dir``, checked (its lease id must be the directory's name)."""
        path = lease_dir / RECORD_NAME
        try:
            with path.open("rb") as f:
                raw = f.read(_MAX_BYTES + 1)
        except OSError as exc:
            raise RecordError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if len(raw) > _MAX_BYTES:
            raise RecordError(f"{path} is over {_MAX_BYTES} bytes")
        try:
            data = json.loads(raw)
            record = cls(**_typed(data))
        except (ValueError, TypeError) as exc:
            raise RecordError(f"{path} is not a lease record: {exc}") from exc
        for name in ("lease_id", "job_id", "node_id"):
            if not _ID.fullmatch(getattr(record, name)):
                raise RecordError(f"{path}: {name} {getattr(record, name)!r} is not an id")
        if record.lease_id != lease_dir.name:
            raise RecordError(f"{path} names lease {record.lease_id}, not {lease_dir.name}")
        return record


def write_job_marker(lease_dir: Path, job_id: str) -> None:
    """Record which job ``lease_dir`` belongs to (see :data:`JOB_MARKER`)."""
    lease_dir.mkdir(parents=True, exist_ok=True)
    (lease_dir / JOB_MARKER).write_text(job_id)


def read_job_marker(lease_dir: Path) -> str | None:
    """The job id :func:`write_job_marker` recorded in ``lease_dir``; None if there is none, or it is
    not a plain file holding an id (a symbolic link is not followed)."""
    try:
        fd = os.open(lease_dir / JOB_MARKER, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(256)
    try:
        job_id = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return job_id if _ID.fullmatch(job_id) else None


_FIELDS: Final = {
    "lease_id": str, "job_id": str, "node_id": str, "epoch": int, "coordinator": bool, "ranks": int,
    "grace_period_s": float, "resume_iteration": int | None, "checkpoint_path": str | None,
    "checkpoint_iteration": int | None,
}  # fmt: skip


def _typed(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or set(data) != set(_FIELDS):
        raise ValueError(f"expected the keys {sorted(_FIELDS)}")
    for name, kind in _FIELDS.items():
        value = data[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = data[name] = float(value)
        ok = isinstance(value, kind) and (not isinstance(value, bool) or kind is bool)
        if not ok:
            raise ValueError(f"{name}={value!r}")
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"{name}={value!r} is negative")
    return data


def confined_checkpoint(path: str | Path, checkpoint_root: Path, job_id: str) -> Path | None:
    """``path`` resolved (``..`` and symbolic links followed) if that is a regular file inside the
    job's checkpoint directory ``<checkpoint_root>/<job_id>``, else None."""
    if not _ID.fullmatch(job_id):
        return None
    job_dir = (checkpoint_root / job_id).resolve()
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not resolved.is_relative_to(job_dir) or not resolved.is_file():
        return None
    return resolved


def newest_checkpoint(record: LeaseRecord, lease_dir: Path, checkpoint_root: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint of the lease, if newer than the one it resumed from, else None.

    Candidates: the record's (the last one the agent reported) and the iteration rank 0 wrote to its
    channel with its last complete checkpoint (``<checkpoint root>/<job id>/checkpoint.pt``). Call it
    once the lease's processes are gone (nothing writes either any more).
    """
    candidates: list[tuple[int, Path]] = []
    if record.checkpoint_path is not None and record.checkpoint_iteration is not None:
        candidates.append((record.checkpoint_iteration, Path(record.checkpoint_path)))
    with contextlib.suppress(ChannelError):
        channel = Channel.open(lease_dir / "rank-0.chan")
        try:
            iteration = channel.checkpoint_iteration
        finally:
            channel.close()
        if iteration is not None and record.coordinator:
            candidates.append((iteration, checkpoint_root / record.job_id / CHECKPOINT_NAME))
    floor = record.resume_iteration
    for iteration, path in sorted(candidates, key=lambda c: c[0], reverse=True):
        if floor is not None and iteration <= floor:
            return None
        confined = confined_checkpoint(path, checkpoint_root, record.job_id)
        if confined is not None:
            return confined, iteration
    return None
