"""The log line format (issue 15, item 6): ISO 8601 ``ts``, the ids of what a line is about as fields,
the existing keys kept; text lines for people; old epoch-float lines still readable."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from services.runtime.logs import (
    JsonFormatter,
    TextFormatter,
    bind_ids,
    bound_ids,
    configure_logging,
    iso_timestamp,
    parse_timestamp,
    reset_ids,
)

CREATED = 1_748_779_200.123456  # 2025-06-01T12:00:00.123456Z


class Event:
    def __init__(self, **ids: str | None) -> None:
        for key, value in ids.items():
            setattr(self, key, value)


def record(msg: str = "hello %s", *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("roundhouse.test", logging.INFO, __file__, 1, msg, args or ("world",), None)
    rec.created = CREATED
    rec.msecs = 123.456
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


@pytest.fixture
def ids() -> Iterator[None]:
    token = bind_ids(Event(job_id="j-42", lease_id="l-7", node_id="node-3"))
    yield
    reset_ids(token)


def test_iso_timestamp_is_utc_with_microseconds_and_z() -> None:
    assert iso_timestamp(CREATED) == "2025-06-01T12:00:00.123456Z"
    assert iso_timestamp(0.0) == "1970-01-01T00:00:00.000000Z"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("2025-06-01T12:00:00.123456Z", CREATED, id="iso"),
        pytest.param(CREATED, CREATED, id="epoch-float-before-issue-15"),
        pytest.param("1748779200.123456", CREATED, id="epoch-as-text"),
        pytest.param("2025-06-01T12:00:00.123456+00:00", CREATED, id="iso-offset"),
    ],
)
def test_parse_timestamp_reads_new_and_old_lines(raw: object, expected: float) -> None:
    assert parse_timestamp(raw) == pytest.approx(expected, abs=1e-6)


def test_parse_timestamp_refuses_what_is_no_time() -> None:
    with pytest.raises(ValueError, match="not a log timestamp"):
        parse_timestamp(None)


def test_json_line_keeps_its_keys_and_stamps_iso_time() -> None:
    line = json.loads(JsonFormatter({"service": "scheduler", "instance": "s-1"}).format(record(extra_key=3)))
    assert line == {
        "ts": "2025-06-01T12:00:00.123456Z", "level": "info", "logger": "roundhouse.test", "msg": "hello world",
        "service": "scheduler", "instance": "s-1", "extra_key": 3,
    }  # fmt: skip


@pytest.mark.usefixtures("ids")
def test_json_line_carries_the_bound_ids() -> None:
    line = json.loads(JsonFormatter().format(record()))
    assert (line["job_id"], line["lease_id"], line["node_id"]) == ("j-42", "l-7", "node-3")


@pytest.mark.usefixtures("ids")
def test_an_explicit_extra_id_wins_over_the_bound_one() -> None:
    line = json.loads(JsonFormatter().format(record(job_id="j-other")))
    assert line["job_id"] == "j-other"
    assert line["lease_id"] == "l-7"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        pytest.param({"job_id": "j-1"}, {"job_id": "j-1"}, id="job-only"),
        pytest.param({"node_id": "n0", "lease_id": "l-1"}, {"lease_id": "l-1", "node_id": "n0"}, id="lease-and-node"),
        pytest.param({"job_id": None, "other": "x"}, {}, id="none-bound"),
    ],
)
def test_bind_ids_takes_only_the_ids_an_event_has(fields: dict[str, str | None], expected: dict[str, str]) -> None:
    token = bind_ids(Event(**fields))
    try:
        assert bound_ids() == expected
        line = json.loads(JsonFormatter().format(record()))
        assert {k: line[k] for k in ("job_id", "lease_id", "node_id") if k in line} == expected
    finally:
        reset_ids(token)
    assert bound_ids() == {}


async def test_tasks_a_handler_starts_inherit_its_ids_and_others_do_not() -> None:
    seen: dict[str, dict[str, str]] = {}

    async def child() -> None:
        seen["child"] = bound_ids()

    token = bind_ids(Event(job_id="j-9"))
    try:
        task = asyncio.create_task(child())
    finally:
        reset_ids(token)
    await task
    seen["after"] = bound_ids()
    assert seen == {"child": {"job_id": "j-9"}, "after": {}}


@pytest.mark.usefixtures("ids")
def test_text_line_is_utc_iso_and_names_the_ids() -> None:
    line = TextFormatter().format(record())
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.123Z INFO    roundhouse\.test: hello world "
        r"\[job_id=j-42 lease_id=l-7 node_id=node-3\]",
        line,
    ), line
    assert line.startswith("2025-06-01T12:00:00.123Z")


def test_configure_logging_writes_json_lines_with_static_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging(level="INFO", fmt="json", service="worker", instance="node-1", node_id="node-1")
        token = bind_ids(Event(job_id="j-5", lease_id="l-5"))
        try:
            logging.getLogger("roundhouse.worker").info("granted")
        finally:
            reset_ids(token)
        configure_logging(level="INFO", fmt="json", service="scheduler", instance="s", node_id=None)
        logging.getLogger("roundhouse.scheduler").info("no ids")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: first[k] for k in ("service", "instance", "node_id", "job_id", "lease_id")} == {
        "service": "worker", "instance": "node-1", "node_id": "node-1", "job_id": "j-5", "lease_id": "l-5",
    }  # fmt: skip
    assert parse_timestamp(first["ts"]) > 1.7e9
    assert "node_id" not in second
    assert "job_id" not in second
