"""GPU packing: per-model GPU memory and utilization profiles, and the slowdown of co-located jobs.

A contract shared by the simulator (``services.core.simulation.packing``), the ``gandiva`` placement
policy (its ``profiles``), the scheduler and the worker's lease table (``MAX_JOBS_PER_GPU``), so it
lives in ``services.core``. The worker's emulated jobs (``--emulate``) do not use the interference
model yet: packed emulated jobs each run at full speed, so an emulated live run with packing
finishes pairs sooner than the simulator does.

Gandiva (Xiao et al., OSDI '18; seed 001, "Packing") runs several training jobs on one GPU at once,
without NVIDIA MPS: the GPU time-shares their kernels. Its observations, which this module models:

* jobs "widely differ in terms of memory usage, GPU core utilization ... and/or interference from
  other jobs" (seed 001, "Domain knowledge" 2), so each model has a profile: GPU memory footprint,
  GPU (SM) utilization when it runs alone, and how sensitive it is to a co-tenant;
* if "the memory requirements of the packing jobs combined are higher than GPU memory, the overhead
  of paging ... is significantly high that packing is not effective": packed jobs must fit;
* "when the memory requirements of two or more jobs are smaller than GPU memory, packing still may
  not be more efficient than suspend-resume": interference can make a fitting pair lose, and
  Gandiva finds out by comparing mini-batch times before and after packing (introspection).

**Interference model** (the utilization-sum model, with a contention term). Job ``i`` of a GPU whose
jobs have solo utilizations ``u_1..u_k`` progresses at rate

    r_i = 1 / (max(1, sum u) * (1 + s_i * sum_{j != i} u_j))

of its solo speed: while the jobs' combined compute demand fits the GPU (``sum u <= 1``) each
would keep its speed, and beyond it the GPU's time is split in proportion to demand (the first
factor, the usual utilization-sum model of GPU sharing); on top of that, each co-tenant's kernels
contend for caches, memory bandwidth and the kernel scheduler, slowing job ``i`` in proportion to
how busy the co-tenant keeps the GPU and to ``i``'s *sensitivity* ``s_i`` (the second factor; 0:
immune). Packing beats time-slicing when ``sum r_i > 1`` (time-slicing gives each job its full
speed for ``1/k`` of the time: a total of 1), which is Gandiva's success test.

Where the model stands: the seed summary gives no packing slowdowns, and the full Gandiva paper
(Xiao et al., OSDI '18; its abstract reports +26% aggregate utilization on a 180-GPU cluster from
time-slicing, packing and migration) measures packing per job pair rather than publishing a model.
Summing utilizations to decide what fits is the usual first-order rule of GPU sharing (Gandiva
packs "the job with the lowest GPU utilization ... on a GPU with the lowest GPU utilization";
Salus, Yu & Chowdhury, arXiv:1902.04610, is another system that packs DL jobs on one GPU); the contention
term is Roundhouse's, so that fitting pairs can still lose, as the summary warns. Measured pairwise
co-location throughputs (Gavel's space-sharing tables, OSDI '20) would replace ``rates`` one for one.

**The numbers** in ``DEFAULT_PROFILES`` are Roundhouse's assumptions, orders of magnitude for the
Blox Table 2 models at their usual batch sizes on a 16 GB GPU (the simulator's default GPU), not
measurements from the papers: small or input-bound models (A3C's reinforcement learning is bound
by its CPU environment, Recoder by its sparse input pipeline, ResNet-18 on CIFAR-sized images)
leave the GPU mostly idle and take little memory; ImageNet ResNet-50, CycleGAN and the Transformer
keep it busy and take most of its memory; the LSTM language model is memory-bandwidth bound, hence
sensitive: two LSTM jobs fit a GPU together (utilizations sum to 1) yet lose to time-slicing
(0.44 + 0.44 < 1), the case Gandiva's introspection exists for. Pass other profiles to study
sensitivity.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

MAX_JOBS_PER_GPU = 2
"""Jobs one GPU may hold at once with packing: Gandiva packs pairs (its success test compares two
jobs' packed throughput with time-slicing them). One bound for every part that packs, so that the
simulator packs what the live scheduler grants and the worker runs: the simulator
(``PackingSimulator``), the scheduler (``services.scheduler.packing``) and the worker's lease table,
which refuses a shared grant beyond it (a scheduler bug must not pile leases onto one GPU)."""


@dataclass(frozen=True, slots=True)
class PackingProfile:
    """How one model uses a GPU when it runs alone on it."""

    gpu_util: float = 1.0
    """Fraction of the GPU's compute (SM time) the job keeps busy alone, in (0, 1]."""
    gpu_mem_mb: float = 16_384.0
    """GPU memory the job needs (weights, optimizer state, activations of one mini-batch)."""
    sensitivity: float = 1.0
    """Slowdown per unit of co-tenant utilization beyond the utilization-sum share (0: immune)."""
    iteration_s: float = 0.5
    """Seconds per mini-batch alone (what the job reports as its iteration time when unshared)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.gpu_util <= 1.0:
            raise ValueError(f"gpu_util must be in (0, 1], got {self.gpu_util}")
        if not self.gpu_mem_mb > 0 or not self.iteration_s > 0 or not self.sensitivity >= 0:
            raise ValueError("gpu_mem_mb and iteration_s must be > 0 and sensitivity >= 0")

    def for_policy(self) -> dict[str, Any]:
        """The profile as the ``gandiva`` placement policy's ``profiles`` take it: what a scheduler
        can know before packing (utilization and memory from profiling, the solo mini-batch time);
        the sensitivity is what packing reveals, so the policy does not get it."""
        return {"gpu_util": self.gpu_util, "gpu_mem_mb": self.gpu_mem_mb, "solo_iteration_s": self.iteration_s}


_OPAQUE = PackingProfile()
"""An unknown model: busy and large, so it is never packed (it fills a 16 GB GPU alone)."""

DEFAULT_PROFILES: Mapping[str, PackingProfile] = MappingProxyType(
    {
        # Blox Table 2 (philly-synthetic models); see the module docstring for where the numbers stand.
        "a3c": PackingProfile(gpu_util=0.25, gpu_mem_mb=1_500, sensitivity=0.3, iteration_s=0.20),
        "recoder": PackingProfile(gpu_util=0.30, gpu_mem_mb=2_500, sensitivity=0.5, iteration_s=0.15),
        "resnet18": PackingProfile(gpu_util=0.45, gpu_mem_mb=3_500, sensitivity=0.8, iteration_s=0.10),
        "lstm": PackingProfile(gpu_util=0.50, gpu_mem_mb=4_500, sensitivity=2.5, iteration_s=0.30),
        "cyclegan": PackingProfile(gpu_util=0.80, gpu_mem_mb=7_000, sensitivity=1.0, iteration_s=0.60),
        "resnet50": PackingProfile(gpu_util=0.90, gpu_mem_mb=11_000, sensitivity=1.0, iteration_s=0.40),
        "transformer": PackingProfile(gpu_util=0.90, gpu_mem_mb=13_000, sensitivity=1.2, iteration_s=0.50),
    }
)


@dataclass(frozen=True, slots=True)
class PackingModel:
    """Per-model profiles (by lower-case model name) with a default for unknown or unnamed models."""

    profiles: Mapping[str, PackingProfile] = field(default_factory=lambda: DEFAULT_PROFILES)
    default: PackingProfile = _OPAQUE

    def profile(self, model: str | None) -> PackingProfile:
        if model is None:
            return self.default
        return self.profiles.get(model.lower(), self.default)

    def fits(self, models: Iterable[str | None], memory_mb: float) -> bool:
        """Whether jobs of ``models`` fit together in a GPU of ``memory_mb`` (no paging)."""
        return math.fsum(self.profile(m).gpu_mem_mb for m in models) <= memory_mb

    def rates(self, models: tuple[str | None, ...]) -> tuple[float, ...]:
        """Each co-located job's speed relative to running alone on the GPU (the module's model);
        1.0 for a job alone."""
        if len(models) == 1:
            return (1.0,)
        profiles = [self.profile(m) for m in models]
        total = math.fsum(p.gpu_util for p in profiles)
        share = 1.0 / max(1.0, total)
        return tuple(share / (1.0 + p.sensitivity * (total - p.gpu_util)) for p in profiles)

    def policy_profiles(self) -> dict[str, dict[str, Any]]:
        """``profiles`` for the ``gandiva`` placement policy (``PackingProfile.for_policy``)."""
        return {model: p.for_policy() for model, p in sorted(self.profiles.items())}
