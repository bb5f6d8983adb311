"""Status words `roundhouse jobs --status` accepts: Roundhouse's own, and Slurm's and Kueue's as aliases.

Pure data and one function, imported by the CLI at start-up (no pydantic, no NATS). The statuses
are ``services.core.state.JobStatus``'s values (``tests/unit/test_cli_jobs.py`` holds them equal).

How the others' words map (what a user of ``squeue -t`` or ``kubectl get workloads`` means):

* Slurm ``PENDING``/``PD``: waiting, whether for GPUs (``queued``) or for admission (``held``: what
  Slurm shows as pending with a reason such as a QOS limit). ``RUNNING``/``R``. ``SUSPENDED``/``S``,
  ``PREEMPTED``/``PR``, ``REQUEUED``/``RQ``: a preempted job waits for GPUs again (``queued``).
  ``COMPLETED``/``CD``, ``FAILED``/``F`` (and ``OUT_OF_MEMORY``/``OOM``, ``NODE_FAIL``/``NF``),
  ``CANCELLED``/``CA``.
* Kueue (workload conditions): ``Pending`` as Slurm's; ``Inadmissible``: ``held``;
  ``QuotaReserved`` and ``Admitted``: ``running`` (Roundhouse admits a job's GPUs by starting it);
  ``Evicted``, ``Preempted``, ``Requeued`` and ``Suspended``: ``queued``; ``Finished``: ``completed``
  or ``failed``; ``Deactivated``: ``cancelled``.
"""

from __future__ import annotations

__all__ = ["ALIASES", "FINAL", "STATUSES", "UnknownStatusError", "parse_statuses", "valid_words"]

STATUSES: tuple[str, ...] = ("held", "queued", "running", "completed", "failed", "cancelled", "rejected")
"""Roundhouse's job statuses (``JobStatus`` values), in a job's life order."""
FINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled", "rejected"})
"""The statuses a job ends in (``JobStatus.is_final``)."""

_WAITING = ("queued", "held")

SLURM: dict[str, tuple[str, ...]] = {
    "pending": _WAITING, "pd": _WAITING,
    "running": ("running",), "r": ("running",),
    "suspended": ("queued",), "s": ("queued",),
    "preempted": ("queued",), "pr": ("queued",),
    "requeued": ("queued",), "rq": ("queued",),
    "completed": ("completed",), "cd": ("completed",),
    "failed": ("failed",), "f": ("failed",),
    "out_of_memory": ("failed",), "oom": ("failed",),
    "node_fail": ("failed",), "nf": ("failed",),
    "cancelled": ("cancelled",), "ca": ("cancelled",),
}  # fmt: skip
"""Slurm's job state names and codes (``squeue -t``), lower-cased."""

KUEUE: dict[str, tuple[str, ...]] = {
    "pending": _WAITING,
    "inadmissible": ("held",),
    "quotareserved": ("running",),
    "admitted": ("running",),
    "evicted": ("queued",),
    "preempted": ("queued",),
    "requeued": ("queued",),
    "suspended": ("queued",),
    "finished": ("completed", "failed"),
    "deactivated": ("cancelled",),
}
"""Kueue's workload conditions, lower-cased."""

ALIASES: dict[str, tuple[str, ...]] = {**SLURM, **KUEUE, **{s: (s,) for s in STATUSES}, "canceled": ("cancelled",)}
"""Every accepted word (lower case, ``-`` as ``_``) -> the Roundhouse statuses it means."""


class UnknownStatusError(ValueError):
    """A status word that is neither Roundhouse's nor an alias; the message lists the valid ones."""


def valid_words() -> str:
    """The accepted words, for an error message or ``--help``."""
    return (
        f"{', '.join(STATUSES)}; Slurm's PENDING/PD, RUNNING/R, SUSPENDED/S, PREEMPTED/PR, REQUEUED/RQ, "
        "COMPLETED/CD, FAILED/F, OUT_OF_MEMORY/OOM, NODE_FAIL/NF, CANCELLED/CA; Kueue's Pending, "
        "Inadmissible, QuotaReserved, Admitted, Evicted, Preempted, Requeued, Suspended, Finished, Deactivated"
    )


def _normalise(word: str) -> str:
    return word.strip().lower().replace("-", "_")


def parse_statuses(words: list[str]) -> list[str]:
    """The Roundhouse statuses ``words`` mean (each may be comma-separated), in life order without
    repeats; :class:`UnknownStatusError` naming the first unknown word and the valid ones."""
    wanted: set[str] = set()
    for word in (part for item in words for part in item.split(",") if part.strip()):
        statuses = ALIASES.get(_normalise(word))
        if statuses is None:
            raise UnknownStatusError(f"unknown status {word!r}; valid: {valid_words()}")
        wanted.update(statuses)
    return [s for s in STATUSES if s in wanted]
