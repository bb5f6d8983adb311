"""The worker's lease table with packing (issue 17): several leases on one GPU only when every lease
on it is marked ``shared``; an unmarked grant of a busy GPU is refused with ``gpu_busy`` as before."""

from __future__ import annotations

from schemas.job import JobSpec
from schemas.leases import LeaseAckError, LeaseGrant
from schemas.nodes import LeaseState
from services.core.packing import MAX_JOBS_PER_GPU
from services.worker.leases import LeaseTable


def grant(lease_id: str, gpus: tuple[int, ...] = (0,), *, shared: bool = False) -> LeaseGrant:
    return LeaseGrant(
        epoch=3, lease_id=lease_id, job_id=f"job-{lease_id}", node_id="n1", gpus=list(gpus),
        spec=JobSpec(name="j", command=["python", "t.py"]), shared=shared,
    )  # fmt: skip


def test_a_grant_is_exclusive_unless_marked_shared() -> None:
    assert grant("a").shared is False


def test_two_shared_leases_run_on_one_gpu() -> None:
    table = LeaseTable([0, 1])
    table.add(grant("a", (0,), shared=True))
    assert table.check_grant(grant("b", (0,), shared=True)) == (None, [])
    table.add(grant("b", (0,), shared=True))
    assert sorted(lease.lease_id for lease in table) == ["a", "b"]


def test_an_unmarked_grant_of_a_busy_gpu_is_refused_even_beside_a_shared_lease() -> None:
    table = LeaseTable([0, 1])
    table.add(grant("a", (0,), shared=True))
    assert table.check_grant(grant("b", (0,))) == (LeaseAckError.GPU_BUSY, [])
    assert table.check_grant(grant("c", (0, 1))) == (LeaseAckError.GPU_BUSY, [])


def test_a_shared_grant_cannot_join_an_exclusive_lease() -> None:
    table = LeaseTable([0])
    table.add(grant("a", (0,)))
    assert table.check_grant(grant("b", (0,), shared=True)) == (LeaseAckError.GPU_BUSY, [])


def test_every_lease_on_the_gpu_must_be_shared() -> None:
    # a shared lease on GPUs 0-1 and an exclusive one on GPU 2: a shared grant of 1-2 is refused
    table = LeaseTable([0, 1, 2])
    table.add(grant("a", (0, 1), shared=True))
    table.add(grant("x", (2,)))
    assert table.check_grant(grant("b", (1, 2), shared=True)) == (LeaseAckError.GPU_BUSY, [])
    assert table.check_grant(grant("c", (1,), shared=True)) == (None, [])


def test_removing_one_shared_lease_keeps_the_other_on_the_gpu() -> None:
    table = LeaseTable([0])
    first = table.add(grant("a", (0,), shared=True))
    table.add(grant("b", (0,), shared=True))
    table.remove(first)
    assert first.ended.is_set()
    # b still holds GPU 0: an exclusive grant is refused, and once b stops it is waited for
    assert table.check_grant(grant("c", (0,))) == (LeaseAckError.GPU_BUSY, [])
    second = table.get("b")
    assert second is not None
    second.state = LeaseState.STOPPING
    assert table.check_grant(grant("c", (0,))) == (None, [second])
    table.remove(second)
    assert table.check_grant(grant("c", (0,))) == (None, [])


def test_a_gpu_takes_at_most_max_jobs_per_gpu_shared_leases() -> None:
    # A scheduler bug (or a replica that lost count) must not pile leases onto one GPU: with two
    # shared leases on GPU 0 a third shared grant is refused; a stopping one does not count.
    assert MAX_JOBS_PER_GPU == 2
    table = LeaseTable([0, 1])
    first = table.add(grant("a", (0,), shared=True))
    table.add(grant("b", (0,), shared=True))
    assert table.check_grant(grant("c", (0,), shared=True)) == (LeaseAckError.GPU_BUSY, [])
    assert table.check_grant(grant("d", (0, 1), shared=True)) == (LeaseAckError.GPU_BUSY, [])
    assert table.check_grant(grant("e", (1,), shared=True)) == (None, [])
    first.state = LeaseState.STOPPING
    assert table.check_grant(grant("c", (0,), shared=True)) == (None, [first])


def test_a_shared_grant_never_joins_a_running_lease_of_its_own_job() -> None:
    # Two leases of one job at once is a double run, packed or not: a second shared lease of job-a
    # on its GPU is refused while the first runs, and waits for it once it stops.
    table = LeaseTable([0])
    first = table.add(grant("a", (0,), shared=True))
    again = grant("a2", (0,), shared=True).model_copy(update={"job_id": first.job_id})
    assert table.check_grant(again) == (LeaseAckError.GPU_BUSY, [])
    first.state = LeaseState.STOPPING
    assert table.check_grant(again) == (None, [first])


def test_a_second_lease_of_a_running_job_is_its_twin_on_any_gpu() -> None:
    # The table finds a live run of the grant's job whatever GPUs the new grant names (the agent
    # refuses such a grant job_running before it looks at GPUs); a stopping run is no twin.
    table = LeaseTable([0, 1])
    first = table.add(grant("a", (0,)))
    elsewhere = grant("a2", (1,)).model_copy(update={"job_id": first.job_id})
    assert table.twins(elsewhere) == [first]
    assert not first.stopping
    assert table.twins(grant("b", (1,))) == []
    assert table.twins(first.grant) == []  # the same lease again is a duplicate, not a twin


def test_holders_name_each_lease_on_the_gpus_and_how_it_holds_them() -> None:
    table = LeaseTable([0, 1, 2])
    table.add(grant("a", (0,), shared=True))
    table.add(grant("b", (0,), shared=True))
    stopping = table.add(grant("c", (1,)))
    stopping.state = LeaseState.STOPPING
    assert table.holders([0, 1, 2]) == (
        "GPU 0: lease a (job job-a, shared); GPU 0: lease b (job job-b, shared); "
        "GPU 1: lease c (job job-c, stopping)"
    )
    assert table.holders([2]) == "none"


def test_a_stopping_lease_of_the_same_job_is_waited_for_on_any_gpu() -> None:
    table = LeaseTable([0, 1])
    first = table.add(grant("a", (0,)))
    elsewhere = grant("a2", (1,)).model_copy(update={"job_id": first.job_id})
    first.state = LeaseState.STOPPING
    assert table.twins(elsewhere) == [first]
    assert first.stopping  # waited for, not refused
    assert table.check_grant(elsewhere) == (None, [])  # its GPU is free: only the twin is waited for
    assert table.twins(grant("b", (1,))) == []
