"""CLI start-up (issue 14, item 9): only the command being run is imported, so `roundhouse --help`
and a command's flags cost no pydantic, NATS or policy imports; the help lines the CLI lists
without importing a command are the ones the command registers; ``benchmarks/cli.py`` runs."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cli import measure
from roundhouse.cli import build_parser, command_of, main
from roundhouse.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pydantic", "nats", "sqlalchemy", "schemas", "services", "numpy", "yaml", "roundhouse.client")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {choice.dest: choice.help for choice in action._choices_actions}


def test_the_help_lines_listed_without_importing_are_the_commands_own() -> None:
    assert _subcommands(build_parser()) == {command.name: command.help for command in COMMANDS}
    assert _subcommands(build_parser([])) == {command.name: command.help for command in COMMANDS}


@pytest.mark.parametrize(
    ("argv", "command"),
    [([], None), (["--help"], None), (["jobs", "--all"], "jobs"), (["--version"], None), (["-h", "submit"], "submit"),
     (["--", "jobs"], None)],
    ids=["empty", "help", "jobs", "version", "option-first", "after-dashes"],
)  # fmt: skip
def test_the_command_named(argv: list[str], command: str | None) -> None:
    assert command_of(argv) == command


def _imported_after(argv: list[str]) -> list[str]:
    """The heavy modules a fresh interpreter holds after ``roundhouse ARGV`` (which must exit 0)."""
    script = (
        "import sys\n"
        "from roundhouse.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))
    return loaded


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["jobs", "--help"], ["cancel", "--help"], ["submit", "--help"], ["--version"]],
    ids=["help", "jobs-help", "cancel-help", "submit-help", "version"],
)
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    version = {"services", "services.runtime", "services.runtime.version"}  # --version reads it, nothing else
    assert [m for m in _imported_after(argv) if m not in version] == []


def test_every_command_is_listed_and_each_still_has_its_own_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    listed = capsys.readouterr().out
    for command in COMMANDS:
        assert command.name in listed
    with pytest.raises(SystemExit):
        main(["jobs", "--help"])
    assert "--status" in capsys.readouterr().out


def test_the_start_up_benchmark_runs() -> None:
    result = measure(runs=1)
    for case in ("help", "jobs", "submit"):
        entry = result[case]
        assert isinstance(entry, dict)
        assert entry["min_s"] > 0
        assert set(entry) >= {"overhead_min_s", "overhead_median_s", "ratio_median", "meets_target"}


def _aiohttp_after(*argv: str) -> bool:
    """Whether aiohttp was really imported by ``python -m roundhouse ARGV`` run as a user runs it."""
    script = (
        "import sys\n"
        f"sys.argv = ['roundhouse', *{list(argv)!r}]\n"
        "from roundhouse.cli import main\n"
        "main()\n"
        "print(sys.modules.get('aiohttp') is not None)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip().splitlines()[-1] == "True"


def test_a_client_command_runs_without_aiohttp_and_the_dashboard_with_it(tmp_path: Path) -> None:
    # nats-py imports aiohttp only for WebSocket connections; `jobs` gets as far as its credentials
    # (nats imported, nothing connected) without paying for it, and the dashboard still has it.
    missing = str(tmp_path / "missing.creds")
    assert not _aiohttp_after("jobs", "--nats", "nats://127.0.0.1:9", "--creds", missing)
    dashboard = (
        "import sys\n"
        "from roundhouse.cli import _skip_aiohttp, command_of\n"
        "_skip_aiohttp(command_of(['dashboard', '--port', '0']))\n"
        "from aiohttp import web\n"
        "print(web.Application is not None)\n"
    )
    done = subprocess.run([sys.executable, "-c", dashboard], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
