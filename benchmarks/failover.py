"""Failover: kill -9 the leading scheduler replica while jobs flow; how long until a new leader acts.

A real local cluster of child processes (``tests/chaos_cluster.py``, built on ``roundhouse up``'s
``LocalCluster``): the bundled nats-server, ``--schedulers`` replicas (default 3) sharing one store,
admission, placement, metrics and emulating worker agents, with short jobs submitted all along. Each
trial waits until the leader has sent a command of its term, waits a random 0.5-2.5 s (so the kill
falls anywhere in the leader's renewal period), kills the leading replica's process with SIGKILL and
measures, from the kill:

* ``expired``: the election key is gone (its TTL ran out after the killed leader's last renewal,
  ``renewal_age`` before the kill);
* ``elected``: the election key names another replica with a new epoch (read every 20 ms): a
  follower's ``create``, tried every ``leader_ttl_s / 3``, succeeded;
* ``claimed``: the new leader's ``leading`` log line (its term claimed in the store, book loaded);
* ``takeover``: the first command of the new term on the wire (a ``schedule.round``, ``lease.grant``
  or ``lease.revoke`` carrying the new epoch), as placement and workers see it.

The killed replica is started again a second later. After the trials the submissions stop, the
queue drains, and the run is audited from the store and the workers' facts (``lost``: jobs not
completed; ``double_runs``: runs of one job under two leases that overlapped).

    python -m benchmarks.failover [--trials 10] [--leader-ttl S] [--db postgres] --json FILE

Keys: ``trials``, ``takeover_s_p50``, ``takeover_s_max``, ``lost``, ``double_runs`` (then details).
Target (issue 12): takeover p50 <= 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from roundhouse.local import _ping_counts
from services.runtime.bus import Bus
from services.runtime.logs import parse_timestamp
from services.scheduler.leader import BUCKET as LEADER_BUCKET
from services.scheduler.leader import KEY as LEADER_KEY
from tests.chaos_cluster import (
    ChaosCluster,
    ChaosConfig,
    ChaosError,
    CommandWatch,
    RenewalWatch,
    Submitter,
    audit,
    connect,
    create_database,
    drop_database,
    leader,
    machine_load,
    percentile,
    running,
    short_job,
    wait_drained,
)

log = logging.getLogger("roundhouse.failover")


async def feed(submitter: Submitter, cluster: ChaosCluster, rng: random.Random, every_s: float,
               stop: asyncio.Event) -> None:  # fmt: skip
    """Submit short jobs until ``stop``."""
    index = 0
    while not stop.is_set():
        spec = short_job(index, rng, cluster.chaos, (1.0, 4.0))
        await submitter.submit(spec, f"flow-{index}-{rng.getrandbits(32):08x}")
        index += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.expovariate(1 / every_s))


async def stable_leader(cluster: ChaosCluster, bus: Bus, watch: CommandWatch, timeout_s: float) -> tuple[str, int]:
    """A leader that has sent a command of its term, with every replica up and answering."""
    assert cluster.endpoint is not None
    deadline = time.monotonic() + timeout_s
    while True:
        found = await leader(bus)
        if found is not None and found[1] in watch.first_seen:
            pings = await _ping_counts(cluster.endpoint, {"scheduler": cluster.chaos.schedulers})
            if pings.get("scheduler", 0) >= cluster.chaos.schedulers:
                return found
        if time.monotonic() > deadline:
            raise ChaosError(f"no stable leader within {timeout_s} s (key: {found})")
        await asyncio.sleep(0.1)


async def elected_after(bus: Bus, epoch: int, timeout_s: float) -> tuple[float | None, float]:
    """When the election key was first seen gone (None: never seen so), and when it first named a
    term above ``epoch`` (read every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    gone: float | None = None
    bucket = await bus.kv(LEADER_BUCKET)
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            entry = await bucket.get(LEADER_KEY)
            if entry is None and gone is None:
                gone = time.time()
            found = await leader(bus)
            if found is not None and found[1] > epoch:
                return gone, time.time()
        await asyncio.sleep(0.02)
    raise ChaosError(f"no leader above epoch {epoch} within {timeout_s} s")


async def renewed_at(bus: Bus) -> float | None:
    """When the election key was last written (the leader's last renewal), from the stream."""
    bucket = bus.name(LEADER_BUCKET)
    try:
        msg = await bus.js.get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{LEADER_KEY}")
    except Exception:  # gone already
        return None
    return msg.time.timestamp() if msg.time is not None else None


def claimed_at(cluster: ChaosCluster, instance: str, after: float) -> float | None:
    """The wall time of ``instance``'s first ``leading`` log line after ``after``."""
    for record in cluster.log_records(instance):
        if record.get("msg") == "leading" and (ts := parse_timestamp(record.get("ts", 0))) > after:
            return ts
    return None


async def trial(cluster: ChaosCluster, bus: Bus, watch: CommandWatch, rng: random.Random) -> dict[str, Any]:
    instance, epoch = await stable_leader(cluster, bus, watch, timeout_s=120)
    await asyncio.sleep(rng.uniform(0.5, 2.5))
    async with cluster.lock:
        killed = await asyncio.to_thread(cluster.kill, instance)
    renewed = await renewed_at(bus)  # nothing renews it any more
    elected = asyncio.create_task(elected_after(bus, epoch, timeout_s=120))
    new_epoch, first_command = await watch.first_after(epoch, timeout_s=120)
    gone, elected_wall = await elected
    found = await leader(bus)
    new_instance = found[0] if found is not None else "?"
    await asyncio.sleep(1.0)
    async with cluster.lock:
        await asyncio.to_thread(cluster.restart, instance)
    claimed = claimed_at(cluster, new_instance, killed)
    result = {
        "killed": instance, "epoch": epoch, "new_leader": new_instance, "new_epoch": new_epoch,
        "elected_s": round(elected_wall - killed, 3), "takeover_s": round(first_command - killed, 3),
        "claimed_s": round(claimed - killed, 3) if claimed is not None else None,
        "renewal_age_s": round(killed - renewed, 3) if renewed is not None else None,
        "expired_s": round(gone - killed, 3) if gone is not None else None,
    }  # fmt: skip
    log.info("trial: %s", result)
    return result


async def measure(args: argparse.Namespace, state_dir: Path) -> dict[str, Any]:
    db = await create_database("rh_failover") if args.db == "postgres" else None
    load_before = machine_load()
    try:
        config = ChaosConfig(
            state_dir=state_dir, schedulers=args.schedulers, workers=args.workers, gpus_per_worker=args.gpus,
            db=db, speedup=args.speedup, round_s=args.round * args.speedup, leader_ttl_s=args.leader_ttl,
        )  # fmt: skip
        rng = random.Random(args.seed)
        async with running(config) as cluster:
            client = await connect(cluster, "failover")
            watch = CommandWatch(client.bus)
            await watch.start()
            renewals = RenewalWatch(client.bus)
            await renewals.start()
            stop = asyncio.Event()
            submitter = Submitter(client)
            jobs_rng = random.Random(args.seed + 1)
            feeder = asyncio.create_task(feed(submitter, cluster, jobs_rng, args.submit_every, stop))
            try:
                trials = [await trial(cluster, client.bus, watch, rng) for _ in range(args.trials)]
            finally:
                stop.set()
                await feeder
            drained = await wait_drained(cluster.store_target, submitter.job_ids, args.drain_timeout)
            result = await audit(cluster, client.bus, submitter.job_ids)
            await watch.stop()
            await renewals.stop()
            await client.close()
    finally:
        if db is not None:
            await drop_database(db)
    takeovers = [t["takeover_s"] for t in trials]
    elected = [t["elected_s"] for t in trials]
    claimed = [t["claimed_s"] for t in trials if t["claimed_s"] is not None]
    expired = [t["expired_s"] for t in trials if t["expired_s"] is not None]
    waited = [t["elected_s"] - t["expired_s"] for t in trials if t["expired_s"] is not None]
    return {
        "trials": len(trials),
        "takeover_s_p50": round(statistics.median(takeovers), 3),
        "takeover_s_max": round(max(takeovers), 3),
        "lost": len(result.lost),
        "double_runs": len(result.double_runs),
        "elected_s_p50": round(statistics.median(elected), 3),
        "claimed_s_p50": round(statistics.median(claimed), 3) if claimed else None,
        "expired_s_p50": round(statistics.median(expired), 3) if expired else None,
        "create_wait_s_p50": round(statistics.median(waited), 3) if waited else None,
        "renewal_gap_s_max": round(max(renewals.gaps(), default=float("nan")), 3),
        "renewal_gap_s_p99": round(percentile(renewals.gaps(), 0.99), 3),
        "renewals": len(renewals.gaps()),
        "takeover_s": takeovers, "elected_s": elected, "claimed_s": claimed,
        "jobs": result.jobs, "completed": result.completed, "stuck": len(result.stuck), "drained": drained,
        "completed_twice": len(result.completed_twice), "crashes": sum(len(p.crashes) for p in cluster.parts.values()),
        "leader_ttl_s": args.leader_ttl, "schedulers": args.schedulers, "store": args.db,
        "details": trials, "load_before": load_before, "load_after": machine_load(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schedulers", type=int, default=3, help="scheduler replicas")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=4, help="fake GPUs per worker")
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--leader-ttl", type=float, default=None,
                        help="the schedulers' --leader-ttl-s (default: the scheduler's own default)")  # fmt: skip
    parser.add_argument("--speedup", type=float, default=50.0)
    parser.add_argument("--round", type=float, default=5.0, help="the scheduler's round (real seconds)")
    parser.add_argument("--submit-every", type=float, default=0.4, help="mean gap between submissions (s)")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--keep", type=Path, default=None, help="keep the cluster's state and logs in this directory")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("roundhouse.failover").setLevel(logging.INFO)
    logging.getLogger("roundhouse.bus").setLevel(logging.CRITICAL)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(measure(args, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="rh-failover-") as tmp:
            result = asyncio.run(measure(args, Path(tmp)))
    ttl = result["leader_ttl_s"] if result["leader_ttl_s"] is not None else "default"
    print(f"failover (leader TTL {ttl}): {result['trials']} leader kills; first command of the new term "
          f"p50 {result['takeover_s_p50']:.2f} s, max {result['takeover_s_max']:.2f} s (key expired p50 "
          f"{result['expired_s_p50']} s, a follower's create {result['create_wait_s_p50']} s after that; "
          f"claimed p50 {result['claimed_s_p50']} s; longest renewal gap {result['renewal_gap_s_max']} s); "
          f"{result['lost']} lost, "
          f"{result['double_runs']} double runs of {result['jobs']} jobs; {result['load_after']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
