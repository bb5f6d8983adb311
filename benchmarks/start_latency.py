"""Trial-job start latency: submit -> ``job.started`` on an idle cluster, with and without fill rounds.

What a researcher feels first: how long a job submitted to a cluster with free GPUs waits before its
process runs. The whole local stack runs as in ``roundhouse up`` (the bundled NATS server, the five
services and one worker with fake GPUs, all real child processes) with the default LAS policy, a
timer-only policy. Each sample submits one short job (``python -c 'sleep 0.5'``) at a random point of
the round, through ``roundhouse.client.Client``, and times until the worker's ``job.started`` fact.

Two runs in one process: ``fill`` (the scheduler's default, ``fill_between_rounds``) and the
baseline ``no-fill`` (``--no-fill-between-rounds``: jobs start only at the policy's rounds, as in
Blox), whose expected wait is about half a round. The ratio of the medians is the number to read.
The ``fill`` median is also the control-plane start latency ``SimConfig.start_latency_s`` models
(``roundhouse.sim.live_config``; ``benchmarks/fidelity.py`` measures it with its own probes).

    python -m benchmarks.start_latency [--samples 8] [--round 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from roundhouse.client import Client
from roundhouse.local import LocalCluster, LocalClusterConfig
from schemas.job import JobSpec
from schemas.jobs import JobStarted


async def _sample_starts(
    nats: str, namespace: str, samples: int, round_s: float, seed: int, *, creds: Path | None = None
) -> list[float]:
    """Submit ``samples`` jobs one at a time; the seconds from publish to ``job.started`` of each."""
    rng = random.Random(seed)
    started: dict[str, float] = {}
    waiting: dict[str, asyncio.Event] = {}

    async def on_started(event: JobStarted) -> None:
        if event.job_id in waiting and event.job_id not in started:
            started[event.job_id] = time.perf_counter()
            waiting[event.job_id].set()

    latencies: list[float] = []
    # With the operator's credentials: it watches every node's job.started.
    async with await Client.connect(nats, namespace=namespace, name="start-latency", creds=creds) as client:
        await client.bus.subscribe("job.started.*", JobStarted, on_started)
        await client.bus.nc.flush()
        for i in range(samples):
            await asyncio.sleep(rng.uniform(0.0, round_s))  # a random phase of the round
            spec = JobSpec(name=f"trial-{i}", command=[sys.executable, "-c", "import time; time.sleep(0.5)"])
            job_id = f"trial-{i}-{rng.getrandbits(32):08x}"
            waiting[job_id] = asyncio.Event()
            sent = time.perf_counter()
            verdict = await client.submit(spec, job_id=job_id)
            if verdict.outcome != "accepted":
                raise RuntimeError(f"{job_id} was {verdict.outcome}: {verdict.reason}")
            await asyncio.wait_for(waiting[job_id].wait(), timeout=2 * round_s + 30)
            latencies.append(started[job_id] - sent)
            await asyncio.sleep(1.0)  # let it finish: the next sample meets an idle cluster again
    return latencies


def measure(mode: str, samples: int, round_s: float, seed: int) -> dict[str, Any]:
    extra = {} if mode == "fill" else {"scheduler": ["--no-fill-between-rounds"]}
    with tempfile.TemporaryDirectory(prefix="rh-start-") as tmp:
        config = LocalClusterConfig(
            state_dir=Path(tmp), workers=1, gpus_per_worker=2, round_s=round_s, log_level="WARNING", extra_args=extra
        )
        with LocalCluster(config) as local:
            local.wait_ready()
            assert local.endpoint is not None
            latencies = asyncio.run(
                _sample_starts(
                    local.endpoint.nats, local.endpoint.namespace, samples, round_s, seed, creds=local.operator_creds
                )
            )
    return {
        "mode": mode,
        "samples": len(latencies),
        "p50_s": statistics.median(latencies),
        "max_s": max(latencies),
        "mean_s": statistics.fmean(latencies),
        "latencies_s": latencies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--round", type=float, default=10.0, dest="round_s", help="the scheduler's round (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [measure(mode, args.samples, args.round_s, args.seed) for mode in ("fill", "no-fill")]
    for r in results:
        print(f"{r['mode']:>8}: submit -> job.started p50 {r['p50_s']:.2f} s, mean {r['mean_s']:.2f} s, "
              f"max {r['max_s']:.2f} s over {r['samples']} jobs (LAS, {args.round_s:g} s rounds)")  # fmt: skip
    ratio = results[1]["p50_s"] / results[0]["p50_s"]
    print(f"fill rounds start trial jobs {ratio:.1f}x sooner (p50)")
    # The fill run's p50 is the control-plane start latency the simulator can model (issue 18).
    print(f"to simulate it: SimConfig(start_latency_s={results[0]['p50_s']:.3f} x the time scale), or "
          f"python -m benchmarks.fidelity --start-latency {results[0]['p50_s']:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"round_s": args.round_s, "runs": results, "p50_ratio": ratio}, indent=1))


if __name__ == "__main__":
    main()
