"""`roundhouse reproduce NAME [--quick] [--json FILE]`: run a seed paper's headline experiment.

Prints our numbers beside the paper's; `--json` writes them (per metric: `paper` and `ours`).
`--quick` runs a smaller seeded version in under a minute. `roundhouse reproduce --list` names them
all; `all` runs every one. Results and the commands behind them: docs/reproductions.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from roundhouse.reproduce import Options, ReproductionError, ReproResult, get, load_all
from roundhouse.text_table import render_table


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "reproduce",
        help="run a seed paper's headline experiment and compare with its numbers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", nargs="?", help="which reproduction (see --list), or 'all'")
    parser.add_argument("--list", action="store_true", help="list the reproductions")
    parser.add_argument("--quick", action="store_true", help="a smaller seeded version (under a minute)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes for independent simulation cases")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    known = load_all()
    if args.list or args.name is None:
        for name, repro in known.items():
            print(f"{name:24} {repro.title}")
        return 0 if args.list else 2
    if args.workers < 1:
        print("roundhouse reproduce: --workers must be >= 1", file=sys.stderr)
        return 2
    names = list(known) if args.name == "all" else [args.name]
    options = Options(quick=args.quick, seed=args.seed, workers=args.workers)
    results: list[ReproResult] = []
    try:
        for name in names:
            repro = get(name)
            started = time.perf_counter()
            result = repro.run(options)
            if not result.wall_s:
                result = replace(result, wall_s=time.perf_counter() - started)
            print(format_result(result))
            results.append(result)
    except ReproductionError as exc:
        print(f"roundhouse reproduce: {exc}", file=sys.stderr)
        return 2
    if args.json is not None:
        payload: Any = results[0].to_json() if len(results) == 1 else {"results": [r.to_json() for r in results]}
        args.json.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return 0


def format_result(result: ReproResult) -> str:
    """A table: metric, paper, ours, unit; then the notes."""
    lines = [f"== {result.name}: {result.title}", f"   {result.source}" + ("  [quick]" if result.options.quick else "")]
    rows = [
        (metric.description, _number(metric.paper), _number(metric.ours), metric.unit)
        for metric in result.metrics.values()
    ]
    lines.append(
        render_table(("metric", "paper", "ours", "unit"), rows, justify=("left", "right", "right", "left"), indent=3)
    )
    for metric in result.metrics.values():
        if metric.note:
            lines.append(f"   note ({metric.description}): {metric.note}")
    lines.append(f"   ({result.wall_s:.1f} s; {result.command})")
    return "\n".join(lines)


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
