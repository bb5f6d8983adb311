"""CLI start-up: what `roundhouse --help`, `jobs` and `submit` cost before any network, against a
bare ``python -c pass`` in the same run (issue 14, item 9; target: <= 0.3 s of overhead each).

Each case is a fresh interpreter, as a user's shell starts one:

* ``python`` — ``python -c pass`` (the interpreter's own start-up: the baseline);
* ``help`` — ``python -m roundhouse --help``;
* ``jobs`` — ``python -m roundhouse jobs --nats URL --creds MISSING``: the command parses its flags, imports
  what it needs to ask the scheduler (client, schemas, NATS) and stops at its first network step,
  reading credentials that do not exist (exit 2); no cluster is needed, and nothing but the
  connection itself is left out;
* ``submit`` — ``python -m roundhouse submit --gpus 1 --nats URL --creds MISSING -- python train.py``: the
  same, after validating the job spec.

Cases run interleaved (baseline, help, jobs, submit, baseline, ...) ``--runs`` times, so load on the
host hits them alike; the overhead of a case is its time minus the baseline's, at the minimum (the
least disturbed run) and at the median. JSON on stdout.

    python -m benchmarks.cli [--runs 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.3

CASES: dict[str, list[str]] = {
    "python": ["-c", "pass"],
    "help": ["-m", "roundhouse", "--help"],
    "jobs": ["-m", "roundhouse", "jobs", "--nats", "nats://127.0.0.1:9", "--creds", "{missing}"],
    "submit": ["-m", "roundhouse", "submit", "--gpus", "1", "--nats", "nats://127.0.0.1:9", "--creds", "{missing}",
               "--", "python", "train.py"],
}
EXPECTED_EXIT = {"python": 0, "help": 0, "jobs": 2, "submit": 2}
"""``jobs`` and ``submit`` end with exit 2 at the missing credentials file, before any connection."""


def _time(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    return time.perf_counter() - start, done.returncode


def measure(runs: int, python: str = sys.executable) -> dict[str, object]:
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as scratch:
        missing = str(Path(scratch) / "missing.creds")
        # The checkout first on the path (as an editable install has it), no cluster named anywhere.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROUNDHOUSE_")}
        env["PYTHONPATH"] = str(root)
        times: dict[str, list[float]] = {name: [] for name in CASES}
        for _ in range(runs):
            for name, args in CASES.items():
                argv = [python, *(a.format(missing=missing) for a in args)]
                elapsed, code = _time(argv, env, Path(scratch))
                if code != EXPECTED_EXIT[name]:
                    raise SystemExit(f"{name}: exit {code}, expected {EXPECTED_EXIT[name]}: {' '.join(argv)}")
                times[name].append(elapsed)
    base = times["python"]
    result: dict[str, object] = {
        "runs": runs,
        "python": {"min_s": round(min(base), 4), "median_s": round(statistics.median(base), 4)},
        "target_overhead_s": TARGET_S,
    }
    for name in ("help", "jobs", "submit"):
        values = times[name]
        overhead_min = min(values) - min(base)
        overhead_median = statistics.median(values) - statistics.median(base)
        result[name] = {
            "min_s": round(min(values), 4),
            "median_s": round(statistics.median(values), 4),
            "overhead_min_s": round(overhead_min, 4),
            "overhead_median_s": round(overhead_median, 4),
            "ratio_median": round(statistics.median(values) / statistics.median(base), 2),
            "meets_target": overhead_median <= TARGET_S,
        }
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]  # the host's, during the run
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    result = measure(args.runs)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
