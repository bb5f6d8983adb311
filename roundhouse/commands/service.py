"""`roundhouse service KIND [flags]`: run one Roundhouse service in the foreground.

The flags are derived from the service's settings model by :mod:`services.runtime.entry`, which
``python -m services.KIND`` uses too. The service class is imported only for the kind being run, so
`roundhouse --help` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from services.runtime import entry
from services.runtime.service import RoundhouseService

SERVICE_CLASSES: dict[str, str] = {
    "admission": "services.admission.service:AdmissionService",
    "scheduler": "services.scheduler.service:SchedulerService",
    "placement": "services.placement.service:PlacementService",
    "metrics": "services.metrics.service:MetricsService",
    "worker": "services.worker.service:WorkerService",
}


class UnknownServiceError(LookupError):
    def __init__(self, kind: str) -> None:
        super().__init__(f"unknown service {kind!r}; valid: {', '.join(sorted(SERVICE_CLASSES))}")


def service_class(kind: str) -> type[RoundhouseService]:
    try:
        target = SERVICE_CLASSES[kind]
    except KeyError:
        raise UnknownServiceError(kind) from None
    module_name, _, class_name = target.partition(":")
    cls = getattr(import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, RoundhouseService)):
        raise TypeError(f"{target} is not a RoundhouseService")
    return cls


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "service",
        help="run one service (admission, scheduler, placement, metrics, worker)",
        description="Run one Roundhouse service; `roundhouse service KIND --help` lists its flags.",
        add_help=False,
    )
    parser.add_argument("kind", nargs="?", metavar="KIND", help=", ".join(SERVICE_CLASSES))
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.kind is None or args.kind in ("-h", "--help"):
        print("usage: roundhouse service KIND [flags]   (KIND: " + ", ".join(SERVICE_CLASSES) + ")")
        print("       roundhouse service KIND --help    lists the flags of that service")
        return 0 if args.kind else 2
    try:
        cls = service_class(args.kind)
    except UnknownServiceError as exc:
        print(f"roundhouse service: {exc}", file=sys.stderr)
        return 2
    return entry.main(args.kind, cls, args.rest)
