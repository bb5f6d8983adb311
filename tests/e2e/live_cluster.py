"""Shared pieces of the live-cluster tests: a running ``LocalCluster`` with a client, job logs, polling.

The cluster is the one ``roundhouse up`` runs (bundled nats-server, the five services and worker
agents as child processes, fake GPUs); jobs are real child processes of the workers running
``tests/e2e/jobs/curve_job.py``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roundhouse.client import Client
from roundhouse.local import LocalCluster, LocalClusterConfig
from schemas.control import JobsQuery, JobView
from schemas.job import JobSpec
from services.runtime.bus import NoResponderError

CURVE_JOB = Path(__file__).resolve().parent / "jobs" / "curve_job.py"
FINAL = ("completed", "failed", "cancelled")


@dataclass(slots=True)
class Live:
    """A started cluster, a connected client and where the jobs' logs go."""

    cluster: LocalCluster
    client: Client
    logs: Path
    submitted: dict[str, float] = field(default_factory=dict)
    """job id -> wall time just before its submission."""

    async def submit(self, spec: JobSpec) -> str:
        before = time.time()
        verdict = await self.client.submit(spec, timeout_s=30)
        assert verdict.outcome == "accepted", verdict
        self.submitted[verdict.job_id] = before
        return verdict.job_id

    def log_of(self, name: str) -> Path:
        return self.logs / f"{name}.jsonl"

    async def jobs(self, job_ids: list[str]) -> list[JobView] | None:
        try:
            reply = await self.client.jobs(JobsQuery(job_ids=sorted(job_ids), include_finished=True))
        except (TimeoutError, NoResponderError):  # the scheduler may be busy in a round (or still electing itself)
            return None
        return reply.jobs

    async def wait_jobs(
        self, job_ids: list[str], done: Callable[[list[JobView]], bool], timeout_s: float, what: str
    ) -> list[JobView]:
        """Poll ``query.jobs`` until ``done(views)``; AssertionError naming ``what`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        views: list[JobView] | None = None
        while True:
            views = await self.jobs(job_ids)
            if views is not None and len(views) == len(job_ids) and done(views):
                return views
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout_s} s: {views}")
            self.cluster.check()
            await asyncio.sleep(0.2)

    async def wait_finished(self, job_ids: list[str], timeout_s: float) -> dict[str, JobView]:
        views = await self.wait_jobs(
            job_ids, lambda vs: all(v.status in FINAL for v in vs), timeout_s, "every job finished"
        )
        return {v.job_id: v for v in views}


def curve_spec(
    live: Live, name: str, *, iterations: int, sleep_s: float = 0.05, rate: float = 0.01,
    checkpoint_s: float = 0.0, plateau_at: int | None = None, restore_s: float = 0.0, **spec: Any,
) -> JobSpec:  # fmt: skip
    """A ``curve_job.py`` job logging to ``live.logs/<name>.jsonl``."""
    command = [sys.executable, str(CURVE_JOB), "--iterations", str(iterations), "--sleep", str(sleep_s),
               "--rate", str(rate), "--checkpoint-s", str(checkpoint_s), "--log", str(live.log_of(name))]  # fmt: skip
    if plateau_at is not None:
        command += ["--plateau-at", str(plateau_at)]
    if restore_s:
        command += ["--restore-s", str(restore_s)]
    return JobSpec(name=name, command=command, env={"PYTHONDONTWRITEBYTECODE": "1"}, **spec)


def read_log(path: Path) -> list[dict[str, Any]]:
    """A job's log lines (a partly written last line is left out)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def iterations(log: list[dict[str, Any]]) -> list[int]:
    return [rec["i"] for rec in log if "i" in rec]


def events(log: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rec for rec in log if rec.get("event") == kind]


@asynccontextmanager
async def live_cluster(tmp_path: Path, config: LocalClusterConfig) -> AsyncIterator[Live]:
    """Start ``config``'s cluster, yield it with a client; on exit check no part died, then stop it."""
    cluster = LocalCluster(config)
    endpoint = await asyncio.to_thread(cluster.start)
    logs = tmp_path / "job-logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        await asyncio.to_thread(cluster.wait_ready)
        # As the operator: the tests also inspect what users may not read (the job-metrics bucket).
        client = await Client.connect(endpoint.nats, namespace=endpoint.namespace, creds=cluster.operator_creds)
        try:
            yield Live(cluster, client, logs)
        finally:
            await client.close()
        cluster.check()  # no service or worker died along the way
    finally:
        await asyncio.to_thread(cluster.stop)
