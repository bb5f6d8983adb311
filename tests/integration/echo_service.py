"""A minimal real service for lifecycle tests: consumes job.arrived, handles each slowly.

Run as a child process: ``python echo_service.py NATS_URL NAMESPACE OUT_FILE``. Each handled job id
is appended to OUT_FILE after a short delay, so a SIGTERM can arrive mid-handler.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from schemas.jobs import JobArrived
from services.runtime.bus import Bus
from services.runtime.config import ServiceConfig
from services.runtime.consumer import ConsumerOptions
from services.runtime.service import RoundhouseService, start_service_process


class EchoService(RoundhouseService):
    kind = "echo"

    def __init__(self, config: ServiceConfig, out: Path) -> None:
        super().__init__(config)
        self.out = out
        self.handled = 0
        self.stopped = False

    async def start(self, bus: Bus) -> None:
        self.consumer = await bus.consume(
            "job.arrived.*", JobArrived, self.handle, durable="echo", options=ConsumerOptions(fetch_timeout_s=0.2)
        )

    async def handle(self, event: JobArrived) -> None:
        with self.out.open("a") as f:
            f.write(f"start {event.job_id}\n")
        await asyncio.sleep(0.5)
        with self.out.open("a") as f:
            f.write(f"done {event.job_id}\n")
        self.handled += 1

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.consumer.stop()

    def stats(self) -> dict[str, Any]:
        return {"handled": self.handled}


if __name__ == "__main__":
    url, namespace, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    config = ServiceConfig(nats=url, namespace=namespace, log_format="text")
    sys.exit(start_service_process(EchoService(config, out)))
