"""Flags and helpers shared by the commands that talk to a running Roundhouse (light to import:
what talking needs is imported by :func:`with_client` when it runs)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from roundhouse.client import Client

T = TypeVar("T")


class CommandFailed(Exception):
    """Ends a command with ``message`` on stderr and exit ``code``, whichever command it is (``cli.main``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def add_endpoint_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats", help="NATS URL(s), comma-separated (default: $ROUNDHOUSE_NATS, else ./.roundhouse/up.json)"
    )
    parser.add_argument("--namespace", help="Roundhouse namespace on that NATS (default: as for --nats)")
    parser.add_argument(
        "--creds", type=Path,
        help="credentials file to connect with (default: $ROUNDHOUSE_CREDS, else the one ./.roundhouse/up.json names)",
    )  # fmt: skip


def with_client(args: argparse.Namespace, work: Callable[[Client], Awaitable[T]]) -> T:
    """Connect as the flags say, run ``work``, disconnect.

    Credentials that cannot be used, or that the broker refuses, end the command with the reason
    (:class:`CommandFailed`: exit code 2 for a bad file, 1 for a refusal), whatever the command.

    The client, NATS and the schemas are imported here, when a command talks to a cluster, not when
    the CLI starts."""
    import asyncio
    import logging

    from roundhouse.client import Client
    from roundhouse.endpoint import resolve
    from services.runtime.auth.creds import CredentialsError, read_creds
    from services.runtime.bus import AuthenticationError

    endpoint = resolve(args.nats, args.namespace, creds=getattr(args, "creds", None))
    command = f"roundhouse {getattr(args, 'command', '') or ''}".rstrip()
    # The bus logs each failed connection attempt (useful in a service's log); a command reports
    # the outcome once, in its own words.
    logging.getLogger("roundhouse.bus").setLevel(logging.ERROR)
    try:
        creds = read_creds(endpoint.creds) if endpoint.creds is not None else None
    except CredentialsError as exc:
        raise CommandFailed(f"{command}: {exc}", 2) from None

    async def main() -> T:
        client = await Client.connect(endpoint.nats, namespace=endpoint.namespace, creds=creds)
        try:
            return await work(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except AuthenticationError as exc:
        raise CommandFailed(f"{command}: {exc}", 1) from None
