"""A job without an agent: the timing budget, the config check, and the lease records read back from disk."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from services.worker.channel import Channel
from services.worker.config import WorkerConfig
from services.worker.orphans import ORPHAN_MARGIN, TimingError, budget, check_timing
from services.worker.records import LeaseRecord, RecordError, confined_checkpoint, newest_checkpoint


@pytest.mark.parametrize(
    ("timing", "expected"),
    [
        # died: window 30 - 2 - 3 = 25; SIGKILL 5 s after SIGTERM; grace what is left, capped by the spec
        ({"lease_ttl_s": 30, "heartbeat_s": 2, "kill_after_s": 5, "grace_period_s": 30}, (20.0, 5.0)),
        ({"lease_ttl_s": 30, "heartbeat_s": 2, "kill_after_s": 5, "grace_period_s": 8}, (8.0, 5.0)),
        # silent for half the TTL: window 15 - 2 - 3 = 10; kill_after shrinks to a quarter of it
        ({"lease_ttl_s": 30, "heartbeat_s": 2, "kill_after_s": 5, "grace_period_s": 30, "silent": True}, (7.5, 2.5)),
        # the tests' short TTLs: windows 2 - 0.2 - 0.2 = 1.6 and 0.75 - 0.2 - 0.15 = 0.4
        ({"lease_ttl_s": 2, "heartbeat_s": 0.2, "kill_after_s": 0.5, "grace_period_s": 5}, (1.2, 0.4)),
        ({"lease_ttl_s": 1.5, "heartbeat_s": 0.2, "kill_after_s": 5, "grace_period_s": 5, "silent": True}, (0.3, 0.1)),
    ],
    ids=["died-default", "died-short-grace", "silent-default", "died-ttl-2", "silent-ttl-1.5"],
)
def test_the_budget_ends_before_the_scheduler_may_reassign(
    timing: dict[str, Any], expected: tuple[float, float]
) -> None:
    got = budget(**timing)
    assert (got.grace_s, got.kill_after_s) == pytest.approx(expected)
    # Counted from the death (or from the last keepalive), done by TTL - heartbeat - margin.
    ttl = timing["lease_ttl_s"]
    start = ttl / 2 if timing.get("silent") else 0.0
    assert start + got.total_s <= ttl - timing["heartbeat_s"] - ORPHAN_MARGIN * ttl + 1e-9


def test_a_heartbeat_that_leaves_no_time_under_the_ttl_is_refused() -> None:
    check_timing(lease_ttl_s=30, heartbeat_s=2)
    with pytest.raises(TimingError, match=r"use heartbeat_s < 1\.6"):
        check_timing(lease_ttl_s=4, heartbeat_s=2)
    with pytest.raises(ValidationError, match="heartbeat_s=2 leaves no time under lease_ttl_s=4"):
        WorkerConfig(lease_ttl_s=4, heartbeat_s=2)
    assert WorkerConfig(lease_ttl_s=4, heartbeat_s=1).heartbeat_s == 1


# --- lease records ------------------------------------------------------------------------------------
def record(**changes: object) -> LeaseRecord:
    fields: dict[str, object] = {
        "lease_id": "L1", "job_id": "j1", "node_id": "n1", "epoch": 3, "coordinator": True, "ranks": 1,
        "grace_period_s": 5.0, "resume_iteration": 10,
    }  # fmt: skip
    fields.update(changes)
    return LeaseRecord(**fields)  # type: ignore[arg-type]


def checkpoint(root: Path, job: str = "j1", name: str = "checkpoint.pt") -> Path:
    path = root / job / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"ckpt")
    return path


def test_a_record_round_trips_and_is_replaced_atomically(tmp_path: Path) -> None:
    lease_dir = tmp_path / "L1"
    first = record()
    first.write(lease_dir)
    assert LeaseRecord.read(lease_dir) == first
    second = first.with_checkpoint("/ck/j1/checkpoint.pt", 20)
    second.write(lease_dir)
    assert LeaseRecord.read(lease_dir) == second
    assert sorted(p.name for p in lease_dir.iterdir()) == ["lease.json"]  # no temp file left
    LeaseRecord.remove(lease_dir)
    LeaseRecord.remove(lease_dir)  # idempotent
    with pytest.raises(RecordError, match="cannot read"):
        LeaseRecord.read(lease_dir)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not json", "not a lease record"),
        (json.dumps({"lease_id": "L1"}).encode(), "expected the keys"),
        (b"{}", "expected the keys"),
        (b"[]", "expected the keys"),
        (b" " * (64 * 1024 + 1), "over 65536 bytes"),
    ],
    ids=["garbage", "missing-keys", "empty", "a-list", "oversized"],
)
def test_a_record_that_is_not_one_is_refused(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "L1").mkdir()
    (tmp_path / "L1" / "lease.json").write_bytes(content)
    with pytest.raises(RecordError, match=message):
        LeaseRecord.read(tmp_path / "L1")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"job_id": "../../etc"}, "job_id '../../etc' is not an id"),
        ({"lease_id": "L2"}, "names lease L2, not L1"),
        ({"epoch": "3"}, "epoch='3'"),
        ({"epoch": True}, "epoch=True"),
        ({"resume_iteration": -1}, "negative"),
        ({"checkpoint_iteration": 1.5}, "checkpoint_iteration=1.5"),
    ],
    ids=["job-id-escapes", "other-lease", "epoch-string", "epoch-bool", "negative", "float-iteration"],
)
def test_a_tampered_record_is_refused(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    data = dataclasses.asdict(record())
    data.update(changes)
    (tmp_path / "L1").mkdir()
    (tmp_path / "L1" / "lease.json").write_text(json.dumps(data))
    with pytest.raises(RecordError, match=message):
        LeaseRecord.read(tmp_path / "L1")


def test_a_checkpoint_path_must_stay_inside_the_jobs_checkpoint_directory(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    inside = checkpoint(root)
    other_job = checkpoint(root, job="j2")
    outside = tmp_path / "secret"
    outside.write_bytes(b"x")
    (root / "j1" / "escape.pt").symlink_to(outside)
    (root / "j1" / "sideways.pt").symlink_to(other_job)
    (root / "j1" / "dir.pt").mkdir()
    assert confined_checkpoint(inside, root, "j1") == inside.resolve()
    assert confined_checkpoint(root / "j1" / ".." / "j1" / "checkpoint.pt", root, "j1") == inside.resolve()
    j1 = root / "j1"
    escapes = [other_job, outside, j1 / "escape.pt", j1 / "sideways.pt", j1 / ".." / "j2" / "checkpoint.pt",
               j1 / "missing.pt", j1 / "dir.pt"]  # fmt: skip
    for path in escapes:
        assert confined_checkpoint(path, root, "j1") is None, path
    assert confined_checkpoint(inside, root, "..") is None
    # A checkpoint root that is itself behind a symbolic link is fine.
    (tmp_path / "link").symlink_to(root)
    assert confined_checkpoint(tmp_path / "link" / "j1" / "checkpoint.pt", tmp_path / "link", "j1") == inside.resolve()


def test_the_newest_checkpoint_is_the_records_or_the_channels_if_newer_than_the_resumed_one(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    path = checkpoint(root)
    lease_dir = tmp_path / "leases" / "L1"
    lease_dir.mkdir(parents=True)
    base = record(resume_iteration=10)
    assert newest_checkpoint(base, lease_dir, root) is None  # no channel, nothing recorded
    assert newest_checkpoint(base.with_checkpoint(str(path), 20), lease_dir, root) == (path.resolve(), 20)
    channel = Channel.create(lease_dir / "rank-0.chan")
    channel.set_checkpoint_iteration(27)  # rank 0 checkpointed after the agent's last report
    assert newest_checkpoint(base.with_checkpoint(str(path), 20), lease_dir, root) == (path.resolve(), 27)
    assert newest_checkpoint(record(coordinator=False), lease_dir, root) is None  # only rank 0 of the job's
    channel.set_checkpoint_iteration(10)  # the one it resumed from: nothing new
    assert newest_checkpoint(base, lease_dir, root) is None
    # A recorded path that escapes (the record was tampered with) is not reported.
    os.replace(path, tmp_path / "moved.pt")
    (root / "j1" / "checkpoint.pt").symlink_to(tmp_path / "moved.pt")
    channel.set_checkpoint_iteration(30)
    assert newest_checkpoint(base.with_checkpoint(str(tmp_path / "moved.pt"), 20), lease_dir, root) is None
    channel.close()
