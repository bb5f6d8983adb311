"""One module per CLI sub-command; each exposes ``register(subparsers)``.

A command module sets ``handler`` on its parser with ``set_defaults(handler=...)``; the handler takes
the parsed namespace and returns the process exit code.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

# Import order is the order in `roundhouse --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "roundhouse.commands.up",
    "roundhouse.commands.submit",
    "roundhouse.commands.jobs",
    "roundhouse.commands.cancel",
    "roundhouse.commands.service",
    "roundhouse.commands.simulate",
    "roundhouse.commands.reproduce",
    "roundhouse.commands.schemas",
    "roundhouse.commands.auth",
)


def load_commands() -> list[ModuleType]:
    return [import_module(name) for name in COMMAND_MODULES]
