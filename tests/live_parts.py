"""Every service real, in one namespace of the session's nats-server: a scheduler (SQLite store),
the placement service, the admission service, and worker agents as child processes (``--emulate``
unless told otherwise). A test submits through the user's client and reads what a user reads:
``query.jobs`` (:meth:`LiveParts.jobs`) and ``roundhouse jobs --json`` run as a command (:meth:`LiveParts.cli_jobs`).

The services run in the test's process (their own code, their own bus connections); only the agents
are processes, so a test can kill one (SIGKILL) and start it again as a new incarnation.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from roundhouse.client import Client
from schemas.control import JobsQuery, JobView
from schemas.job import JobSpec
from services.admission.service import AdmissionConfig, AdmissionService
from services.placement.service import PlacementConfig, PlacementService
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions
from services.runtime.consumer import ConsumerOptions
from services.runtime.store.engine import DB_FILENAME
from services.scheduler.config import SchedulerConfig
from services.scheduler.service import SchedulerService
from tests.helpers import eventually
from tests.integration.test_worker_harness import Facts, WorkerProcess, collect

REPO = Path(__file__).resolve().parents[1]
FAST = ConsumerOptions(fetch_timeout_s=0.1, retry_backoff_s=0.05)
SCHEDULER_DEFAULTS: dict[str, Any] = {
    "policy": "fifo", "round_s": 0.5, "leader_ttl_s": 1.0, "plan_timeout_s": 2.0, "request_timeout_s": 1.0,
    "revoke_margin_s": 0.5, "lease_ttl_s": 30.0, "log_format": "text",
}  # fmt: skip
EMULATED = ("--emulate", "--speedup", "100", "--emulate-iteration-s", "0.1", "--emulate-checkpoint-s", "2")


def emulated_job(name: str, *, gpus: int = 1, seconds: float = 50.0, **fields: Any) -> JobSpec:
    """A job an emulating agent runs for ``seconds`` emulated seconds (0.01 s each at speed-up 100)."""
    return JobSpec(name=name, command=["train.py"], gpus=gpus, expected_duration_s=seconds, **fields)


class LiveParts:
    """The parts of one test's cluster; start what the test needs, :meth:`close` stops it all."""

    def __init__(self, broker: Broker, tmp: Path) -> None:
        self.broker = broker
        self.tmp = tmp
        self.namespace = f"lp{uuid.uuid4().hex[:12]}"
        self.db = tmp / "scheduler.db"  # a data directory: the SQLite file is in it
        self.buses: list[Bus] = []
        self.schedulers: list[SchedulerService] = []
        self.schedulers_started = 0  # names each replica anew: one started after a crash is not the dead one
        self.placements: list[PlacementService] = []
        self.admission: AdmissionService | None = None
        self.workers: dict[str, WorkerProcess] = {}
        self.client: Client
        self.facts: Facts

    async def connect(self, name: str) -> Bus:
        bus = await Bus.connect(self.broker.url, name=name, options=BusOptions(namespace=self.namespace))
        self.buses.append(bus)
        return bus

    async def open(self) -> None:
        watcher = await self.connect("facts")
        self.facts = await collect(watcher)
        self.client = Client(await self.connect("client"), identity="alice")

    async def start_scheduler(self, db: Path | None = None, **settings: Any) -> SchedulerService:
        """A replica on the shared store (``db``: another data directory, e.g. a copy taken by
        :meth:`back_up_store`)."""
        config = SchedulerConfig(
            nats=self.broker.url,
            namespace=self.namespace,
            db=str(db or self.db),
            instance=f"sched-{self.schedulers_started}",
            **{**SCHEDULER_DEFAULTS, **settings},
        )
        self.schedulers_started += 1
        service = SchedulerService(config, consumer_options=FAST)
        await service.start(await self.connect(config.instance or "sched"))
        self.schedulers.append(service)
        return service

    def back_up_store(self, name: str) -> Path:
        """A consistent copy of the store as it is now (SQLite's online backup), to start a replica on
        later: the store "restored from last night's backup"."""
        copy = self.tmp / name
        copy.mkdir()
        source, target = sqlite3.connect(self.db / DB_FILENAME), sqlite3.connect(copy / DB_FILENAME)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        return copy

    async def crash_scheduler(self, service: SchedulerService) -> None:
        """Stop a replica as if its process died: no resignation, its connection gone."""
        election = service.election
        assert election is not None
        await election.stop(resign=False)
        service.election = None
        await service.stop()
        bus = service.bus
        assert bus is not None
        await bus.close()
        self.buses.remove(bus)
        self.schedulers.remove(service)

    async def start_placement(self, policy: str = "consolidated", **options: Any) -> PlacementService:
        service = PlacementService(PlacementConfig(nats=self.broker.url, namespace=self.namespace, policy=policy,
                                                   policy_options=options))  # fmt: skip
        await service.start(await self.connect(f"placement-{len(self.placements)}"))
        self.placements.append(service)
        return service

    async def stop_placement(self, service: PlacementService) -> None:
        await service.stop()
        self.placements.remove(service)

    async def swap_placement(self, policy: str, **options: Any) -> PlacementService:
        """Stop every placement service and start one with ``policy`` (the scheduler sends the new
        instance a full snapshot: it has no base for deltas)."""
        for service in list(self.placements):
            await self.stop_placement(service)
        return await self.start_placement(policy, **options)

    async def start_admission(self, policy: str = "accept-all", **options: Any) -> AdmissionService:
        service = AdmissionService(AdmissionConfig(nats=self.broker.url, namespace=self.namespace, policy=policy,
                                                   policy_options=options, reoffer_interval_s=0.2))  # fmt: skip
        await service.start(await self.connect("admission"))
        await asyncio.wait_for(service.ready.wait(), 20)
        self.admission = service
        return service

    async def start_worker(self, node_id: str, gpus: int = 2, *extra: str, emulate: bool = True) -> WorkerProcess:
        """An agent for ``node_id`` (again: a new incarnation in the same work directory); returns once
        this incarnation registered."""
        args = ["--fake-gpus", str(gpus), "--heartbeat-s", "0.2", "--metrics-s", "0.1", "--kill-after-s", "0.5",
                *(EMULATED if emulate else ()), *extra]  # fmt: skip
        worker = WorkerProcess(self.broker.url, self.namespace, node_id, self.tmp / "nodes" / node_id, *args)
        await worker.start(self.facts)
        self.workers[node_id] = worker
        return worker

    async def up(self, nodes: dict[str, int], *, placement: str = "consolidated", admission: str = "accept-all",
                 admission_options: dict[str, Any] | None = None, placement_options: dict[str, Any] | None = None,
                 **scheduler: Any) -> SchedulerService:  # fmt: skip
        """The usual cluster: a leading scheduler, placement, admission, and one agent per node."""
        leader = await self.start_scheduler(**scheduler)
        await eventually(lambda: leader.is_leader, 15, "a leading scheduler")
        await self.start_placement(placement, **(placement_options or {}))
        await asyncio.gather(*(self.start_worker(node_id, gpus) for node_id, gpus in nodes.items()))
        await eventually(lambda: all(n in leader.inventory for n in nodes), 15, "every node registered")
        await self.start_admission(admission, **(admission_options or {}))
        return leader

    async def submit(self, spec: JobSpec, job_id: str | None = None) -> str:
        verdict = await self.client.submit(spec, job_id=job_id or f"j-{uuid.uuid4().hex[:8]}", timeout_s=20)
        return verdict.job_id

    async def jobs(self, *job_ids: str) -> dict[str, JobView]:
        """The leader's answer to ``query.jobs`` (finished jobs included), by job id."""
        reply = await self.client.jobs(JobsQuery(requester="alice", job_ids=list(job_ids), include_finished=True),
                                       timeout_s=10)  # fmt: skip
        return {view.job_id: view for view in reply.jobs}

    async def status_of(self, job_id: str) -> str | None:
        view = (await self.jobs(job_id)).get(job_id)
        return view.status if view is not None else None

    async def until_status(self, job_id: str, *statuses: str, timeout_s: float = 30.0) -> JobView:
        """Wait, asking ``query.jobs`` as a user would, until ``job_id`` is in one of ``statuses``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        seen: str | None = None
        while True:
            try:
                view = (await self.jobs(job_id)).get(job_id)
            except (TimeoutError, OSError):  # no leader for a moment (an election): ask again
                view = None
            seen = view.status if view is not None else seen
            if view is not None and seen in statuses:
                return view
            if loop.time() > deadline:
                raise AssertionError(f"{job_id} not {'/'.join(statuses)} within {timeout_s} s (last seen: {seen})")
            await asyncio.sleep(0.05)

    async def cli_jobs(self, *job_ids: str) -> dict[str, dict[str, Any]]:
        """``roundhouse jobs --json --all`` as a user runs it (a child process), by job id."""
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "roundhouse", "jobs", "--json", "--all", "--nats", self.broker.url,
            "--namespace", self.namespace, *job_ids, cwd=str(self.tmp),
            env={**os.environ, "PYTHONPATH": str(REPO), "ROUNDHOUSE_USER": "alice"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert process.returncode == 0, err.decode(errors="replace")
        return {job["job_id"]: job for job in json.loads(out)["jobs"]}

    async def close(self) -> None:
        errors: list[str] = []
        for worker in self.workers.values():
            if await worker.stop() != 0:
                errors.append(f"{worker.node_id} exited non-zero:\n{worker.log_text()[-3000:]}")
        if self.admission is not None:
            await self.admission.stop()
        for placement in self.placements:
            await placement.stop()
        for scheduler in self.schedulers:
            await scheduler.stop()
        for bus in self.buses:
            await bus.close()
        assert not errors, "\n".join(errors)


@asynccontextmanager
async def live_parts(broker: Broker, tmp: Path) -> AsyncIterator[LiveParts]:
    parts = LiveParts(broker, tmp)
    await parts.open()
    try:
        yield parts
    finally:
        await parts.close()
