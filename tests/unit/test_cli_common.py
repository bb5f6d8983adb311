"""The helpers every cluster command shares (``roundhouse/commands/common.py``): the failures
``ask_cluster`` reports alike, with the command's name and exit code, and the rough durations of the
tables."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest
from pydantic import BaseModel, ValidationError

from roundhouse.commands import common
from roundhouse.commands.common import CommandFailed, ask_cluster, rough_duration
from services.runtime.bus import BusError, NoResponderError


class _Gpus(BaseModel):
    gpus: int


def _validation_error() -> ValidationError:
    try:
        _Gpus.model_validate({"gpus": "many"})
    except ValidationError as exc:
        return exc
    raise AssertionError("not refused")


def _failing(exc: BaseException) -> Callable[..., object]:
    def with_client(args: argparse.Namespace, work: object) -> object:
        raise exc

    return with_client


@pytest.mark.parametrize(
    ("raised", "message", "code"),
    [
        (NoResponderError("query.x"), "roundhouse nodes: nothing answers query.x", 1),
        (TimeoutError(), "roundhouse nodes: too slow", 1),
        (BusError("query.x: RuntimeError: not the leader"),
         "roundhouse nodes: the scheduler failed to answer: query.x: RuntimeError: not the leader", 1),
        (ConnectionRefusedError("nothing at 4222"), "roundhouse nodes: cannot reach NATS: nothing at 4222", 1),
        (_validation_error(), "roundhouse nodes: gpus: Input should be a valid integer, unable to parse string "
                              "as an integer", 2),
    ],
    ids=["no-responder", "timeout", "bus-error", "os-error", "validation"],
)  # fmt: skip
def test_ask_cluster_says_what_failed_with_the_commands_name(
    monkeypatch: pytest.MonkeyPatch, raised: BaseException, message: str, code: int
) -> None:
    monkeypatch.setattr(common, "with_client", _failing(raised))
    args = argparse.Namespace(command="nodes")
    with pytest.raises(CommandFailed) as failed:
        ask_cluster(args, _unused, nobody_answers="nothing answers query.x", too_slow="too slow")
    assert (str(failed.value), failed.value.code) == (message, code)


def test_a_timeout_says_what_nobody_answering_says_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "with_client", _failing(TimeoutError()))
    with pytest.raises(CommandFailed, match=r"^roundhouse status: nothing answers query.status$"):
        ask_cluster(argparse.Namespace(command="status"), _unused, nobody_answers="nothing answers query.status")


def test_ctrl_c_exits_130_without_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "with_client", _failing(KeyboardInterrupt()))
    with pytest.raises(SystemExit) as stopped:
        ask_cluster(argparse.Namespace(command="logs"), _unused, nobody_answers="-")
    assert stopped.value.code == 130


def test_a_commands_own_failure_and_its_answer_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "with_client", _failing(CommandFailed("roundhouse drain: no such node", 1)))
    with pytest.raises(CommandFailed, match=r"^roundhouse drain: no such node$"):
        ask_cluster(argparse.Namespace(command="drain"), _unused, nobody_answers="-")
    monkeypatch.setattr(common, "with_client", lambda args, work: 42)
    assert ask_cluster(argparse.Namespace(command="drain"), _unused, nobody_answers="-") == 42


async def _unused(client: object) -> int:
    raise AssertionError("with_client is replaced: work is never run")


@pytest.mark.parametrize(
    ("seconds", "digits", "shown"),
    [(0.04, 0, "0s"), (4.25, 1, "4.2s"), (59.0, 0, "59s"), (60.0, 0, "1m"), (5400.0, 0, "2h"), (3 * 86400.0, 1, "3d")],
)
def test_rough_durations_use_the_largest_unit(seconds: float, digits: int, shown: str) -> None:
    assert rough_duration(seconds, second_digits=digits) == shown
