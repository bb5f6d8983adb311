"""Hermes §4 (Son et al., Electronics 2021; seed 003): time until the good hyper-parameter
combinations reach 90% of the optimal loss, Hermes vs FIFO, RR and SLAQ.

The paper's testbed is 4 nodes with one GPU each; a bin of 16 jobs (one model, 16 hyper-parameter
combinations, submitted in a random order) is scheduled by each policy, and it measures the
average time until the *good* combinations reach "at least 90% of the optimal loss" (Fig. 5: all
good jobs of bin type 1, 4 good of 16; Fig. 6: the top 4 of bin type 2, 12 good of 16), averaged
over five runs. Its summary: Hermes' average speedups are 2.08 / 1.92 / 4.04 / 3.39 for GoogleNet,
VGG16, VGG19 and ResNet50.

What runs here (``Simulator`` with the registered policy objects, one GPU per node,
``ClusterState.uniform(4, 1)``; every job needs one GPU; all submitted at t = 0):

* ``hermes``: the ``hermes`` ranking (Eq. 2-4, 10 s quantum growing at the 25/50/75% loss-decrease
  milestones, §3.3, and by 1.5x per preemption of the job "as the number of preemptions adds up",
  §4.1.2, at most 80 s; the policy's defaults) with the ``hermes`` placement (Algorithms 1-2,
  G_thres = 4); rounds every 10 s.
* ``rr`` and ``slaq``: the same placement (per-GPU queues) with the ``rr`` and ``slaq`` rankings,
  30 s quantum (§4.1.2), rounds every 30 s.
* ``fifo``: the same placement with the ``fifo`` ranking (non-preemptive, per-GPU queues in submit
  order; Algorithm 2 deals the jobs round-robin over the GPUs, so this is the submit order).

All policies also run a round on every completion (a freed GPU is refilled at once).

Workload, per model, bin type and repetition (a seeded ``random.Random``):

* every job is 1000 iterations (§4.1.2: final losses "obtained by training for 1000 iterations")
  taking Table 2's Hermes time for 1000 iterations when alone (GoogleNet 32.73 s, VGG16 97.25 s,
  VGG19 112.73 s, ResNet50 69.46 s: the framework's own overhead included, as every policy ran
  inside it);
* loss curves from ``services.core.simulation.loss.family``: the good jobs are *fast* (reach the goal within
  50% of the job) or *moderate* (within 95%), 0.6 : 0.25 as Fig. 2a's promising combinations
  (60% within 500 iterations, 85% within 1000); the bad ones are *slow* (never reach it). Initial
  loss ln(1000) = 6.91 (an untrained 1000-class classifier); the good combinations converge towards
  half of it (3.45); reported values fluctuate by up to 2% (Fig. 4's noisy curves, which Eq. 2
  smooths); one sample per second of training;
* the goal: the *optimal loss* is the lowest loss any job of the bin has after its 1000 iterations;
  a good job reaches "90% of it" when its (noise-free) loss has come 90% of the way from the
  initial loss down to it. The simulator records that time exactly (``Outcome.loss_reached``);
  jobs keep training after it (the paper does not stop them);
* preemption overheads from Fig. 7 (``CostModel`` built here, charged by the simulator: the
  checkpoint save holds the GPU, the restore delays progress): GoogleNet 0.24 s save + 0.43 s
  restore and VGG19 1.57 s in all are the numbers in the text; Fig. 7 itself is an image, so
  VGG16 and ResNet50 are interpolated by model size between those two (GoogleNet ~27 MB, VGG19
  ~548 MB of weights: VGG16 ~528 MB -> 1.54 s, ResNet50 ~98 MB -> 0.79 s), split into save and
  restore in GoogleNet's ratio. No other relaunch cost (§3.4: a sub-process respawn, < 0.2 s).

Metric: per bin type, the mean over repetitions of the average time-to-goal (bin type 1: the 4
good jobs; bin type 2: its top 4 jobs, the four good combinations with the lowest final loss, as
Fig. 6 asks "how effectively Hermes can uncover the best performing combinations among multiple
good performing ones"; the details also give the mean of the first 4 good jobs to get there and of
all 12); the speedup of a bin type is
the best (lowest) baseline's time over Hermes'; a model's speedup is the mean of its two bin
types' (the paper's "average speedup"; it does not say over what it averages, so the details also
give the speedup over the mean of the three baselines). Repetitions: 5 (the paper's "averages of
five iterations"); ``--quick``: 2 repetitions.

By construction the loss families encode the paper's premise (good combinations fall fastest in
their first iterations, Fig. 2); what the reproduction tests is how much the policies turn that
into earlier feedback under the time-sharing costs, not the premise.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from roundhouse.reproduce.base import Metric, Options, ReproResult, parallel_map, reproduction
from services.core.costs import CostModel, ModelCosts
from services.core.protocols import Trigger
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING
from services.core.simulation.engine import SimConfig, Simulator
from services.core.simulation.loss import Family, LossCurve, family, goal_loss
from services.core.simulation.workload import TraceJob
from services.core.state import ClusterState

NAME = "hermes"
TITLE = "Hermes §4: time until good hyper-parameter combinations reach 90% of the optimal loss"
SOURCE = "Hermes (Electronics 2021), §4.2 Figs. 5-6, Table 2, Fig. 7"


@dataclass(frozen=True, slots=True)
class ModelSetup:
    name: str
    duration_s: float
    """Table 2, Hermes row: seconds for 1000 iterations alone."""
    save_s: float
    restore_s: float
    paper_speedup: float
    overhead_source: str


MODELS: tuple[ModelSetup, ...] = (
    ModelSetup("googlenet", 32.73, 0.24, 0.43, 2.08, "Fig. 7 (text: 0.24 s save, 0.43 s restore)"),
    ModelSetup("vgg16", 97.25, 0.55, 0.99, 1.92, "interpolated by model size (1.54 s)"),
    ModelSetup("vgg19", 112.73, 0.56, 1.01, 4.04, "Fig. 7 (text: 1.57 s in all), split as GoogleNet's"),
    ModelSetup("resnet50", 69.46, 0.28, 0.51, 3.39, "interpolated by model size (0.79 s)"),
)

ITERATIONS = 1000
NODES = 4
JOBS_PER_BIN = 16
GOOD_PER_BIN = {1: 4, 2: 12}
TOP = 4
"""Bin type 2 is measured on its 4 best combinations (lowest final loss; Fig. 6)."""
INITIAL_LOSS = 6.907755278982137  # ln(1000)
OPTIMUM = INITIAL_LOSS / 2
NOISE = 0.02
FAST_SHARE = 0.6 / 0.85
REPETITIONS = 5
QUICK_REPETITIONS = 2
POLICIES: dict[str, tuple[dict[str, Any], float]] = {
    "fifo": ({}, 10.0),
    "rr": ({"quantum_s": 30.0}, 30.0),
    "slaq": ({"quantum_s": 30.0}, 30.0),
    "hermes": ({"quantum_s": 10.0}, 10.0),
}
"""Scheduling policy -> (its options, round length in seconds)."""
BASELINES = ("fifo", "rr", "slaq")
PAPER_BIN2_SPEEDUP = 2.68
"""§4.2 on bin type 2 (Fig. 6): "the resulting average speedup is 2.68"."""
MEAN_NOTE = (
    "ours is about half the paper's: Hermes must run every job for one quantum before Eq. 4 can rank it "
    "(4 jobs per GPU: 30 s of exploration before it exploits the best), which FIFO does not pay when a good "
    "job happens to come first on its GPU, and once the good job's curve flattens its C falls below the C "
    "other jobs showed in their first quantum, so it yields its GPU before reaching the goal. Without noise, "
    "with free preemption, with the literal Algorithm 3, without milestones, with flatter slow curves or with "
    "the preemption-driven quantum growth of §4.1.2 at any factor from 1 to 3 the mean over seeds 0-2 stays "
    "within 1.3-1.5x (docs/reproductions.md)"
)
BIN2_NOTE = (
    "with most jobs good, Hermes shares each GPU among its good jobs: a running job's C (Eq. 3, its "
    "current, flattening slope) falls below the C the waiting good jobs showed in their first quantum "
    "(Eq. 4, the steep start), so at each quantum end it yields, and the best jobs reach the goal later "
    "than under FIFO, which runs one job per GPU to the end"
)


@dataclass(frozen=True, slots=True)
class Run:
    model: str
    bin_type: int
    repetition: int
    policy: str
    seed: int


def bin_workload(model: ModelSetup, bin_type: int, repetition: int, seed: int) -> tuple[list[TraceJob], list[str]]:
    """The 16 jobs of one bin (random submission order) and their families, in job order."""
    rng = random.Random(f"hermes/{seed}/{model.name}/{bin_type}/{repetition}")
    good = GOOD_PER_BIN[bin_type]
    kinds: list[Family] = [
        ("fast" if rng.random() < FAST_SHARE else "moderate") for _ in range(good)
    ] + ["slow"] * (JOBS_PER_BIN - good)
    rng.shuffle(kinds)
    curves: list[LossCurve] = [family(kind, rng, initial=INITIAL_LOSS, optimum=OPTIMUM, noise=NOISE) for kind in kinds]
    optimal = min(curve.smooth(1.0) for curve in curves)
    goal = goal_loss(INITIAL_LOSS, optimal)
    jobs = [
        TraceJob(
            index=i, arrival_s=0.0, gpus=1, duration_s=model.duration_s, model=model.name, iterations=ITERATIONS,
            loss_curve=curve, loss_target=goal if kind != "slow" else None,
        )
        for i, (kind, curve) in enumerate(zip(kinds, curves, strict=True))
    ]
    return jobs, list(kinds)


def cost_model(model: ModelSetup) -> CostModel:
    """Fig. 7's save and restore times for ``model`` (no relaunch cost, no multi-GPU terms)."""
    costs = ModelCosts(checkpoint_s=model.save_s, restore_s=model.restore_s, relaunch_s=0.0)
    return CostModel(models={model.name: costs}, default=costs)


def run_one(run: Run) -> dict[str, Any]:
    """One bin under one policy: the good jobs' times to the goal, and the run's totals."""
    model = next(m for m in MODELS if m.name == run.model)
    jobs, kinds = bin_workload(model, run.bin_type, run.repetition, run.seed)
    options, round_s = POLICIES[run.policy]
    sim = Simulator(
        jobs,
        ClusterState.uniform(NODES, 1),
        admission=ADMISSION.create("accept-all"),
        scheduling=SCHEDULING.create(run.policy, **options),
        placement=PLACEMENT.create("hermes"),
        config=SimConfig(round_s=round_s, costs=cost_model(model), extra_triggers=Trigger.CHURN,
                         max_time_s=100 * JOBS_PER_BIN * model.duration_s),
    )
    out = sim.run()
    good = [i for i, kind in enumerate(kinds) if kind != "slow"]
    missing = [i for i in good if i not in out.loss_reached]
    if missing:
        raise RuntimeError(f"{run}: good jobs {missing} never reached the goal")
    reached = sorted(out.loss_reached[i] for i in good)
    best = sorted(good, key=lambda i: (_final_loss(jobs[i]), i))[:TOP]
    top = statistics.fmean(out.loss_reached[i] for i in best)
    metric = statistics.fmean(reached) if run.bin_type == 1 else top
    return {
        "model": run.model, "bin_type": run.bin_type, "repetition": run.repetition, "policy": run.policy,
        "time_to_goal_s": metric, "all_good_mean_s": statistics.fmean(reached),
        "first4_mean_s": statistics.fmean(reached[:TOP]), "top4_mean_s": top,
        "makespan_s": out.end_time, "preemptions": out.all_preemptions, "lost_gpu_s": out.all_lost_gpu_s,
    }


def _final_loss(job: TraceJob) -> float:
    assert job.loss_curve is not None
    return job.loss_curve.smooth(1.0)


def _runs(options: Options) -> list[Run]:
    models = tuple(m.name for m in MODELS)
    reps = QUICK_REPETITIONS if options.quick else REPETITIONS
    return [
        Run(model, bin_type, rep, policy, options.seed)
        for model in models for bin_type in GOOD_PER_BIN for rep in range(reps) for policy in POLICIES
    ]


@reproduction(NAME, title=TITLE)
def run(options: Options) -> ReproResult:
    started = time.perf_counter()
    runs = _runs(options)
    rows = parallel_map(run_one, runs, options.workers)
    models = [m for m in MODELS if any(r.model == m.name for r in runs)]
    metrics: dict[str, Metric] = {}
    per_model: dict[str, Any] = {}
    speedups: list[float] = []
    for model in models:
        bins: dict[str, Any] = {}
        best_speedups: list[float] = []
        mean_speedups: list[float] = []
        for bin_type in GOOD_PER_BIN:
            cell = [r for r in rows if r["model"] == model.name and r["bin_type"] == bin_type]
            times = {p: statistics.fmean(r["time_to_goal_s"] for r in cell if r["policy"] == p) for p in POLICIES}
            first4 = {p: statistics.fmean(r["first4_mean_s"] for r in cell if r["policy"] == p) for p in POLICIES}
            best = min(BASELINES, key=lambda p: times[p])
            best_speedups.append(times[best] / times["hermes"])
            mean_speedups.append(statistics.fmean(times[p] for p in BASELINES) / times["hermes"])
            bins[f"bin{bin_type}"] = {
                "time_to_goal_s": {p: round(t, 2) for p, t in times.items()},
                "best_baseline": best,
                "speedup_vs_best": round(best_speedups[-1], 3),
                "speedup_vs_mean_baseline": round(mean_speedups[-1], 3),
                "first4_time_to_goal_s": {p: round(t, 2) for p, t in first4.items()},
                "first4_speedup_vs_best": round(min(first4[p] for p in BASELINES) / first4["hermes"], 3),
            }
        speedup = statistics.fmean(best_speedups)
        speedups.append(speedup)
        per_model[model.name] = {
            **bins,
            "speedup_vs_best": round(speedup, 3),
            "speedup_vs_mean_baseline": round(statistics.fmean(mean_speedups), 3),
            "job_s": model.duration_s,
            "preemption_overhead_s": {"save": model.save_s, "restore": model.restore_s,
                                      "source": model.overhead_source},
        }
        metrics[f"speedup_{model.name}"] = Metric(
            ours=speedup, paper=model.paper_speedup, unit="x",
            description=f"{model.name}: Hermes' speedup in time-to-90%-of-optimal-loss over the best of "
                        "FIFO/RR/SLAQ (mean of bin types 1 and 2)",
            note=_note(model, bins),
        )
    bin_speedups = {
        b: statistics.fmean(per_model[m.name][f"bin{b}"]["speedup_vs_best"] for m in models) for b in GOOD_PER_BIN
    }
    metrics["speedup_bin1"] = Metric(
        ours=bin_speedups[1], paper=None, unit="x",
        description="bin type 1 (4 good of 16): Hermes' speedup over the best baseline, mean over models",
        note="the paper gives no number for bin type 1 alone: Hermes is best except for two cases (Fig. 5)",
    )
    metrics["speedup_bin2"] = Metric(
        ours=bin_speedups[2], paper=PAPER_BIN2_SPEEDUP, unit="x",
        description="bin type 2 (12 good of 16, top 4): Hermes' speedup over the best baseline, mean over models",
        note=BIN2_NOTE if bin_speedups[2] < 1.0 else "",
    )
    metrics["speedup_mean"] = Metric(
        ours=statistics.fmean(speedups),
        paper=statistics.fmean(m.paper_speedup for m in models),
        unit="x",
        description="mean of the per-model speedups above",
        note=MEAN_NOTE,
    )
    reps = QUICK_REPETITIONS if options.quick else REPETITIONS
    return ReproResult(
        name=NAME, title=TITLE, source=SOURCE,
        command=options.command_line(NAME),
        options=options, metrics=metrics,
        details={"models": per_model, "repetitions": reps, "runs": rows},
        wall_s=time.perf_counter() - started,
    )


def _note(model: ModelSetup, bins: dict[str, Any]) -> str:
    losing = [f"{b['best_baseline']} in bin type {name[-1]}" for name, b in bins.items() if b["speedup_vs_best"] < 1.0]
    if not losing:
        return ""
    return f"{model.name}: Hermes is slower than {' and '.join(losing)}" + (
        " (see the bin type 2 note)" if any(name == "bin2" and b["speedup_vs_best"] < 1.0 for name, b in bins.items())
        else ""
    )
