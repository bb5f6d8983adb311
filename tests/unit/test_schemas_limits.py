"""Every value a message carries is bounded: strings, lists, maps and numbers (checked on the JSON Schema).

A publisher — or an attacker with bus credentials — must not be able to make a consumer allocate
without limit or feed a policy an absurd number. Walking each model's JSON Schema finds any field
added later without a bound.
"""

from __future__ import annotations

from typing import Any

import pytest

from roundhouse.commands.schemas import models

MODELS = models()


def _walk(node: Any, path: str, out: list[tuple[str, dict[str, Any]]]) -> None:
    if isinstance(node, dict):
        if "type" in node or "enum" in node or "const" in node:
            out.append((path, node))
        for key, value in node.items():
            _walk(value, f"{path}/{key}", out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _walk(value, f"{path}/{i}", out)


def _has_both_bounds(node: dict[str, Any]) -> bool:
    return bool(
        {"minimum", "exclusiveMinimum"} & node.keys() and {"maximum", "exclusiveMaximum"} & node.keys()
    )


def _unbounded(schema: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    nodes: list[tuple[str, dict[str, Any]]] = []
    _walk(schema, "", nodes)
    for path, node in nodes:
        kind = node.get("type")
        if "enum" in node or "const" in node or kind in ("boolean", "null"):
            continue
        bounded = {
            "string": "maxLength" in node or node.get("format") == "uuid",
            "array": "maxItems" in node,
            "object": "properties" in node or "maxProperties" in node,
            "integer": _has_both_bounds(node),
            "number": _has_both_bounds(node),
        }
        if not bounded.get(kind, True):
            problems.append(f"{path}: {kind} without a bound")
    return problems


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_value_is_bounded(name: str) -> None:
    schema = MODELS[name].model_json_schema()
    assert _unbounded(schema) == []


def test_the_walk_finds_unbounded_fields() -> None:
    """The checker itself catches each kind of missing bound (so a green run means something)."""
    schema = {
        "properties": {
            "s": {"type": "string"},
            "a": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 1}},
            "m": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
            "n": {"type": "number", "minimum": 0},
            "ok": {"type": "string", "maxLength": 5},
        },
        "type": "object",
    }
    found = _unbounded(schema)
    assert len(found) == 4
    assert any("/s:" in p for p in found)
    assert any("/n:" in p and "number" in p for p in found)
