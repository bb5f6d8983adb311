"""``python -m services.worker [--flag value ...]``: run a worker agent (``roundhouse service worker``'s flags)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from services.runtime.config import load_config
from services.runtime.service import start_service_process
from services.worker.config import WorkerConfig
from services.worker.service import WorkerService


def parse(argv: list[str]) -> WorkerConfig:
    parser = argparse.ArgumentParser(prog="python -m services.worker", description="Run a Roundhouse worker agent.")
    parser.add_argument("--config", type=Path)
    for name, info in WorkerConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if info.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None)
        elif name != "policy_options":
            parser.add_argument(flag, dest=name, default=None, help=info.description)
    args = vars(parser.parse_args(argv))
    file = args.pop("config")
    flags: dict[str, Any] = {k: v for k, v in args.items() if v is not None}
    return load_config(WorkerConfig, file=file, flags=flags)


if __name__ == "__main__":
    sys.exit(start_service_process(WorkerService(parse(sys.argv[1:]))))
