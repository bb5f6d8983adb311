"""Probes of what the broker lets through, shared by the permission tests (issue 13)."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from services.runtime.bus import Bus

REPUBLISH_S = 0.25


async def reaches(listener: Bus, speaker: Bus, subject: str, within: float, *, settle_s: float = 0.0) -> bool:
    """Whether what ``speaker`` publishes on ``subject`` reaches ``listener``'s subscription to it.

    ``settle_s``: when the listener's subscription is the one under test, the broker's ``-ERR`` for a
    refused subscription arrives after the flush's PONG, so give it that long before publishing."""
    got: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        await got.put(msg)

    sub = await listener.nc.subscribe(listener.wire(subject), cb=on_msg)
    await listener.nc.flush()
    if settle_s:
        await asyncio.sleep(settle_s)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    try:
        # Published again every REPUBLISH_S until it arrives: right after a new subscription, nats-server
        # 2.15.1 with nats-py 2.16 drops about 1 core message in 100-200 on this machine even after
        # the subscriber's flush (measured: lost, not late). A refused publish stays refused however
        # often it is sent, so repeating it only makes a negative probe stricter.
        while True:
            await speaker.nc.publish(speaker.wire(subject), b"{}")
            await speaker.nc.flush()
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(got.get(), min(REPUBLISH_S, left))
                return True
            except TimeoutError:
                continue
    finally:
        if not listener.nc.is_closed:
            await sub.unsubscribe()
