"""`roundhouse simulate`: run the scheduling policies on a workload in the discrete-event simulator.

Comma-separated values of ``--scheduler``, ``--admission``, ``--placement``, ``--jobs-per-hour``,
``--load`` and ``--seed`` make a sweep: every combination runs in its own process (or, with
``--ray ADDRESS``, as a task on an existing Ray cluster) and one table is printed. See docs/simulator.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from roundhouse.sim.case import GPU_COUNT_CHOICES, WORKLOADS, Case
from roundhouse.sim.cluster import ClusterSpecError, cluster_from_text
from roundhouse.sim.per_job import write_jobs_csv
from roundhouse.sim.report import format_table
from roundhouse.sim.synthetic import FITGPP_ARRIVALS
from roundhouse.sim.traces import FORMATS
from services.core.link_profiles import LINK_PROFILES
from services.core.registry import ADMISSION, PLACEMENT, SCHEDULING, Registry, UnknownPolicyError
from services.core.simulation.engine import SimulationError
from services.core.simulation.workload import WorkloadError

T = TypeVar("T")

_OPTION_EXAMPLES = {
    "scheduler": "'{\"queue_thresholds_gpu_s\": [3250, 7200], \"promote_knob\": null}' for tiresias as the "
                 "Tiresias simulator's dlas-gpu",
    "admission": "'{\"factor\": 1.2}' for load-threshold",
    "placement": "'{}'",
}


def _list(kind: Callable[[str], T]) -> Callable[[str], list[T]]:
    def parse(text: str) -> list[T]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected one value or a comma-separated list")
        try:
            return [kind(item) for item in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _track(text: str) -> tuple[int, int]:
    try:
        start, end = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--track must be START:END (job indexes), got {text!r}") from None
    if not 0 <= start <= end:
        raise argparse.ArgumentTypeError(f"--track needs 0 <= START <= END, got {text!r}")
    return start, end


def _options(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"policy options must be a JSON object, got {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"policy options must be a JSON object, got {text!r}")
    return value


def _cluster(text: str) -> str:
    try:
        cluster_from_text(text)
    except ClusterSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="run scheduling policies on a workload in the simulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_argument_group("workload")
    source.add_argument("--workload", choices=WORKLOADS, default="philly-synthetic",
                        help="synthetic generator (default: philly-synthetic, as in Blox)")
    source.add_argument("--trace", type=Path, help="replay a trace file instead of a generator")
    source.add_argument("--format", choices=FORMATS, help="format of --trace")
    source.add_argument("--jobs-per-hour", type=_list(float), default=[8.0], metavar="RATE[,RATE...]",
                        help="philly-synthetic arrival rate (default 8)")
    source.add_argument("--load", type=_list(float), default=[2.0], metavar="LOAD[,LOAD...]",
                        help="fitgpp-synthetic load (default 2.0)")
    source.add_argument("--arrivals", choices=FITGPP_ARRIVALS, default="offered",
                        help="fitgpp-synthetic: Poisson at the offered --load (default), or 'fifo': arrivals that "
                             "keep --load under a reference FIFO run (FitGpp Appendix A; docs/simulator.md)")
    source.add_argument("--gpus", choices=GPU_COUNT_CHOICES, default="1",
                        help="philly-synthetic GPUs per job: 1, Gavel's mix, or the Philly trace's counts")
    source.add_argument("--max-gpus", type=int, dest="max_gpus", metavar="N",
                        help="philly-synthetic: every job elastic up to N GPUs (Optimus and Gandiva's "
                             "grow-shrink may give it more than it asks for); default rigid")
    source.add_argument("--num-jobs", type=int, help="stop generating (or reading) after N jobs")
    source.add_argument("--seed", type=_list(int), default=[0], metavar="SEED[,SEED...]")
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--cluster", type=_cluster, default="32x4",
                         help="NODESxGPUS (default 32x4), or GPU types: TYPE:NODESxGPUS[,...], e.g. "
                              "k80:3x4,p100:3x4,v100:3x4")
    cluster.add_argument("--heterogeneity", action="store_true",
                         help="a job runs at its throughput on the GPU type it holds (Gavel's per-model "
                              "table; off: every type runs at the trace's speed)")
    cluster.add_argument("--cluster-spec", type=Path, help="Tiresias cluster spec CSV (overrides --cluster)")
    cluster.add_argument("--links", choices=sorted(LINK_PROFILES),
                         help="give every node a server's link bandwidths (GPU pairs, uplink; Gb/s)")
    cluster.add_argument("--uplink-gbps", type=float, help="override the --links profile's node uplink (Gb/s)")
    cluster.add_argument("--network-model", action="store_true",
                         help="a multi-GPU job's speed from its model size and its GPUs' links (off: the "
                              "fixed per-model spread slowdown)")
    policies = parser.add_argument_group("policies")
    policies.add_argument("--scheduler", type=_list(str), default=["fifo"], metavar="NAME[,NAME...]")
    policies.add_argument("--admission", type=_list(str), default=["accept-all"], metavar="NAME[,NAME...]")
    policies.add_argument("--placement", type=_list(str), default=["consolidated"], metavar="NAME[,NAME...]")
    for kind in ("scheduler", "admission", "placement"):
        policies.add_argument(f"--{kind}-options", type=_options, default={}, metavar="JSON",
                              help=f"keyword options of the {kind} policy (every case of a sweep), e.g. "
                                   + _OPTION_EXAMPLES[kind])  # fmt: skip
    run = parser.add_argument_group("simulation")
    run.add_argument("--round", type=float, default=300.0, dest="round_s", help="round length in s (default 300)")
    run.add_argument("--round-on", type=_list(str), default=[], metavar="EVENT[,EVENT...]",
                     help="also run a round on arrival, completion or churn, whatever the policy declares")
    run.add_argument("--fill-between-rounds", action="store_true",
                     help="between the policy's rounds, start waiting jobs on free GPUs without preempting "
                          "(the live scheduler's default; off here, as in Blox)")
    run.add_argument("--packing", action="store_true",
                     help="several jobs per GPU where the placement packs them (gandiva: with the packing "
                          "model's profiles unless --placement-options gives some); docs/simulator.md, Packing")
    run.add_argument("--track", type=_track, help="measure jobs START..END (inclusive), e.g. 3000:4000")
    run.add_argument("--max-time", type=float, dest="max_time_s", help="stop at this simulated time (s)")
    run.add_argument("--free-preemption", action="store_true",
                     help="charge nothing for checkpoint/restore and no spread penalty (as Blox's simulator)")
    run.add_argument("--debug", action="store_true", help="check invariants on every event (slow)")
    output = parser.add_argument_group("output")
    output.add_argument("--json", type=Path, dest="json_path", help="write the metrics as JSON")
    output.add_argument("--plot", type=Path, help="draw JCT and responsiveness CDFs into this PNG")
    output.add_argument("--jobs-csv", type=Path, dest="jobs_csv",
                        help="write one row per measured, finished job (a sweep's cases in one file)")
    output.add_argument("--workers", type=int, help="parallel processes for a sweep (default: CPU count)")
    output.add_argument("--ray", metavar="ADDRESS", dest="ray_address",
                        help="run the cases as tasks on the existing Ray cluster at ADDRESS (HOST:PORT of its head, "
                             "ray://HOST:PORT or auto; needs the 'ray' extra); the results are the same as local "
                             "runs'; --workers does not apply (the cluster's CPUs bound the parallelism)")
    output.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(handler=run_command)


def _check_names(kind: str, names: Sequence[str], valid: Callable[[], list[str]]) -> None:
    known = valid()
    for name in names:
        if name not in known:
            raise UnknownPolicyError(kind, name, known)


def _check_options(registry: Registry[Any], names: Sequence[str], options: dict[str, Any]) -> None:
    """Build each named policy once with ``options`` so a bad option fails before any case runs."""
    if not options:
        return
    for name in names:
        registry.check(name, options)


def build_cases(args: argparse.Namespace) -> list[Case]:
    _check_names("scheduling", args.scheduler, SCHEDULING.names)
    _check_names("admission", args.admission, ADMISSION.names)
    _check_names("placement", args.placement, PLACEMENT.names)
    _check_options(SCHEDULING, args.scheduler, args.scheduler_options)
    _check_options(ADMISSION, args.admission, args.admission_options)
    _check_options(PLACEMENT, args.placement, args.placement_options)
    if args.trace is not None and args.format is None:
        raise WorkloadError("--trace needs --format (" + ", ".join(FORMATS) + ")")
    base = Case(
        workload=None if args.trace is not None else args.workload,
        trace=str(args.trace) if args.trace is not None else None,
        format=args.format,
        cluster=args.cluster,
        cluster_spec=str(args.cluster_spec) if args.cluster_spec is not None else None,
        gpus=args.gpus,
        max_gpus=args.max_gpus,
        arrivals=args.arrivals,
        num_jobs=args.num_jobs,
        round_s=args.round_s,
        track=args.track,
        round_on=tuple(args.round_on),
        fill_between_rounds=args.fill_between_rounds,
        links=args.links,
        uplink_gbps=args.uplink_gbps,
        network=args.network_model,
        heterogeneity=args.heterogeneity,
        packing=args.packing,
        scheduler_options=args.scheduler_options,
        admission_options=args.admission_options,
        placement_options=args.placement_options,
        max_time_s=args.max_time_s,
        free_preemption=args.free_preemption,
        debug=args.debug,
    )
    cases = []
    for scheduler, admission, placement, rate, load, seed in itertools.product(
        args.scheduler, args.admission, args.placement, args.jobs_per_hour, args.load, args.seed
    ):
        cases.append(
            replace(base, scheduler=scheduler, admission=admission, placement=placement,
                    jobs_per_hour=rate, load=load, seed=seed)
        )
    return cases


def unfinished_warning(report: dict[str, Any]) -> str | None:
    """What a reader of the averages must know when measured jobs did not finish: every JCT and
    responsiveness figure covers finished jobs only, so it is biased low."""
    unfinished = int(report.get("unfinished") or 0)
    if not unfinished and not report.get("stalled"):
        return None
    why = "the run stalled" if report.get("stalled") else "the run hit --max-time"
    return (f"{unfinished} measured job(s) unfinished ({why}); JCT and responsiveness cover the "
            f"{report.get('jobs', 0)} finished job(s) only and are biased low")  # fmt: skip


def run_command(args: argparse.Namespace) -> int:
    from roundhouse.sim.plot import PlotUnavailableError, plot_cdfs
    from roundhouse.sim.ray_runner import RayUnavailableError
    from roundhouse.sim.sweep import run_cases

    try:
        cases = build_cases(args)
        results = run_cases(
            cases,
            workers=args.workers,
            progress=not args.no_progress and sys.stderr.isatty(),
            record_jobs=args.jobs_csv is not None,
            ray_address=args.ray_address,
        )
    except (
        UnknownPolicyError, WorkloadError, ClusterSpecError, SimulationError, ValueError, RayUnavailableError
    ) as exc:
        print(f"roundhouse simulate: {exc}", file=sys.stderr)
        return 2
    rows = [(case.labels(), result.report) for case, result in zip(cases, results, strict=True)]
    print(format_table(rows))
    for case, result in zip(cases, results, strict=True):
        warning = unfinished_warning(result.report)
        if warning:
            print(f"roundhouse simulate: {' '.join(case.labels().values())}: {warning}", file=sys.stderr)
    if args.json_path is not None:
        payload: dict[str, Any] = (
            results[0].report if len(results) == 1 else {"cases": [result.report for result in results]}
        )
        args.json_path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if args.jobs_csv is not None:
        per_case = [(case.labels(), result.jobs) for case, result in zip(cases, results, strict=True)]
        write_jobs_csv(args.jobs_csv, per_case)
    if args.plot is not None:
        try:
            plot_cdfs(cases, results, args.plot)
        except PlotUnavailableError as exc:
            print(f"roundhouse simulate: {exc}", file=sys.stderr)
            return 2
    return 0
