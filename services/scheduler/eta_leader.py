"""The leader's side of the ETA (``eta.py``): when to run one, and its request taken from the book.

A run is taken only while this replica leads, between rounds (a round in flight owns the snapshot it
ranked), when the book changed since the last run (``state_version``: an arrival, a start, a
completion, a suspension) or ``eta_refresh_s`` passed; at most every ``eta_interval_s``. It sees
the cluster a round would: live nodes, held leases, and the GPUs of draining or silent nodes
withheld (``RoundCycle.withheld_gpus``), so their free GPUs do not shorten an ETA.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

from services.core.protocols import SchedulingPolicy
from services.scheduler.config import SchedulerConfig
from services.scheduler.cycle import RoundCycle
from services.scheduler.eta import EtaRefresher, EtaRequest, EtaSettings, EtaTable, Options, options, prepare
from services.scheduler.replica import Replica
from services.scheduler.topology import UnknownGpuError


def policy_in_force(policy: SchedulingPolicy, name: str, policy_options: Options) -> tuple[str, Options]:
    """The scheduling policy (name, options) whose fresh instance the ETA simulates: the configured
    one, except the synthesizer, whose combination in force is simulated (a fresh synthesizer would
    run its own forward simulations inside this one)."""
    synthesis = getattr(policy, "synthesis", None)
    current = getattr(synthesis, "current", None)
    scheduling = getattr(current, "scheduling", None)
    if isinstance(scheduling, str):
        return scheduling, ()
    return name, policy_options


def settings_from(cfg: SchedulerConfig) -> EtaSettings:
    return EtaSettings(
        scheduling=cfg.policy,
        scheduling_options=options(cfg.policy_options),
        placement=cfg.eta_placement,
        placement_options=options(cfg.eta_placement_options),
        round_s=cfg.round_s,
        fill_between_rounds=cfg.fill_between_rounds,
        horizon_s=cfg.eta_horizon_s,
        max_jobs=cfg.eta_max_jobs,
        default_duration_s=cfg.eta_default_duration_s,
        time_scale=cfg.eta_time_scale,
        packing=cfg.packing,
    )


class LeaderEta:
    """Runs the ETA of the leader's queued jobs (an :class:`EtaRefresher` fed from the book)."""

    def __init__(self, replica: Replica, cycle: RoundCycle, cfg: SchedulerConfig) -> None:
        self.replica = replica
        self.cycle = cycle
        self.settings = settings_from(cfg)
        self.refresh_s = cfg.eta_refresh_s
        self.enabled = cfg.eta
        self.refresher = EtaRefresher(
            self.take, interval_s=cfg.eta_interval_s, sleep=replica.clock.sleep, executor=cfg.eta_executor
        )
        self._taken: tuple[int, int] | None = None
        """(epoch, state_version) of the last request taken."""
        self._taken_at = 0.0

    def start(self) -> None:
        if self.enabled:
            self.refresher.start()

    async def stop(self) -> None:
        await self.refresher.stop()

    def table(self) -> EtaTable | None:
        """The last run's table if it was taken in the current term (None otherwise, or when off)."""
        term = self.replica.term
        table = self.refresher.table
        if term is None or table is None or table.epoch != term.epoch:
            return None
        return table

    def take(self) -> EtaRequest | None:
        """The next run's request, or None when none is due (module doc)."""
        r = self.replica
        term = r.term
        if term is None or self.cycle.in_round:
            return None
        book = r.book
        now = r.clock.time()
        key = (term.epoch, book.state_version)
        if key == self._taken and now - self._taken_at < self.refresh_s:
            return None
        if not book.waiting_count():
            return None
        topology = self.cycle.current_topology()
        cluster = topology.cluster()
        for job_id, lease in book.held_gpus():
            with contextlib.suppress(UnknownGpuError):  # a lease on a node that went silent
                cluster.assign(job_id, topology.lease_gpus(lease))
        # Running jobs' executed time and GPUs up to now, as a round's snapshot has them.
        book.refresh(now, topology, restore_allowance_s=r.cfg.restore_allowance_s)
        name, opts = policy_in_force(self.cycle.policy, self.settings.scheduling, self.settings.scheduling_options)
        settings = replace(self.settings, scheduling=name, scheduling_options=opts)
        request = prepare(
            book.active, cluster, now, settings, order=self.cycle.last_ranked[1], epoch=term.epoch,
            version=book.state_version, withheld=self.cycle.withheld_gpus(topology),
        )  # fmt: skip
        self._taken, self._taken_at = key, now
        return request


__all__ = ["LeaderEta", "policy_in_force", "settings_from"]
