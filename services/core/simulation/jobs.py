"""The simulator's job: a ``JobState`` whose progress fields are computed from a shared clock.

A running job's attained service, executed time and iterations grow continuously. Updating every
running job at every round costs O(running) Python work per round, which dominates a long
simulation, so ``SimJobState`` stores progress as a straight line instead: the value at the last
change (launch, suspension) plus ``rate x (clock.now - productive_from)``. Policies read the usual
``JobState`` attributes and always see values exact at ``clock.now``, which the simulator sets to
the ``now`` it passes them. Writes (from the dataclass constructor) set the base value.

Loss (``services.core.simulation.loss``): a job whose ``TraceJob`` carries a ``loss_curve`` reports
``loss`` = the curve at its current progress (None before its first launch) and a bounded
``loss_history`` of samples taken every ``curve.sample_s`` seconds of productive time, both exact at
``clock.now`` and computed on demand from the progress line (``LossLog``). A job without a curve
holds one ``None`` slot for all of it and reports no loss, as before.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from schemas.job import JobSpec
from services.core.costs import ModelCosts
from services.core.simulation.goodput_jobs import noise_scale_now
from services.core.simulation.loss import LossLog, Run
from services.core.simulation.workload import TraceJob
from services.core.state import JobState, JobStatus

_RUNNING = JobStatus.RUNNING
"""Read through a module constant: ``JobStatus.RUNNING`` costs ~20x more (an enum class lookup),
and the progress properties below run for every job the policies look at."""


class SimClock:
    """The simulator's current time, shared by all ``SimJobState`` objects of one run."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0


class SimJobState(JobState):
    """A ``JobState`` plus the simulator's private progress bookkeeping (policies ignore the extra
    attributes; they are not part of the policy contract)."""

    __slots__ = (
        "_executed0",
        "_spec",
        "alloc_since",
        "checkpoint_s",
        "clock",
        "costs",
        "done0",
        "gpus_requested",
        "line_a",
        "loss_log",
        "lost_gpu_s",
        "measured",
        "productive_from",
        "rate",
        "service0",
        "total_iterations",
        "trace",
        "version",
        "work_s",
    )

    def __init__(
        self,
        *args: Any,
        clock: SimClock,
        work_s: float,
        costs: ModelCosts,
        checkpoint_s: float,
        measured: bool,
        total_iterations: int | None,
        trace: TraceJob | None = None,
        **kwargs: Any,
    ) -> None:
        self.clock = clock
        self.trace = trace
        """The workload record; with it, ``spec`` is built on first access (see ``spec``)."""
        self._spec: JobSpec | None = None
        self.gpus_requested: int = trace.gpus if trace is not None else kwargs["spec"].gpus
        """A slot shadowing ``JobState.gpus_requested`` (same value, no spec needed, read per round)."""
        self.service0 = 0.0
        """Attained service as of the last launch or suspension (the progress line's base)."""
        self._executed0 = 0.0
        self.done0 = 0.0
        self.rate = 0.0
        self.productive_from = 0.0
        self.line_a = 0.0
        curve = trace.loss_curve if trace is not None else None
        self.loss_log = LossLog(curve, trace.loss_target) if curve is not None and trace is not None else None
        """Loss samples and target bookkeeping; None for a job without a loss curve."""
        super().__init__(*args, **kwargs)
        self.work_s = work_s
        """Run time alone at the requested GPU count, consolidated: the work to do, in those seconds."""
        self.costs = costs
        self.checkpoint_s = checkpoint_s
        self.measured = measured
        self.total_iterations = total_iterations
        self.version = 0
        """Bumped on every launch and suspension; a completion event of another version is stale."""
        self.alloc_since = 0.0
        self.lost_gpu_s = 0.0

    @property
    def spec(self) -> JobSpec:
        """The job's ``JobSpec``, built from ``trace`` the first time a policy asks for it.

        A million-job simulation keeps hundreds of thousands of queued jobs whose specs no policy
        ever reads (FIFO looks at the head of the queue only); a spec costs ~1 KB and ~10 us to
        build, so it is made on demand and kept."""
        spec = self._spec
        if spec is None:
            if self.trace is None:
                raise AttributeError("SimJobState has neither a spec nor a trace to build one from")
            spec = self._spec = spec_for(self.trace)
        return spec

    @spec.setter
    def spec(self, value: JobSpec | None) -> None:
        self._spec = value

    @property
    def priority(self) -> int:
        """``spec.priority`` without building the spec: a spec built from a trace has the default
        tier (``spec_for`` sets none), so only a spec given or built already can say otherwise.
        Every round reads it for every job (``by_priority``)."""
        spec = self._spec
        return 0 if spec is None else spec.priority

    @property
    def resumed_at(self) -> float | None:
        """When the current run's progress starts or started: after restore + relaunch (None unless
        running)."""
        return self.productive_from if self.status is _RUNNING else None

    @resumed_at.setter
    def resumed_at(self, value: float | None) -> None:
        pass  # derived from the run's progress line

    @property
    def grad_noise_scale(self) -> float | None:
        """A goodput job's noise scale at its current progress, as its training client would report
        it (``services.core.simulation.goodput_jobs``); None for other jobs."""
        return noise_scale_now(self)

    @grad_noise_scale.setter
    def grad_noise_scale(self, value: float | None) -> None:
        pass  # derived from the job's progress and its goodput profile

    @property
    def run_start_service(self) -> float | None:
        """Attained service when the current run began (None unless running): the frozen value
        its progress line starts from."""
        return self.service0 if self.status is _RUNNING else None

    @run_start_service.setter
    def run_start_service(self, value: float | None) -> None:
        pass  # derived from the run's progress line

    @property
    def loss(self) -> float | None:
        """The curve at the current progress (exact at ``clock.now``); None without a curve or
        before the first launch."""
        log = self.loss_log
        if log is None or self.first_start_time is None:
            return None
        return log.curve.at(self.done_s / self.work_s)

    @loss.setter
    def loss(self, value: float | None) -> None:
        if value is not None:
            raise ValueError("a simulated job's loss comes from its loss curve")

    @property
    def loss_history(self) -> list[tuple[float, float]]:
        """(time, loss) samples, oldest first, bounded (``services.core.simulation.loss.LossLog``); empty
        without a curve (a fresh list, so no memory is held per job). Do not mutate it."""
        log = self.loss_log
        if log is None:
            return []
        run = Run(self.productive_from, self.done0, self.rate, self.work_s)
        return log.view(run, self.clock.now, self.version, running=self.status is _RUNNING)

    @loss_history.setter
    def loss_history(self, value: list[tuple[float, float]]) -> None:
        if value:
            raise ValueError("simulated jobs derive their loss history from their loss curve")

    @property
    def loss_reached_at(self) -> float | None:
        """When the smooth loss first reached ``loss_target``, as of the last ``freeze``."""
        return self.loss_log.reached_at if self.loss_log is not None else None

    def _productive_s(self) -> float:
        if self.status is not _RUNNING:
            return 0.0
        dt = self.clock.now - self.productive_from
        return dt if dt > 0.0 else 0.0

    @property
    def attained_service(self) -> float:
        if self.status is not _RUNNING or self.clock.now <= self.productive_from:
            return self.service0
        return self.line_a + len(self.gpus) * self.clock.now

    @attained_service.setter
    def attained_service(self, value: float) -> None:
        self.service0 = value

    @property
    def executed_time(self) -> float:
        return self._executed0 + self._productive_s()

    @executed_time.setter
    def executed_time(self, value: float) -> None:
        self._executed0 = value

    @property
    def iterations_done(self) -> int:
        if self.total_iterations is None:
            return 0
        return min(self.total_iterations, int(self.total_iterations * self.done_s / self.work_s))

    @iterations_done.setter
    def iterations_done(self, value: int) -> None:
        pass  # derived from done_s

    @property
    def done_s(self) -> float:
        """Work done so far, in seconds of the job's standalone run time."""
        return self.done0 + self.rate * self._productive_s()

    def start_line(self, productive_from: float, rate: float) -> None:
        """The job (re)starts: progress resumes at ``productive_from`` at ``rate`` (the engine's
        ``_launch`` does the same inline, once per launch)."""
        self.productive_from = productive_from
        self.rate = rate
        self.line_a = self.service0 - len(self.gpus) * productive_from

    def freeze(self, final: bool = False) -> float:
        """Fold progress up to ``clock.now`` into the base values; returns GPU-seconds just folded.

        ``final``: the job ends (or the simulation does), so the loss samples of this run are not
        kept, only whether it reached its loss target (nobody reads a finished job's history)."""
        if self.status is not _RUNNING:
            return 0.0
        now = self.clock.now
        productive = now - self.productive_from
        if productive <= 0.0:
            return 0.0
        n = len(self.gpus)
        if self.loss_log is not None:
            self.loss_log.fold(Run(self.productive_from, self.done0, self.rate, self.work_s), now, samples=not final)
        # ``attained_service`` and ``_productive_s`` inlined (this runs on every suspension).
        service = self.service0 = self.line_a + n * now
        self._executed0 += productive
        self.done0 += self.rate * productive
        self.productive_from = now
        self.line_a = service - n * now
        return productive * n


@cache
def _spec_template() -> dict[str, Any]:
    return dict(JobSpec(name="sim", command=["simulated"]).__dict__)


_SPEC_FIELDS_SET = frozenset({"name", "command", "gpus", "job_class", "user", "model", "expected_duration_s"})
_ELASTIC_FIELDS_SET = _SPEC_FIELDS_SET | {"max_gpus"}


def spec_for(job: TraceJob) -> JobSpec:
    """A ``JobSpec`` for a trusted, already validated ``TraceJob``, built without pydantic validation.

    Validation costs ~20 us per spec and ``model_construct`` ~45 us; a million-job workload cannot
    afford either. ``TraceJob`` checks the fields that matter (GPUs >= 1, positive duration) when it
    is created, so the spec is assembled from a validated template's field dict.
    """
    fields = _spec_template().copy()
    fields["name"] = f"job-{job.index}"
    fields["gpus"] = job.gpus
    fields["job_class"] = job.job_class
    fields["user"] = job.user
    fields["model"] = job.model
    fields["expected_duration_s"] = job.duration_s
    if job.iterations is not None:
        fields["expected_iterations"] = job.iterations
    if job.checkpoint_s is not None:
        fields["grace_period_s"] = job.checkpoint_s
    if job.cpus is not None:
        fields["cpus"] = job.cpus
    if job.memory_gb is not None:
        fields["memory_gb"] = job.memory_gb
    if job.loss_target is not None:
        fields["loss_target"] = job.loss_target
    if job.gpu_throughputs is not None:
        fields["gpu_throughputs"] = dict(job.gpu_throughputs)
    fields_set = _SPEC_FIELDS_SET
    if job.max_gpus is not None:
        fields["max_gpus"] = job.max_gpus
        fields_set = _ELASTIC_FIELDS_SET
    spec = JobSpec.__new__(JobSpec)
    object.__setattr__(spec, "__dict__", fields)
    object.__setattr__(spec, "__pydantic_fields_set__", fields_set)
    object.__setattr__(spec, "__pydantic_extra__", None)
    object.__setattr__(spec, "__pydantic_private__", None)
    return spec
