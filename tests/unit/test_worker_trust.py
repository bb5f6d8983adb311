"""The worker's pure trust checks (issue 13): peers of a gang, and checkpoint paths from the bus."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.job import JobSpec
from schemas.leases import LeaseGrant, WorldInfo
from services.worker.checkpoints import confine, confine_resume
from services.worker.peers import PeerBook, PeerClaim, judge_peer_fact

ME = "n1"


def grant(*, node_rank: int = 0, num_nodes: int = 3, coordinator: str = ME, epoch: int = 4) -> LeaseGrant:
    world = WorldInfo(num_nodes=num_nodes, node_rank=node_rank, world_size=num_nodes, rank_offset=node_rank,
                      coordinator_node=coordinator, coordinator_host="h", coordinator_port=29_500)  # fmt: skip
    return LeaseGrant(epoch=epoch, lease_id="l1", job_id="j1", node_id=ME, gpus=[0],
                      spec=JobSpec(name="j", command=["python", "t.py"]), world=world)  # fmt: skip


def claim(node: str, *, job_id: str = "j1", epoch: int = 4) -> PeerClaim:
    return PeerClaim(node_id=node, lease_id="l1", job_id=job_id, epoch=epoch)


def test_a_coordinator_learns_its_gang_from_matching_starts_up_to_its_size() -> None:
    book, g = PeerBook(), grant()
    assert book.note(claim("n2"), g, ME) is None
    assert book.note(claim("n2"), g, ME) is None  # again: no new place taken
    assert book.note(claim("x", job_id="other"), g, ME) == "lease l1 runs job j1, not other"
    assert book.note(claim("x", epoch=9), g, ME) == "lease l1 was granted in epoch 4, not 9"
    assert book.note(claim(ME), g, ME) == "it comes from this node"
    assert book.note(claim("n3"), g, ME) is None
    assert book.note(claim("n4"), g, ME) == "lease l1's 3 nodes are all known already"
    assert book.members(g, ME) == {"n2", "n3"}
    book.forget("l1")
    assert book.members(g, ME) == frozenset()


def test_a_non_coordinator_knows_its_coordinator_and_keeps_early_starts_until_its_grant() -> None:
    book, g = PeerBook(), grant(node_rank=1, coordinator="n0")
    assert book.note(claim("n2"), None, ME) is None  # before this node's grant: kept, unchecked
    assert book.note(claim("forged", epoch=1), None, ME) is None
    assert book.adopt(g) == ["lease l1 was granted in epoch 4, not 1"]
    assert book.members(g, ME) == {"n0", "n2"}
    assert book.note(claim("n5"), g, ME) == "lease l1's 3 nodes are all known already"


def test_early_starts_are_bounded() -> None:
    book = PeerBook(early_leases=2)
    for lease in ("a", "b", "c"):
        book.note(PeerClaim(node_id="n2", lease_id=lease, job_id="j1", epoch=4), None, ME)
    assert book.adopt(grant().model_copy(update={"lease_id": "a"})) == []
    assert book.members(grant().model_copy(update={"lease_id": "a"}), ME) == frozenset()


@pytest.mark.parametrize(
    ("node", "job_id", "epoch", "held", "why"),
    [
        ("n2", "j1", 4, True, None),
        (None, "j1", 4, True, "it names no node"),
        (ME, "j1", 4, True, "it comes from this node"),
        ("n2", "j1", 4, False, "this node holds no such lease"),
        ("n2", "j2", 4, True, "lease l1 runs job j1, not j2"),
        ("n2", "j1", None, True, "lease l1 was granted in epoch 4, not None"),
        ("n9", "j1", 4, True, "node n9 is not known to share lease l1"),
    ],
    ids=["member", "no-node", "self", "not-held", "other-job", "no-epoch", "stranger"],
)
def test_a_peer_fact_counts_only_from_a_member_about_the_same_lease(
    node: str | None, job_id: str, epoch: int | None, held: bool, why: str | None
) -> None:
    g = grant()
    assert judge_peer_fact(g if held else None, job_id=job_id, epoch=epoch, node_id=node, self_node=ME,
                           members=frozenset({"n2"})) == why  # fmt: skip


def test_confine_keeps_paths_strictly_inside_the_job_directory(tmp_path: Path) -> None:
    job_dir = tmp_path / "ck" / "j1"
    job_dir.mkdir(parents=True)
    inside = job_dir / "checkpoint.pt"
    inside.write_bytes(b"x")
    outside = tmp_path / "evil.pt"
    outside.write_bytes(b"x")
    (job_dir / "link.pt").symlink_to(outside)
    (job_dir / "sub").mkdir()
    assert confine(inside, job_dir) == inside.resolve()
    assert confine(job_dir / "sub" / ".." / "checkpoint.pt", job_dir) == inside.resolve()
    assert confine(job_dir / "not-yet.pt", job_dir) == (job_dir / "not-yet.pt").resolve()
    for bad in (outside, job_dir / ".." / ".." / "evil.pt", job_dir / "link.pt", job_dir, job_dir / "sub",
                tmp_path / "ck" / "j10" / "checkpoint.pt", Path("ck/j1/checkpoint.pt")):  # fmt: skip
        assert confine(bad, job_dir) is None, bad


def test_confine_resume_drops_a_foreign_path_with_its_iteration(tmp_path: Path) -> None:
    job_dir = tmp_path / "j1"
    g = grant().model_copy(update={"resume_from": str(tmp_path / "evil.pt"), "resume_iteration": 12})
    kept, why = confine_resume(g, job_dir)
    assert (kept.resume_from, kept.resume_iteration) == (None, None)
    assert why is not None
    assert "not inside the job's checkpoint directory" in why
    own = g.model_copy(update={"resume_from": str(job_dir / "checkpoint.pt")})
    kept, why = confine_resume(own, job_dir)
    assert (kept.resume_from, kept.resume_iteration, why) == (str((job_dir / "checkpoint.pt").resolve()), 12, None)
