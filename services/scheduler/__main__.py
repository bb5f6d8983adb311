"""``python -m services.scheduler [--policy las] [--round-s 2] [--nats URL] [--db DIR] ...``

Runs one scheduler replica in this process (child-process tests use it; ``roundhouse service
scheduler`` is the user-facing way). Flags are derived from ``SchedulerConfig``'s scalar fields.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.runtime.config import ConfigError, load_config
from services.runtime.service import start_service_process
from services.scheduler.config import SchedulerConfig


def parse(argv: list[str]) -> SchedulerConfig:
    parser = argparse.ArgumentParser(prog="python -m services.scheduler", description=__doc__)
    parser.add_argument("--config", type=Path, default=None, help="YAML or JSON settings file.")
    for name, info in SchedulerConfig.model_fields.items():
        if name == "operators":  # a JSON list or comma-separated names (SchedulerConfig._names)
            parser.add_argument("--operators", dest=name, type=str, default=None, help=info.description)
        elif info.annotation in (str, int, float, str | None):
            kind: type[str] | type[int] | type[float] = (
                int if info.annotation is int else float if info.annotation is float else str
            )
            parser.add_argument(
                f"--{name.replace('_', '-')}", dest=name, type=kind, default=None, help=info.description
            )
    args = vars(parser.parse_args(argv))
    file = args.pop("config")
    return load_config(SchedulerConfig, file=file, flags=args)


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from services.scheduler.service import SchedulerService

    return start_service_process(SchedulerService(config))


if __name__ == "__main__":
    sys.exit(main())
