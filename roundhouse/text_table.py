"""Plain-text tables for the terminal, drawn by rich (``simulate``'s sweep table, ``reproduce``'s results).

rich is imported inside :func:`render_table`, never at module import, so commands that print no table
(``roundhouse --help``, ``jobs``, ``submit``) do not pay for it (``benchmarks/cli.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Justify = Literal["left", "right"]


def render_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, justify: Sequence[Justify] | None = None, indent: int = 0
) -> str:
    """``header``, a rule under it, then ``rows``; columns as wide as their widest cell (never wrapped
    or cut, whatever the terminal's width, so piped output and logs keep whole numbers), no colours,
    trailing spaces stripped. ``justify`` per column (default: right, for numbers); ``indent`` spaces
    before every line."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    if justify is None:
        justify = ["right"] * len(header)
    if len(justify) != len(header) or any(len(row) != len(header) for row in rows):
        raise ValueError("every row and the justification need one entry per header column")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), safe_box=False)
    for title, how in zip(header, justify, strict=True):
        table.add_column(title, justify=how, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    buffer = io.StringIO()
    console = Console(file=buffer, width=1_000_000, color_system=None, force_terminal=False, highlight=False)
    console.print(table, crop=False, soft_wrap=False)
    pad = " " * indent
    return "\n".join(pad + line.rstrip() for line in buffer.getvalue().splitlines() if line.strip())
