"""docs/schemas.md's subject table says what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from schemas.subjects import SUBJECTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "schemas.md"


def _table_rows() -> dict[str, list[str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Subjects", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows[re.sub(r"<[a-z_.]+>", "*", cells[0])] = cells[1:]
    return rows


def test_doc_table_matches_registry() -> None:
    if not DOC.is_file():
        pytest.fail(f"{DOC} is missing")
    rows = _table_rows()
    assert set(rows) == {s.pattern for s in SUBJECTS}
    for spec in SUBJECTS:
        model, storage, direction, reply = rows[spec.pattern]
        assert model == spec.model.__name__, spec.pattern
        assert storage == ("JetStream" if spec.durable else "core"), spec.pattern
        assert direction == spec.direction, spec.pattern
        expected_reply = f"`{spec.reply_model.__name__}`" if spec.reply_model else ""
        assert reply.strip("`") == expected_reply.strip("`"), spec.pattern
    # and the placeholders name the payload field the codec checks against the token
    text = DOC.read_text(encoding="utf-8")
    for spec in SUBJECTS:
        if spec.token_field is not None:
            assert spec.pattern.replace("*", f"<{spec.token_field}>") in text
