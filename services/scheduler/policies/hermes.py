"""``hermes``: convergence-aware node scheduling (Son et al., Electronics 2021; seed 003, §3.3).

Hermes time-shares each GPU among the jobs placed on it and, at every time quantum, runs the
waiting job whose loss is falling fastest. For job ``j`` and its ``i``-th quantum ``q_j(i)``, with
``L_j(i)`` the losses it reported during that quantum:

    loss_j(i) = (max L_j(i) + min L_j(i)) / 2                                         (Eq. 2)
    C_j(i)    = (loss_j(i-1) - loss_j(i)) / |L_j(i)|                                  (Eq. 3)
    C_j(0)    = (max L_j(i) - min L_j(i)) / |L_j(i)|   when only one quantum exists   (Eq. 4)

Algorithm 3 schedules the job with the largest ``C`` on each GPU; the per-GPU queues (Algorithms 1-2)
are the ``hermes`` *placement*, which runs, on each GPU, the highest-ranked job placed there. This
ranking supplies the order. The quantum is 10 s and grows in two ways, both per job:

* "once [a job] achieves a certain milestone ... set by the user as the percentage decrease of the
  loss" (§3.3): ``growth`` per milestone passed;
* "as the number of preemptions adds up" (§4.1.2, the evaluation's setting): ``preemption_growth``
  per preemption the job has had (``JobState.preemptions``, kept by the simulator and by the live
  scheduler alike), so a job that keeps losing its GPU holds it longer each time it gets it back
  and the save/restore overhead (Fig. 7) is paid less often.

The job's quantum is ``quantum_s x growth ** milestones_passed x preemption_growth ** preemptions``,
at most ``max_quantum_s``.

How the quanta are read from ``JobState.loss_history`` (time, loss), deterministically: a job
reports losses only while it runs, so its history is a sequence of bursts separated by
suspensions. Walking back from the newest sample, the last quantum ``L_j(i)`` is every sample less
than ``Q_j`` seconds older than the newest one; the quantum before it, ``L_j(i-1)``, is anchored
the same way at the newest sample older than that window. Anchoring windows at actual samples
skips the gaps when the job was suspended, so a run of one quantum gives one window.

Ranking: (1) running jobs inside the first quantum of their run (``time_slicing.protected``, with
their own ``Q_j``); (2) everyone else by ``C``, largest first; a job with no loss sample yet
ranks first (``C`` = +inf: it must run one quantum to be measured, which Eq. 4 needs anyway);
(3) on equal ``C`` a running job before a waiting one (no needless preemption), then submit time,
``seq``. So at each quantum boundary the running job competes with its fresh ``C`` (the reading of
Algorithm 3 where the current job is not preempted for a job with a lower ``C``). With
``yield_at_quantum_end=True`` the literal reading applies instead: Algorithm 3 line 13 takes the
maximum over the *waiting* queue ``Q_W`` only, so a running job whose quantum ended ranks after
every waiting job and gives its GPU to the best of them whenever its GPU has one.

Choices where the paper is silent:

* Milestones (option ``milestones``, fractions of loss decrease, default 25%, 50%, 75%) are
  measured on Eq. 2 representatives over the base quantum: progress = 1 - loss_rep(newest base
  window) / loss_rep(first base window). Each milestone passed multiplies the quantum by
  ``growth`` (default 2: 10 s, 20 s, 40 s, 80 s). A first loss <= 0 passes no milestone.
  Milestones are per policy, not per job (``JobSpec`` has no field for them yet).
* Preemption growth (§4.1.2 gives no numbers): "the number of preemptions" is the job's own count,
  not the GPU's or the cluster's (a pure function of the job, like the milestones); each one
  multiplies its quantum by ``preemption_growth`` (default 1.5, "gradually": 10 s, 15 s, 22.5 s,
  ...; 1 turns it off). It compounds with the milestones.
* ``max_quantum_s`` (default None: 8 x ``quantum_s``, as far as the three default milestones
  reach, or further if the milestones alone reach further) caps the grown quantum, so a job
  preempted many times still yields within a bounded time.
* Non-finite loss samples are ignored.
* Loss histories are bounded by their owner; only the last two quanta and the first base window
  are read.

Triggers: timer (the quantum; run rounds every ``quantum_s``) and churn (arrivals fill idle GPUs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import ClassVar

from services.core.registry import SCHEDULING
from services.core.state import JobState
from services.scheduler.policies.time_slicing import QuantumRanking, check_quantum, protected

Samples = Sequence[tuple[float, float]]


def representative(losses: Sequence[float]) -> float:
    """Eq. 2: the midpoint of the largest and smallest loss of a quantum."""
    return (max(losses) + min(losses)) / 2.0


def last_two_quanta(history: Samples, quantum_s: float) -> tuple[list[float], list[float]]:
    """``(L_j(i-1), L_j(i))``: the losses of the last two quanta (the first is empty if there is
    only one), windows anchored at the newest sample of each (see module docstring)."""
    samples = [(t, x) for t, x in history if math.isfinite(x)]
    windows: list[list[float]] = []
    k = len(samples) - 1
    while k >= 0 and len(windows) < 2:
        anchor = samples[k][0]
        window: list[float] = []
        while k >= 0 and samples[k][0] > anchor - quantum_s:
            window.append(samples[k][1])
            k -= 1
        windows.append(window)
    if not windows:
        return [], []
    if len(windows) == 1:
        return [], windows[0]
    return windows[1], windows[0]


def convergence(history: Samples, quantum_s: float) -> float | None:
    """``C_j`` of the latest quantum (Eq. 3, or Eq. 4 with one quantum); None without samples."""
    previous, last = last_two_quanta(history, quantum_s)
    if not last:
        return None
    if not previous:
        return (max(last) - min(last)) / len(last)
    return (representative(previous) - representative(last)) / len(last)


@SCHEDULING.register("hermes")
class Hermes(QuantumRanking):
    """Protected running jobs, then the largest convergence ``C`` first (Eq. 2-4, Algorithm 3).

    Its own ``key``: each job's quantum grows with its loss milestones, and ``yield_at_quantum_end``
    moves running jobs after waiting ones; ``rank`` and the triggers are ``QuantumRanking``'s."""

    name: ClassVar[str] = "hermes"

    def __init__(
        self,
        *,
        quantum_s: float = 10.0,
        milestones: Sequence[float] = (0.25, 0.5, 0.75),
        growth: float = 2.0,
        preemption_growth: float = 1.5,
        max_quantum_s: float | None = None,
        yield_at_quantum_end: bool = False,
    ) -> None:
        self.quantum_s = check_quantum(quantum_s)
        marks = tuple(float(m) for m in milestones)
        if any(not 0 < m < 1 for m in marks) or any(b <= a for a, b in pairwise(marks)):
            raise ValueError(f"milestones must be increasing fractions in (0, 1), got {marks}")
        if not growth >= 1:
            raise ValueError(f"growth must be >= 1 (the quantum only grows), got {growth}")
        if not (preemption_growth >= 1 and math.isfinite(preemption_growth)):
            raise ValueError(f"preemption_growth must be a finite number >= 1, got {preemption_growth}")
        reach = self.quantum_s * float(growth) ** len(marks)
        cap = max(8.0 * self.quantum_s, reach) if max_quantum_s is None else float(max_quantum_s)
        if not (cap >= self.quantum_s and math.isfinite(cap)):
            raise ValueError(f"max_quantum_s must be finite and >= quantum_s ({self.quantum_s}), got {max_quantum_s}")
        self.milestones = marks
        self.growth = float(growth)
        self.preemption_growth = float(preemption_growth)
        self.max_quantum_s = cap
        self._preemption_steps = (
            math.ceil(math.log(cap / self.quantum_s, self.preemption_growth)) if self.preemption_growth > 1 else 0
        )
        """Preemptions past which the cap is reached whatever the milestones: the exponent's bound."""
        self.yield_at_quantum_end = yield_at_quantum_end

    def quantum_of(self, job: JobState) -> float:
        """The job's quantum: ``quantum_s x growth ** (milestones passed) x preemption_growth **
        preemptions``, at most ``max_quantum_s``."""
        grown = self.quantum_s * self.growth ** self.milestones_passed(job)
        if job.preemptions > 0 and self.preemption_growth > 1:
            # The exponent is bounded so that the power cannot overflow for any count.
            grown *= self.preemption_growth ** min(job.preemptions, self._preemption_steps)
        return min(grown, self.max_quantum_s)

    def milestones_passed(self, job: JobState) -> int:
        """How many loss milestones the job has passed (§3.3), measured over the base quantum."""
        samples = [(t, x) for t, x in job.loss_history if math.isfinite(x)]
        if not samples or not self.milestones:
            return 0
        base = self.quantum_s
        first_t, last_t = samples[0][0], samples[-1][0]
        first = representative([x for t, x in samples if t < first_t + base])
        recent = representative([x for t, x in samples if t > last_t - base])
        if first <= 0:
            return 0
        progress = 1.0 - recent / first
        return sum(1 for m in self.milestones if progress >= m)

    def convergence_of(self, job: JobState) -> float | None:
        """``C_j`` over the job's own quantum, None if it has reported no loss."""
        return convergence(job.loss_history, self.quantum_of(job))

    def key(self, job: JobState, now: float) -> tuple[int, float, int, float, int]:
        if job.is_running and protected(job, now, self.quantum_of(job)):
            return (0, 0.0, 0, job.submit_time, job.seq)
        c = self.convergence_of(job)
        group = 2 if job.is_running and self.yield_at_quantum_end else 1
        return (group, -math.inf if c is None else -c, 0 if job.is_running else 1, job.submit_time, job.seq)
