"""`roundhouse schemas`: print the JSON Schema of every wire model, for docs and non-Python publishers.

Without options it prints one JSON document::

    {"schema_version": 1,
     "subjects": {"job.arrived.*": {"model": "JobArrived", "durable": true, ...}, ...},
     "models":   {"JobArrived": {<JSON Schema, draft 2020-12>}, ...}}

``--list`` prints the subject table, ``--model NAME`` one model's schema (NAME may also be a subject,
e.g. ``lease.grant.node-1``), ``--example NAME`` a valid example payload, and ``--out DIR`` writes
one ``<Model>.schema.json`` per model plus ``subjects.json`` for code generators.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from schemas.base import SCHEMA_VERSION, WireModel
from schemas.codec import encode
from schemas.examples import example
from schemas.job import JobSpec
from schemas.subjects import SUBJECTS, UnknownSubjectError, spec_for

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "schemas",
        help="print the JSON Schema of each event",
        description="Print the JSON Schema of every message model and the subject each one uses.",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--list", action="store_true", help="print the subject table (subject, model, durable)"
    )
    group.add_argument(
        "--model", metavar="NAME", help="print one model's JSON Schema (a model name or subject)"
    )
    group.add_argument("--example", metavar="NAME", help="print a valid example payload of a model")
    group.add_argument(
        "--out", metavar="DIR", type=Path, help="write <Model>.schema.json files and subjects.json"
    )
    parser.set_defaults(handler=run)


def models() -> dict[str, type[WireModel]]:
    """Every top-level wire model by name: each subject's model and reply model, and JobSpec."""
    found: dict[str, type[WireModel]] = {}
    for spec in SUBJECTS:
        found[spec.model.__name__] = spec.model
        if spec.reply_model is not None:
            found[spec.reply_model.__name__] = spec.reply_model
    found[JobSpec.__name__] = JobSpec
    return found


def json_schema(model: type[WireModel]) -> dict[str, Any]:
    """``model``'s JSON Schema (validation mode: what a publisher must send), with its dialect."""
    return {"$schema": JSON_SCHEMA_DIALECT, **model.model_json_schema()}


def subject_table() -> dict[str, dict[str, Any]]:
    return {
        spec.pattern: {
            "model": spec.model.__name__,
            "durable": spec.durable,
            "reply_model": spec.reply_model.__name__ if spec.reply_model is not None else None,
            "direction": spec.direction,
            "description": spec.description,
            "token_field": spec.token_field,
        }
        for spec in SUBJECTS
    }


def document() -> dict[str, Any]:
    """Everything ``roundhouse schemas`` prints: the subject table and every model's schema."""
    return {
        "schema_version": SCHEMA_VERSION,
        "subjects": subject_table(),
        "models": {name: json_schema(model) for name, model in sorted(models().items())},
    }


class UnknownModelError(LookupError):
    """A ``--model``/``--example`` name that is neither a model nor a subject."""


def resolve(name: str) -> type[WireModel]:
    """A model by name (``JobArrived``) or by a subject it travels on (``lease.grant.node-1``)."""
    known = models()
    if name in known:
        return known[name]
    if "." in name:
        try:
            return spec_for(name).model
        except UnknownSubjectError as exc:
            raise UnknownModelError(str(exc)) from None
    raise UnknownModelError(f"no model named {name!r}; known models: {', '.join(sorted(known))}")


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)


def _print_list() -> None:
    rows = [("SUBJECT", "MODEL", "STORAGE", "REPLY", "DIRECTION")]
    for spec in SUBJECTS:
        reply = spec.reply_model.__name__ if spec.reply_model is not None else "-"
        rows.append(
            (
                spec.pattern,
                spec.model.__name__,
                "jetstream" if spec.durable else "core",
                reply,
                spec.direction,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])


def _write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, model in sorted(models().items()):
        (out / f"{name}.schema.json").write_text(_dump(json_schema(model)) + "\n", encoding="utf-8")
    subjects = {"schema_version": SCHEMA_VERSION, "subjects": subject_table()}
    (out / "subjects.json").write_text(_dump(subjects) + "\n", encoding="utf-8")
    print(f"wrote {len(models())} schemas and subjects.json to {out}")


def run(args: argparse.Namespace) -> int:
    try:
        if args.list:
            _print_list()
        elif args.model is not None:
            print(_dump(json_schema(resolve(args.model))))
        elif args.example is not None:
            print(_dump(json.loads(encode(example(resolve(args.example))))))
        elif args.out is not None:
            _write(args.out)
        else:
            print(_dump(document()))
    except UnknownModelError as exc:
        print(f"roundhouse schemas: {exc}", file=sys.stderr)
        return 2
    return 0
