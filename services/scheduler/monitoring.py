"""The scheduler's Prometheus series (served at ``/metrics`` with ``metrics_port``; docs/operations.md).

Kept off the hot path: nothing here runs per message except :meth:`SchedulerMonitor.landed`, a
scan of a committed change's few operations for the transitions that count (a start, a finish, a
preemption, a revoke), which skips an arrival's insert and an acceptance's update after a dict
lookup. The rest is read when Prometheus scrapes (:meth:`SchedulerMonitor.collect`, on the event
loop): the queue by class and user, nodes and their GPUs, leadership, refusals; or once per round
(:meth:`SchedulerMonitor.round_ended`): the phase timings.

Series (all ``roundhouse_``): ``scheduler_leader``, ``scheduler_epoch``; ``queue_depth`` and
``queue_gpus`` (waiting jobs and the GPUs they ask for) and ``running_jobs`` by ``job_class`` and
``user``; ``node_gpus``, ``node_gpus_allocated``, ``node_up``, ``node_draining`` by ``node``;
``job_wait_seconds`` (each start: how long the job had waited, first start or resume) by
``job_class``; ``job_completion_seconds`` (JCT: submission to finish) by ``job_class`` and
``status``; ``round_phase_seconds`` by ``phase`` and ``round_cpu_seconds``; counters
``rounds_total`` by ``trigger``, ``grants_total``, ``revokes_total`` by ``reason``,
``preemptions_total``, ``refusals_total`` by ``what`` and ``reason`` (facts and requests refused
for their source, ``trust.py``). Only the leader reports jobs and nodes (a follower's book is
empty), so a sum over replicas counts each once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schemas.rounds import RoundTrigger
from services.core.state import JobStatus
from services.runtime.store import UpdateJob
from services.scheduler.change import Change
from services.scheduler.replica import Replica
from services.scheduler.timings import RoundTimings

__all__ = ["JOB_SECONDS_BUCKETS", "PHASES", "PHASE_BUCKETS", "SchedulerMonitor"]

JOB_SECONDS_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14_400, 43_200, 86_400, 259_200, 604_800)
"""Waits and completion times: a second to a week."""
PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PHASES = ("snapshot", "rank", "encode", "publish", "placement", "apply", "revoke", "wait", "grant")
"""The phases of a round (``RoundTimings``); ``total`` is snapshot through apply."""

_RUNNING = JobStatus.RUNNING


class SchedulerMonitor(Collector):
    """The scheduler replica's series; registered on the service's registry by ``SchedulerService``."""

    def __init__(self, replica: Replica, registry: CollectorRegistry) -> None:
        self.replica = replica
        self.wait = Histogram(
            "roundhouse_job_wait_seconds", "Seconds a job waited before each start (first start or resume).",
            ["job_class"], buckets=JOB_SECONDS_BUCKETS, registry=registry,
        )  # fmt: skip
        self.completion = Histogram(
            "roundhouse_job_completion_seconds", "Job completion time: submission to finish, by final status.",
            ["job_class", "status"], buckets=JOB_SECONDS_BUCKETS, registry=registry,
        )  # fmt: skip
        self.phase = Histogram(
            "roundhouse_round_phase_seconds", "Wall seconds of each phase of a round.", ["phase"],
            buckets=PHASE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.cpu = Histogram(
            "roundhouse_round_cpu_seconds", "CPU seconds the scheduler spent in a round.", buckets=PHASE_BUCKETS,
            registry=registry,
        )  # fmt: skip
        self.rounds = PromCounter("roundhouse_rounds", "Rounds run to the end, by trigger.", ["trigger"],
                                  registry=registry)  # fmt: skip
        self.grants = PromCounter("roundhouse_grants", "Leases granted (job starts).", registry=registry)
        self.revokes = PromCounter("roundhouse_revokes", "Leases revoked, by reason.", ["reason"], registry=registry)
        self.preemptions = PromCounter("roundhouse_preemptions", "Runs stopped that resume later.", registry=registry)
        for trigger in RoundTrigger:
            self.rounds.labels(trigger.value)
        for name in PHASES:
            self.phase.labels(name)
        registry.register(self)

    # --- per change and per round -----------------------------------------------------------
    def landed(self, change: Change) -> None:
        """Count what a committed change does; called before its effect (jobs show old values)."""
        for _, reason in change.revokes:
            self.revokes.labels(reason.value).inc()
        book = self.replica.book
        finished: set[str] = set()
        for op in change.ops:
            if type(op) is not UpdateJob:
                continue
            changes = op.changes
            status = changes.get("status")
            finish = changes.get("finish_time")
            preemptions = changes.get("preemptions")
            if status is None and finish is None and preemptions is None:
                continue
            entry = book.entry(op.job_id)
            if entry is None:
                continue
            state = entry.state
            if status is _RUNNING:
                self.grants.inc()
                start = changes.get("last_start_time")
                if start is not None and state.queued_since is not None:
                    self.wait.labels(state.spec.job_class.value).observe(max(0.0, start - state.queued_since))
            if preemptions is not None and preemptions > state.preemptions:
                self.preemptions.inc(preemptions - state.preemptions)
            final = status if status is not None else state.status
            if finish is not None and state.finish_time is None and final.is_final and op.job_id not in finished:
                finished.add(op.job_id)
                jct = max(0.0, finish - state.submit_time)
                self.completion.labels(state.spec.job_class.value, final.value).observe(jct)

    def round_ended(self, timings: RoundTimings, trigger: RoundTrigger) -> None:
        self.rounds.labels(trigger.value).inc()
        for name in PHASES:
            self.phase.labels(name).observe(getattr(timings, name))
        self.phase.labels("total").observe(
            timings.snapshot + timings.rank + timings.encode + timings.publish + timings.placement + timings.apply
        )
        self.cpu.observe(timings.cpu)

    # --- read at scrape time ----------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        r = self.replica
        term = r.term
        leader = GaugeMetricFamily("roundhouse_scheduler_leader", "1 while this replica leads.")
        leader.add_metric([], 1.0 if r.is_leader else 0.0)
        yield leader
        epoch = GaugeMetricFamily("roundhouse_scheduler_epoch", "Epoch of the term this replica leads (0: none).")
        epoch.add_metric([], float(term.epoch) if term is not None else 0.0)
        yield epoch
        if r.is_leader:  # a follower's book and inventory are stale or empty: sums stay right
            yield from self._jobs()
            yield from self._nodes()
        refusals = CounterMetricFamily(
            "roundhouse_refusals", "Facts and requests refused for their source or rights (trust.py).",
            labels=["what", "reason"],
        )  # fmt: skip
        for key, count in sorted(r.refusals.counts.items()):
            what, _, reason = key.rpartition(":")
            refusals.add_metric([what, reason], float(count))
        yield refusals

    def _jobs(self) -> Iterable[Metric]:
        waiting: Counter[tuple[str, str]] = Counter()
        waiting_gpus: Counter[tuple[str, str]] = Counter()
        running: Counter[tuple[str, str]] = Counter()
        for state in self.replica.book.active.values():
            spec = state.spec
            key = (spec.job_class.value, spec.user)
            if state.status is _RUNNING:
                running[key] += 1
            else:
                waiting[key] += 1
                waiting_gpus[key] += spec.gpus
        labels = ["job_class", "user"]
        depth = GaugeMetricFamily("roundhouse_queue_depth", "Jobs waiting for GPUs.", labels=labels)
        gpus = GaugeMetricFamily("roundhouse_queue_gpus", "GPUs the waiting jobs ask for.", labels=labels)
        busy = GaugeMetricFamily("roundhouse_running_jobs", "Jobs running under a granted lease.", labels=labels)
        for key in sorted(waiting):
            depth.add_metric(list(key), float(waiting[key]))
            gpus.add_metric(list(key), float(waiting_gpus[key]))
        for key in sorted(running):
            busy.add_metric(list(key), float(running[key]))
        yield from (depth, gpus, busy)

    def _nodes(self) -> Iterable[Metric]:
        r = self.replica
        labels = ["node"]
        total = GaugeMetricFamily("roundhouse_node_gpus", "GPUs a registered node has.", labels=labels)
        allocated = GaugeMetricFamily("roundhouse_node_gpus_allocated", "GPUs held by leases.", labels=labels)
        up = GaugeMetricFamily("roundhouse_node_up", "1 while the node is live (heard from within the TTL).",
                               labels=labels)  # fmt: skip
        draining = GaugeMetricFamily("roundhouse_node_draining", "1 while the node drains.", labels=labels)
        for node in r.inventory.nodes():
            key = [node.node_id]
            total.add_metric(key, float(len(node.gpus)))
            allocated.add_metric(key, float(len(r.book.gpus_held_on(node.node_id))))
            up.add_metric(key, 1.0 if r.inventory.is_live(node.node_id) else 0.0)
            draining.add_metric(key, 1.0 if node.draining else 0.0)
        yield from (total, allocated, up, draining)
