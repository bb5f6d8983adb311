"""Chaos: short jobs through a local cluster whose parts are killed with SIGKILL at random moments.

A real local cluster of child processes (``tests/chaos_cluster.py``, built on ``roundhouse up``'s
``LocalCluster``): the bundled nats-server, 2 or 3 scheduler replicas sharing one store (the SQLite
file of ``up``, or a fresh database on the local PostgreSQL with ``--db postgres``), admission,
placement, metrics and worker agents that emulate their jobs (``--emulate``). It submits ``--jobs``
one-GPU jobs of a few real seconds each and, at random moments (seeded), kill -9s a random
scheduler replica, service, agent or the broker itself, restarting each after a short random delay
(the broker on its port and data directory). Killing stops ``--chaos-after`` seconds after the last
submission; then it waits (at most ``--drain-timeout``) for every job to be final and judges from
the store and the workers' own facts:

* ``completed``: jobs the store says completed; ``stuck``: still held, queued or running at the
  deadline; ``lost``: neither (failed, cancelled, or never stored);
* ``double_runs``: pairs of runs of one job under different leases that overlapped in time, each
  run from its worker's ``job.started`` to its end fact (or its agent's death);
* ``kills`` (and ``kills_<kind>``), ``drain_s`` (killing over, every part back -> every job final).

    python -m benchmarks.chaos --jobs 200 --json FILE [--schedulers 3] [--db postgres] [--seed 1]

Target (issue 12): 200/200 completed, 0 lost, 0 double.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.chaos_cluster import (
    BROKER,
    ChaosConfig,
    ChaosPlan,
    create_database,
    drop_database,
    machine_load,
    run_chaos,
    running,
)


async def measure(args: argparse.Namespace, state_dir: Path) -> dict[str, Any]:
    db = await create_database() if args.db == "postgres" else None
    try:
        config = ChaosConfig(
            state_dir=state_dir, schedulers=args.schedulers, workers=args.workers, gpus_per_worker=args.gpus,
            db=db, speedup=args.speedup, round_s=args.round * args.speedup, leader_ttl_s=args.leader_ttl,
            log_level="INFO",
        )  # fmt: skip
        kinds = tuple(k for k in (BROKER, "scheduler", "admission", "placement", "metrics", "worker")
                      if k not in args.spare)  # fmt: skip
        plan = ChaosPlan(
            jobs=args.jobs, seed=args.seed, submit_every_s=args.submit_every, job_s=(args.job_min, args.job_max),
            chaos_after_s=args.chaos_after, kinds=kinds, mean_gap_s=args.kill_every,
            down_s=(args.down_min, args.down_max), drain_timeout_s=args.drain_timeout, opening=tuple(args.opening),
        )  # fmt: skip
        load_before = machine_load()
        began = time.monotonic()
        async with running(config) as cluster:
            result = await run_chaos(cluster, plan)
        summary = result.summary()
    finally:
        if db is not None:
            await drop_database(db)
    return {
        **summary, "wall_s": round(time.monotonic() - began, 1), "seed": args.seed, "schedulers": args.schedulers,
        "workers": args.workers, "gpus_per_worker": args.gpus, "store": args.db, "speedup": args.speedup,
        "leader_ttl_s": args.leader_ttl, "load_before": load_before, "load_after": machine_load(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schedulers", type=int, default=2, help="scheduler replicas")
    parser.add_argument("--workers", type=int, default=3, help="worker agents")
    parser.add_argument("--gpus", type=int, default=4, help="fake GPUs per worker")
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite",
                        help="the schedulers' store: the SQLite file of `up`, or a fresh database on "
                        "127.0.0.1:5432 (trust auth), dropped afterwards")  # fmt: skip
    parser.add_argument("--speedup", type=float, default=50.0, help="emulation speed-up")
    parser.add_argument("--round", type=float, default=5.0, help="the scheduler's round (real seconds)")
    parser.add_argument("--leader-ttl", type=float, default=None, help="schedulers' --leader-ttl-s (default: theirs)")
    parser.add_argument("--job-min", type=float, default=1.0, help="shortest job (real seconds)")
    parser.add_argument("--job-max", type=float, default=4.0, help="longest job (real seconds)")
    parser.add_argument("--submit-every", type=float, default=0.25, help="mean gap between submissions (s)")
    parser.add_argument("--kill-every", type=float, default=3.0, help="mean gap between kills (s)")
    parser.add_argument("--down-min", type=float, default=0.5, help="shortest time a killed part stays down (s)")
    parser.add_argument("--down-max", type=float, default=3.0, help="longest time a killed part stays down (s)")
    parser.add_argument("--chaos-after", type=float, default=15.0, help="keep killing this long after the last job")
    parser.add_argument("--opening", nargs="*", default=["leader", "broker", "worker"],
                        help="kinds killed first, in order (leader: the leading scheduler), then at random")
    parser.add_argument("--spare", nargs="*", default=[], help="kinds never killed (e.g. broker worker)")
    parser.add_argument("--drain-timeout", type=float, default=300.0)
    parser.add_argument("--keep", type=Path, default=None, help="keep the cluster's state and logs in this directory")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("roundhouse.chaos").setLevel(logging.INFO)
    logging.getLogger("roundhouse.bus").setLevel(logging.CRITICAL)  # our own client's reconnects
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(measure(args, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="rh-chaos-") as tmp:
            result = asyncio.run(measure(args, Path(tmp)))
    print(f"chaos: {result['completed']}/{result['jobs']} completed, {result['lost']} lost, "
          f"{result['double_runs']} double runs, {result['stuck']} stuck; {result['kills']} kills "
          f"({', '.join(f'{k[6:]} {v}' for k, v in result.items() if k.startswith('kills_'))}), "
          f"{result['crashes']} crashes; drained in {result['drain_s']:.1f} s; {result['load_after']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
