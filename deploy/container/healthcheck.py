#!/usr/bin/env python3
"""Health check of one Roundhouse service process, through the NATS services API (``$SRV.PING``).

    roundhouse-healthcheck KIND          # KIND: admission, scheduler, placement, metrics, worker

The image's HEALTHCHECK and the Kubernetes probes run this in the service's own container. It
connects as the container's identity (``ROUNDHOUSE_CREDS`` or ``--creds``, TLS through
``SSL_CERT_FILE``) to ``ROUNDHOUSE_NATS``, pings ``roundhouse-KIND`` and is healthy only if the
instance in *this* container answers: ``metadata.instance`` equal to ``ROUNDHOUSE_INSTANCE`` when set,
else starting with this host name (a service's default instance is ``<hostname>-<pid>``, and a
container's or pod's host name is its own). Another replica answering does not count, and neither
does another namespace's service of the same kind.

Exit status: 0 healthy; 1 unhealthy (the reason on stderr); 2 misconfigured (no credentials, bad
kind). ``--connect-only-if-refused``: where the broker refuses the ping to this identity (a role table
without the services-API publish permission for the service's own kind, see docs/deploy.md "Health
checks"), accept an authenticated connection instead and say so on stdout, rather than fail a service
that is running. The check never prints the seed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
from pathlib import Path

KINDS = ("admission", "scheduler", "placement", "metrics", "worker")
EXIT_HEALTHY, EXIT_UNHEALTHY, EXIT_MISCONFIGURED = 0, 1, 2


def matches(metadata: dict[str, str], *, instance: str | None, host: str, namespace: str) -> bool:
    """Whether a ping answer's metadata is this container's process (of this namespace)."""
    if metadata.get("namespace", "") != namespace:
        return False
    found = metadata.get("instance", "")
    return found == instance if instance else found.startswith(f"{host}-")


async def check(
    kind: str,
    *,
    servers: list[str],
    creds_path: Path,
    namespace: str,
    instance: str | None,
    timeout_s: float,
    connect_only_if_refused: bool,
) -> tuple[int, str]:
    import nats
    import nats.errors

    from schemas.roles import inbox_prefix
    from services.runtime.auth import CredentialsError, read_creds

    try:
        creds = read_creds(creds_path)
    except CredentialsError as exc:
        return EXIT_MISCONFIGURED, f"cannot use {creds_path}: {exc}"
    refused: list[str] = []

    async def on_error(exc: Exception) -> None:
        if "permissions violation" in str(exc).lower():
            refused.append(str(exc))

    try:
        nc = await nats.connect(
            servers, name=f"roundhouse-healthcheck-{kind}", allow_reconnect=False, connect_timeout=timeout_s,
            max_reconnect_attempts=0, error_cb=on_error, nkeys_seed_str=creds.seed,
            inbox_prefix=inbox_prefix(creds.role, creds.identity),
        )  # fmt: skip
    except Exception as exc:
        return EXIT_UNHEALTHY, f"cannot connect to {','.join(servers)} as {creds.identity}: {exc!r}"
    host = socket.gethostname()
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(f"$SRV.PING.roundhouse-{kind}", b"", reply=inbox)
        await nc.flush(timeout=max(1, round(timeout_s)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        seen: list[str] = []
        while (left := deadline - loop.time()) > 0 and not refused:
            try:
                msg = await sub.next_msg(timeout=min(left, 0.1))
            except nats.errors.TimeoutError:
                continue
            if not msg.data:  # "no responders": nobody of this kind is subscribed
                continue
            metadata = json.loads(msg.data).get("metadata") or {}
            if matches(metadata, instance=instance, host=host, namespace=namespace):
                return EXIT_HEALTHY, f"roundhouse-{kind} {metadata.get('instance')} answers"
            seen.append(str(metadata.get("instance")))
        if refused:
            if connect_only_if_refused:
                return EXIT_HEALTHY, (
                    f"connected as {creds.role.value} {creds.identity}; the broker refuses this identity the "
                    f"services-API ping ({refused[0]}), so only the authenticated connection was checked"
                )
            return EXIT_UNHEALTHY, f"the broker refuses the ping to {creds.identity}: {refused[0]}"
        who = f"instance {instance}" if instance else f"an instance of host {host}"
        others = f" (answered: {', '.join(seen)})" if seen else ""
        return (
            EXIT_UNHEALTHY,
            f"no answer from roundhouse-{kind} {who} in namespace {namespace!r} within {timeout_s} s{others}",
        )
    finally:
        await nc.close()


SETTINGS = ("creds", "nats", "namespace", "instance")


def service_settings(cmdline: list[str], environ: dict[str, str]) -> tuple[str | None, dict[str, str]]:
    """The kind and connection settings of the service started as ``cmdline`` (``roundhouse service KIND
    ...`` or ``python -m services.KIND ...``), in the services' own precedence: ROUNDHOUSE_* environment
    < its ``--config`` file < its flags."""
    import yaml

    kind = None
    for index, word in enumerate(cmdline):
        if word == "service" and index + 1 < len(cmdline) and cmdline[index + 1] in KINDS:
            kind = cmdline[index + 1]
        elif word.startswith("services.") and word.split(".", 1)[1] in KINDS:
            kind = word.split(".", 1)[1]
    flags: dict[str, str] = {}
    words = iter(cmdline)
    for word in words:
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            flags[name.replace("-", "_")] = value if eq else next(words, "")
    settings = {
        name: environ[f"ROUNDHOUSE_{name.upper()}"] for name in SETTINGS if f"ROUNDHOUSE_{name.upper()}" in environ
    }
    if flags.get("config"):
        try:
            data = yaml.safe_load(Path(flags["config"]).read_text()) or {}
        except (OSError, yaml.YAMLError):
            data = {}
        if isinstance(data, dict):
            data = {str(k).replace("-", "_"): v for k, v in data.items()}
            settings.update({name: str(data[name]) for name in SETTINGS if data.get(name) is not None})
    settings.update({name: flags[name] for name in SETTINGS if flags.get(name)})
    return kind, settings


def pid1_cmdline() -> list[str]:
    try:
        return [w.decode() for w in Path("/proc/1/cmdline").read_bytes().split(b"\0") if w]
    except OSError:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="roundhouse-healthcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "kind", nargs="?", choices=KINDS, help="default: the kind of the service this container runs (its process 1)"
    )
    parser.add_argument("--creds", help="this container's creds file (default: the service's)")
    parser.add_argument("--nats")
    parser.add_argument("--namespace")
    parser.add_argument("--instance")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    parser.add_argument("--connect-only-if-refused", action="store_true")
    args = parser.parse_args(argv)
    # What process 1 runs with, where this runs beside it (HEALTHCHECK, an exec probe), then our flags.
    kind, settings = service_settings(pid1_cmdline(), dict(os.environ))
    kind = args.kind or kind
    settings.update({name: getattr(args, name) for name in SETTINGS if getattr(args, name)})
    if kind is None:
        print("roundhouse-healthcheck: which service? (KIND, or run beside `roundhouse service KIND`)", file=sys.stderr)
        return EXIT_MISCONFIGURED
    if not settings.get("creds"):
        print("roundhouse-healthcheck: no credentials (--creds, ROUNDHOUSE_CREDS or the service's)", file=sys.stderr)
        return EXIT_MISCONFIGURED
    servers = [s.strip() for s in settings.get("nats", "nats://127.0.0.1:4222").split(",") if s.strip()]
    code, why = asyncio.run(check(
        kind, servers=servers, creds_path=Path(settings["creds"]), namespace=settings.get("namespace", ""),
        instance=settings.get("instance") or None, timeout_s=args.timeout_s,
        connect_only_if_refused=args.connect_only_if_refused,
    ))  # fmt: skip
    print(f"roundhouse-healthcheck: {why}", file=sys.stdout if code == EXIT_HEALTHY else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
