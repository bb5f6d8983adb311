"""`roundhouse dashboard`: serve the read-only web dashboard of a running Roundhouse.

Visitors sign in with HTTP Basic as their own bus identity (user name: the identity, or
``ROLE/IDENTITY``; password: their credentials file's nkey seed): the dashboard opens a bus
connection with those credentials, so each sees what ``roundhouse jobs`` shows them. Without
``--insecure`` nothing is served to a visitor who did not sign in (401). Binds 127.0.0.1 unless told.

aiohttp and the dashboard's modules are imported when the command runs, not when the CLI starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from roundhouse.commands.common import add_endpoint_flags


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0-65535 (0: any free one), not {port}")
    return port


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dashboard", help="serve the read-only web dashboard (queue, jobs, nodes, policies)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this host only)")
    parser.add_argument("--port", type=_port, default=8787, help="port to bind (default: 8787; 0: any free port)")
    parser.add_argument("--state-dir", type=Path, default=Path(".roundhouse"),
                        help="where `roundhouse up` runs: its up.json lists the services' /metrics "
                             "(nodes, policies) (default: ./.roundhouse)")  # fmt: skip
    parser.add_argument("--refresh-s", type=_positive, default=5.0, help="page refresh period (default: 5)")
    parser.add_argument("--sample-s", type=_positive, default=5.0,
                        help="seconds between samples of the charts over time (default: 5)")  # fmt: skip
    parser.add_argument("--idle-s", type=_positive, default=300.0,
                        help="close a visitor's bus connection this long after their last request (default: 300)")
    parser.add_argument("--url-file", type=Path, help="write the URL served here once listening (for `up`)")
    parser.add_argument(
        "--insecure", action="store_true",
        help="serve without authentication, as this command's own identity (--creds): for an --insecure cluster",
    )  # fmt: skip
    add_endpoint_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from roundhouse.client import Client
    from roundhouse.dashboard import DashboardConfig, SnapshotSource, serve
    from roundhouse.endpoint import NoClusterError, resolve
    from services.runtime.auth.creds import Credentials, CredentialsError, read_creds

    try:
        endpoint = resolve(args.nats, args.namespace, creds=args.creds, state_dir=args.state_dir)
    except NoClusterError as exc:
        print(f"roundhouse dashboard: {exc}", file=sys.stderr)
        return 2
    own: Credentials | None = None
    if args.insecure and endpoint.creds is not None:
        try:
            own = read_creds(endpoint.creds)
        except CredentialsError as exc:
            print(f"roundhouse dashboard: {exc}", file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("roundhouse.bus").setLevel(logging.ERROR)  # a refused sign-in is the dashboard's to log
    config = DashboardConfig(host=args.host, port=args.port, insecure=args.insecure, refresh_s=args.refresh_s,
                             sample_s=args.sample_s, idle_s=args.idle_s, cluster=endpoint.namespace,
                             url_file=args.url_file)  # fmt: skip

    async def connect(credentials: Credentials | None) -> Client:
        # A visitor's own credentials; with --insecure, this command's (the visitor gives none).
        return await Client.connect(endpoint.nats, namespace=endpoint.namespace, name="roundhouse-dashboard",
                                    creds=credentials if not args.insecure else own)  # fmt: skip

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, connect, SnapshotSource(state_dir=args.state_dir.resolve()), stop)

    try:
        asyncio.run(main())
    except OSError as exc:  # the address is in use, or cannot be bound
        print(f"roundhouse dashboard: cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0
