"""One module per CLI sub-command; each exposes ``register(subparsers)``.

A command module sets ``handler`` on its parser with ``set_defaults(handler=...)``; the handler takes
the parsed namespace and returns the process exit code. A command that talks to a running Roundhouse
builds its parser with ``common.cluster_command`` (its help line from :data:`COMMANDS`, the endpoint
flags, the handler) and asks through ``common.ask_cluster``, which reports the failures they share
(nothing answers, an error as the answer, NATS out of reach, a rejected value, Ctrl-C) alike.

Start-up stays quick because only the command being run is imported (issue 14, item 9:
``benchmarks/cli.py``): :data:`COMMANDS` names every command with the one-line help that
``roundhouse --help`` shows, so the others need not be imported to list them. A command module
imports at its top only what its parser needs, and what its handler needs when it runs.
``tests/unit/test_cli_startup.py`` holds each line equal to the help its module registers.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from types import ModuleType


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    module: str
    help: str

    def load(self) -> ModuleType:
        return import_module(self.module)


# The order of `roundhouse --help`.
COMMANDS: tuple[Command, ...] = (
    Command("up", "roundhouse.commands.up", "run broker, services and local workers (Ctrl-C stops)"),
    Command("submit", "roundhouse.commands.submit", "submit a job (YAML spec, or flags -- CMD ARGS...)"),
    Command("jobs", "roundhouse.commands.jobs", "list jobs (a table, or --json)"),
    Command("cancel", "roundhouse.commands.cancel", "cancel jobs"),
    Command("nodes", "roundhouse.commands.nodes", "list nodes: GPUs, jobs, liveness, drains (a table, or --json)"),
    Command("drain", "roundhouse.commands.drain",
            "drain a node: no new work there (--now: preempt its jobs with checkpoints)"),
    Command("undrain", "roundhouse.commands.undrain", "undrain a node: it takes new work again"),
    Command("status", "roundhouse.commands.status",
            "the leader, services, policies, round timings and queue depth (or --json)"),
    Command("logs", "roundhouse.commands.logs", "print a job's output (all runs and ranks; -f follows)"),
    Command("dashboard", "roundhouse.commands.dashboard",
            "serve the read-only web dashboard (queue, jobs, nodes, policies)"),
    Command("service", "roundhouse.commands.service",
            "run one service (admission, scheduler, placement, metrics, worker)"),
    Command("simulate", "roundhouse.commands.simulate", "run scheduling policies on a workload in the simulator"),
    Command("reproduce", "roundhouse.commands.reproduce",
            "run a seed paper's headline experiment and compare with its numbers"),
    Command("history", "roundhouse.commands.history",
            "export finished jobs as a trace CSV that `simulate --trace` replays"),
    Command("schemas", "roundhouse.commands.schemas", "print the JSON Schema of each event"),
    Command("auth", "roundhouse.commands.auth", "create credentials and the NATS server's authorization config"),
)  # fmt: skip
BY_NAME: dict[str, Command] = {command.name: command for command in COMMANDS}

COMMAND_MODULES: tuple[str, ...] = tuple(command.module for command in COMMANDS)


def load_commands() -> list[ModuleType]:
    """Every command module (imports them all: for tests and tools, not for one command's run)."""
    return [command.load() for command in COMMANDS]
