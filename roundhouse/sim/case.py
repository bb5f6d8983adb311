"""One simulation case, described by plain values (picklable, so sweeps run cases in processes)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from roundhouse.sim.cluster import ClusterSpecError, cluster_from_text, read_tiresias_spec
from roundhouse.sim.per_job import JobRecord, job_records
from roundhouse.sim.progress import ProgressBar
from roundhouse.sim.report import summarize
from roundhouse.sim.synthetic import FitGppSynthetic, GpuCounts, PhillySynthetic
from roundhouse.sim.traces import read_trace
from services.core.costs import CostModel
from services.core.link_profiles import link_profile, with_links
from services.core.network import NetworkModel
from services.core.packing import PackingModel
from services.core.protocols import Trigger
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.engine import SimConfig, Simulator
from services.core.simulation.packing import PackingSimulator
from services.core.simulation.workload import TraceJob, WorkloadError
from services.core.state import ClusterState

WORKLOADS: tuple[str, ...] = ("fitgpp-synthetic", "philly-synthetic")
GPU_COUNT_CHOICES: tuple[str, ...] = ("1", "gavel", "philly")


def default_traces_dir() -> Path:
    """``<repo>/../shared/data/traces``, where the project keeps real traces (not in the repo)."""
    return Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "traces"


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """Everything that defines one run; ``asdict`` of it goes into the report as ``config``."""

    workload: str | None = "philly-synthetic"
    trace: str | None = None
    format: str | None = None
    cluster: str = "32x4"
    cluster_spec: str | None = None
    jobs_per_hour: float = 8.0
    load: float = 2.0
    arrivals: str = "offered"
    """fitgpp-synthetic: ``offered`` (Poisson at the offered load) or ``fifo`` (load kept under FIFO)."""
    num_jobs: int | None = None
    gpus: str = "1"
    max_gpus: int | None = None
    """philly-synthetic: every job elastic up to this many GPUs (None: rigid)."""
    seed: int = 0
    round_s: float = 300.0
    track: tuple[int, int] | None = None
    scheduler: str = "fifo"
    admission: str = "accept-all"
    placement: str = "consolidated"
    free_preemption: bool = False
    round_on: tuple[str, ...] = ()
    fill_between_rounds: bool = False
    links: str | None = None
    """A link profile (``services.core.link_profiles``: ``p3.8xlarge``, ...) for every node (None: no links)."""
    uplink_gbps: float | None = None
    """Overrides the profile's node uplink, Gb/s."""
    network: bool = False
    """Rates from model sizes and link bandwidths (``SimConfig.network``) instead of the fixed spread slowdown."""
    heterogeneity: bool = False
    """GPU types set jobs' speeds (``SimConfig.heterogeneity``; a typed ``cluster`` gives the types)."""
    packing: bool = False
    """Several jobs per GPU where the placement packs them (``PackingSimulator`` with the default
    ``PackingModel``; a placement taking ``profiles``, e.g. gandiva, gets the model's unless given)."""
    scheduler_options: Mapping[str, Any] = field(default_factory=dict)
    """Keyword options of the scheduling policy (as a service's ``policy_options``)."""
    admission_options: Mapping[str, Any] = field(default_factory=dict)
    placement_options: Mapping[str, Any] = field(default_factory=dict)
    max_time_s: float | None = None
    debug: bool = False
    fast_paths: bool = True

    def labels(self) -> dict[str, str]:
        """Short labels for a sweep table."""
        return {
            "scheduler": self.scheduler,
            "admission": self.admission,
            "placement": self.placement,
            "load": f"{self.jobs_per_hour:g}/h" if self.trace is None and self.workload == "philly-synthetic"
            else f"{self.load:g}" if self.trace is None else Path(self.trace).name,
            "seed": str(self.seed),
        }


def build_cluster(case: Case) -> ClusterState:
    cluster = _shape(case)
    if case.links is None:
        return cluster
    return with_links(cluster, link_profile(case.links), uplink_gbps=case.uplink_gbps)


def _shape(case: Case) -> ClusterState:
    if case.cluster_spec is not None:
        return read_tiresias_spec(Path(case.cluster_spec))
    return cluster_from_text(case.cluster)


def build_workload(case: Case, cluster: ClusterState) -> Iterable[TraceJob]:
    if case.max_gpus is not None and (case.trace is not None or case.workload != "philly-synthetic"):
        raise WorkloadError(
            "--max-gpus applies to philly-synthetic only (a roundhouse CSV trace gives each job's max_gpus)"
        )
    if case.trace is not None:
        if case.format is None:
            raise WorkloadError("--trace needs --format (tiresias, pollux, philly or roundhouse)")
        jobs: Iterable[TraceJob] = read_trace(Path(case.trace), case.format)
        if case.num_jobs is not None:
            jobs = list(jobs)[: case.num_jobs]
        return jobs
    if case.workload == "philly-synthetic":
        if case.gpus == "1":
            gpu_counts = GpuCounts.single()
        elif case.gpus == "gavel":
            gpu_counts = GpuCounts.gavel()
        elif case.gpus == "philly":
            gpu_counts = GpuCounts.from_philly(default_traces_dir() / "philly-pollux.csv")
        else:
            raise WorkloadError(f"--gpus must be one of {', '.join(GPU_COUNT_CHOICES)}, got {case.gpus!r}")
        if case.num_jobs is None and case.track is None:
            raise WorkloadError("philly-synthetic is an endless stream: give --track START:END or --num-jobs N")
        return PhillySynthetic(
            jobs_per_hour=case.jobs_per_hour,
            seed=case.seed,
            gpu_counts=gpu_counts,
            num_jobs=case.num_jobs,
            elastic_max_gpus=case.max_gpus,
        )
    if case.workload == "fitgpp-synthetic":
        return FitGppSynthetic(
            total_gpus=cluster.total_gpus,
            load=case.load,
            num_jobs=case.num_jobs if case.num_jobs is not None else 2**19,
            max_gpus=min(8, cluster.largest_node_gpus),
            seed=case.seed,
            arrivals=case.arrivals,
        )
    raise WorkloadError(f"unknown workload {case.workload!r}; valid: {', '.join(WORKLOADS)} (or --trace FILE)")


def _triggers(names: Iterable[str]) -> Trigger:
    result = Trigger(0)
    for name in names:
        try:
            result |= Trigger[name.upper()]
        except KeyError:
            raise ValueError(f"unknown round trigger {name!r}; valid: arrival, completion, churn, timer") from None
    return result


def trigger_names(triggers: Trigger) -> list[str]:
    """The events that start rounds, by name (``timer``, ``arrival``, ``completion``): a report says
    which regime produced it, since round timing moves JCT and responsiveness a lot (Blox rounds on a
    300 s timer; the Tiresias and FitGpp simulators decide on every arrival and completion)."""
    return [t.name.lower() for t in (Trigger.TIMER, Trigger.ARRIVAL, Trigger.COMPLETION) if t & triggers and t.name]


@dataclass(frozen=True, slots=True)
class CaseResult:
    report: dict[str, Any]
    jct_s: list[float]
    responsiveness_s: list[float]
    jobs: tuple[JobRecord, ...] = ()
    """Per measured, finished job, by job index (only when ``run_case`` was asked to record them)."""


def _job_count(case: Case) -> int | None:
    """The jobs a run of ``case`` measures, if known in advance (for its progress bar)."""
    if case.track is not None:
        return case.track[1] - case.track[0] + 1
    return case.num_jobs


def packing_options(placement: str, options: Mapping[str, Any], packing: PackingModel) -> dict[str, Any]:
    """``options`` plus the packing model's ``profiles`` when the placement takes them and none are
    given (so ``--packing`` with gandiva packs with the profiles the simulator models)."""
    if "profiles" in options:
        return dict(options)
    with_profiles = {**options, "profiles": packing.policy_profiles()}
    try:
        PLACEMENT.check(placement, with_profiles)
    except ValueError:
        return dict(options)  # a placement without profiles packs nothing: the simulator is the engine
    return with_profiles


def run_case(case: Case, *, progress: bool = False, record_jobs: bool = False) -> CaseResult:
    """Build everything ``case`` names, run it, and summarize (and keep per-job records if asked)."""
    cluster = build_cluster(case)
    workload = build_workload(case, cluster)
    config = SimConfig(
        round_s=case.round_s,
        track=case.track,
        max_time_s=case.max_time_s,
        extra_triggers=_triggers(case.round_on),
        fill_between_rounds=case.fill_between_rounds,
        heterogeneity=case.heterogeneity,
        network=NetworkModel() if case.network else None,
        costs=CostModel.free() if case.free_preemption else CostModel(),
        debug=case.debug,
        fast_paths=case.fast_paths,
        record_jobs=record_jobs,
    )
    scheduling = SCHEDULING.create(case.scheduler, **case.scheduler_options)
    bar = ProgressBar(_job_count(case)) if progress else None
    admission = ADMISSION.create(case.admission, **case.admission_options)
    simulator: Simulator
    if case.packing:
        packing = PackingModel()
        placement = PLACEMENT.create(case.placement, **packing_options(case.placement, case.placement_options, packing))
        simulator = PackingSimulator(
            workload, cluster, admission=admission, scheduling=scheduling, placement=placement, config=config,
            progress=bar, packing=packing,
        )  # fmt: skip
    else:
        placement = PLACEMENT.create(case.placement, **case.placement_options)
        simulator = Simulator(
            workload, cluster, admission=admission, scheduling=scheduling, placement=placement, config=config,
            progress=bar,
        )  # fmt: skip
    started = time.perf_counter()
    try:
        outcome = simulator.run()
    finally:
        if bar is not None:
            bar.stop()  # after an error too, or a terminal is left without its cursor
    wall = time.perf_counter() - started
    recorded = asdict(case)
    recorded["track"] = list(case.track) if case.track is not None else None
    recorded["round_on"] = list(case.round_on)
    report = summarize(outcome, wall_s=wall, config=recorded)
    report["round_triggers"] = trigger_names(scheduling.triggers | config.extra_triggers)
    return CaseResult(
        report=report,
        jct_s=sorted(outcome.jct),
        responsiveness_s=sorted(outcome.responsiveness),
        jobs=job_records(outcome) if record_jobs else (),
    )


__all__ = ["Case", "CaseResult", "ClusterSpecError", "build_cluster", "build_workload", "run_case"]
