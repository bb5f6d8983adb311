"""Pollux's goodput model: throughput x statistical efficiency (Qiao et al., OSDI '21, §3).

A data-parallel job on ``replicas`` GPUs over ``nodes`` nodes, at total batch size ``M``, makes
progress at

    GOODPUT(nodes, replicas, M) = THROUGHPUT(nodes, replicas, M) x EFFICIENCY(M)

* **Throughput** (Pollux §3.2; adaptdl ``adaptdl/goodput.py``, ``_predict_*``): per-GPU compute time
  ``alpha_c + beta_c * atomic_bsz`` for each micro-batch, network time ``alpha + beta * (replicas -
  2)`` with intra-node (``_r``) or inter-node (``_n``) constants, and an overlap exponent ``gamma``:
  ``T_sync_step = (T_compute^gamma + T_network^gamma)^(1/gamma)``; with ``s`` gradient-accumulation
  steps a step takes ``s * T_compute + T_sync_step`` and processes ``replicas * atomic_bsz * (s+1)``
  examples.
* **Statistical efficiency** (Pollux §3.1, after McCandlish et al., *An Empirical Model of
  Large-Batch Training*, 2018): with the gradient noise scale ``B_noise`` (examples) and the job's
  initial batch size ``M0``, ``EFFICIENCY(M) = (B_noise + M0) / (B_noise + M)``: an example
  processed at batch size ``M`` is worth ``EFFICIENCY(M)`` of one processed at ``M0`` (large
  batches help little while the noise scale is small, early in training).

Progress is counted as Pollux's simulator counts it (adaptdl ``simulator/simulator.py``,
``Job.step``): in iterations at the initial batch size, so ``goodput`` is such iterations per
second and a job is done after ``total_progress`` of them.

A job picks the batch size (and accumulation steps) that maximises its goodput on its allocation
(adaptdl ``GoodputFunction.optimize``: 50 batch sizes in geometric space between the smallest
valid one and ``max_batch_size``), so its **speed-up** on an allocation is that best goodput over
the best goodput on one GPU (adaptdl ``simulator/speedup.py``). Pollux's scheduler maximises a
fairness-weighted mean of these speed-ups (``services.scheduler.policies.pollux``).

The per-model constants (``PROFILES``) are fitted to the measurements in adaptdl's simulator
(branch ``osdi21-artifact``, ``simulator/traces/<model>/``) by ``benchmarks/fit_pollux_profiles.py``,
which says how; the noise scale is kept at five evenly spaced fractions of the job's progress (it
grows as training goes on, which is why Pollux grows batch sizes late in training).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Final

__all__ = [
    "PROFILES",
    "BatchConfig",
    "GoodputProfile",
    "PerfParams",
    "profile_for",
]

_EPS: Final = 1e-8
"""Tolerance of adaptdl's floor/ceil operations on batch sizes."""
BATCH_CANDIDATES: Final = 50
"""Total batch sizes tried per allocation (adaptdl ``np.geomspace``'s default count)."""


@dataclass(frozen=True, slots=True)
class PerfParams:
    """adaptdl's ``PerfParams``: the throughput model's seven constants (seconds)."""

    alpha_c: float
    """Compute time per micro-batch: constant term."""
    beta_c: float
    """Compute time per micro-batch: per example of the micro-batch."""
    alpha_n: float
    """Inter-node all-reduce time: constant term."""
    beta_n: float
    """Inter-node all-reduce time: per replica beyond two (ring retrogression)."""
    alpha_r: float
    """Intra-node all-reduce time: constant term."""
    beta_r: float
    """Intra-node all-reduce time: per replica beyond two."""
    gamma: float
    """Overlap of compute and network, in [1, 10]: 1 none (times add), large total (max)."""

    def __post_init__(self) -> None:
        for name in ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if not 1.0 <= self.gamma <= 10.0:
            raise ValueError(f"gamma must be in [1, 10], got {self.gamma}")

    def compute_time(self, atomic_bsz: int) -> float:
        return self.alpha_c + self.beta_c * atomic_bsz

    def network_time(self, nodes: int, replicas: int) -> float:
        """All-reduce time of one synchronisation; zero on one GPU."""
        if replicas <= 1:
            return 0.0
        extra = max(replicas - 2, 0)
        if nodes > 1:
            return self.alpha_n + self.beta_n * extra
        return self.alpha_r + self.beta_r * extra

    def step_time(self, nodes: int, replicas: int, atomic_bsz: int, accum_steps: int) -> float:
        """Seconds per optimizer step: ``accum_steps`` local micro-batches, then one synchronised."""
        compute = self.compute_time(atomic_bsz)
        network = self.network_time(nodes, replicas)
        g = self.gamma
        synced = (compute**g + network**g) ** (1.0 / g) if network > 0 else compute
        return accum_steps * compute + synced


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """A job's best batch configuration on one allocation."""

    goodput: float
    """Progress per second: iterations at the initial batch size, discounted by efficiency."""
    batch_size: int
    atomic_bsz: int
    """Examples per GPU per micro-batch."""
    accum_steps: int
    """Gradient-accumulation steps before each synchronisation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GoodputProfile:
    """One model's goodput constants (see the module docstring for where they come from)."""

    perf: PerfParams
    init_batch_size: int
    """The batch size the user gave (``M0``): efficiency is 1 there."""
    max_batch_size: int
    """The largest total batch size the job may use (its validated range)."""
    local_bsz: tuple[int, int]
    """Smallest and largest examples per GPU per micro-batch (GPU memory bounds the largest)."""
    total_progress: float
    """Iterations at ``init_batch_size`` to completion (``max_epochs`` epochs in adaptdl)."""
    noise_scale: tuple[float, ...]
    """Gradient noise scale (examples) at evenly spaced fractions of progress, first at 0, last at 1."""

    def __post_init__(self) -> None:
        low, high = self.local_bsz
        if not 1 <= low <= high:
            raise ValueError(f"local_bsz must be 1 <= min <= max, got {self.local_bsz}")
        if not 1 <= self.init_batch_size <= self.max_batch_size:
            raise ValueError("batch sizes must be 1 <= init_batch_size <= max_batch_size")
        if not (math.isfinite(self.total_progress) and self.total_progress > 0):
            raise ValueError(f"total_progress must be positive, got {self.total_progress}")
        if not self.noise_scale or not all(math.isfinite(x) and x >= 0 for x in self.noise_scale):
            raise ValueError("noise_scale needs at least one finite value >= 0")

    @property
    def max_replicas(self) -> int:
        """More GPUs than this cannot each get ``local_bsz[0]`` examples within ``max_batch_size``."""
        return max(1, self.max_batch_size // self.local_bsz[0])

    def noise_scale_at(self, fraction: float) -> float:
        """The noise scale at ``fraction`` of the job's progress (linear between the knots)."""
        knots = self.noise_scale
        if len(knots) == 1:
            return knots[0]
        x = min(max(fraction, 0.0), 1.0) * (len(knots) - 1)
        i = min(int(x), len(knots) - 2)
        return knots[i] + (knots[i + 1] - knots[i]) * (x - i)

    def efficiency(self, batch_size: float, noise_scale: float) -> float:
        """Statistical efficiency of ``batch_size`` relative to ``init_batch_size`` (1 there)."""
        return (noise_scale + self.init_batch_size) / (noise_scale + batch_size)

    def goodput(self, nodes: int, replicas: int, atomic_bsz: int, accum_steps: int, noise_scale: float) -> float:
        """Progress per second (iterations at the initial batch size) of one configuration."""
        batch = replicas * atomic_bsz * (accum_steps + 1)
        step = self.perf.step_time(nodes, replicas, atomic_bsz, accum_steps)
        return batch / self.init_batch_size * self.efficiency(batch, noise_scale) / step

    def best(self, nodes: int, replicas: int, noise_scale: float) -> BatchConfig | None:
        """The batch configuration with the highest goodput on ``replicas`` GPUs over ``nodes``
        nodes (adaptdl ``GoodputFunction.optimize`` with accumulation); None when no valid one
        exists (more replicas than ``max_replicas``)."""
        return _best(self, nodes, replicas, _bucket(noise_scale))

    def speedup(self, nodes: int, replicas: int, noise_scale: float) -> float:
        """Best goodput on this allocation over the best on one GPU (0 for no GPUs or no valid
        configuration): Pollux's SPEEDUP_j (§4.1)."""
        if replicas <= 0:
            return 0.0
        here = self.best(nodes, replicas, noise_scale)
        base = self.best(1, 1, noise_scale)
        if here is None or base is None:
            return 0.0
        return here.goodput / base.goodput

    def fixed_goodput(self, nodes: int, replicas: int, batch_size: int, noise_scale: float) -> float:
        """Goodput at a fixed total batch size (a job that does not adapt it: Pollux's baselines run
        the trace's tuned ``batch_size``), split as adaptdl's simulator splits it (``update_local_bsz``)."""
        local = math.ceil(batch_size / replicas - _EPS)
        accum = math.ceil(local / self.local_bsz[1] - _EPS) - 1
        if replicas == 1 and batch_size > self.init_batch_size:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - _EPS)
        return self.goodput(nodes, replicas, atomic, accum, noise_scale)

    def seconds(self, nodes: int, replicas: int, batch_size: int | None = None) -> float:
        """Seconds to finish alone on this allocation: at ``batch_size`` fixed, or (None) at the
        best batch size, re-chosen as the noise scale grows. Integrates ``d progress / goodput``
        over ``SLICES`` equal slices of the progress (midpoint rule)."""
        if batch_size is None:
            return self.remaining_seconds(nodes, replicas, 0.0)
        slice_progress = self.total_progress / SLICES
        return sum(
            slice_progress / self.fixed_goodput(nodes, replicas, batch_size, self.noise_scale_at((k + 0.5) / SLICES))
            for k in range(SLICES)
        )

    def remaining_seconds(self, nodes: int, replicas: int, fraction: float) -> float:
        """Seconds from ``fraction`` of the progress to the end, alone on this allocation at the
        best batch size (``math.inf`` when it has no valid configuration)."""
        times = _slice_seconds(self, nodes, replicas)
        if not times:
            return math.inf
        x = min(max(fraction, 0.0), 1.0) * SLICES
        k = min(int(x), SLICES - 1)
        return times[k] * (k + 1 - x) + _suffix(self, nodes, replicas)[k + 1]

    def progress_fraction(self, one_gpu_seconds: float) -> float:
        """The fraction of the progress a job has made after ``one_gpu_seconds`` of work on one
        GPU (how the simulator, which counts work in those seconds, finds the noise scale)."""
        times = _slice_seconds(self, 1, 1)
        done = max(one_gpu_seconds, 0.0)
        for k, seconds in enumerate(times):
            if done < seconds:
                return (k + done / seconds) / SLICES
            done -= seconds
        return 1.0

    def mean_speedup(self, nodes: int, replicas: int, fraction: float) -> float:
        """The speed-up that takes the job from ``fraction`` to the end on this allocation in the
        time it really takes there (the one-GPU time over this allocation's, both from
        ``fraction``): the constant rate that is exact for a run kept to completion, however the
        noise scale grows meanwhile."""
        here = self.remaining_seconds(nodes, replicas, fraction)
        if replicas <= 0 or not math.isfinite(here) or here <= 0:
            return 0.0
        return self.remaining_seconds(1, 1, fraction) / here


SLICES: Final = 64
"""Slices of the progress over which run times are integrated."""


@lru_cache(maxsize=4_096)
def _slice_seconds(profile: GoodputProfile, nodes: int, replicas: int) -> tuple[float, ...]:
    """Seconds per slice of progress on one allocation at the best batch size (empty if none)."""
    slice_progress = profile.total_progress / SLICES
    out: list[float] = []
    for k in range(SLICES):
        config = profile.best(nodes, replicas, profile.noise_scale_at((k + 0.5) / SLICES))
        if config is None:
            return ()
        out.append(slice_progress / config.goodput)
    return tuple(out)


@lru_cache(maxsize=4_096)
def _suffix(profile: GoodputProfile, nodes: int, replicas: int) -> tuple[float, ...]:
    """``_suffix(...)[k]``: seconds of slices ``k..SLICES-1`` (0 at ``SLICES``)."""
    out = [0.0]
    for seconds in reversed(_slice_seconds(profile, nodes, replicas)):
        out.append(out[-1] + seconds)
    return tuple(reversed(out))


def _bucket(noise_scale: float) -> float:
    """Round the noise scale to 5% steps in log space, so that ``best``'s cache is hit across
    rounds: efficiency ``(B + M0) / (B + M)`` moves by less than 5% over such a step."""
    if noise_scale <= 0 or not math.isfinite(noise_scale):
        return 0.0
    return round(math.exp(round(math.log(noise_scale) * 20) / 20), 6)


@lru_cache(maxsize=4_096)
def _candidates(profile: GoodputProfile, nodes: int, replicas: int) -> tuple[tuple[float, int, int, int], ...]:
    """The valid batch configurations on one allocation, as ``(examples per second / M0, batch,
    atomic_bsz, accum_steps)``: everything but the efficiency, which alone depends on the noise
    scale. adaptdl ``GoodputFunction.optimize`` with accumulation: ``BATCH_CANDIDATES`` batch sizes
    in geometric space from the smallest valid one to ``max_batch_size``."""
    low, high = profile.local_bsz
    smallest = max(profile.init_batch_size, low * replicas)
    largest = profile.max_batch_size
    if smallest > largest:
        return ()
    out: list[tuple[float, int, int, int]] = []
    ratio = largest / smallest
    for k in range(BATCH_CANDIDATES):
        batch = smallest * ratio ** (k / (BATCH_CANDIDATES - 1))
        local = batch / replicas
        accum = math.ceil(local / high - _EPS) - 1
        if replicas == 1 and local > profile.init_batch_size + _EPS:
            # adaptdl: one GPU above the initial batch size accumulates at least once, because the
            # gradient statistics need two micro-batches to be estimated.
            accum = max(accum, 1)
        atomic = math.ceil(local / (accum + 1) - _EPS)
        if not low <= atomic <= high:
            continue
        total = replicas * atomic * (accum + 1)
        step = profile.perf.step_time(nodes, replicas, atomic, accum)
        out.append((total / profile.init_batch_size / step, total, atomic, accum))
    return tuple(out)


@lru_cache(maxsize=65_536)
def _best(profile: GoodputProfile, nodes: int, replicas: int, noise_scale: float) -> BatchConfig | None:
    best: tuple[float, int, int, int] | None = None
    best_value = -1.0
    for candidate in _candidates(profile, nodes, replicas):
        value = candidate[0] / (noise_scale + candidate[1])  # goodput / (B + M0): same argmax
        if value > best_value:
            best, best_value = candidate, value
    if best is None:
        return None
    speed, total, atomic, accum = best
    return BatchConfig(speed * profile.efficiency(total, noise_scale), total, atomic, accum)


PROFILES: Mapping[str, GoodputProfile] = MappingProxyType(
    {
        # Fitted by benchmarks/fit_pollux_profiles.py from adaptdl osdi21-artifact simulator/traces.
        "bert": GoodputProfile(
            perf=PerfParams(0.213, 0.05784, 1.405, 0.008824, 0.1839, 0.05953, 2.0),
            init_batch_size=12,
            max_batch_size=384,
            local_bsz=(4, 12),
            total_progress=14774,
            noise_scale=(423, 423, 423, 689.6, 1124),
        ),
        "cifar10": GoodputProfile(
            perf=PerfParams(0.01723, 0.0006642, 0.1068, 0.001998, 0.06811, 0.0, 1.3),
            init_batch_size=128,
            max_batch_size=4096,
            local_bsz=(32, 1024),
            total_progress=39062.9,
            noise_scale=(72.48, 2498, 4837, 1.244e04, 3.866e04),
        ),
        "ncf": GoodputProfile(
            perf=PerfParams(0.007353, 4.317e-07, 0.01413, 0.0006029, 0.00383, 0.0008774, 1.0),
            init_batch_size=256,
            max_batch_size=32768,
            local_bsz=(32, 32768),
            total_progress=194174,
            noise_scale=(1.857e04, 1.511e06, 7.49e06, 2.959e07, 5.913e07),
        ),
        "imagenet": GoodputProfile(
            perf=PerfParams(0.07844, 0.004208, 0.2894, 0.006119, 0.08341, 0.05341, 2.1),
            init_batch_size=200,
            max_batch_size=12800,
            local_bsz=(20, 200),
            total_progress=576526,
            noise_scale=(928.2, 5959, 1.136e04, 1.437e04, 1.443e04),
        ),
        "deepspeech2": GoodputProfile(
            perf=PerfParams(0.09128, 0.02905, 0.7604, 0.008295, 0.3033, 0.04792, 1.8),
            init_batch_size=20,
            max_batch_size=640,
            local_bsz=(10, 80),
            total_progress=28536,
            noise_scale=(10.23, 2345, 2.122e04, 1.075e07, 2.106e05),
        ),
        "yolov3": GoodputProfile(
            perf=PerfParams(0.2164, 0.0243, 0.7472, 0.009321, 0.05596, 0.07295, 1.1),
            init_batch_size=8,
            max_batch_size=512,
            local_bsz=(4, 8),
            total_progress=103444,
            noise_scale=(0.6494, 374.3, 433.6, 934.9, 5099),
        ),
    }
)
"""Goodput profiles of the models in Pollux's workloads (``pollux-workload-*.csv``'s ``application``)."""


def profile_for(model: str | None) -> GoodputProfile | None:
    """The goodput profile of ``model`` (case-insensitive), or None when it has none."""
    if model is None:
        return None
    return PROFILES.get(model.lower())
