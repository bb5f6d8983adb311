"""`roundhouse cancel ID...`: ask the scheduler to stop jobs (running ones checkpoint first)."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from roundhouse.client import Client
from roundhouse.commands.common import add_endpoint_flags, with_client


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cancel", help="cancel jobs")
    parser.add_argument("job_ids", nargs="+", metavar="ID")
    parser.add_argument("--reason", help="recorded with the cancellation")
    add_endpoint_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    async def cancel(client: Client) -> None:
        for job_id in args.job_ids:
            await client.cancel(job_id, reason=args.reason)

    try:
        with_client(args, cancel)
    except ValidationError as exc:
        print(f"roundhouse cancel: {exc.errors()[0]['loc'][-1]}: {exc.errors()[0]['msg']}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"roundhouse cancel: cannot reach NATS: {exc}", file=sys.stderr)
        return 1
    for job_id in args.job_ids:
        print(f"{job_id} cancel requested")
    return 0
