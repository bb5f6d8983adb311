"""Reading a job's output (issue 14, item 1), the parts without a bus: chunks and offsets on the agent,
runs and ranks on the scheduler, selection and prefixes in the CLI."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from roundhouse.commands.logs import LogsError, Printer, select_runs, streams
from schemas.logs import MAX_LOG_CHUNK, LogRead, LogRun
from services.runtime.store import LeaseRecord
from services.scheduler.logs_query import JobRun, runs_from_rows
from services.worker.log_reader import complete_utf8, read_chunk, serve_log_read
from services.worker.records import write_job_marker

TEXT = "step 1\nhéllo wörld ✓\n日本語のログ\n🚀 done\n"


@pytest.mark.parametrize(
    ("data", "keep"),
    [
        (b"", 0),
        (b"abc", 3),
        ("é".encode(), 2),
        ("é".encode()[:1], 0),  # a 2-byte character cut after its lead byte
        (b"ab" + "✓".encode()[:2], 2),  # a 3-byte character cut after 2 bytes
        (b"ab" + "🚀".encode()[:3], 2),  # a 4-byte character cut after 3 bytes
        (b"ab" + "🚀".encode(), 6),
        (b"ab\xff", 3),  # not UTF-8: counts as complete (decodes to U+FFFD), so a reader moves on
        (b"\x80\x80\x80\x80", 4),  # stray continuation bytes: likewise
    ],
    ids=["empty", "ascii", "whole-2", "cut-2", "cut-3", "cut-4", "whole-4", "invalid-lead", "stray-continuations"],
)
def test_complete_utf8_keeps_whole_characters(data: bytes, keep: int) -> None:
    assert complete_utf8(data) == keep


@pytest.mark.parametrize("max_bytes", [1, 2, 3, 5, 7, 64, MAX_LOG_CHUNK])
def test_paging_by_offsets_gives_back_the_file_exactly(tmp_path: Path, max_bytes: int) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(TEXT.encode())
    offset, pieces, reads = 0, [], 0
    while True:
        text, next_offset, size = read_chunk(path, offset, max_bytes)
        assert size == len(TEXT.encode())
        assert next_offset - offset <= max_bytes
        if next_offset == offset:
            break
        pieces.append(text)
        offset, reads = next_offset, reads + 1
    assert offset == size
    if max_bytes >= 4:  # every chunk ends on a character: the pieces are the text's own
        assert "".join(pieces) == TEXT
    else:  # a character longer than a chunk still makes progress, as replacement characters
        assert "".join(pieces).replace("\ufffd", "").startswith("step 1\nh")
    assert reads >= len(TEXT.encode()) // max_bytes


def test_a_follower_reads_only_what_was_appended(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"first\n")
    text, offset, _ = read_chunk(path, 0, MAX_LOG_CHUNK)
    assert (text, offset) == ("first\n", 6)
    assert read_chunk(path, offset, MAX_LOG_CHUNK) == ("", 6, 6)  # caught up: nothing, same offset
    with path.open("ab") as f:
        f.write("sécond\n".encode())
    text, offset, size = read_chunk(path, offset, MAX_LOG_CHUNK)
    assert (text, offset, size) == ("sécond\n", 14, 14)
    assert read_chunk(path, 100, MAX_LOG_CHUNK) == ("", 100, 14)  # past the end (a replaced log): nothing


def _lease_dir(root: Path, lease_id: str, job_id: str, log: bytes = b"hello\n") -> Path:
    lease_dir = root / lease_id
    write_job_marker(lease_dir, job_id)
    (lease_dir / "rank-0.log").write_bytes(log)
    return lease_dir


def test_the_agent_serves_a_lease_log_of_that_job_only(tmp_path: Path) -> None:
    _lease_dir(tmp_path, "l-1", "job-a")
    ok = serve_log_read(LogRead(node_id="n", job_id="job-a", lease_id="l-1", local_rank=0), tmp_path)
    assert (ok.data, ok.next_offset, ok.size, ok.missing) == ("hello\n", 6, 6, None)
    other_job = serve_log_read(LogRead(node_id="n", job_id="job-b", lease_id="l-1", local_rank=0), tmp_path)
    assert other_job.data == ""
    assert other_job.missing == "no output of job job-b in lease l-1 here"
    no_rank = serve_log_read(LogRead(node_id="n", job_id="job-a", lease_id="l-1", local_rank=3), tmp_path)
    assert no_rank.data == ""
    assert no_rank.missing == "no output of local rank 3 in lease l-1"
    no_lease = serve_log_read(LogRead(node_id="n", job_id="job-a", lease_id="l-9", local_rank=0), tmp_path)
    assert no_lease.data == ""
    assert no_lease.missing is not None


def test_the_agent_reads_nothing_outside_the_lease_directory(tmp_path: Path) -> None:
    leases = tmp_path / "leases"
    secret = tmp_path / "secret.txt"
    secret.write_text("the agent's credentials\n")
    lease_dir = _lease_dir(leases, "l-1", "job-a")
    os.symlink(secret, lease_dir / "rank-1.log")  # a job planting a link to another file
    linked = serve_log_read(LogRead(node_id="n", job_id="job-a", lease_id="l-1", local_rank=1), leases)
    assert linked.data == ""
    assert linked.missing == "the log of rank 1 is not a file in its lease directory"
    # A lease id that is a path (the schema refuses it; built unchecked as a forger's client would send it).
    for forged in ("..", "../secret.txt", "/etc", "l-1/../.."):
        request = LogRead.model_construct(node_id="n", job_id="job-a", lease_id=forged, local_rank=0, offset=0,
                                          max_bytes=MAX_LOG_CHUNK)  # fmt: skip
        reply = serve_log_read(request, leases)
        assert reply.data == "", forged
        assert reply.missing is not None, forged
    # A job marker that is a link is not followed: that lease serves nothing.
    other = leases / "l-2"
    other.mkdir()
    (tmp_path / "marker").write_text("job-a")
    os.symlink(tmp_path / "marker", other / "job")
    (other / "rank-0.log").write_text("x\n")
    assert serve_log_read(LogRead(node_id="n", job_id="job-a", lease_id="l-2", local_rank=0), leases).data == ""


def _row(lease: str, rank: int, node: str, gpus: tuple[int, ...], at: float) -> LeaseRecord:
    return LeaseRecord(lease_id=f"{lease}-n{rank}", job_id="j", node_id=node, gpu_indices=gpus, epoch=1,
                       granted_at=at)  # fmt: skip


def test_runs_are_the_leases_in_grant_order_with_nodes_in_rank_order() -> None:
    rows = [
        _row("L-b", 1, "n2", (0, 1), 20.0), _row("L-b", 0, "n1", (2, 3), 20.0),
        _row("L-a", 0, "n3", (0,), 10.0), _row("L-c", 0, "n1", (0, 1), 30.0),
    ]  # fmt: skip
    runs = runs_from_rows([*rows, LeaseRecord("not-a-row", "j", "n9", (0,), 1, 0.0)], current_lease="L-c")
    assert [(r.run, r.lease_id, r.current) for r in runs] == [(1, "L-a", False), (2, "L-b", False), (3, "L-c", True)]
    assert runs[1].parts == (("n1", (2, 3)), ("n2", (0, 1)))


@pytest.mark.parametrize(
    ("parts", "distributed", "ranks"),
    [
        ((("n1", (0, 1, 2, 3)),), False, [(0, "n1", 0)]),  # one process seeing every GPU
        ((("n1", (2, 3)),), True, [(0, "n1", 0), (1, "n1", 1)]),  # one per GPU
        ((("n1", (0, 1)), ("n2", (5,))), False, [(0, "n1", 0), (1, "n1", 1), (2, "n2", 0)]),  # several nodes
    ],
    ids=["one-node", "one-node-distributed", "two-nodes"],
)
def test_which_node_holds_each_ranks_log(
    parts: tuple[tuple[str, tuple[int, ...]], ...], distributed: bool, ranks: list[tuple[int, str, int]]
) -> None:
    run = JobRun(1, "L", parts)
    assert run.ranks(distributed=distributed) == ranks
    assert run.to_wire(distributed=distributed).ranks == [r for r, _, _ in ranks]


RUNS = [LogRun(run=k, lease_id=f"L{k}", nodes=["n1"], ranks=[1, 0]) for k in (1, 2, 3)]


@pytest.mark.parametrize(
    ("run", "chosen"), [(None, [1, 2, 3]), (1, [1]), (3, [3]), (-1, [3]), (-3, [1])], ids=str
)  # fmt: skip
def test_select_runs(run: int | None, chosen: list[int]) -> None:
    assert [r.run for r in select_runs(RUNS, run)] == chosen


@pytest.mark.parametrize("run", [0, 4, -4])
def test_a_run_the_job_does_not_have_is_an_error(run: int) -> None:
    with pytest.raises(LogsError, match="the job has 3 runs"):
        select_runs(RUNS, run)


def test_streams_go_run_by_run_rank_0_first() -> None:
    assert streams(RUNS[:2], None) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert streams(RUNS[:2], 1) == [(1, 1), (2, 1)]


def test_prefixed_lines_stay_whole_across_chunks() -> None:
    out = io.StringIO()
    printer = Printer(out, prefix=True)
    printer.write((1, 0), "alpha\nbe")
    printer.write((1, 1), "other\n")
    printer.write((1, 0), "ta\ngam")
    printer.flush((1, 0))
    assert out.getvalue().splitlines() == [
        "[run 1 rank 0] alpha", "[run 1 rank 1] other", "[run 1 rank 0] beta", "[run 1 rank 0] gam",
    ]  # fmt: skip
    plain = io.StringIO()
    Printer(plain, prefix=False).write((1, 0), "as is, no newline")
    assert plain.getvalue() == "as is, no newline"
