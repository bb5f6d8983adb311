"""The service base against a real nats-server: services API, graceful SIGTERM in a child process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from pathlib import Path

import nats.errors
import nats.js.errors

from schemas.examples import example
from schemas.jobs import JobArrived
from services.runtime.broker import Broker
from services.runtime.bus import Bus
from services.runtime.config import ServiceConfig
from services.runtime.service import run_service
from tests.helpers import eventually
from tests.integration.echo_service import EchoService

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def arrived(job_id: str) -> JobArrived:
    return example(JobArrived).model_copy(update={"event_id": uuid.uuid4(), "job_id": job_id})


async def test_service_answers_the_nats_services_api(broker: Broker, bus: Bus, namespace: str,
                                                     tmp_path: Path) -> None:
    config = ServiceConfig(nats=broker.url, namespace=namespace, instance="echo-1")
    service = EchoService(config, tmp_path / "out.txt")
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(service, stop=stop))
    try:
        await bus.publish("job.arrived.*", arrived("job-1"))
        await eventually(lambda: service.handled == 1)
        ping = json.loads((await bus.nc.request("$SRV.PING.roundhouse-echo", b"", timeout=2)).data)
        assert ping["name"] == "roundhouse-echo"
        assert ping["metadata"]["instance"] == "echo-1"
        stats = json.loads((await bus.nc.request("$SRV.STATS.roundhouse-echo", b"", timeout=2)).data)
        data = stats["endpoints"][0]["data"]
        assert data["service"] == {"handled": 1}
        assert data["bus"]["received"] == 1
        own = json.loads((await bus.nc.request(bus.wire("rh.echo.stats"), b"", timeout=2)).data)
        assert own["service"] == {"handled": 1}
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert service.stopped


async def test_sigterm_finishes_the_message_in_hand_acks_it_and_exits_cleanly(
    broker: Broker, bus: Bus, namespace: str, tmp_path: Path
) -> None:
    out = tmp_path / "handled.txt"
    out.touch()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "echo_service.py"), broker.url, namespace, str(out),
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await _wait_for_consumer(bus, f"{namespace}_echo")
        await bus.publish("job.arrived.*", arrived("job-7"))
        await eventually(lambda: "start job-7" in out.read_text())
        child.send_signal(signal.SIGTERM)  # mid-handler
        _, raw_stderr = await asyncio.wait_for(child.communicate(), 15)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    code, stderr = child.returncode, raw_stderr.decode()
    assert code == 0, stderr
    assert out.read_text().splitlines() == ["start job-7", "done job-7"]
    info = await bus.js.consumer_info(bus.stream_name, f"{namespace}_echo")
    assert info.num_ack_pending == 0  # the handled message was acked before exit
    assert info.num_pending == 0
    assert "echo service stopped" in stderr


async def _wait_for_consumer(bus: Bus, durable: str, timeout_s: float = 20.0) -> None:
    """The child has started once its durable consumer exists on the server."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await bus.js.consumer_info(bus.stream_name, durable)
            return
        except nats.js.errors.NotFoundError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_stats_name_the_policy_and_options_a_service_runs(broker: Broker, bus: Bus, namespace: str,
                                                                tmp_path: Path) -> None:
    # `roundhouse status` shows every service's policy from these stats (services/scheduler/status_query.py).
    config = ServiceConfig(nats=broker.url, namespace=namespace, instance="echo-2", policy="quota",
                           policy_options={"max_gpus": 4})
    stop = asyncio.Event()
    task = asyncio.create_task(run_service(EchoService(config, tmp_path / "out.txt"), stop=stop))
    try:
        async def policy_said() -> object:
            msg = await bus.nc.request("$SRV.STATS.roundhouse-echo", b"", timeout=2)
            return json.loads(msg.data)["endpoints"][0]["data"].get("policy")

        said = None
        for _ in range(50):  # the request is answered once the service has announced itself
            try:
                said = await policy_said()
                break
            except nats.errors.NoRespondersError:
                await asyncio.sleep(0.1)
        assert said == {"name": "quota", "options": {"max_gpus": 4}}
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
