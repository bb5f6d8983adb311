"""Print branch coverage per package from coverage.py's JSON report (CI: after `coverage json`).

Issue 18 asks for >= 85% on services/scheduler, services/worker and services/runtime; the table shows
every package so the rest is visible too. It only reports: the suite's result decides CI, not this.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

AIMED = {"services/scheduler", "services/worker", "services/runtime"}


def package_of(path: str) -> str:
    parts = Path(path).parts
    if parts[0] == "services" and len(parts) > 2:
        return "/".join(parts[:2])
    if parts[0] == "roundhouse" and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0]


def main(report: str) -> int:
    data = json.loads(Path(report).read_text())
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for path, entry in data["files"].items():
        summary = entry["summary"]
        row = totals[package_of(path)]
        row[0] += summary["covered_lines"]
        row[1] += summary["num_statements"]
        row[2] += summary.get("covered_branches", 0)
        row[3] += summary.get("num_branches", 0)
    print(f"{'package':<24} {'lines':>8} {'branches':>9} {'lines+branches':>15}")
    for package in sorted(totals):
        lines, statements, branches, all_branches = totals[package]
        if not statements:
            continue  # only empty __init__ files
        combined = 100.0 * (lines + branches) / max(1, statements + all_branches)
        mark = "  (aim 85%)" if package in AIMED else ""
        print(f"{package:<24} {100.0 * lines / max(1, statements):7.1f}% "
              f"{100.0 * branches / max(1, all_branches):8.1f}% {combined:14.1f}%{mark}")
    print(f"{'total':<24} {data['totals']['percent_covered']:38.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "coverage.json"))
