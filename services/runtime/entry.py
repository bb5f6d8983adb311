"""The command line of one service: flags derived from its settings model, then run it.

Every service is started the same way, whether by ``roundhouse service KIND`` or by
``python -m services.KIND``: every field ``round_s`` of the service's ``config_model`` becomes
``--round-s``, booleans get ``--x/--no-x``, dicts and lists take JSON. Values merge as defaults <
``--config FILE`` < ``ROUNDHOUSE_<FIELD>`` environment variables < flags. The caller passes the
service class, so this module knows no service.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from services.runtime.config import ConfigError, ServiceConfig, load_config
from services.runtime.service import RoundhouseService, start_service_process

__all__ = ["build_parser", "main", "parse_flags"]


def _is_bool(info: FieldInfo) -> bool:
    return info.annotation is bool


def _is_structured(info: FieldInfo) -> bool:
    origin = typing.get_origin(info.annotation)
    return origin in (dict, list, tuple) or info.annotation in (dict, list, tuple)


def build_parser(kind: str, model: type[ServiceConfig]) -> argparse.ArgumentParser:
    """One flag per field of ``model``; a flag not given parses as None (left to file and environment)."""
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
    """The flags that were given, with JSON ones decoded; raises ``ConfigError`` on bad JSON."""
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


def main(kind: str, cls: type[RoundhouseService], argv: Sequence[str]) -> int:
    """Parse ``argv`` for the service ``cls`` (named ``kind`` in messages), run it, return the exit code."""
    model = cls.config_model
    parsed = build_parser(kind, model).parse_args(list(argv))
    try:
        config = load_config(model, file=parsed.config, flags=parse_flags(model, parsed))
    except ConfigError as exc:
        print(f"roundhouse service {kind}: {exc}", file=sys.stderr)
        return 2
    return start_service_process(cls(config))
