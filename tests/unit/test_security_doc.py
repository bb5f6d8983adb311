"""docs/security.md's permission table is the code's (schemas/roles.py): one table, printed twice."""

from __future__ import annotations

from pathlib import Path

from schemas.roles import ROLE_PERMISSIONS, Role, inbox_prefix

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BEGIN = "<!-- permission table: generated from schemas/roles.py -->"
END = "<!-- end of permission table -->"


def _cell(patterns: tuple[str, ...] | list[str]) -> str:
    return "<br>".join(f"`{p}`" for p in patterns) or "-"


def render_table() -> str:
    """The table as docs/security.md shows it (``{id}``: the identity's own name)."""
    rows = ["| role | may publish | may subscribe | answers requests | why |", "|---|---|---|---|---|"]
    for role in Role:
        spec = ROLE_PERMISSIONS[role]
        subscribe = [*spec.subscribe, inbox_prefix(role, "{id}") + ".>"]
        rows.append(
            f"| {role.value} | {_cell(spec.publish)} | {_cell(subscribe)} | "
            f"{'yes' if spec.allow_responses else 'no'} | {spec.why} |"
        )
    return "\n".join(rows)


def test_doc_table_is_the_code_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text, f"{DOC} must hold the generated table after {BEGIN}"
    assert END in text, f"{DOC} must end the generated table with {END}"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    # To regenerate: python -c 'from tests.unit.test_security_doc import render_table; print(render_table())'
    assert shown == render_table()
