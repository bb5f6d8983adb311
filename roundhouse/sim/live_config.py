"""One configuration for both worlds: a simulation built from a live cluster's own settings (issue 18).

The simulator and the live services run the same policy code, but each used to take its settings
from its own defaults, and they drifted apart: the scheduler service gained fill rounds between its
policy rounds (on by default) while the fidelity benchmark's simulation kept starting jobs at rounds
only, and simulated JCT came out 39% above live. Here the simulation's settings are *derived* from
the services' settings models, parsed from the very flags a ``LocalCluster`` starts each service with
(:func:`local_cluster_settings`), so a setting changed on the live side changes the simulation too:

==========================  ===========================================================================
simulation                  live setting
==========================  ===========================================================================
round length                ``SchedulerConfig.round_s`` x the time scale
fill rounds                 ``SchedulerConfig.fill_between_rounds``
scheduling policy, options  ``SchedulerConfig.policy`` / ``policy_options`` (durations x the time scale)
placement policy, options   ``PlacementConfig.policy`` / ``policy_options`` (the same)
admission policy, options   ``AdmissionConfig.policy`` / ``policy_options`` (the same)
preemption costs            an emulating worker's: each model's checkpoint cost (``services.core.costs``,
                            as ``services.worker.emulator`` waits it), ``emulate_checkpoint_s`` for a job
                            without a model, and no restore, relaunch or spread penalty (the emulator
                            charges none); real jobs pay their own costs: the simulator's defaults
lease TTL                   ``SchedulerConfig.lease_ttl_s`` (recorded: the simulator has no failures)
start and stop latency      measured by the caller (``benchmarks/start_latency.py``, or the probes of
                            ``benchmarks/fidelity.py``), in live seconds
==========================  ===========================================================================

The *time scale* is simulated seconds per live second: an emulating worker's ``speedup`` (its jobs
run that much faster than their trace durations, and ``LocalCluster`` divides the round by it), 1
for real jobs. Live latencies are multiplied by it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from services.admission.service import AdmissionConfig
from services.core.costs import CostModel, ModelCosts
from services.core.packing import PackingModel
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING, Registry
from services.core.simulation.engine import SimConfig, Simulator
from services.core.simulation.packing import PackingSimulator
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState
from services.placement.service import PlacementConfig
from services.runtime import entry
from services.runtime.config import ServiceConfig, load_config
from services.scheduler.config import SchedulerConfig
from services.worker.config import WorkerConfig

if TYPE_CHECKING:
    from roundhouse.local import LocalCluster

__all__ = [
    "LiveSettings",
    "LiveSimulation",
    "emulated_costs",
    "local_cluster_settings",
    "parse_service_args",
    "scaled_options",
    "simulation_from_live",
]

C = TypeVar("C", bound=ServiceConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSettings:
    """The settings a live cluster's services and (one of its) workers run with."""

    scheduler: SchedulerConfig
    placement: PlacementConfig
    admission: AdmissionConfig
    worker: WorkerConfig


def parse_service_args(kind: str, model: type[C], argv: Sequence[str], environ: Mapping[str, str] | None = None) -> C:
    """The settings ``roundhouse service KIND ARGV`` would run with in ``environ`` (default: this
    process's): the service's own flag parser and merge (defaults < ``--config`` file <
    ``ROUNDHOUSE_*`` environment < flags). A leading ``service KIND`` in ``argv`` is skipped."""
    args = list(argv)
    if args[:2] == ["service", kind]:
        args = args[2:]
    parsed = entry.build_parser(kind, model).parse_args(args)
    return load_config(model, file=parsed.config, flags=entry.parse_flags(model, parsed), environ=environ)


def local_cluster_settings(cluster: LocalCluster) -> LiveSettings:
    """What ``cluster`` (started: its broker is up) runs its services and its first worker with."""
    env = cluster.child_env()  # what the children see: without the shared policy variables
    return LiveSettings(
        scheduler=parse_service_args("scheduler", SchedulerConfig, cluster.service_args("scheduler"), env),
        placement=parse_service_args("placement", PlacementConfig, cluster.service_args("placement"), env),
        admission=parse_service_args("admission", AdmissionConfig, cluster.service_args("admission"), env),
        worker=parse_service_args("worker", WorkerConfig, cluster.worker_args(0), env),
    )


def emulated_costs(worker: WorkerConfig, base: CostModel | None = None) -> CostModel:
    """The preemption costs an emulating worker charges (``services.worker.emulator``): each model's
    checkpoint cost from ``base`` (the emulator's ``CostModel()``), ``emulate_checkpoint_s`` for a job
    without a model, and no restore, relaunch or spread slowdown (an emulated job resumes at once and
    runs at full speed wherever it is placed)."""
    base = base or CostModel()

    def emulated(costs: ModelCosts, checkpoint_s: float) -> ModelCosts:
        return ModelCosts(checkpoint_s=checkpoint_s, restore_s=0.0, relaunch_s=0.0, spread_slowdown=1.0,
                          scaling_exponent=costs.scaling_exponent)  # fmt: skip

    models = {name: emulated(costs, costs.checkpoint_s) for name, costs in base.models.items()}
    # A job without a model gets the worker's emulate_checkpoint_s, as in the emulator (the engine asks
    # for_model(None) -> default). A model name the table lacks gets the same default here but the
    # CostModel's default in the emulator: equal unless emulate_checkpoint_s was changed.
    return CostModel(models=MappingProxyType(models), default=emulated(base.default, worker.emulate_checkpoint_s))


def scaled_options(registry: Registry[Any], name: str, options: Mapping[str, Any], scale: float) -> dict[str, Any]:
    """``options`` of policy ``name`` with every duration multiplied by ``scale``.

    A live service's clock is real time: on an emulated cluster at speed-up X, an option of 60 s
    (LAS's ``starvation_s``, Tiresias' ``queue_thresholds_gpu_s``, ...) is 60 X simulated seconds.
    Durations are the options whose name ends in ``_s`` (the project's convention), given or left at
    the factory's default (read from its signature): numbers and sequences of numbers; None stays."""
    out = dict(options)
    if scale == 1.0:
        return out
    registry.names()  # loads the policy packages
    factory = registry._factories.get(name)
    defaults: dict[str, Any] = {}
    if factory is not None:
        try:
            parameters = list(inspect.signature(factory).parameters.values())
        except (TypeError, ValueError):  # a factory without a signature: only the given options
            parameters = []
        for parameter in parameters:
            if parameter.kind is parameter.KEYWORD_ONLY and parameter.default is not parameter.empty:
                defaults[parameter.name] = parameter.default
    for key in sorted({*defaults, *out}):
        if not key.endswith("_s"):
            continue
        value = out.get(key, defaults.get(key))
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            out[key] = value * scale
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
            out[key] = [v * scale for v in value]
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSimulation:
    """A simulator configuration and its policies, derived from a live cluster's settings."""

    config: SimConfig
    scheduler: str
    scheduler_options: Mapping[str, Any] = field(default_factory=dict)
    placement: str
    placement_options: Mapping[str, Any] = field(default_factory=dict)
    admission: str
    admission_options: Mapping[str, Any] = field(default_factory=dict)
    time_scale: float
    """Simulated seconds per live second (an emulating worker's speed-up; 1 for real jobs)."""
    lease_ttl_s: float
    """The live lease TTL in simulated seconds (recorded: the simulator models no failures)."""
    emulated: bool
    costs_given: bool = False
    """The caller replaced the derived preemption costs."""
    packing: bool = False
    """The live scheduler runs with ``--packing``: the simulation packs as it does (the packing
    simulator, whose interference model the emulating worker does not apply: docs/scheduler.md)."""

    def simulator(self, workload: Iterable[TraceJob], cluster: ClusterState) -> Simulator:
        """A simulator of ``workload`` on ``cluster`` with fresh policy objects built from the settings."""
        admission = ADMISSION.create(self.admission, **self.admission_options)
        scheduling = SCHEDULING.create(self.scheduler, **self.scheduler_options)
        placement = PLACEMENT.create(self.placement, **self.placement_options)
        if self.packing:
            return PackingSimulator(workload, cluster, admission=admission, scheduling=scheduling,
                                    placement=placement, config=self.config, packing=PackingModel())  # fmt: skip
        return Simulator(
            workload, cluster, admission=admission, scheduling=scheduling, placement=placement, config=self.config
        )

    def describe(self) -> dict[str, Any]:
        """The derived settings, for a report (JSON-ready)."""
        config = self.config
        return {
            "source": "live settings",
            "scheduler": self.scheduler, "scheduler_options": dict(self.scheduler_options),
            "placement": self.placement, "placement_options": dict(self.placement_options),
            "admission": self.admission, "admission_options": dict(self.admission_options),
            "round_s": config.round_s, "fill_between_rounds": config.fill_between_rounds, "packing": self.packing,
            "start_latency_s": config.start_latency_s, "stop_latency_s": config.stop_latency_s,
            "time_scale": self.time_scale, "lease_ttl_s": self.lease_ttl_s,
            "costs": "given by the caller" if self.costs_given
            else "emulated worker (checkpoint only)" if self.emulated else "simulator defaults (real jobs)",
        }  # fmt: skip


def simulation_from_live(
    settings: LiveSettings,
    *,
    start_latency_s: float | Sequence[float] = 0.0,
    stop_latency_s: float = 0.0,
    record_jobs: bool = False,
    max_time_s: float | None = None,
    costs: CostModel | None = None,
) -> LiveSimulation:
    """The simulation of a cluster that runs with ``settings``. Latencies are live seconds (the
    simulation gets them multiplied by the time scale): a constant, or measured samples. ``costs``
    replaces the derived preemption costs (e.g. ``CostModel.free()`` to replay run times measured
    live, which already include what each preemption cost)."""
    scheduler, worker = settings.scheduler, settings.worker
    scale = worker.speedup if worker.emulate else 1.0
    if isinstance(start_latency_s, (int, float)):
        start: float | tuple[float, ...] = float(start_latency_s) * scale
    else:
        start = tuple(float(x) * scale for x in start_latency_s)
    config = SimConfig(
        round_s=scheduler.round_s * scale,
        fill_between_rounds=scheduler.fill_between_rounds,
        costs=costs if costs is not None else emulated_costs(worker) if worker.emulate else CostModel(),
        start_latency_s=start,
        stop_latency_s=stop_latency_s * scale,
        record_jobs=record_jobs,
        max_time_s=max_time_s,
    )
    placement, admission = settings.placement, settings.admission
    return LiveSimulation(
        config=config,
        scheduler=scheduler.policy,
        scheduler_options=scaled_options(SCHEDULING, scheduler.policy, scheduler.policy_options, scale),
        placement=placement.policy,
        placement_options=scaled_options(PLACEMENT, placement.policy, placement.policy_options, scale),
        admission=admission.policy,
        admission_options=scaled_options(ADMISSION, admission.policy, admission.policy_options, scale),
        time_scale=scale,
        lease_ttl_s=scheduler.lease_ttl_s * scale,
        emulated=worker.emulate,
        costs_given=costs is not None,
        packing=scheduler.packing,
    )
