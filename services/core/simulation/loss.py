"""Simulated training loss: a job's loss as a function of its training progress.

The simulator has no real training, so loss-aware policies (Hermes' convergence ``C``, SLAQ's
highest loss first, Blox §5.3 loss-based termination) read a modelled curve instead. A
:class:`LossCurve` maps *progress* ``p`` = the fraction of the job's work done (``done_s / work_s``,
the same as the fraction of its iterations) to a loss:

    loss(p) = floor + (initial - floor) * exp(-decay * p)                               (smooth)

an exponential decay towards a floor: the shape of the loss curves of Hermes Fig. 2b and 4 (a
steep start whose slope shrinks, "the slope of loss curves decreases exponentially", §3.3). With
``noise`` > 0 the reported value is multiplied by ``1 + noise * u`` where ``u`` in [-1, 1] is a
deterministic function of ``seed`` and of the progress step (``noise_steps`` steps over the job;
the same progress always gives the same value), the fluctuation Hermes' Eq. 2 smooths (Fig. 4).
:meth:`LossCurve.progress_at` inverts the *smooth* curve: when the true loss reaches a value.

Named families (:func:`family`) after Hermes §2.2 and Fig. 2, measured there as iterations to reach
a goal out of 1000-iteration jobs: *fast* combinations reach it within the first half of the
job (500 iterations), *moderate* ones within the job (1000 iterations), *slow* ones never (their
floor stays above the goal). Here the goal is 90% of the way from the initial loss to the optimum
(Hermes §4.2 "90% of the optimal loss"), and a family draws, from a seeded generator, the
progress at which the curve gets there (fast: 0.2-0.5, moderate: 0.5-0.95) or, for slow, a floor
40-90% of the way back up from the optimum and a small decay (1-2). These ranges are Roundhouse's
reading of Fig. 2 (its curves are an image, not numbers): the point is the paper's observation
that good combinations converge quickly early, which Hermes exploits.

:meth:`LossCurve.reaching` builds a curve that reaches a target at a given progress (Blox §5.3:
"75% of jobs converge at 40% of their epochs").

Sampling (``services.core.simulation.jobs``): a running job reports one loss every ``sample_s`` seconds of
productive time (default 1 s: a client reporting every few iterations; two 10 s Hermes quanta hold
20 samples), and ``JobState.loss_history`` keeps at most ``HISTORY_LIMIT`` samples, as the live
metrics service does: the newest, plus those taken within ``HEAD_WINDOW_S`` of the job's first
sample (Hermes measures its milestones against its first quantum).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal, NamedTuple

SAMPLE_S = 1.0
"""Default seconds of productive time between two loss samples of a running job."""
HISTORY_LIMIT = 256
"""Samples kept in a simulated job's ``loss_history`` (the live metrics service's default)."""
HEAD_WINDOW_S = 10.0
"""The job's first samples within this many seconds are kept too (Hermes' base quantum)."""

Family = Literal["fast", "moderate", "slow"]
FAMILIES: tuple[Family, ...] = ("fast", "moderate", "slow")
GOAL_FRACTION = 0.9
"""A family's goal: this fraction of the way from the initial loss to the optimum (Hermes §4.2)."""


class LossCurveError(ValueError):
    """A loss curve's parameters are impossible (floor above the start, a target out of reach, ...)."""


@dataclass(frozen=True, slots=True)
class LossCurve:
    """Loss as a function of progress in [0, 1]; shared, immutable, cheap to evaluate."""

    initial: float
    """Loss at progress 0."""
    floor: float
    """The loss the curve decays towards (never reached)."""
    decay: float
    """Rate of the exponential decay per unit of progress (> 0)."""
    noise: float = 0.0
    """Relative amplitude of the deterministic fluctuation of reported values (0: smooth)."""
    seed: int = 0
    noise_steps: int = 1000
    """Progress steps of the fluctuation (one value per step: an iteration of a 1000-iteration job)."""
    sample_s: float = SAMPLE_S
    """Seconds of productive time between two reported samples."""

    def __post_init__(self) -> None:
        values = (self.initial, self.floor, self.decay, self.noise, self.sample_s)
        if not all(math.isfinite(v) for v in values):
            raise LossCurveError(f"loss curve parameters must be finite, got {values}")
        if self.floor > self.initial:
            raise LossCurveError(f"floor {self.floor} is above the initial loss {self.initial}")
        if self.decay <= 0:
            raise LossCurveError(f"decay must be > 0, got {self.decay}")
        if not 0 <= self.noise < 1:
            raise LossCurveError(f"noise must be in [0, 1), got {self.noise}")
        if self.noise_steps < 1 or self.sample_s <= 0:
            raise LossCurveError("noise_steps must be >= 1 and sample_s > 0")

    def smooth(self, progress: float) -> float:
        """The noise-free loss at ``progress`` (clamped to [0, 1])."""
        p = 0.0 if progress < 0.0 else 1.0 if progress > 1.0 else progress
        return self.floor + (self.initial - self.floor) * math.exp(-self.decay * p)

    def at(self, progress: float) -> float:
        """The reported loss at ``progress``: the smooth value, with the fluctuation if any."""
        value = self.smooth(progress)
        if self.noise:
            step = int(min(max(progress, 0.0), 1.0) * self.noise_steps)
            value *= 1.0 + self.noise * _unit_noise(self.seed, step)
        return value

    def progress_at(self, loss: float) -> float:
        """The least progress at which the smooth loss is <= ``loss``; ``inf`` if it never is."""
        if loss >= self.initial:
            return 0.0
        if loss <= self.floor:
            return math.inf
        p = math.log((self.initial - self.floor) / (loss - self.floor)) / self.decay
        if p <= 1.0:
            return p
        return 1.0 if p <= 1.0 + 1e-9 else math.inf  # a curve built to reach it at the very end, rounded

    @classmethod
    def reaching(
        cls, target: float, at: float, *, initial: float, floor: float, noise: float = 0.0, seed: int = 0
    ) -> LossCurve:
        """A curve from ``initial`` towards ``floor`` whose smooth loss is exactly ``target`` at
        progress ``at`` (0 < at <= 1; floor < target < initial)."""
        if not 0 < at <= 1:
            raise LossCurveError(f"the progress to reach the target must be in (0, 1], got {at}")
        if not floor < target < initial:
            raise LossCurveError(f"target {target} must lie strictly between floor {floor} and initial {initial}")
        decay = math.log((initial - floor) / (target - floor)) / at
        return cls(initial=initial, floor=floor, decay=decay, noise=noise, seed=seed)


def family(
    name: Family, rng: random.Random, *, initial: float, optimum: float, noise: float = 0.0
) -> LossCurve:
    """A curve of Hermes' ``fast``, ``moderate`` or ``slow`` family (module docstring), drawn from ``rng``.

    ``optimum`` is the loss the good combinations converge towards; the family's goal is
    ``goal_loss(initial, optimum)``."""
    if not optimum < initial:
        raise LossCurveError(f"optimum {optimum} must be below the initial loss {initial}")
    seed = rng.randrange(2**31)
    goal = goal_loss(initial, optimum)
    if name == "fast":
        return LossCurve.reaching(goal, rng.uniform(0.2, 0.5), initial=initial, floor=optimum, noise=noise, seed=seed)
    if name == "moderate":
        return LossCurve.reaching(goal, rng.uniform(0.5, 0.95), initial=initial, floor=optimum, noise=noise, seed=seed)
    if name == "slow":
        floor = optimum + rng.uniform(0.4, 0.9) * (initial - optimum)
        return LossCurve(initial=initial, floor=floor, decay=rng.uniform(1.0, 2.0), noise=noise, seed=seed)
    raise LossCurveError(f"unknown loss curve family {name!r}; expected one of {FAMILIES}")


def goal_loss(initial: float, optimum: float, fraction: float = GOAL_FRACTION) -> float:
    """The loss ``fraction`` of the way from ``initial`` down to ``optimum``."""
    return initial - fraction * (initial - optimum)


def _unit_noise(seed: int, step: int) -> float:
    """A deterministic value in [-1, 1) for (seed, step): a cheap integer hash (no global state)."""
    x = (seed * 0x9E3779B1 + step * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    x ^= x >> 12
    x = (x * 0x297A2D39) & 0xFFFFFFFF
    x ^= x >> 15
    return x / 2147483648.0 - 1.0


_HEAD_LIMIT = HISTORY_LIMIT // 4
_K_EPS = 1e-9


class Run(NamedTuple):
    """A job's current progress line: productive from ``t0`` with ``done0`` seconds of work done,
    at ``rate`` seconds of work per second, out of ``work`` seconds."""

    t0: float
    done0: float
    rate: float
    work: float


class LossLog:
    """One simulated job's loss samples, produced lazily from its progress lines.

    A running job reports ``curve.at(progress)`` every ``curve.sample_s`` seconds of productive
    time, the first sample ``sample_s`` after its run turns productive (after any restore). The
    samples of finished runs are folded in when a run ends (``fold``); those of the current run
    are computed on demand (``view``), so the history is exact at any ``now`` with no per-round
    work. Bounded like the live metrics service (module docstring): the newest ``HISTORY_LIMIT``
    samples plus up to a quarter of that from within ``HEAD_WINDOW_S`` of the job's first sample.
    """

    __slots__ = ("_key", "_view", "count", "curve", "first_t", "head", "head_done", "reached_at", "tail",
                 "target_p")

    def __init__(self, curve: LossCurve, target: float | None) -> None:
        self.curve = curve
        self.target_p = curve.progress_at(target) if target is not None else math.inf
        """Progress at which the smooth loss reaches the job's target (inf: never, or no target)."""
        self.reached_at: float | None = None
        """Exact time the smooth loss first reached the target, once a finished run got there."""
        self.first_t: float | None = None
        self.head: list[tuple[float, float]] = []
        self.head_done = False
        self.tail: list[tuple[float, float]] = []
        self.count = 0
        self._key: tuple[float, int] | None = None
        self._view: list[tuple[float, float]] = []

    def _samples(self, run: Run, lo: int, hi: int) -> list[tuple[float, float]]:
        s = self.curve.sample_s
        at = self.curve.at
        t0, d0, rate, work = run
        return [(t0 + k * s, at((d0 + rate * k * s) / work)) for k in range(lo, hi + 1)]

    def _run_count(self, run: Run, now: float) -> int:
        if now <= run.t0 or run.rate <= 0:
            return 0
        return int((now - run.t0) / self.curve.sample_s + _K_EPS)

    def _head_of_run(self, run: Run, k: int) -> list[tuple[float, float]]:
        s = self.curve.sample_s
        first = self.first_t if self.first_t is not None else run.t0 + s
        room = _HEAD_LIMIT - len(self.head)
        n = min(k, room, max(0, math.ceil((first + HEAD_WINDOW_S - run.t0) / s - _K_EPS) - 1))
        return self._samples(run, 1, n) if n > 0 else []

    def fold(self, run: Run, now: float, *, samples: bool = True) -> None:
        """``run`` ends at ``now``: keep its samples (bounded; not if ``samples`` is False, for a job
        that ends) and note when it reached the target."""
        k = self._run_count(run, now) if samples else 0
        if k:
            if not self.head_done:
                head = self._head_of_run(run, k)
                if self.first_t is None:
                    self.first_t = run.t0 + self.curve.sample_s
                self.head.extend(head)
                if len(head) < k or len(self.head) >= _HEAD_LIMIT:
                    self.head_done = True
            self.tail.extend(self._samples(run, max(1, k - HISTORY_LIMIT + 1), k))
            if len(self.tail) > HISTORY_LIMIT:
                del self.tail[: len(self.tail) - HISTORY_LIMIT]
            self.count += k
        t0, d0, rate, work = run
        if self.reached_at is None and rate > 0:
            goal = self.target_p * work
            if d0 <= goal <= d0 + rate * max(0.0, now - t0) + _K_EPS:
                self.reached_at = t0 + (goal - d0) / rate

    def view(self, run: Run, now: float, version: int, *, running: bool) -> list[tuple[float, float]]:
        """The history at ``now`` (cached per ``(now, version)``; callers must not mutate it)."""
        key = (now, version)
        if key == self._key:
            return self._view
        k = self._run_count(run, now) if running else 0
        if self.count + k <= HISTORY_LIMIT:
            out = self.tail + self._samples(run, 1, k) if k else list(self.tail)
        else:
            head = list(self.head)
            if not self.head_done and k:
                head += self._head_of_run(run, k)
            need = HISTORY_LIMIT - len(head)
            current = self._samples(run, max(1, k - need + 1), k) if k else []
            rest = need - len(current)
            out = head + (self.tail[len(self.tail) - rest:] if rest > 0 else []) + current
        self._key = key
        self._view = out
        return out
