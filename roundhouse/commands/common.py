"""Flags and helpers shared by the commands that talk to a running Roundhouse (light to import:
what talking needs is imported by :func:`with_client` when it runs)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from roundhouse.commands import BY_NAME

if TYPE_CHECKING:
    from roundhouse.client import Client

T = TypeVar("T")


class CommandFailed(Exception):
    """Ends a command with ``message`` on stderr and exit ``code``, whichever command it is (``cli.main``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def rough_duration(seconds: float, *, second_digits: int = 0) -> str:
    """A duration as a table shows it, in its largest unit: ``3d``, ``2h``, ``5m``, ``42s`` (``4.2s``
    with ``second_digits=1``)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.{second_digits}f}s"


def add_endpoint_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats", help="NATS URL(s), comma-separated (default: $ROUNDHOUSE_NATS, else ./.roundhouse/up.json)"
    )
    parser.add_argument("--namespace", help="Roundhouse namespace on that NATS (default: as for --nats)")
    parser.add_argument(
        "--creds", type=Path,
        help="credentials file to connect with (default: $ROUNDHOUSE_CREDS, else the one ./.roundhouse/up.json names)",
    )  # fmt: skip


@contextmanager
def cluster_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str,
    handler: Callable[[argparse.Namespace], int], description: str | None, **defaults: object,
) -> Iterator[argparse.ArgumentParser]:  # fmt: skip
    """The parser of a command that talks to a running Roundhouse: the body adds the command's own
    arguments, then the endpoint flags follow them and ``handler`` (with ``defaults``) is set. The
    one-line help is the one :data:`roundhouse.commands.COMMANDS` lists, so it is written once."""
    parser = subparsers.add_parser(name, help=BY_NAME[name].help, description=description)
    yield parser
    add_endpoint_flags(parser)
    parser.set_defaults(handler=handler, **defaults)


def command_name(args: argparse.Namespace) -> str:
    """``roundhouse CMD``, the prefix of every message a command prints about itself."""
    return f"roundhouse {getattr(args, 'command', '') or ''}".rstrip()


def ask_cluster(
    args: argparse.Namespace, work: Callable[[Client], Awaitable[T]], *, nobody_answers: str,
    too_slow: str | None = None,
) -> T:  # fmt: skip
    """:func:`with_client`, with the failures every command that asks the cluster reports alike turned
    into :class:`CommandFailed` (``roundhouse CMD: ...``):

    - nothing answers the request (``NoResponderError``): ``nobody_answers``, which says what the
      command asked (e.g. which subject nothing serves); no answer in time (``TimeoutError``):
      ``too_slow``, by default the same words; exit code 1;
    - an error as the answer (``BusError``): ``the scheduler failed to answer: ...``; exit code 1;
    - NATS cannot be reached (``OSError``): ``cannot reach NATS: ...``; exit code 1;
    - a value the schemas reject (``ValidationError``): the field and why; exit code 2;
    - Ctrl-C: exit code 130, without a traceback.

    Failures particular to a command are ``work``'s to raise as :class:`CommandFailed` (which passes
    through), or the caller's to catch (anything else passes through too)."""
    from pydantic import ValidationError

    from services.runtime.bus import BusError, NoResponderError

    command = command_name(args)
    try:
        return with_client(args, work)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise CommandFailed(f"{command}: {error['loc'][-1]}: {error['msg']}", 2) from None
    except NoResponderError:
        raise CommandFailed(f"{command}: {nobody_answers}") from None
    except TimeoutError:
        raise CommandFailed(f"{command}: {too_slow or nobody_answers}") from None
    except BusError as exc:
        raise CommandFailed(f"{command}: the scheduler failed to answer: {exc}") from None
    except OSError as exc:
        raise CommandFailed(f"{command}: cannot reach NATS: {exc}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


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
    command = command_name(args)
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
