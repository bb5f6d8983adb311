"""Cost of the per-iteration lease check of ``roundhouse.train``, against a bare loop in the same run.

Three loops over the same N items, each doing the same trivial body:

* bare: ``for item in data``;
* wrapped: ``for item in job.iterate(data)`` with a real mmap'd channel attached (the lease check,
  the iteration counter written to the channel, the iteration-time EWMA);
* custom: ``while not job.should_stop(): ...; job.iteration_done()`` (the API for custom loops).

The overhead per iteration is (loop - bare) / N; the best of ``--repeat`` runs is kept, so noise
from other processes on the host inflates nothing. Target (issue 4): <= 5 µs per iteration.

    python -m benchmarks.lease_check [--iterations 1000000] [--repeat 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from roundhouse.train import Job, JobEnv
from services.worker.channel import Channel

TARGET_US = 5.0


def _bare(n: int) -> float:
    data = range(n)
    acc = 0
    start = time.perf_counter()
    for item in data:
        acc += item
    return time.perf_counter() - start


def _wrapped(n: int, directory: Path) -> float:
    path = directory / "bench.chan"
    agent = Channel.create(path)
    job = Job(JobEnv(channel=path, checkpoint_dir=directory))
    acc = 0
    start = time.perf_counter()
    for item in job.iterate(range(n), epochs=1):
        acc += item
    elapsed = time.perf_counter() - start
    assert job.iteration == n
    assert agent.iteration == n
    job.close()
    agent.close()
    return elapsed


def _custom(n: int, directory: Path) -> float:
    path = directory / "bench.chan"
    agent = Channel.create(path)
    job = Job(JobEnv(channel=path, checkpoint_dir=directory))
    acc = 0
    start = time.perf_counter()
    while not job.should_stop() and job.iteration < n:
        acc += job.iteration
        job.iteration_done()
    elapsed = time.perf_counter() - start
    job.close()
    agent.close()
    return elapsed


def _best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    n = args.iterations
    with tempfile.TemporaryDirectory(prefix="rh-lease-bench-") as tmp:
        directory = Path(tmp)
        bare = _best(lambda: _bare(n), args.repeat)
        wrapped = _best(lambda: _wrapped(n, directory), args.repeat)
        custom = _best(lambda: _custom(n, directory), args.repeat)
    per = {name: (t - bare) / n * 1e6 for name, t in (("wrapped", wrapped), ("custom", custom))}
    result = {
        "iterations": n,
        "bare_ns_per_iteration": bare / n * 1e9,
        "wrapped_ns_per_iteration": wrapped / n * 1e9,
        "custom_ns_per_iteration": custom / n * 1e9,
        "wrapped_overhead_us": per["wrapped"],
        "custom_overhead_us": per["custom"],
        "target_us": TARGET_US,
        "ok": max(per.values()) <= TARGET_US,
    }
    print(f"lease check over {n} iterations (best of {args.repeat}):")
    print(f"  bare loop                 {result['bare_ns_per_iteration']:8.1f} ns/iteration")
    print(f"  job.iterate(data)         {result['wrapped_ns_per_iteration']:8.1f} ns/iteration"
          f"  -> overhead {per['wrapped']:.3f} us")
    print(f"  should_stop + iteration_done {result['custom_ns_per_iteration']:5.1f} ns/iteration"
          f"  -> overhead {per['custom']:.3f} us")
    print(f"  target <= {TARGET_US} us per iteration: {'met' if result['ok'] else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
