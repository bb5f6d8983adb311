"""Simulator speed: the two measured targets of issue 3.

(a) Blox-comparable: philly-synthetic, 8 jobs/hour, 32x4 GPUs, LAS, consolidated placement,
    300 s rounds, jobs 3000-4000 tracked. Blox's simulator needs 181-229 s for this on a 2-core
    machine; target <= 2 s. The baseline measured in the same run is Roundhouse's own simulator
    with its fast paths off (plain ``rank()`` every round, full placement walk): same results.
(b) FitGpp scale: 2^19 fitgpp-synthetic jobs at offered load 2.0 on 84 nodes x 8 GPUs, FIFO;
    target <= 60 s and bounded memory.

Each case runs in a fresh process so its peak RSS is its own. Prints wall time, CPU time (the honest
number on a machine other processes share: wall time there includes waiting for a core), events/s,
peak RSS. The placement round behind the live scheduler's target is ``benchmarks/placement.py``.
Usage: ``python benchmarks/simulator.py [--only a|b] [--jobs N] [--baseline]``.

Speed work must not change results: ``--reports DIR`` writes the JSON report (less ``wall_s``) and
the sorted JCTs of every case in ``SAME_RESULTS`` to ``DIR/<name>.json``; run it before and after a
change and compare the folders with ``--compare DIR_BEFORE DIR_AFTER`` (byte for byte).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from roundhouse.sim.case import Case, run_case

BLOX_SECONDS = (181.0, 229.0)
"""Blox's simulator on case (a), as reported for a 2-core machine (not measured here)."""

CASE_A = Case(
    workload="philly-synthetic", jobs_per_hour=8.0, cluster="32x4", track=(3000, 4000), round_s=300.0,
    scheduler="las", admission="accept-all", placement="consolidated", seed=0,
)
CASE_B = Case(
    workload="fitgpp-synthetic", load=2.0, num_jobs=2**19, cluster="84x8",
    scheduler="fifo", admission="accept-all", placement="consolidated", seed=0,
)


_GAVEL = Case(
    workload="philly-synthetic", gpus="gavel", jobs_per_hour=5.0, cluster="32x4", track=(200, 600), seed=1,
    max_time_s=3e6,
)
SAME_RESULTS: dict[str, Case] = {
    "a": CASE_A,
    "a-baseline": replace(CASE_A, fast_paths=False, track=(300, 700)),
    "fifo-gavel": replace(_GAVEL, scheduler="fifo"),
    "las-gavel": replace(_GAVEL, scheduler="las"),
    "tiresias-gavel": replace(_GAVEL, scheduler="tiresias"),
    "srtf-gavel": replace(_GAVEL, scheduler="srtf"),
    "las-gavel-first-free": replace(_GAVEL, scheduler="las", placement="first-free"),
    "las-gavel-bandwidth": replace(_GAVEL, scheduler="las", placement="bandwidth-aware"),
    "las-16x4": Case(scheduler="las", jobs_per_hour=5.0, cluster="16x4", track=(200, 800), seed=2, max_time_s=2e6),
    "las-8x8": Case(scheduler="las", jobs_per_hour=5.0, cluster="8x8", track=(200, 800), seed=3, max_time_s=2e6),
    "fitgpp-fifo": replace(CASE_B, num_jobs=2**14),
    "fitgpp-las": replace(CASE_B, scheduler="las", load=1.0, num_jobs=2**12, cluster="16x8"),
    "las-debug": Case(scheduler="las", cluster="32x4", track=(300, 500), seed=4, debug=True),
}
"""Cases whose results a speed change must leave byte-identical (``--reports``): the Blox case, its
slow-path baseline, the sort-keyed policies with multi-GPU jobs on three placements, one-GPU LAS on
other node sizes, FitGpp's workload, and a run with every invariant checked (``debug``, ~25 s)."""


def report_text(case: Case) -> str:
    """The results of ``case`` as canonical JSON: the report less ``wall_s``, the sorted JCTs and
    responsiveness; equal texts mean equal results."""
    result = run_case(case)
    report = {k: v for k, v in result.report.items() if k != "wall_s"}
    payload = {"report": report, "jct": result.jct_s, "resp": result.responsiveness_s}
    return json.dumps(payload, sort_keys=True, indent=1)


def write_reports(folder: Path, names: list[str] | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names or list(SAME_RESULTS):
        started = time.process_time()
        (folder / f"{name}.json").write_text(report_text(SAME_RESULTS[name]), encoding="utf-8")
        print(f"{name}: {time.process_time() - started:.2f} s CPU", flush=True)


def compare_reports(before: Path, after: Path) -> list[str]:
    """Names whose reports differ (or exist in one folder only)."""
    names = sorted({p.name for p in before.glob("*.json")} | {p.name for p in after.glob("*.json")})
    differ = []
    for name in names:
        a, b = before / name, after / name
        if not (a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()):
            differ.append(name.removesuffix(".json"))
    return differ


def _measure(case: Case) -> dict[str, Any]:
    started = time.perf_counter()
    cpu_started = time.process_time()
    result = run_case(case)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = result.report
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_wall_s": report["wall_s"],
        "events": report["events"],
        "rounds": report["rounds"],
        "peak_rss_mib": peak_kib / 1024.0,
        "avg_jct_s": report["avg_jct_s"],
        "jobs": report["jobs"],
    }


def measure(case: Case) -> dict[str, Any]:
    """Run ``case`` in a fresh process and return its timings."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result: dict[str, Any] = pool.apply(_measure, (case,))
        return result


def show(label: str, m: dict[str, Any], target_s: float) -> None:
    verdict = "meets" if m["wall_s"] <= target_s else "MISSES"
    print(
        f"{label}: wall {m['wall_s']:.2f} s (simulation {m['sim_wall_s']:.2f} s, CPU {m['cpu_s']:.2f} s), "
        f"{m['events']} events + {m['rounds']} rounds, {m['events'] / m['sim_wall_s']:,.0f} events/s, "
        f"peak RSS {m['peak_rss_mib']:.0f} MiB, {m['jobs']} jobs measured, avg JCT {m['avg_jct_s'] / 3600:.2f} h "
        f"-> {verdict} the {target_s:g} s target"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("a", "b"))
    parser.add_argument("--jobs", type=int, help="case (b) job count (default 2^19)")
    parser.add_argument("--baseline", action="store_true", help="also run case (a) with fast paths off")
    parser.add_argument("--reports", type=Path, metavar="DIR", help="write the SAME_RESULTS reports to DIR")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                        help="compare two --reports folders byte for byte")
    args = parser.parse_args(argv)
    if args.reports is not None:
        write_reports(args.reports)
        return 0
    if args.compare is not None:
        differ = compare_reports(*args.compare)
        print("identical" if not differ else f"DIFFERENT: {', '.join(differ)}")
        return 1 if differ else 0
    if args.only in (None, "a"):
        a = measure(CASE_A)
        show("(a) Blox-comparable LAS", a, 2.0)
        low, high = BLOX_SECONDS
        speedup = f"{low / a['wall_s']:.0f}x-{high / a['wall_s']:.0f}x"
        print(f"    vs Blox's reported {low:.0f}-{high:.0f} s: {speedup} faster")
        if args.baseline:
            base = measure(replace(CASE_A, fast_paths=False))
            show("    baseline (fast paths off)", base, 2.0)
            print(f"    fast paths: {base['wall_s'] / a['wall_s']:.1f}x faster than the baseline")
    if args.only in (None, "b"):
        case = CASE_B if args.jobs is None else replace(CASE_B, num_jobs=args.jobs)
        b = measure(case)
        show(f"(b) FitGpp-scale FIFO, {case.num_jobs} jobs", b, 60.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
