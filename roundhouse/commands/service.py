"""`roundhouse service KIND [flags]`: run one Roundhouse service in the foreground.

The flags are derived from the service's settings model (``config_model``): every field ``round_s``
becomes ``--round-s``, booleans get ``--x/--no-x``, dicts and lists take JSON. Values merge as
defaults < ``--config FILE`` < ``ROUNDHOUSE_<FIELD>`` environment variables < flags. The service
class is imported only for the kind being run, so `roundhouse --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from importlib import import_module
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from services.runtime.config import ConfigError, ServiceConfig, load_config
from services.runtime.service import RoundhouseService, start_service_process

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


def _is_bool(info: FieldInfo) -> bool:
    return info.annotation is bool


def _is_structured(info: FieldInfo) -> bool:
    origin = typing.get_origin(info.annotation)
    return origin in (dict, list, tuple) or info.annotation in (dict, list, tuple)


def build_parser(kind: str, model: type[ServiceConfig]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"roundhouse service {kind}", description=f"Run the {kind} service.")
    parser.add_argument("--config", type=Path, help="YAML or JSON settings file")
    for name, info in model.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = info.get_default(call_default_factory=True)
        help_text = f"{info.description or ''} (default: {default!r})".strip()
        if _is_bool(info):
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(),
                                help=help_text + (" [JSON]" if _is_structured(info) else ""))
    return parser


def parse_flags(model: type[ServiceConfig], args: argparse.Namespace) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        if _is_structured(info) and isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ConfigError(f"--{name.replace('_', '-')} must be JSON: {exc}") from exc
        flags[name] = value
    return flags


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
    model = cls.config_model
    parsed = build_parser(args.kind, model).parse_args(args.rest)
    try:
        config = load_config(model, file=parsed.config, flags=parse_flags(model, parsed))
    except ConfigError as exc:
        print(f"roundhouse service {args.kind}: {exc}", file=sys.stderr)
        return 2
    return start_service_process(cls(config))
