"""The scheduler service's settings (``roundhouse service scheduler --policy las --round-s 2``)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.core.registry import PLACEMENT, SCHEDULING
from services.runtime.config import ServiceConfig
from services.scheduler.resume import DEFAULT_RESTORE_ALLOWANCE_S


class SchedulerConfig(ServiceConfig):
    """Settings of one scheduler replica; every replica of a deployment should use the same values.

    Times are seconds. ``lease_ttl_s`` must equal the workers' own TTL: a worker cut off from the bus
    for that long suspends its jobs, and the scheduler reassigns a silent node's GPUs only after the
    same time has passed since its last heartbeat (DESIGN, Leases and preemption).
    """

    policy: str = Field(default="las", description="Scheduling policy (a name registered in SCHEDULING).")
    round_s: float = Field(default=300.0, gt=0, le=86_400, description="Round length (Blox: 300 s).")
    churn_debounce_s: float = Field(
        default=0.05, ge=0, le=60, description="Churn-triggered rounds wait this long to batch events."
    )
    fill_between_rounds: bool = Field(
        default=True,
        description="An arrival or completion the policy does not react to starts a round that only fills "
        "free GPUs in rank order, never preempting (a job on an idle cluster starts at once, not at the "
        "next tick). False: jobs start only at the policy's own rounds, as in Blox.",
    )
    packing: bool = Field(
        default=False,
        description="Accept plans that put several jobs on one GPU (a packing placement policy, e.g. gandiva "
        "with profiles; at most services.scheduler.packing.MAX_JOBS_PER_GPU), and mark every grant shared "
        "so the workers run them side by side. False: a launch onto a held GPU is dropped, grants are exclusive.",
    )
    plan_timeout_s: float = Field(default=5.0, gt=0, le=600, description="Wait for placement.plan.")
    leader_ttl_s: float = Field(default=5.0, gt=0.3, le=600, description="TTL of the leader key.")
    lease_ttl_s: float = Field(default=30.0, gt=0, le=86_400, description="Worker lease TTL.")
    node_silent_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="A node not heard from for this long offers no free GPUs to new work (reasons and "
        "placement); its leases still stand until lease_ttl_s. Default: half of lease_ttl_s, at least two "
        "heartbeats (workers beat at most every lease_ttl_s / 4); a stopping worker says so at once.",
    )

    @property
    def silent_after_s(self) -> float:
        """``node_silent_s``, or half the lease TTL."""
        return self.node_silent_s if self.node_silent_s is not None else self.lease_ttl_s / 2

    revoke_margin_s: float = Field(
        default=5.0, ge=0, le=3600, description="Wait past a revoke's grace period before reusing GPUs."
    )
    request_timeout_s: float = Field(default=2.0, gt=0, le=60, description="One lease request's timeout.")
    grant_attempts: int = Field(default=3, ge=1, le=100, description="Tries per grant before giving up.")
    reconcile_grace_s: float = Field(
        default=5.0, ge=0, le=3600, description="A granted lease a heartbeat omits is lost only after this."
    )
    held_fact_s: float = Field(
        default=12.0, ge=0, le=3600,
        description="After a failover, leases heartbeats omit are released as lost only this long into the new "
        "term: a job.completed the old leader fetched and never acked is redelivered only after the consumers' "
        "ack_wait (10 s), and releasing before it lands runs the finished job again.",
    )  # fmt: skip
    max_parallel_requests: int = Field(default=256, ge=1, le=100_000, description="Lease requests in flight.")
    restore_allowance_s: float = Field(
        default=DEFAULT_RESTORE_ALLOWANCE_S, ge=0, le=86_400, description="Longest time a run counts as restoring."
    )
    query_finished_limit: int = Field(
        default=10_000, ge=0, le=1_000_000, description="Finished jobs read from the store per query."
    )
    max_user_priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="Highest priority tier a user who is not an operator may submit at; higher asks run at this "
        "tier (operators may use any).",
    )
    operators: tuple[str, ...] = Field(
        default=("operator",),
        max_length=1000,
        description="Identities that may cancel and read every user's jobs (others act only on their own): "
        "a JSON list or comma-separated names (ROUNDHOUSE_OPERATORS).",
    )

    eta: bool = Field(
        default=True,
        description="Estimate queued jobs' start (``roundhouse jobs`` ETA, ``eta_s``) by a forward simulation of the "
        'book under the policy in force, in a worker process (docs/scheduler.md, "ETA").',
    )
    eta_interval_s: float = Field(
        default=2.0, gt=0, le=3600, description="Run the ETA simulation at most this often, and only if jobs changed."
    )
    eta_refresh_s: float = Field(
        default=60.0, gt=0, le=86_400, description="Run it again after this long even if no job changed."
    )
    eta_max_jobs: int = Field(
        default=1000, ge=1, le=100_000, description="Queued jobs the ETA simulates (queue order); later ones get none."
    )
    eta_horizon_s: float = Field(
        default=7 * 86_400.0, gt=0, le=365 * 86_400, description="Simulated time; a job not started by then: no ETA."
    )
    eta_default_duration_s: float = Field(
        default=3600.0, gt=0, le=365 * 86_400,
        description="Duration assumed for a job without expected_duration_s when no job of its user and class, or "
        "of its class, declares one (its ETA, and those it delays, are marked guessed).",
    )  # fmt: skip
    eta_placement: str = Field(
        default="consolidated", description="Placement policy the ETA simulates (the placement service's, by name)."
    )
    eta_placement_options: dict[str, Any] = Field(default_factory=dict, description="Its options.")
    eta_time_scale: float = Field(
        default=1.0, gt=0, le=1e6,
        description="Divide durations by this in the ETA (an emulated cluster's speed-up: its workers run jobs that "
        "many times faster).",
    )  # fmt: skip
    eta_executor: Literal["process", "thread"] = Field(
        default="process", description="Where the ETA simulation runs: a worker process (off the GIL) or a thread."
    )

    @field_validator("operators", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        # The environment and ``python -m services.scheduler`` hand over a string: a JSON list
        # (as ``roundhouse up`` writes it) or the names separated by commas.
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return tuple(name.strip() for name in text.split(",") if name.strip())

    @model_validator(mode="after")
    def _policy_builds(self) -> SchedulerConfig:
        # Fail at configuration time, with the valid names, rather than when the service starts.
        SCHEDULING.check(self.policy, self.policy_options, label="policy_options")
        PLACEMENT.check(self.eta_placement, self.eta_placement_options, label="eta_placement_options")
        return self
