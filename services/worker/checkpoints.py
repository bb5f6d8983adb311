"""Checkpoint paths that come from the bus, confined to the job's checkpoint directory on this node.

A grant's ``resume_from`` is whatever the scheduler was told in some ``job.suspended`` or
``job.checkpointed``; the training process loads that file. Unchecked, a forged fact naming the
attacker's file had the victim's next run load it (issue 13, attack 2). So the agent passes a job
only a path inside ``<checkpoint root>/<job id>`` (resolved: ``..`` and symbolic links followed, so
neither can lead out), and reports only paths there. The training client checks the same again
before it loads (``roundhouse.train``), and loads tensors without running pickled code.
"""

from __future__ import annotations

from pathlib import Path

from schemas.leases import LeaseGrant

__all__ = ["confine", "confine_resume"]


def confine(path: str | Path, job_dir: Path) -> Path | None:
    """``path`` resolved if it lies strictly inside ``job_dir`` (resolved too) and is not a directory
    or other non-file; else None. Relative paths are refused: they would depend on the agent's
    working directory. A path that does not exist (yet) is kept: the client then says it is missing
    rather than the job silently starting over."""
    candidate = Path(path)
    if not candidate.is_absolute():
        return None
    try:
        root = job_dir.resolve()
        resolved = candidate.resolve()
    except (OSError, RuntimeError):  # a symbolic link loop, an unreadable directory
        return None
    if resolved == root or not resolved.is_relative_to(root):
        return None
    if resolved.exists() and not resolved.is_file():
        return None
    return resolved


def confine_resume(grant: LeaseGrant, job_dir: Path) -> tuple[LeaseGrant, str | None]:
    """The grant to run, with ``resume_from`` confined to ``job_dir``, and why it was dropped (None: kept).

    A path outside is dropped, with its iteration, and the job starts from scratch, reported as such
    (``job.started`` with ``resumed_from=None``, iteration 0). Refusing the whole grant instead would
    let one forged checkpoint fact keep the job from ever running again: the scheduler would offer
    the same path on every retry.
    """
    if grant.resume_from is None:
        return grant, None
    confined = confine(grant.resume_from, job_dir)
    if confined is None:
        why = f"checkpoint {grant.resume_from!r} is not inside the job's checkpoint directory {job_dir}"
        return grant.model_copy(update={"resume_from": None, "resume_iteration": None}), why
    return grant.model_copy(update={"resume_from": str(confined)}), None
