"""`roundhouse up`: the bundled NATS server, the five services and local workers, in the foreground.

State lives in ``./.roundhouse/`` (broker data, the scheduler's SQLite database, job checkpoints,
logs). ``roundhouse submit``, ``jobs`` and ``cancel`` find the running cluster through
``./.roundhouse/up.json``, which also names the credentials they connect with: the broker requires
authentication and enforces each role's permissions, and ``up`` generates every identity into
``./.roundhouse/auth/`` (``--insecure`` runs an open broker instead). Ctrl-C (or SIGTERM) stops
everything cleanly: workers first, so running jobs checkpoint, then the services, then the broker.

Run ``up`` again in the same directory and it goes on where it stopped: the same namespace (recorded
in ``cluster.json``), the same credentials, the scheduler's jobs and the broker's streams. One ``up``
per state directory: a second one there refuses and names the first's pid (after a crash, the next ``up`` stops what the
crashed one left running). Each policy service takes
its own options (``--scheduler-options`` and so on, JSON objects as ``roundhouse simulate`` takes
them); policy names and options are checked before anything starts.

It also serves the read-only web dashboard (``roundhouse dashboard``) on 127.0.0.1 (``--dashboard-port``,
a free port by default; ``--no-dashboard`` leaves it out): its URL is printed and recorded in ``up.json``
as ``dashboard_url``. Visitors sign in as their own identity (docs/operations.md, "Dashboard").
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from roundhouse.commands.dashboard import _port as port_number
from roundhouse.commands.simulate import _options as policy_options
from roundhouse.local import (
    POLICY_REGISTRIES,
    LocalCluster,
    LocalClusterConfig,
    LocalClusterError,
    check_policies,
    detect_gpus,
)
from schemas.roles import Role, validate_identity
from services.core.registry import PolicyPackageError

_POLICY_HELP = {"scheduler": "scheduling", "admission": "admission", "placement": "placement"}
_OPTION_EXAMPLES = {
    "scheduler": "'{\"starvation_s\": 3600}' for las",
    "admission": "'{\"max_jobs\": 4}' for user-quota",
    "placement": "'{}'",
}


def _valid_names(kind: str) -> str:
    try:
        return ", ".join(POLICY_REGISTRIES[kind].names())
    except PolicyPackageError as exc:
        return f"(cannot list: {exc})"


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends each option's default, unless its help says it already or it is an off switch."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, ""):
            return text
        return super()._get_help_string(action)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up", help="run broker, services and local workers (Ctrl-C stops)", description=__doc__,
        formatter_class=_HelpFormatter,
    )  # fmt: skip
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".roundhouse"),
        help="broker data, the scheduler's database, credentials, logs; one `up` at a time",
    )
    parser.add_argument("--workers", type=int, default=2, help="local workers")
    parser.add_argument("--gpus-per-worker", type=int, default=4, help="fake GPUs per worker")
    parser.add_argument("--fake-gpus", action="store_true", help="use fake GPUs even if NVML finds real ones")
    policies = parser.add_argument_group("policies (checked before anything starts)")
    for kind, default in (("scheduler", "las"), ("placement", "consolidated"), ("admission", "accept-all")):
        policies.add_argument(
            f"--{kind}",
            default=default,
            metavar="NAME",
            help=f"{_POLICY_HELP[kind]} policy, one of: {_valid_names(kind)}",
        )
    for kind in ("scheduler", "placement", "admission"):
        policies.add_argument(f"--{kind}-options", type=policy_options, default={}, metavar="JSON",
                              help=f"keyword options of the {_POLICY_HELP[kind]} policy, for the {kind} "
                                   f"service only (as `roundhouse simulate` takes them), e.g. "
                                   f"{_OPTION_EXAMPLES[kind]}")  # fmt: skip
    parser.add_argument("--round", type=float, default=30.0, dest="round_s", help="round length in seconds")
    parser.add_argument("--packing", action="store_true",
                        help="let several jobs share a GPU where the placement packs them (gandiva with "
                             "profiles; docs/scheduler.md, Packing)")  # fmt: skip
    parser.add_argument("--emulate", action="store_true", help="emulate job progress instead of running jobs")
    parser.add_argument("--speedup", type=float, default=1.0, help="with --emulate: clock speed-up factor")
    parser.add_argument("--namespace", default="",
                        help="namespace on the broker (default: the one recorded in --state-dir by an earlier "
                             "run, else a fresh one; another than the recorded one is refused)")  # fmt: skip
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="services' log level"
    )
    parser.add_argument(
        "--insecure", action="store_true",
        help="no authentication: anyone who can reach the NATS port may do anything (never on a shared host)",
    )  # fmt: skip
    parser.add_argument(
        "--dashboard-port",
        type=port_number,
        default=0,
        help="the web dashboard's port on 127.0.0.1 (default: 0, a free one; printed)",
    )
    parser.add_argument("--no-dashboard", action="store_true", help="do not serve the web dashboard")
    parser.add_argument("--user", help="the user identity commands run here act as (default: your login name)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.speedup <= 0:
        print("roundhouse up: --speedup must be > 0", file=sys.stderr)
        return 2
    if args.user is not None:
        try:
            validate_identity(Role.USER, args.user)
        except ValueError as exc:
            print(f"roundhouse up: --user: {exc}", file=sys.stderr)
            return 2
    real = not args.fake_gpus and not args.emulate and detect_gpus() > 0
    placement_options = args.placement_options
    if args.packing:  # as `simulate --packing`: gandiva packs with the packing model's profiles unless given some
        from roundhouse.sim.case import packing_options
        from services.core.packing import PackingModel

        placement_options = packing_options(args.placement, placement_options, PackingModel())
    config = LocalClusterConfig(
        state_dir=args.state_dir, workers=args.workers, gpus_per_worker=args.gpus_per_worker, real_gpus=real,
        scheduler=args.scheduler, placement=args.placement, admission=args.admission,
        scheduler_options=args.scheduler_options, placement_options=placement_options,
        admission_options=args.admission_options, round_s=args.round_s, packing=args.packing, emulate=args.emulate,
        speedup=args.speedup,
        namespace=args.namespace, log_level=args.log_level,
        auth=not args.insecure, user=args.user, dashboard=not args.no_dashboard, dashboard_port=args.dashboard_port,
    )  # fmt: skip
    try:
        check_policies(config)
    except LocalClusterError as exc:
        print(f"roundhouse up: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = LocalCluster(config)
    try:
        endpoint = cluster.start()  # nothing is left running when it raises
    except LocalClusterError as exc:
        print(f"roundhouse up: {exc}", file=sys.stderr)
        return 1
    code = 0
    try:
        cluster.wait_ready()
        gpus = "the GPUs NVML found" if real else f"{args.workers} workers x {args.gpus_per_worker} fake GPUs"
        reused = " (reused from the state directory)" if cluster.namespace_reused else ""
        print(
            f"roundhouse up: NATS {endpoint.nats} namespace {endpoint.namespace}{reused}; {gpus}; "
            f"logs in {cluster.state_dir / 'logs'}",
            flush=True,
        )
        if cluster.metrics_urls:
            print(f"  Prometheus /metrics on 127.0.0.1 (recorded in {cluster.state_dir / 'up.json'}, "
                  "metrics_urls):", flush=True)  # fmt: skip
            for name, url in cluster.metrics_urls.items():
                print(f"    {name:<10} {url}", flush=True)
        if cluster.dashboard_url:
            sign_in = "" if cluster.auth is None else " (sign in: your identity, and the seed of its credentials file)"
            print(f"  dashboard  {cluster.dashboard_url}{sign_in}", flush=True)
        if cluster.auth is not None:
            print(f"  credentials in {cluster.auth.root}; commands here connect as {cluster.user or 'operator'} "
                  f"({cluster.user_creds})", flush=True)  # fmt: skip
        else:
            print("  WARNING: --insecure: no authentication, anyone who reaches the port controls every node",
                  flush=True)  # fmt: skip
        print("  try: roundhouse submit --gpus 1 -- python examples/train_mlp.py   (Ctrl-C stops)", flush=True)
        while not stop.wait(0.5):
            cluster.check()
    except LocalClusterError as exc:
        print(f"roundhouse up: {exc}", file=sys.stderr)
        code = 1
    finally:
        print("roundhouse up: stopping (workers, services, broker)...", flush=True)
        cluster.stop()
    return code
