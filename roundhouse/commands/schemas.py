"""`roundhouse schemas`: print the JSON Schema of every wire model (placeholder until schemas land)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from schemas.job import JobSpec


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("schemas", help="print the JSON Schema of each event")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    schemas: dict[str, Any] = {"JobSpec": JobSpec.model_json_schema()}
    print(json.dumps(schemas, indent=2, sort_keys=True))
    return 0
