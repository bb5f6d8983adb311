"""Flags and helpers shared by the commands that talk to a running Roundhouse."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from roundhouse.client import Client
from roundhouse.endpoint import resolve

T = TypeVar("T")


def add_endpoint_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats", help="NATS URL(s), comma-separated (default: $ROUNDHOUSE_NATS, else ./.roundhouse/up.json)"
    )
    parser.add_argument("--namespace", help="Roundhouse namespace on that NATS (default: as for --nats)")


def with_client(args: argparse.Namespace, work: Callable[[Client], Awaitable[T]]) -> T:
    """Connect as the flags say, run ``work``, disconnect."""
    endpoint = resolve(args.nats, args.namespace)
    # The bus logs each failed connection attempt (useful in a service's log); a command reports
    # the outcome once, in its own words.
    logging.getLogger("roundhouse.bus").setLevel(logging.ERROR)

    async def main() -> T:
        client = await Client.connect(endpoint.nats, namespace=endpoint.namespace)
        try:
            return await work(client)
        finally:
            await client.close()

    return asyncio.run(main())
