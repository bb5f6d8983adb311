"""Per-user quotas on jobs and on GPUs (Blox §3 names admission control as the place for such gates).

What "a quota on running jobs" means here, and why it is enforced at admission: admission decides
which jobs may be scheduled at all, not which of them run; the scheduling policy and placement
decide that later, and they may run every admitted job at once. So the only way admission can
*guarantee* "user U never runs more than J jobs / G GPUs" is to cap what U has admitted and
unfinished (running + queued). That is the rule: a user's ``max_jobs`` and ``max_gpus`` bound the
jobs in ``jobs`` (admitted, unfinished) of that user plus the ones accepted in this call; over-quota
jobs are **held** (not rejected) and offered again next round, so they enter as the user's earlier
jobs finish. The price is that a user at quota cannot queue extra work behind running work; a
softer "queue many, run few" quota would be a scheduling-side filter, which this policy is not.

Other choices:

* Per-user FIFO: once one of a user's jobs is held, that user's later jobs in this call are held
  too (a small job does not overtake a large one of the same user, so large jobs cannot starve).
  Other users are unaffected.
* A job that can never fit its user's quota (``spec.gpus > max_gpus``, or a quota of 0 jobs) is
  **rejected** with a reason saying what to change, instead of being held forever.
* ``max_jobs`` / ``max_gpus`` are the defaults for every user; ``users`` overrides them per user
  (``{"alice": {"max_gpus": 16}}``); a field left out of an override inherits the default; ``None``
  means unlimited.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from services.core.decisions import Admission
from services.core.registry import ADMISSION
from services.core.state import ClusterState, JobState

_QUOTA_KEYS = frozenset({"max_jobs", "max_gpus"})


@dataclass(frozen=True, slots=True)
class UserQuota:
    """Limits for one user; ``None`` means unlimited."""

    max_jobs: int | None = None
    max_gpus: int | None = None

    def __post_init__(self) -> None:
        for key in ("max_jobs", "max_gpus"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"{key} must be a non-negative integer or None, got {value!r}")


@ADMISSION.register("user-quota")
@dataclass(frozen=True, kw_only=True, slots=True)
class UserQuotaAdmission:
    """Hold a user's jobs while the user's admitted, unfinished jobs are at their job or GPU quota."""

    name: ClassVar[str] = "user-quota"

    max_jobs: int | None = None
    """Default cap on a user's admitted, unfinished jobs (running + queued); None = unlimited."""
    max_gpus: int | None = None
    """Default cap on the GPUs those jobs request; None = unlimited."""
    users: Mapping[str, UserQuota | Mapping[str, int | None]] = field(default_factory=dict)
    """Per-user overrides; a key missing from an override inherits the default above."""
    _default: UserQuota = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        default = UserQuota(self.max_jobs, self.max_gpus)
        object.__setattr__(self, "_default", default)
        resolved: dict[str, UserQuota] = {}
        for user, override in self.users.items():
            if isinstance(override, UserQuota):
                resolved[user] = override
                continue
            unknown = set(override) - _QUOTA_KEYS
            if unknown:
                raise ValueError(
                    f"quota for user {user!r} has unknown key(s) {sorted(unknown)}; "
                    f"valid: {sorted(_QUOTA_KEYS)}"
                )
            resolved[user] = UserQuota(
                override.get("max_jobs", default.max_jobs), override.get("max_gpus", default.max_gpus)
            )
        object.__setattr__(self, "users", MappingProxyType(resolved))

    def quota_for(self, user: str) -> UserQuota:
        quota = self.users.get(user)
        return quota if isinstance(quota, UserQuota) else self._default

    def admit(
        self,
        offered: Sequence[JobState],
        jobs: Mapping[str, JobState],
        cluster: ClusterState,
        now: float,
    ) -> Admission:
        job_count: dict[str, int] = {}
        gpu_count: dict[str, int] = {}
        for job in jobs.values():
            user = job.spec.user
            job_count[user] = job_count.get(user, 0) + 1
            gpu_count[user] = gpu_count.get(user, 0) + job.spec.gpus
        accepted: list[str] = []
        held: list[str] = []
        rejected: dict[str, str] = {}
        blocked: set[str] = set()
        for job in offered:
            user, gpus = job.spec.user, job.spec.gpus
            quota = self.quota_for(user)
            if quota.max_jobs == 0:
                rejected[job.job_id] = f"user {user!r} has a job quota of 0; ask an operator to raise it"
                continue
            if quota.max_gpus is not None and gpus > quota.max_gpus:
                rejected[job.job_id] = (
                    f"job needs {gpus} GPUs but user {user!r} may hold at most {quota.max_gpus}; "
                    f"request fewer GPUs or ask an operator to raise the quota"
                )
                continue
            if user in blocked:
                held.append(job.job_id)
                continue
            jobs_after = job_count.get(user, 0) + 1
            gpus_after = gpu_count.get(user, 0) + gpus
            if (quota.max_jobs is not None and jobs_after > quota.max_jobs) or (
                quota.max_gpus is not None and gpus_after > quota.max_gpus
            ):
                held.append(job.job_id)
                blocked.add(user)
                continue
            accepted.append(job.job_id)
            job_count[user] = jobs_after
            gpu_count[user] = gpus_after
        return Admission(accepted=tuple(accepted), held=tuple(held), rejected=rejected)
