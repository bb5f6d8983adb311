"""A durable publish waits out a stream with no leader for a while, but not a stream that does not exist."""

from __future__ import annotations

import time

import pytest

from schemas.job import JobSpec
from schemas.jobs import JobArrived
from services.runtime.broker import Broker
from services.runtime.bus import Bus, BusOptions, PublishError


async def test_a_durable_publish_with_no_stream_fails_at_once_and_says_why(broker: Broker, namespace: str) -> None:
    bus = await Bus.connect(broker.url, name="no-stream", options=BusOptions(namespace=namespace), provision=False)
    try:
        event = JobArrived(job_id="j1", spec=JobSpec(name="j1", command=["python", "train.py"], gpus=1))
        began = time.monotonic()
        with pytest.raises(PublishError, match=r"no stream takes job\.arrived\.default: .*RH_EVENTS does not exist"):
            await bus.publish("job.arrived.*", event)
        assert time.monotonic() - began < 2.0
    finally:
        await bus.close()
